"""A group larger than the notifier takes in one body is never refused: the generated webhook config sends at
most `max_alerts` (deploy/webhook_size.py), so the body of the largest alerts the generated scrape limits let
through fits `notifier.max_body_bytes`, and the message counts the rest as "N more not included". Through the
real Alertmanager, for label values at the limit made of what Go's JSON encoder writes longest (`<` as
\\u003c), control characters, multi-byte UTF-8 and plain ASCII, and for the reported case: a storm group of
hundreds of ordinary alerts."""

from __future__ import annotations

import pytest

from conftest import _start
from inferwatch.deploy.alertmanager import PATH, outputs
from inferwatch.deploy.webhook_size import LABEL_LIMIT, VALUE_LIMIT, max_alerts
from inferwatch.spec import spec_from_dict
from inferwatch.testing.alertmanager import start_alertmanager
from notifier_support import metric, notifier_behind_alertmanager, wait_for

BODY_LIMIT = 2 * 1024 * 1024


def _alerts(name: str, count: int, value: str, labels: int) -> list[dict]:
    filler = {f"f{i:02d}": value for i in range(labels)}
    return [{"labels": {"alertname": name, "layer": "L1", "severity": "critical", "idx": str(i), **filler},
             "annotations": {"summary": "Worst case.", "description": value * 3,
                             "runbook_url": "https://r.example/x.md"},
             "generatorURL": "http://prometheus.example:9090/graph?g0.expr=" + "%3C" * 2000 + "&g0.tab=1"}
            for i in range(count)]


# (alertname, label value, labels per alert, alerts beyond max_alerts); whole, the escaped groups are over the limit
ROWS = [
    ("SizeHtmlEscaped", "<" * VALUE_LIMIT, LABEL_LIMIT - 1, 6),       # 6 bytes a byte in the body
    ("SizeControl", "\x01" * VALUE_LIMIT, LABEL_LIMIT - 1, 6),         # \u0001
    ("SizeMultiByte", "界" * (VALUE_LIMIT // 3), LABEL_LIMIT - 1, 6),  # 3 bytes a character, not escaped
    ("SizeAscii", "a" * VALUE_LIMIT, LABEL_LIMIT - 1, 6),
    ("SizeStormGroup", "node-a", 4, 300),                              # the report: hundreds of small alerts
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(simulators, notifier, max_alerts, Alertmanager): one notifier behind one real Alertmanager for every
    row, instead of one of each per row. Groups are by alertname and each row has its own, so each row's page
    is its own; the too_large count must stay 0 across all rows."""
    tmp = tmp_path_factory.mktemp("webhook-size")
    with notifier_behind_alertmanager(tmp, {"L1": ["alertname"]}, max_body_bytes=BODY_LIMIT) as (sims, svc, data):
        spec = spec_from_dict(data)
        config = tmp / "alertmanager.yml"
        config.write_text(outputs(spec)[PATH])
        am = _start(start_alertmanager, tmp_path_factory.mktemp("alertmanager"), config)
        try:
            yield sims, svc, max_alerts(spec), am
        finally:
            am.stop()


@pytest.mark.parametrize("name, value, labels, extra", ROWS, ids=[r[0] for r in ROWS])
def test_a_group_of_any_size_reaches_the_channel_counted(stack, name, value, labels, extra):
    sims, svc, limit, am = stack
    am.post_alerts(_alerts(name, limit + extra, value, labels))
    event = wait_for(lambda: next((r.body for r in sims.pagerduty.received if name in r.text), None),
                     timeout=60, what=f"the {name} page")
    details = event["payload"]["custom_details"]
    print(f"\n{name}: max_alerts {limit} at max_body_bytes {BODY_LIMIT}; {limit + extra} alerts -> "
          f"{details['num_firing']} in the body, {details['truncated_alerts']} counted as not included")
    assert (details["num_firing"], details["truncated_alerts"]) == (limit, extra)
    assert f"{extra} more not included" in event["payload"]["summary"]
    assert metric(svc.url, 'inferwatch_notifier_webhooks_total{outcome="too_large"}') == 0
