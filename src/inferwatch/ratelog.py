"""One log line per condition, not one per occurrence: a flood of refused requests, idle sockets or failing
writes must not bury the log (or fill the disk) with identical lines.

`ConditionLog.log(key, level, msg, *args)` writes the first occurrence of `key` at once; repeats within
`interval_s` are only counted, and the next line for that key (after the interval) says how many there
were. Keys are bounded (`max_keys`): past it, new keys share one overflow key, so hostile input cannot
grow the table.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

OVERFLOW_KEY = "(other)"


class ConditionLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, *, max_keys: int = 256,
                 clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.interval_s = interval_s
        self.max_keys = max_keys
        self.clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def log(self, key: str, level: int, msg: str, *args, **kwargs) -> bool:
        """Log now, or count the occurrence for the next line of `key`. Returns True when a line was written."""
        now = self.clock()
        with self._lock:
            if key not in self._last and len(self._last) >= self.max_keys:
                key = OVERFLOW_KEY
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
        if held:
            msg += f" (and {held} more like it in the last {self.interval_s:.0f}s)"
        self.logger.log(level, msg, *args, **kwargs)
        return True

    def clear(self, key: str) -> None:
        """The condition ended: its next occurrence is logged at once."""
        with self._lock:
            self._last.pop(key, None)
            self._held.pop(key, None)
