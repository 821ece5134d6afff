"""Triage judges a source stale by the age of its newest scrape against that source's own scrape interval
(observed from the spacing of its stored `up` samples, else the spec's), not a fixed number. A real Prometheus
serving backfilled `up` series: one node per row, scraped every 15, 30 or 60 s, its newest scrape some seconds
before the evaluation time."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from conftest import REPO_ROOT
from inferwatch.spec import load_spec
from inferwatch.testing.backfill import Series, serve_series
from inferwatch.triage.freshness import check_sources, scrape_interval
from inferwatch.triage.sources import PrometheusSource

SPEC = load_spec(REPO_ROOT / "inferwatch.yaml")   # prometheus.scrape_interval 15 s
AGO_S = 60          # the data's evaluation time lies this long before the module's Prometheus starts
SPAN_S = 30 * 60

# id -> (scrape interval s, age of the newest scrape at the evaluation time s, samples stored (None: whole
# span), stale?, the interval judged against, where it came from, words of the reason)
ROWS = {
    "15s-age-10s": (15, 10, None, False, 15, "samples", []),
    "15s-age-29s": (15, 29, None, False, 15, "samples", []),
    "15s-age-31s": (15, 31, None, True, 15, "samples",
                    ["newest scrape is 31 s old",
                     "2 scrape intervals (30 s; one every 15 s, observed from its samples)"]),
    # A fixed limit of two spec intervals (30 s) would call these two stale; their own interval says not.
    "30s-age-45s": (30, 45, None, False, 30, "samples", []),
    "30s-age-59s": (30, 59, None, False, 30, "samples", []),
    "30s-age-90s": (30, 90, None, True, 30, "samples", ["newest scrape is 90 s old", "(60 s; one every 30 s"]),
    "60s-age-100s": (60, 100, None, False, 60, "samples", []),
    "60s-age-150s": (60, 150, None, True, 60, "samples", ["newest scrape is 150 s old", "(120 s; one every 60 s"]),
    # Past Prometheus's 5-minute lookback: no instant `up`, stale by age too.
    "60s-age-400s": (60, 400, None, True, 60, "samples", ["400 s old", "(120 s;", "holds its series stale"]),
    # Two samples only: no spacing to trust, the spec's 15 s decides (45 s > 30 s).
    "two-samples-60s-apart-age-45s": (60, 45, 2, True, 15, "spec",
                                      ["45 s old", "(30 s; one every 15 s, the spec's prometheus.scrape_interval)"]),
}


def _up(node: str, interval: float, age: float, count: int | None, end: float) -> Series:
    last = end - age
    n = count if count is not None else int(SPAN_S // interval)
    times = [last - i * interval for i in reversed(range(n))]
    return Series("up", {"job": "inferwatch-gpu", "instance": f"{node}:9400", "node": node},
                  [(t, 1.0) for t in times])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("freshness-interval-prom")
    end = time.time() - AGO_S
    series = [_up(row, interval, age, count, end) for row, (interval, age, count, *_rest) in ROWS.items()]
    server = serve_series(series, work)
    yield SimpleNamespace(url=server.url, end=end)
    server.stop()


@pytest.mark.parametrize("row", list(ROWS))
def test_a_source_is_stale_by_its_own_scrape_interval(prometheus, row):
    interval, age, _count, stale, judged, origin, words = ROWS[row]
    source = PrometheusSource(prometheus.url, at=prometheus.end)
    state = check_sources(source, ["gpu"], {"node": row}, {}, SPEC)["gpu"]
    assert state.age_s == pytest.approx(age, abs=0.01), state
    assert (state.stale, state.interval_s, state.interval_from) == (stale, judged, origin), state
    assert state.up == (None if age > 300 else 1.0), state
    for word in words:
        assert word in state.reason, state.reason
    lead = f"GPU exporter (inferwatch's or dcgm-exporter) on node {row} stopped reporting: "
    assert state.reason.startswith(lead) if stale else state.reason == ""


@pytest.mark.parametrize("times, expected", [
    ([0, 15, 30, 45], (15, "samples")),
    ([0, 30, 60, 120, 150], (30, "samples")),       # one missed scrape does not double the interval
    ([0, 60], (15, "spec")),                          # one spacing: too few
    ([], (15, "spec")),
])
def test_the_interval_is_the_median_spacing_of_the_newest_series(times, expected):
    older = ({"instance": "old"}, [(t - 1000.0, 1.0) for t in (0, 5, 10, 15, 20)])
    newest = ({"instance": "new"}, [(float(t), 1.0) for t in times])
    assert scrape_interval([older, newest] if times else [], 15.0) == expected
