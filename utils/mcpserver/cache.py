"""Results kept per job and arguments, so that a repeated call costs a dictionary look-up.

The key is the tool, its arguments and each job's fingerprint: its path, its log's size and
mtime, and the mtimes of its TSDB directory and WAL. A job that is still running writes to its log
and TSDB, so its fingerprint changes and the next call runs the tool again.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from diagnosis import jobdir, locate

MAX_ENTRIES = 128


def fingerprint(job: locate.Job) -> tuple:
    """What changes when a job's log or TSDB changes (jobdir.fingerprint, answer.sh's key too)."""
    return jobdir.fingerprint(job.path, job.dir, job.log)


@dataclasses.dataclass
class Hit:
    value: Any
    cached: bool
    seconds: float  # the tool's own run time (0 for a cached result's look-up)
    runs: int  # how many times this server has run this tool (cached calls do not count)


class Cache:
    """A bounded, thread-safe map (tool, key) -> result, oldest first out, with a run counter per tool."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._data: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._busy: dict[tuple, threading.Lock] = {}
        self.max_entries = max_entries
        self.runs: collections.Counter[str] = collections.Counter()

    def get(self, tool: str, key: tuple, compute: Callable[[], Any]) -> Hit:
        """The cached result for (tool, key), else compute() (once, however many callers wait)."""
        k = (tool, key)
        with self._lock:
            busy = self._busy.setdefault(k, threading.Lock())
        with busy:
            with self._lock:
                if k in self._data:
                    self._data.move_to_end(k)
                    return Hit(self._data[k], True, 0.0, self.runs[tool])
            t = time.monotonic()
            try:
                value = compute()  # an exception is not cached
            finally:
                with self._lock:
                    self._busy.pop(k, None)
            seconds = time.monotonic() - t
            with self._lock:
                self.runs[tool] += 1
                self._data[k] = value
                while len(self._data) > self.max_entries:
                    self._data.popitem(last=False)
                return Hit(value, False, seconds, self.runs[tool])
