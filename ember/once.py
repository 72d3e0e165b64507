"""What a process says only once: a fast path not taken, a slower build in use, an old config
name, an eval set with one class... ``first(topic, key)`` is the one record of what was said
(thread-safe), so every "logged once per reason" in ember works the same way; ``forget(topic)``
lets a test hear a topic's messages again.

Example:
    >>> first("example", "a reason"), first("example", "a reason"), first("example", "another")
    (True, False, True)
    >>> forget("example"); first("example", "a reason")
    True
"""

from __future__ import annotations

import threading
from typing import Hashable

__all__ = ["first", "forget"]

_said: set[tuple[str, Hashable]] = set()
_lock = threading.Lock()


def first(topic: str, key: Hashable = None) -> bool:
    """True the first time (``topic``, ``key``) is asked about in this process, False after."""
    with _lock:
        if (topic, key) in _said:
            return False
        _said.add((topic, key))
        return True


def forget(topic: str) -> None:
    """Forget what was said under ``topic`` (its messages are said again)."""
    with _lock:
        _said.difference_update([k for k in _said if k[0] == topic])
