"""End to end: the `inferwatch demo` scenario on the real stack (Triton, gateway, collector, GPU exporter on the
simulated NVML, Prometheus with the generated rules, Alertmanager, notifier, provider simulators).

It runs the demo's own code (inferwatch.demo.Demo) once and checks what the simulated PagerDuty, Slack and
WeCom accepted: nothing during the clean stretch; each fault's alert at its layer's channel within the time
the demo spec's intervals, windows, `for`s and Alertmanager waits allow; nothing on a wrong channel;
resolution messages after the faults are removed; every process stopped afterwards.

The run removes the faults once every alert they raised (pending or firing in Prometheus, each in its group)
reached a channel (`until_settled`), instead of holding them until the time left only suffices for the
resolutions as `inferwatch demo` does for a viewer: the same messages, about 80 s sooner. DURATION_S stays the
upper bound: a slow alert still has the whole hold.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from inferwatch.demo import Demo
from inferwatch.demo.report import Reporter
from inferwatch.notifier.routing import Router

pytestmark = pytest.mark.slow

DURATION_S = 240.0
# The demo spec's routes: layer -> (channel name, provider the channel's type speaks).
EXPECTED = {"L1": ("phone", "pagerduty"), "L2": ("oncall-slack", "slack"), "L3": ("llm-owners-wecom", "wecom")}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = io.StringIO()
    reporter = Reporter(Console(file=out, width=160, highlight=False))
    run = Demo(tmp_path_factory.mktemp("demo"), DURATION_S, nvml="sim", reporter=reporter, until_settled=True)
    result = run.run()
    return run, result, out.getvalue()


def test_the_scenario_has_one_fault_per_layer(demo):
    _, result, _ = demo
    assert [(o.fault.layer, o.fault.alert) for o in result.outcomes] == [
        ("L1", "GpuTemperatureCritical"), ("L2", "TritonModelErrorRatioHigh"), ("L3", "LlmTtftP95High")]
    for o in result.outcomes:
        assert o.expected_channels == [EXPECTED[o.fault.layer][0]], o.fault.title


def test_the_clean_stretch_sends_nothing(demo):
    _, result, _ = demo
    assert result.first_fault_at - result.traffic_started_at >= 20, "too short a clean stretch to mean anything"
    assert result.clean_deliveries() == []
    assert result.attempts_before_faults == 0, "a provider was called (even if it refused) before any fault"


def test_each_fault_reaches_its_channel_within_the_expected_time(demo):
    run, result, _ = demo
    base = run.config.spec.runbook_base_url.rstrip("/")
    for o in result.outcomes:
        layer = o.fault.layer
        d = o.delivered
        assert o.fired_at is not None, f"{o.fault.alert} never fired in Prometheus"
        assert d is not None, f"{o.fault.alert} never reached a channel"
        assert (d.channel, d.provider) == EXPECTED[layer]
        assert d.status == "firing" and o.fault.alert in d.alerts
        assert o.injected_at < o.fired_at <= d.at
        assert d.at - o.injected_at <= result.bounds.fire[layer], (
            f"{o.fault.alert}: {d.at - o.injected_at:.1f}s from fault to {d.channel}, bound "
            f"{result.bounds.fire[layer]:.0f}s from the demo spec")
        assert d.runbook == f"{base}/{o.fault.alert}.md"


def test_no_alert_reaches_a_wrong_channel(demo):
    run, result, _ = demo
    assert result.deliveries, "nothing was delivered at all"
    assert all(d.alerts for d in result.deliveries), [d.title for d in result.deliveries if not d.alerts]
    assert result.misrouted(Router(run.config.spec)) == []
    for d in result.deliveries:
        assert d.layers and run.config.spec.channels[d.channel].type == d.provider, (d.provider, d.alerts)
    sims = run.stack.sims
    assert sims.voice.received == []
    assert all(p.rejected == [] for p in sims.providers), {p.name: p.rejected for p in sims.providers}


def test_resolution_messages_follow_when_the_faults_are_removed(demo):
    _, result, _ = demo
    for o in result.outcomes:
        r = o.resolved
        assert r is not None, f"no resolution message for {o.fault.alert}"
        assert r.channel == o.delivered.channel and r.status == "resolved"
        assert r.at > o.removed_at
        assert r.at - o.removed_at <= result.bounds.resolve[o.fault.layer], (
            f"{o.fault.alert}: resolution {r.at - o.removed_at:.1f}s after the fix")
    # Every alert that fired on a channel was resolved on the same channel, after it fired.
    for d in result.deliveries:
        if d.status != "firing":
            continue
        for name in d.alerts:
            assert any(r.status == "resolved" and name in r.alerts and r.channel == d.channel and r.at > d.at
                       for r in result.deliveries), f"{name} fired on {d.channel} and was never resolved"


def test_every_process_is_stopped_and_the_user_saw_the_timeline(demo):
    run, result, text = demo
    names = {s.name for s in run.stack.started}
    assert names == {"triton", "gateway", "triton-collector", "gpu-exporter", "notifier", "alertmanager",
                     "prometheus"}
    assert not [s.name for s in run.stack.started if s.running()]
    assert "GPU layer: SIMULATED" in text
    for word in ("FAULT", "FIRING", "SENT", "RESOLVED", "fault → alert → channel", "clean stretch: 0 message(s)"):
        assert word in text, word
    for o in result.outcomes:
        assert o.fault.alert in text


def test_an_l1_warning_goes_to_chat_not_the_phone(demo):
    """The overheat also raises GpuThrottling (severity warning): the demo spec sends it to Slack."""
    _, result, text = demo
    gpu = result.outcomes[0]
    throttling = gpu.companions.get("GpuThrottling")
    assert throttling is not None, f"GpuThrottling was not delivered: {sorted(gpu.companions)}"
    assert (throttling.channel, throttling.provider) == ("oncall-slack", "slack")
    assert not [d for d in result.deliveries if "GpuThrottling" in d.alerts and d.provider == "pagerduty"]
    assert "with GpuThrottling (warning) → oncall-slack (Slack)" in text


def test_each_tenant_of_the_l3_fault_gets_its_message_and_its_resolution(demo):
    _, result, text = demo
    ttft = result.outcomes[2]
    tenants = {g: d for g, d in ttft.groups.items()}
    assert len(tenants) >= 2, list(tenants)  # acme and globex send realtime traffic
    for group in tenants:
        assert group in ttft.group_resolutions, f"no resolution for {group}"
        assert ttft.group_resolutions[group].at > ttft.removed_at
    assert "acme" in text and "globex" in text
    firing = [e.at for e in result.events]
    assert firing == sorted(firing), "the timeline is printed in time order"
