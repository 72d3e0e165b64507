"""How an ``ember`` command ends its process: every clean-up Python would run, then ``os._exit``.

Why not a plain ``sys.exit``: native thread pools that ember reads and trains with (Arrow's CPU
and IO pools, which hold Python objects such as a CSV reader's ``invalid_row_handler`` or a
``py_buffer`` over a block's bytes; gloo's and torch's threads) can release such an object a
moment after the call that used them returned. If that moment falls inside the interpreter's
teardown, CPython 3.11-3.13 ends the pool thread with ``pthread_exit`` while it waits for the
GIL; unwinding through the C++ destructor it is in calls ``std::terminate`` and the process
aborts ("terminate called without an active exception", SIGABRT) after it has done its work and
reported its result (CPython gh-87135; Python 3.14 parks such threads instead). A command's exit
status must be its own, so a command ends here: it joins Python's non-daemon threads and runs
the ``atexit`` handlers exactly as the interpreter would (logging flushed, temporary folders
removed, multiprocessing children joined), collects garbage (a reader dropped now is dropped
while every library is alive), flushes stdout and stderr, and leaves with ``os._exit`` so that
no teardown runs at all.

Library use (``ember.train`` in a script or notebook) is unchanged: only the command line ends
this way.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from typing import NoReturn

__all__ = ["end_process"]


def end_process(code: int | None) -> NoReturn:
    """End the process with exit status ``code`` (None: 0) after Python's own clean-up, without
    the interpreter's teardown (see the module docstring)."""
    status = 0 if code is None else int(code)
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first at exit
    if shutdown is None:  # an interpreter without it: its own exit, as before
        sys.exit(status)
    try:
        shutdown()  # joins non-daemon threads (after concurrent.futures has stopped its pools)
        atexit._run_exitfuncs()
        gc.collect()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or a reader that went away: nothing to flush to
                pass
        os._exit(status)
