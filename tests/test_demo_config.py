"""The demo's configuration (fast): the committed demo spec with only ports and secrets filled in, the files
generated from it, and the delivery-time bounds the scenario test uses."""

from __future__ import annotations

import pytest
import yaml

from inferwatch.demo.config import DEMO_SPEC, SIM_GPU_NODE, prepare
from inferwatch.demo.scenario import MARGIN_S, Bounds
from inferwatch.spec import load_spec
from inferwatch.testing.channels import ProviderSimulators


def test_the_demo_spec_loads_and_shortens_time_in_the_spec_itself():
    spec = load_spec(DEMO_SPEC)
    assert str(spec.prometheus.scrape_interval) == "2s" and str(spec.prometheus.rate_window) == "20s"
    assert {str(spec.layers.L1.for_), str(spec.layers.L2.for_), str(spec.layers.L3.for_)} == {"10s"}
    assert [c.type for c in spec.channels.values()] == ["pagerduty", "slack", "wecom"]


def test_prepare_fills_in_ports_and_secret_files_and_nothing_else(tmp_path):
    sims = ProviderSimulators(port=45678)  # not started: only its URLs are needed
    config = prepare(tmp_path, sims, real_gpu=True)
    p = config.ports
    written = yaml.safe_load(config.spec_path.read_text())
    original = yaml.safe_load(DEMO_SPEC.read_text())
    for key in ("prometheus", "layers", "tiers", "tenants", "channels", "routes"):
        assert written[key] == original[key], key
    assert written["notifier"]["grouping"] == original["notifier"]["grouping"]
    assert len(set(vars(p).values())) == len(vars(p)), "every service gets its own port"

    prom = yaml.safe_load(config.prometheus_config.read_text())
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in prom["scrape_configs"]}
    assert targets["triton"] == [f"127.0.0.1:{p.triton_metrics}"]
    assert targets["inferwatch-gpu"] == [f"127.0.0.1:{p.gpu}", f"127.0.0.1:{p.gpu_sim}"]
    assert targets["inferwatch-gateway"] == [f"127.0.0.1:{p.gateway_metrics}"]
    assert targets["inferwatch-notifier"] == [f"127.0.0.1:{p.notifier}"]
    assert prom["global"]["scrape_interval"] == "2s"
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [f"127.0.0.1:{p.alertmanager}"]
    gpu_nodes = [sc["labels"]["node"] for job in prom["scrape_configs"] if job["job_name"] == "inferwatch-gpu"
                 for sc in job["static_configs"]]
    assert gpu_nodes == ["demo-node", SIM_GPU_NODE]

    rules = "".join(f.read_text() for f in (tmp_path / "rules" / "generated").glob("*.yml"))
    assert "[20s]" in rules and "[5m]" not in rules and "for: 10s" in rules

    am = yaml.safe_load(config.alertmanager_config.read_text())
    hooks = [w for r in am["receivers"] for w in r.get("webhook_configs", [])]
    assert {w["url"] for w in hooks} == {f"http://127.0.0.1:{p.notifier}/alerts"}
    token_file = hooks[0]["http_config"]["authorization"]["credentials_file"]
    assert open(token_file).read().strip() == config.env["INFERWATCH_DEMO_NOTIFIER_TOKEN"]
    l1 = next(r for r in am["route"]["routes"] if r["matchers"] == ['layer="L1"'])
    assert (l1["group_wait"], l1["group_interval"]) == ("2s", "10s")
    assert config.env["INFERWATCH_DEMO_SLACK_URL"] == sims.slack_url
    assert sims.slack_url not in config.spec_path.read_text(), "secrets stay out of the written spec"


def test_bounds_add_up_the_spec_delays():
    spec = load_spec(DEMO_SPEC)
    b = Bounds.from_spec(spec)
    # L2: 20s window + 10s for + 2x(2s scrape + 2s eval) + 4s group_wait + 4s enrichment + margin
    assert b.fire["L2"] == 20 + 10 + 8 + 4 + 4 + MARGIN_S
    # L1: 6s ramp instead of a window, 2s group_wait
    assert b.fire["L1"] == 6 + 10 + 8 + 2 + 4 + MARGIN_S
    assert b.resolve["L3"] == 20 + 8 + 10 + MARGIN_S


# ------------------------------------------------------------------------------ what the demo prints (fast)
def _reporter(width: int = 100):
    import io

    from rich.console import Console

    from inferwatch.demo.report import Reporter

    out = io.StringIO()
    return Reporter(Console(file=out, width=width, highlight=False)), out


def test_triage_and_titles_are_wrapped_whole_words_not_cut():
    from inferwatch.demo.observe import Delivery
    from inferwatch.demo.scenario import Event

    reporter, out = _reporter(100)
    reporter.t0 = 0.0
    triage = ("likely cause: slow-after-scheduling (L2): Triton schedules requests at once (queue 1 ms, 0 pending) "
              "yet the first token takes 1.97 s at P95: the time goes after scheduling - model prefill or the path "
              "between gateway and Triton.")
    d = Delivery(12.0, "wecom", "llm-owners-wecom", "firing", ("LlmTtftP95High",),
                 "[FIRING:1] LlmTtftP95High toy_llm acme realtime warning", "https://runbooks/LlmTtftP95High.md",
                 triage)
    reporter.event(Event(12.0, "delivered", d.title, delivery=d, after_s=18.1))
    text = out.getvalue()
    assert " ".join(text.split()).endswith(" ".join(("triage: " + triage).split()))  # every word, in order
    assert all(len(line) <= 100 for line in text.splitlines())
    words = set(triage.split())
    for line in text.splitlines():
        if "triage:" in line or line.startswith(" " * 27):
            assert all(w in words or w == "triage:" for w in line.split()), line  # no word broken in two


