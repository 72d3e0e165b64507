"""How an ``ember`` command ends its process (``ember.process_exit``): Python's own clean-up runs
(non-daemon threads joined, ``atexit`` handlers, buffered output written), the status is the
command's, and no interpreter teardown follows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from ember.process_exit import end_process

out = sys.argv[1]
pool = ThreadPoolExecutor(1)                       # joined only after concurrent.futures stops it
pool.submit(lambda: None).result()
def late():
    time.sleep(0.3)
    open(out + ".thread", "w").write("done")
threading.Thread(target=late).start()             # non-daemon: the exit waits for it
atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
class Teardown:                                    # a teardown-time finalizer: must never run
    def __del__(self):
        open(out + ".teardown", "w").write("ran")
keep = Teardown()
if sys.argv[3] == "closed":                        # the reader of stdout went away
    import os
    r, w = os.pipe()
    os.close(r)
    sys.stdout = os.fdopen(w, "w")
sys.stdout.write("buffered, no newline")          # still in the buffer when the exit starts
end_process(int(sys.argv[2]))
"""


def _run(tmp_path: Path, code: int, stdout: str = "open") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "x"), str(code), stdout], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_the_status_is_the_commands_and_python_cleans_up_first(tmp_path):
    for code in (0, 2, 141):
        done = _run(tmp_path, code)
        assert done.returncode == code, done.stderr
        assert done.stdout == "buffered, no newline"
        assert (tmp_path / "x.thread").read_text() == "done"
        assert (tmp_path / "x.atexit").read_text() == "ran"
        assert not (tmp_path / "x.teardown").exists()  # no interpreter teardown ran
        (tmp_path / "x.thread").unlink()
        (tmp_path / "x.atexit").unlink()


def test_a_closed_stdout_does_not_change_the_status(tmp_path):
    done = _run(tmp_path, 3, "closed")  # the flush meets a broken pipe
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "x.atexit").read_text() == "ran"


def test_the_ember_command_ends_through_it():
    done = subprocess.run([sys.executable, "-m", "ember", "--version"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip()
    entry = (ROOT / "pyproject.toml").read_text()
    assert 'ember = "ember.cli:run"' in entry


def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on():
    script = ("import os, signal\nfrom ember.cli import _stacks_on_sigusr1\n_stacks_on_sigusr1()\n"
              "os.kill(os.getpid(), signal.SIGUSR1)\nprint('went on')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "went on\n"
    assert "most recent call first" in done.stderr and "<string>" in done.stderr


def test_sigterm_ends_a_command_as_ctrl_c_does_and_leaves_no_temporary_file(tmp_path):
    """``ember generate`` stopped by SIGTERM mid-write: exit 143, said so, and the atomic write's
    hidden temporary removed (it was left behind, gigabytes of it)."""
    import os
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "ember", "generate", "--out", str(tmp_path / "gen.csv"),
                             "--rows", "50000000"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob(".gen.csv.tmp-*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert list(tmp_path.glob(".gen.csv.tmp-*")), "the temporary file never appeared"
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "ember generate: interrupted (SIGTERM)" in err
    assert list(tmp_path.iterdir()) == []
