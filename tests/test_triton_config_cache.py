"""Which model configurations the collector fetches: only on a version or state change (plus a spread-out
refresh for age), never every configuration every poll."""

from __future__ import annotations

from inferwatch.exporters.triton.configcache import ConfigCache, index_keys
from inferwatch.exporters.triton.snapshot import ModelConfigFigures, ModelVersionState

FIG = ModelConfigFigures(0, False, None, None, {})


def _keys(*entries: tuple[str, str, str]):
    return index_keys([ModelVersionState(*e) for e in entries])


def _fetch(cache: ConfigCache, keys, now: float) -> list[str]:
    due = cache.due(keys, now)
    for name in due:
        cache.store(name, keys[name], FIG, now)
    return due


def test_fetch_once_then_only_on_change():
    cache = ConfigCache(max_age=600, interval=10)
    keys = _keys(("a", "1", "READY"), ("b", "1", "READY"))
    assert _fetch(cache, keys, 0) == ["a", "b"]
    assert _fetch(cache, keys, 10) == []  # nothing changed: no request
    # a new version of b appears (LOADING, then READY): b is fetched at each change, a never
    keys = _keys(("a", "1", "READY"), ("b", "1", "READY"), ("b", "2", "LOADING"))
    assert _fetch(cache, keys, 20) == ["b"]
    keys = _keys(("a", "1", "READY"), ("b", "1", "READY"), ("b", "2", "READY"))
    assert _fetch(cache, keys, 30) == ["b"]
    assert _fetch(cache, keys, 40) == []
    # a model that leaves the index is forgotten; when it comes back it is fetched again
    assert _fetch(cache, _keys(("b", "1", "READY"), ("b", "2", "READY")), 50) == []
    assert _fetch(cache, keys, 60) == ["a"]


def test_failed_fetch_is_retried_next_poll():
    cache = ConfigCache(max_age=600, interval=10)
    keys = _keys(("a", "1", "READY"))
    assert cache.due(keys, 0) == ["a"]
    cache.drop("a")  # the call failed
    assert cache.figures(["a"]) == {}
    assert cache.due(keys, 10) == ["a"]


def test_refresh_for_age_is_spread_over_polls():
    cache = ConfigCache(max_age=600, interval=10)
    keys = _keys(*((f"m{i:03d}", "1", "READY") for i in range(500)))
    assert len(_fetch(cache, keys, 0)) == 500
    per_poll = [len(_fetch(cache, keys, t)) for t in range(10, 1210, 10)]
    assert per_poll[:59] == [0] * 59  # younger than max_age
    assert max(per_poll) == 9  # ceil(500 * 10 / 600): never all 500 at once
    assert sum(per_poll[59:]) >= 500  # every configuration refreshed within the second max_age


def test_max_age_zero_fetches_every_poll():
    cache = ConfigCache(max_age=0, interval=10)
    keys = _keys(("a", "1", "READY"), ("b", "1", "READY"))
    assert _fetch(cache, keys, 0) == ["a", "b"]
    assert _fetch(cache, keys, 10) == ["a", "b"]
