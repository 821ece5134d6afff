"""Triage checks each source's freshness first and never names a cause from a source that stopped reporting.
A real Prometheus serving backfilled data: one node per row, the same hot, busy GPU on each, and the GPU
exporter's `up` as each row has it."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from conftest import REPO_ROOT
from inferwatch.spec import load_spec
from inferwatch.testing.backfill import gauge, serve_series
from inferwatch.triage.engine import triage_alert
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.sources import PrometheusSource

SPEC = load_spec(REPO_ROOT / "inferwatch.yaml")   # scrape interval 15 s: stale after 30 s without a scrape
# The data ends a minute before the module's Prometheus starts (not before the module is imported: the notifier
# hook reads "now", which in a long session is far past an import-time end).
AGO_S = 60
SPAN_S = 30 * 60

# node -> (up: "to the end" | "0 for the last 3 min" | "ends 5 min ago" | None, GPU data ends this long ago)
ROWS = {
    "node-fresh": ("up", 0),
    "node-exporter-down": ("down", 180),       # the example: the exporter died 3 minutes ago
    "node-scrapes-stopped": ("ends", 300),     # the target left service discovery: no scrape, no `up`
    "node-no-up": (None, 0),                   # no `up` series at all (a store without it): freshness unknown
}


def series(end: float):
    out, start = [], end - SPAN_S
    for node, (up, stop_ago) in ROWS.items():
        labels = {"job": "inferwatch-gpu", "instance": f"{node}:9400", "node": node, "gpu": "0",
                  "UUID": f"GPU-{node}", "Hostname": node}
        data_end = end - stop_ago
        out += [gauge("DCGM_FI_DEV_GPU_TEMP", labels, 90, start, data_end),
                gauge("DCGM_FI_DEV_GPU_UTIL", labels, 87, start, data_end),
                gauge("DCGM_FI_DEV_POWER_USAGE", labels, 513, start, data_end)]
        scrape = {"job": "inferwatch-gpu", "instance": f"{node}:9400", "node": node}
        if up == "up":
            out.append(gauge("up", scrape, 1, start, end))
        elif up == "down":
            out.append(gauge("up", scrape, lambda t, cut=data_end: 1 if t <= cut else 0, start, end))
        elif up == "ends":
            out.append(gauge("up", scrape, 1, start, data_end))
    return out


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("freshness-prom")
    end = time.time() - AGO_S
    server = serve_series(series(end), work)
    yield SimpleNamespace(url=server.url, end=end)
    server.stop()


def triage(prometheus, node):
    runbook = load_runbooks()["GpuTemperatureCritical"]
    labels = {"alertname": "GpuTemperatureCritical", "node": node, "gpu": "0", "UUID": f"GPU-{node}"}
    source = PrometheusSource(prometheus.url, at=prometheus.end + 1)
    return triage_alert("GpuTemperatureCritical", labels, runbook, source, "", spec=SPEC)


# node, stale?, words of the stale reason
CASES = [
    ("node-fresh", False, []),
    ("node-exporter-down", True, ["GPU exporter", "on node node-exporter-down", "is down: up = 0"]),
    ("node-scrapes-stopped", True, ["stopped reporting", "newest scrape is 301 s old",
                                    "2 scrape intervals (30 s; one every 15 s, observed", "holds its series stale"]),
    ("node-no-up", False, []),
]


@pytest.mark.parametrize("node, stale, words", CASES, ids=[c[0] for c in CASES])
def test_no_cause_from_a_stale_source(prometheus, node, stale, words):
    r = triage(prometheus, node)
    assert [s.source for s in r.stale_sources] == (["gpu"] if stale else [])
    if not stale:
        # The same data, fresh: the cause is named (so the stale rows' silence is the freshness check's doing).
        assert r.top is not None and r.top.cause == "sustained-load", r.to_dict()
        assert r.condition.holds is True
        return
    reason = r.stale_sources[0].reason
    for word in words:
        assert word in reason, reason
    # Not one finding from the last values it sent; the condition is not checked; every GPU query says why.
    assert r.findings == [] and r.condition.holds is None, r.to_dict()
    assert all(e.skipped == reason for e in r.evidence), [e.skipped for e in r.evidence]
    assert r.to_dict()["stale_sources"][0]["reason"] == reason
    assert "not run: " + reason in r.why_missing("temperature_celsius")


def test_the_notifier_hook_says_which_source_is_stale(prometheus):
    from inferwatch.triage.hook import top_finding_for

    labels = {"alertname": "GpuTemperatureCritical", "node": "node-exporter-down", "gpu": "0",
              "UUID": "GPU-node-exporter-down"}
    text = top_finding_for(labels, prometheus.url, load_runbooks(), spec=SPEC)
    assert text is not None and text.startswith("no cause named: GPU exporter"), text
    assert "is down: up = 0" in text and "likely cause" not in text
