"""The effective routing table (`deploy/routetable.py`): every alert × severity × window of the generated
rules → channels, escalation and the inhibitions that can silence it, for the shipped spec and for a spec
without routes (the notifier's defaults); and `inferwatch notifier routes test --all` prints it."""

from __future__ import annotations

import pytest

from conftest import REPO_ROOT
from inferwatch.cli import main
from inferwatch.deploy.routetable import effective_table
from inferwatch.rules.names import ALERTS
from inferwatch.spec import load_spec, spec_from_dict

SHIPPED = load_spec(REPO_ROOT / "inferwatch.yaml")


def rows_of(spec):
    return {(r.alert, r.severity, r.window): r for r in effective_table(spec)}


# (alert, severity, window) -> (channels, escalate_to, escalate_after_s, inhibited by (names))
SHIPPED_ROWS = [
    (("GpuTemperatureCritical", "critical", ""), ("phone",), (), None, ()),
    (("GpuThrottling", "warning", ""), ("oncall-slack",), (), None, ()),
    (("GpuMemoryUsageHigh", "warning", ""), ("oncall-slack",), (), None, ("GpuMemoryUsageCritical",)),
    (("TritonServerDown", "critical", ""), ("oncall-slack",), ("phone",), 1800.0, ()),
    (("TritonModelNotReady", "critical", ""), ("oncall-slack",), ("phone",), 1800.0,
     ("GpuNvmlLost", "GpuLost", "TritonServerDown")),
    (("TritonQueueTimeP95High", "warning", ""), ("oncall-slack",), (), None,
     ("GpuNvmlLost", "GpuLost", "TritonServerDown")),
    # the example: the critical fast window pages (and the owners see it), not only the chat group
    (("LlmTtftBurnRate", "critical", "fast-1h"), ("phone", "llm-owners-wecom"), (), None, ()),
    (("LlmAvailabilityBurnRate", "critical", "slow-6h"), ("phone", "llm-owners-wecom"), (), None, ()),
    (("LlmTtftBurnRate", "warning", "slow-3d"), ("llm-owners-wecom",), (), None, ("LlmTtftBurnRate",)),
    (("LlmTtftP95High", "warning", ""), ("llm-owners-wecom",), (), None, ()),
    (("NotifierDown", "critical", ""), ("notifier-fallback",), (), None, ()),
]


@pytest.mark.parametrize("key, channels, escalate_to, after, inhibitors", SHIPPED_ROWS,
                         ids=["-".join(filter(None, r[0])) for r in SHIPPED_ROWS])
def test_shipped_spec_rows(key, channels, escalate_to, after, inhibitors):
    row = rows_of(SHIPPED)[key]
    assert row.channels == channels
    assert row.escalate_to == escalate_to and row.escalate_after_s == after
    assert tuple(text.split(" (")[0] for text in row.inhibited_by) == inhibitors
    assert row.external is (key[0] == "NotifierDown")


def test_every_alert_and_severity_of_the_registry_has_a_row():
    keys = {(r.alert, r.severity) for r in effective_table(SHIPPED)}
    assert keys == {(name, s) for name, info in ALERTS.items() for s in info.severities if name in
                    {k[0] for k in keys}}
    # every registry alert the shipped spec generates (the HA alerts need `ha`)
    assert {name for name, _ in keys} >= {n for n in ALERTS if not n.startswith(("Alertmanager", "Prometheus"))
                                          and n != "NotifierOutboxGrowing"}


@pytest.mark.parametrize("channels, expected", [
    # a spec without routes: the notifier's defaults send L3 critical to the phone channel and the owners
    ({"pd": {"type": "pagerduty", "routing_key": "k"}, "s": {"type": "slack", "url": "u"},
      "w": {"type": "wecom", "url": "u"}}, ("pd", "w")),
    ({"v": {"type": "voice", "url": "u"}, "w": {"type": "wecom", "url": "u"}}, ("v", "w")),
    # nobody to wake: the owners' group still gets it
    ({"w": {"type": "wecom", "url": "u"}}, ("w",)),
])
def test_default_routes_page_the_critical_l3_alerts(channels, expected):
    rows = rows_of(spec_from_dict({"channels": channels}))
    assert rows[("LlmTtftBurnRate", "critical", "fast-1h")].channels == expected
    assert rows[("LlmTtftBurnRate", "warning", "fast-1d")].channels == (expected[-1],)


def test_routes_test_all_prints_the_table(capsys):
    assert main(["notifier", "routes", "test", "--all", "--spec", str(REPO_ROOT / "inferwatch.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["alert", "severity", "window", "channels"]
    line = next(x for x in out if x.startswith("LlmTtftBurnRate") and " fast-1h " in x)
    assert "phone, llm-owners-wecom" in line


def test_routes_test_without_labels_or_all_is_a_usage_error(capsys):
    assert main(["notifier", "routes", "test", "--spec", str(REPO_ROOT / "inferwatch.yaml")]) == 2
    assert "layer=L2 severity=critical), or --all" in capsys.readouterr().err