def test_summary_names_each_tenants_message_and_resolution():
    from inferwatch.demo.faults import Fault
    from inferwatch.demo.observe import Delivery
    from inferwatch.demo.scenario import Bounds, FaultOutcome, ScenarioResult

    reporter, out = _reporter(160)

    def msg(at, status, group):
        return Delivery(at, "wecom", "llm-owners-wecom", status, ("LlmTtftP95High",),
                        f"[{status.upper()}:1] LlmTtftP95High {group}", group=group)

    acme, globex = "toy_llm acme realtime warning", "toy_llm globex realtime warning"
    o = FaultOutcome(Fault("ttft", "slow first tokens", "L3", "LlmTtftP95High", ""), ["llm-owners-wecom"],
                     injected_at=100.0, removed_at=200.0, fired_at=114.0)
    o.groups = {acme: msg(118.1, "firing", acme), globex: msg(121.1, "firing", globex)}
    o.delivered = o.groups[acme]
    o.group_resolutions = {acme: msg(225.4, "resolved", acme)}  # globex's resolution has not come
    o.resolved = o.group_resolutions[acme]
    result = ScenarioResult(0.0, 100.0, 200.0, 240.0, [], [o], [], Bounds({}, {}), 0)
    reporter.summary(result)
    text = out.getvalue()
    assert "acme 18.1 s" in text and "globex 21.1 s" in text
    assert "acme 25.4 s" in text and "globex —" in text


@pytest.mark.parametrize(("titles", "lines"), [
    # only the page fired: warning is not claimed
    (["LlmTtftBurnRate realtime critical"], ["with LlmTtftBurnRate (critical) → oncall-pagerduty (PagerDuty)"]),
    (["LlmTtftBurnRate realtime warning"], ["with LlmTtftBurnRate (warning) → llm-owners-wecom (WeCom robot)"]),
    # both: each severity with the channel it went to, in the alert's order of severities
    (["LlmTtftBurnRate realtime warning", "LlmTtftBurnRate realtime critical"],
     ["with LlmTtftBurnRate (critical) → oncall-pagerduty (PagerDuty)",
      "with LlmTtftBurnRate (warning) → llm-owners-wecom (WeCom robot)"]),
    # a title without a severity: no severity claimed
    (["LlmTtftBurnRate realtime"], ["with LlmTtftBurnRate → llm-owners-wecom (WeCom robot)"]),
])
def test_summary_names_each_severity_a_companion_was_sent_with(titles, lines):
    from inferwatch.demo.faults import Fault
    from inferwatch.demo.observe import Delivery, group_of
    from inferwatch.demo.scenario import Bounds, FaultOutcome, ScenarioResult

    reporter, out = _reporter(160)
    group = "toy_llm acme realtime warning"
    o = FaultOutcome(Fault("ttft", "slow first tokens", "L3", "LlmTtftP95High", ""), ["llm-owners-wecom"],
                     injected_at=100.0, fired_at=114.0)
    o.delivered = Delivery(118.0, "wecom", "llm-owners-wecom", "firing", ("LlmTtftP95High",),
                           f"[FIRING:1] LlmTtftP95High {group}", group=group)
    for i, rest in enumerate(titles):
        title = f"[FIRING:1] {rest}"
        provider, channel = (("pagerduty", "oncall-pagerduty") if rest.endswith("critical")
                             else ("wecom", "llm-owners-wecom"))
        o.note_companion("LlmTtftBurnRate", Delivery(130.0 + i, provider, channel, "firing", ("LlmTtftBurnRate",),
                                                     title, group=group_of(title)))
    reporter.summary(ScenarioResult(0.0, 100.0, None, 240.0, [], [o], [], Bounds({}, {}), 0))
    text = out.getvalue()
    assert [line.strip() for line in text.splitlines() if "with LlmTtftBurnRate" in line] == lines


def test_events_are_reported_in_time_order():
    from inferwatch.demo.scenario import Event, ScenarioRunner

    seen = []
    runner = ScenarioRunner.__new__(ScenarioRunner)  # only the event buffer is exercised
    runner.events, runner._pending, runner.on_event = [], [], seen.append
    for at, kind in ((88.0, "firing"), (87.4, "delivered"), (90.0, "phase"), (86.0, "cleared")):
        runner._emit(Event(at, kind, kind))
    runner._flush(89.0)
    assert [e.at for e in seen] == [86.0, 87.4, 88.0]
    runner._emit(Event(89.5, "resolved", "late"))
    runner._flush()
    assert [e.at for e in seen] == [86.0, 87.4, 88.0, 89.5, 90.0] and runner.events == seen


def test_demo_routes_send_an_l1_warning_to_chat_not_the_phone():
    from inferwatch.demo.scenario import expected_channels
    from inferwatch.notifier.routing import Router

    router = Router(load_spec(DEMO_SPEC))
    assert expected_channels(router, "GpuThrottling") == ["oncall-slack"]
    assert expected_channels(router, "GpuTemperatureCritical") == ["phone"]
    assert expected_channels(router, "TritonModelErrorRatioHigh") == ["oncall-slack"]
    assert expected_channels(router, "LlmTtftP95High") == ["llm-owners-wecom"]
