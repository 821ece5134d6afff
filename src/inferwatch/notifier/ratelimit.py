"""Per-destination rate limiter: at most `limit` sends in any `window` seconds, evenly spaced.

A sliding log (not a token bucket): a bucket with burst B lets B + limit messages through in the first
window, which is exactly what gets a WeCom robot throttled (20/min, errcode 45009). Spacing sends by
window/limit also keeps a storm from spending the whole minute's quota in its first second, so later
messages (coalescing everything pending) still go out within seconds.
"""

from __future__ import annotations

import collections
import threading


class RateLimiter:
    def __init__(self, limit: int, window_s: float):
        if limit < 1 or window_s <= 0:
            raise ValueError(f"rate limit needs limit >= 1 and window > 0, got {limit}/{window_s}s")
        self.limit = limit
        self.window_s = window_s
        self.spacing_s = window_s / limit
        self._sent: collections.deque[float] = collections.deque()
        self._blocked_until = 0.0
        self._lock = threading.Lock()

    def wait_time(self, now: float) -> float:
        """Seconds until a send is allowed (0 = now)."""
        with self._lock:
            while self._sent and self._sent[0] <= now - self.window_s:
                self._sent.popleft()
            waits = [self._blocked_until - now]
            if self._sent:
                waits.append(self._sent[-1] + self.spacing_s - now)
                if len(self._sent) >= self.limit:
                    waits.append(self._sent[0] + self.window_s - now)
            return max(0.0, *waits)

    def record(self, now: float) -> None:
        """A request was sent at `now` (count every attempt: the provider counts them too)."""
        with self._lock:
            self._sent.append(now)

    def block(self, now: float, seconds: float) -> None:
        """The provider said slow down (429, WeCom 45009): send nothing for `seconds`."""
        with self._lock:
            self._blocked_until = max(self._blocked_until, now + seconds)
