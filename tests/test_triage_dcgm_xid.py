"""Triage of GpuXidCritical on dcgm-exporter's last-XID gauge, evaluated by a real Prometheus over backfilled
data. dcgm-exporter labels `DCGM_FI_DEV_XID_ERRORS` with the code itself (`err_code`, `err_msg`), so a new
XID is a new series: the evidence must see the change per GPU across series, as the rule does
(rules/gpu.py `xid_events`), not per series (where the value never changes)."""

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

SPEC = load_spec(REPO_ROOT / "inferwatch.yaml")
SPAN_S = 40 * 60
CHANGE_AGO_S = 20 * 60  # the new XID appears 20 minutes before the data's end

# node -> (the gauge's code before the change, after it; None: no series), critical events expected after it
ROWS = {
    "node-0-to-48": ((0, 48), 1),          # the kind: a memory XID on a healthy GPU
    "node-13-to-48": ((13, 48), 1),        # a non-critical XID, then a critical one
    "node-0-to-13": ((0, 13), 0),          # a change to a code not on the critical list
    "node-held-48": ((48, 48), 0),         # an old XID held since before the window: no new event
    "node-0-to-79": ((0, 79), 0),          # XID 79 is GpuLost's, not this alert's
}


def series(end: float):
    out, start, change = [], end - SPAN_S, end - CHANGE_AGO_S
    for node, ((before, after), _) in ROWS.items():
        base = {"job": "inferwatch-gpu", "instance": f"{node}:9400", "node": node, "gpu": "0",
                "UUID": f"GPU-{node}", "Hostname": node, "modelName": "NVIDIA A100"}
        if before == after:
            out.append(gauge("DCGM_FI_DEV_XID_ERRORS", {**base, "err_code": str(before)}, before, start, end))
            continue
        out.append(gauge("DCGM_FI_DEV_XID_ERRORS", {**base, "err_code": str(before)}, before, start, change - 15))
        out.append(gauge("DCGM_FI_DEV_XID_ERRORS", {**base, "err_code": str(after)}, after, change, end))
    return out


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("dcgm-xid-prom")
    end = time.time() - 60
    server = serve_series(series(end), work)
    yield SimpleNamespace(url=server.url, end=end)
    server.stop()


def _critical_xids(prometheus, node: str, at: float) -> float | None:
    runbook = load_runbooks()["GpuXidCritical"]
    labels = {"alertname": "GpuXidCritical", "node": node, "gpu": "0", "UUID": f"GPU-{node}"}
    result = triage_alert("GpuXidCritical", labels, runbook, PrometheusSource(prometheus.url, at=at), "",
                          spec=SPEC)
    values = {e.result.name: e.result.value for e in result.evidence}
    return values["critical_xids_recent"]


@pytest.mark.parametrize("node", list(ROWS))
def test_a_new_xid_on_dcgm_exporter_s_gauge_is_the_evidence(prometheus, node):
    change = prometheus.end - CHANGE_AGO_S
    # A minute after the change (inside the rules' rate window): a critical code counts, others do not.
    assert _critical_xids(prometheus, node, change + 60) == ROWS[node][1]
    # Before the change, and once the window has passed it: no event, and 0 (known), not "no data".
    assert _critical_xids(prometheus, node, change - 120) == 0
    assert _critical_xids(prometheus, node, prometheus.end) == 0
