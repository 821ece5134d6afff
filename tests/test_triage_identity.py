"""Triage's runbook evidence with the spec's identity labels (inferwatch/triage/identity.py): every query of
the Triton runbooks, scoped to an alert labelled as the user's ServiceMonitor labels Triton (`service`, `pod`,
`node`), selects Triton's own and recorded series by `service` and the collector's by its own `triton`, each
with the alert's values; with the default identity every query is exactly as written. Table: one row per
identity, the defaults one row."""

from __future__ import annotations

import re

import pytest

from inferwatch.spec import spec_from_dict
from inferwatch.triage.evidence import default_runbook_dir, load_runbook
from inferwatch.triage.identity import with_identity
from inferwatch.triage.scope import scoped

ALERTS = ["TritonServerDown", "TritonModelErrorRatioHigh", "TritonQueueTimeP95High", "TritonModelNotReady"]
# (row id, spec identity, alert labels, server label on Triton's series)
ROWS = [
    ("defaults", None, {"triton": "triton-metrics", "pod": "triton-0", "node": "gpu-a"}, "triton"),
    ("operator", {"triton": {"server": "service", "replica": "pod", "node": "node"}},
     {"service": "triton-metrics", "pod": "triton-0", "node": "gpu-a"}, "service"),
]
SELECTOR = re.compile(r"\{([^{}]*(?:\{\{[^{}]*\}\}[^{}]*)*)\}")


@pytest.mark.parametrize("identity, alert_labels, server", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
@pytest.mark.parametrize("alert", ALERTS)
def test_runbook_queries_select_by_the_spec_identity(alert, identity, alert_labels, server):
    spec = spec_from_dict({"identity": identity} if identity else {})
    labels = {"alertname": alert, "layer": "L2", "severity": "critical", "model": "simple", "version": "1",
              **alert_labels}
    book = load_runbook(default_runbook_dir() / f"{alert}.md")
    scoped_server = 0
    for query in book.queries.values():
        expr, aliased = with_identity(query.expr, labels, spec)
        if identity is None:
            assert expr == query.expr  # the defaults: every query as the runbook writes it
        for block in SELECTOR.findall(expr):
            if "$triton_collector_selector" in block:
                assert f'{server}=~"' not in block or server == "triton", block
            elif "$triton_selector" in block or ":nv_inference" in query.expr:
                assert 'triton=~"{{' not in block or server == "triton", (query.name, block)
        text = scoped(expr, aliased, {"triton_selector": 'job="t"', "triton_collector_selector": 'job="c"',
                                      "gpu_selector": 'job="g"', "gateway_selector": 'job="gw"',
                                      "engine_selector": 'job="e"'} | {p: "1" for p in query.params})
        scoped_server += f'{server}=~"triton-metrics"' in text
        # The alert's values reach the collector's own `triton` too (aliased from `service`).
        if "$triton_collector_selector" in query.expr and 'triton=~"{{ $labels.triton }}"' in query.expr:
            assert 'triton=~"triton-metrics"' in text, text
    if any("$triton_selector" in q.expr for q in book.queries.values()):
        assert scoped_server, f"no query of {alert} selects the alert's server by {server}"
