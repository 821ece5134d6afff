"""Which model configurations to fetch this poll: only those whose versions or states changed.

A configuration changes when Triton loads the model (a new version, a reload, a restart), and every load
shows in the repository index as a change of the model's (version, state) pairs. Fetching every READY
model's configuration on every poll instead cost one request per model per interval: 500 models polled every
10 s were about 50 requests/s to Triton for figures that almost never change.

So a configuration is fetched when the model is new to the cache, when its (version, state) pairs differ
from those seen at the last fetch, when the last fetch failed, and, as a safety net for a reload that
changes the configuration without any state change visible between two polls, when it is older than
`max_age`. Refreshes for age are spread: each poll refreshes at most `len(cache) * interval / max_age`
(rounded up) of the oldest entries, so 500 models with a 10 minute max age and a 10 s interval refresh about
9 per poll instead of 500 at once every 10 minutes. `max_age` 0 fetches every configuration every poll.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from inferwatch.exporters.triton.snapshot import ModelConfigFigures, ModelVersionState

DEFAULT_MAX_AGE_SECONDS = 600.0


@dataclasses.dataclass
class _Entry:
    key: tuple[tuple[str, str], ...]
    figures: ModelConfigFigures
    fetched_at: float


def index_keys(models: Iterable[ModelVersionState]) -> dict[str, tuple[tuple[str, str], ...]]:
    """model name → its sorted (version, state) pairs as the index lists them."""
    pairs: dict[str, set[tuple[str, str]]] = {}
    for mv in models:
        pairs.setdefault(mv.name, set()).add((mv.version, mv.state))
    return {name: tuple(sorted(p)) for name, p in pairs.items()}


class ConfigCache:
    """Last-fetched configuration per model of one Triton. Not thread-safe (one reader, one loop).

    `max_age`: seconds after which a configuration is refreshed even without a change (0: every poll);
    `interval`: the poll interval in seconds, to spread those refreshes.
    """

    def __init__(self, max_age: float = DEFAULT_MAX_AGE_SECONDS, interval: float = 10.0):
        self.max_age = max_age
        self.interval = interval
        self._entries: dict[str, _Entry] = {}

    def due(self, keys: dict[str, tuple[tuple[str, str], ...]], now: float) -> list[str]:
        """The models (among `keys`, the READY ones) whose configuration must be fetched now, sorted.

        Models no longer listed are forgotten.
        """
        for name in set(self._entries) - set(keys):
            del self._entries[name]
        if self.max_age <= 0:
            return sorted(keys)
        changed = [n for n, k in keys.items() if n not in self._entries or self._entries[n].key != k]
        stale = sorted((e.fetched_at, n) for n, e in self._entries.items()
                       if n in keys and n not in changed and now - e.fetched_at >= self.max_age)
        budget = math.ceil(len(self._entries) * self.interval / self.max_age) if stale else 0
        return sorted(changed + [n for _, n in stale[:budget]])

    def store(self, name: str, key: tuple[tuple[str, str], ...], figures: ModelConfigFigures, now: float) -> None:
        self._entries[name] = _Entry(key, figures, now)

    def drop(self, name: str) -> None:
        """Forget a model whose fetch failed: its figures are no longer known, and it is fetched next poll."""
        self._entries.pop(name, None)

    def figures(self, names: Iterable[str]) -> dict[str, ModelConfigFigures]:
        return {n: self._entries[n].figures for n in names if n in self._entries}

    def clear(self) -> None:
        self._entries.clear()
