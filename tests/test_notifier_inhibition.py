"""Inhibition never crosses its scope.

Alertmanager treats a label missing on both alerts as equal, so an inhibit rule keyed on a label either
alert may lack matches the whole fleet. Checked three ways: every `equal` label is required on both sides
of every generated rule; the rule files guarantee those labels on every alert branch that can match a side
(read from their PromQL, tests/rule_labels.py); and the real Alertmanager, fed a table of alert pairs
through the generated configuration, suppresses exactly the alerts in scope and delivers the rest."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO_ROOT
from inferwatch.deploy.alertmanager import PATH, inhibit_rules, outputs
from inferwatch.notifier import amtree
from inferwatch.rules.identity import MIG
from inferwatch.spec import load_spec, spec_from_dict
from notifier_support import notifier_behind_alertmanager, wait_for
from rule_labels import alert_rules

SPEC = REPO_ROOT / "inferwatch.yaml"
# Compared but not required: a part within the object the required labels name (a GPU's MIG instance),
# absent on both alerts of a GPU without MIG.
REFINEMENTS = set(MIG)


def _spec(external_labels: dict | None = None):
    spec = load_spec(SPEC)
    if external_labels:
        spec.prometheus.external_labels = dict(external_labels)
    return spec


@pytest.mark.parametrize("external", [None, {"cluster": "prod-a", "region": "eu"}])
def test_every_equal_label_is_required_on_both_sides(external):
    rules = inhibit_rules(_spec(external))
    assert rules
    for rule in rules:
        for side in ("source_matchers", "target_matchers"):
            matchers = [amtree.parse_matcher(m) for m in rule[side]]
            for label in set(rule["equal"]) - REFINEMENTS:
                assert any(m.name == label and not m.matches({}) for m in matchers), (rule, side, label)
        # Prometheus attaches external labels to every alert it sends: no rule reaches across clusters.
        assert set(external or {}) <= set(rule["equal"]), rule


def _can_match(matchers, alert, branch, external) -> bool:
    """Whether an alert branch can match `matchers`: labels the rule fixes are decided here; a matcher that
    rejects the empty value needs a label the branch may carry."""
    static = {"alertname": alert.alert, **alert.labels}
    for m in matchers:
        if m.name in static:
            if not m.matches(static):
                return False
        elif not m.matches({}) and m.name not in branch.possible | set(external):
            return False
    return True


def scope_violations(rules: list[dict], spec, external=()) -> tuple[list[str], list[str]]:
    """(alert branches that can match a side without carrying every equal label, sides nothing matches)."""
    alerts = alert_rules(spec)
    crossing, dead = [], []
    for i, rule in enumerate(rules):
        for side in ("source_matchers", "target_matchers"):
            matchers = [amtree.parse_matcher(m) for m in rule[side]]
            hits = 0
            for alert in alerts:
                for n, branch in enumerate(alert.branches):
                    if not _can_match(matchers, alert, branch, external):
                        continue
                    hits += 1
                    missing = set(rule["equal"]) - REFINEMENTS - branch.guaranteed - set(external)
                    if missing:
                        crossing.append(f"inhibit_rules[{i}].{side}: {alert.alert} (branch {n}) "
                                        f"may lack {sorted(missing)}")
            if not hits:
                dead.append(f"inhibit_rules[{i}].{side}: no alert of the rule files can match")
    return crossing, dead


@pytest.mark.parametrize("external", [None, {"cluster": "prod-a"}])
def test_equal_labels_are_guaranteed_by_the_rules_that_produce_the_alerts(external):
    spec = _spec(external)
    crossing, dead = scope_violations(inhibit_rules(spec), spec, tuple(external or ()))
    assert crossing == []
    assert dead == []


def test_the_check_catches_an_inhibition_that_crosses_its_scope():
    # The rule this project shipped before: TritonServerDown from absent(up{job="triton"}) has no node, nor
    # do the LLM alerts, so `equal: [node]` held between them and every L3 alert was silenced.
    old = [{"source_matchers": ['alertname=~"GpuLost|TritonServerDown"'],
            "target_matchers": ['layer=~"L2|L3"', 'alertname!~"GpuLost|TritonServerDown"'], "equal": ["node"]}]
    crossing, _ = scope_violations(old, _spec())
    assert any(c.startswith("inhibit_rules[0].source_matchers: TritonServerDown") for c in crossing), crossing
    assert any("target_matchers: LlmTtftP95High" in c for c in crossing), crossing


def alert(name: str, layer: str, severity: str, **labels) -> dict:
    return {"labels": {"alertname": name, "layer": layer, "severity": severity, **labels},
            "annotations": {"summary": f"{name} summary.", "description": f"{name} {labels}",
                            "runbook_url": f"https://runbooks.example/{name}.md"},
            "generatorURL": "http://prometheus.example/graph"}


# (alerts fired together, {index of an alert: suppressed?}): each row on its own node/tier names.
TABLE = [
    # The reported fault: a TritonServerDown without node (absent(), or a job relabelled without it) must not
    # silence an LLM alert, which has no node either.
    ([alert("TritonServerDown", "L2", "critical"),
      alert("LlmTtftP95High", "L3", "warning", tenant="acme", tier="realtime", model="toy_llm")], {1: False}),
    ([alert("TritonServerDown", "L2", "critical", node="n2", triton="t2"),
      alert("TritonQueueTimeP95High", "L2", "warning", node="n2", triton="t2", model="m", version="1")], {1: True}),
    ([alert("TritonServerDown", "L2", "critical", node="n3", triton="t3"),
      alert("TritonModelErrorRatioHigh", "L2", "critical", node="n3", triton="t3b", model="m")], {1: False}),
    ([alert("TritonServerDown", "L2", "critical", triton="t4"),
      alert("TritonModelNotReady", "L2", "critical", triton="t4", model="m")], {1: False}),
    ([alert("GpuLost", "L1", "critical", node="n5", gpu="0"),
      alert("TritonModelErrorRatioHigh", "L2", "critical", node="n5", triton="t5", model="m")], {1: True}),
    ([alert("GpuLost", "L1", "critical", gpu="0", UUID="GPU-6"),
      alert("TritonPendingRequestsHigh", "L2", "warning", triton="t6", model="m")], {1: False}),
    # A lost NVML library is one page for the node; its GPUs' GpuLost are held back, other nodes' are not.
    ([alert("GpuNvmlLost", "L1", "critical", node="n7", instance="n7:9400"),
      alert("GpuLost", "L1", "critical", node="n7", gpu="0"), alert("GpuLost", "L1", "critical", node="n7", gpu="1"),
      alert("GpuLost", "L1", "critical", node="n8", gpu="0")], {1: True, 2: True, 3: False}),
    ([alert("GpuMemoryUsageCritical", "L1", "critical", node="n9", gpu="0"),
      alert("GpuMemoryUsageHigh", "L1", "warning", node="n9", gpu="0"),
      alert("GpuMemoryUsageHigh", "L1", "warning", node="n9", gpu="1")], {1: True, 2: False}),
    ([alert("GpuMemoryUsageCritical", "L1", "critical", gpu="5"),
      alert("GpuMemoryUsageHigh", "L1", "warning", gpu="5")], {1: False}),
    # MIG: one full instance does not hide another instance's warning (its own workload) on the same GPU.
    ([alert("GpuMemoryUsageCritical", "L1", "critical", node="n21", gpu="0", GPU_I_ID="1", GPU_I_PROFILE="3g.40gb"),
      alert("GpuMemoryUsageHigh", "L1", "warning", node="n21", gpu="0", GPU_I_ID="1", GPU_I_PROFILE="3g.40gb"),
      alert("GpuMemoryUsageHigh", "L1", "warning", node="n21", gpu="0", GPU_I_ID="2", GPU_I_PROFILE="3g.40gb")],
     {1: True, 2: False}),
    ([alert("LlmAvailabilityBurnRate", "L3", "critical", tier="rt10", slo="availability", window="fast-1h"),
      alert("LlmAvailabilityBurnRate", "L3", "warning", tier="rt10", slo="availability", window="fast-1d"),
      alert("LlmAvailabilityBurnRate", "L3", "warning", tier="bt10", slo="availability", window="fast-1d"),
      alert("LlmTtftBurnRate", "L3", "warning", tier="rt10", slo="ttft", window="fast-1d")],
     {1: True, 2: False, 3: False}),
    ([alert("TritonServerDown", "L2", "critical", node="n12", triton="t12"),
      alert("LlmTtftP95High", "L3", "warning", node="n12", tenant="globex", tier="realtime", model="toy_llm")],
     {1: False}),
    ([alert("GpuLost", "L1", "critical", node="n13", gpu="0"),
      alert("GatewayExporterDown", "L3", "warning", node="n13", job="inferwatch-gateway")], {1: False}),
    # A streaming model's gateway errors are explained by its Triton being down, not by another Triton being
    # down. A Triton that is live but not ready (a model failed to load, or models are loading) still serves
    # its loaded models: their users' errors are news, so TritonServerNotReady inhibits nothing.
    ([alert("TritonServerDown", "L2", "critical", node="n14", triton="t14"),
      alert("TritonDecoupledModelErrorRatioHigh", "L2", "critical", node="n14", triton="t14", model="m",
            source="gateway"),
      alert("TritonDecoupledModelErrorRatioHigh", "L2", "critical", node="n14", triton="t14b", model="m",
            source="gateway")], {1: True, 2: False}),
    ([alert("TritonServerNotReady", "L2", "critical", node="n15", triton="t15"),
      alert("TritonDecoupledModelErrorRatioHigh", "L2", "critical", node="n15", triton="t15", model="m",
            source="gateway")], {1: False}),
    # A model that failed to load makes its Triton not ready (strict readiness): the model alert, which names
    # the model and Triton's reason, holds back the server's; never another Triton's, never without node.
    ([alert("TritonModelNotReady", "L2", "critical", node="n16", triton="t16", model="m", version="1"),
      alert("TritonServerNotReady", "L2", "critical", node="n16", triton="t16"),
      alert("TritonServerNotReady", "L2", "critical", node="n16", triton="t16b")], {0: False, 1: True, 2: False}),
    ([alert("TritonModelNotReady", "L2", "critical", triton="t17", model="m", version="1"),
      alert("TritonServerNotReady", "L2", "critical", triton="t17")], {1: False}),
    # LLM engines, one object per engine: on Triton's port a model version on one replica (held back by its
    # Triton being down); a vLLM server of its own (no node, no triton, no version) by instance and engine core.
    ([alert("EngineKvCacheFull", "L2", "critical", node="n18", triton="t18", instance="t18:8002", model="m",
            version="1", backend="tensorrt_llm"),
      alert("EngineKvCacheFull", "L2", "warning", node="n18", triton="t18", instance="t18:8002", model="m",
            version="1", backend="tensorrt_llm"),
      alert("EngineKvCacheFull", "L2", "warning", node="n18", triton="t18", instance="t18:8002", model="m",
            version="2", backend="tensorrt_llm")], {1: True, 2: False}),
    ([alert("EngineKvCacheFull", "L2", "critical", instance="gpu-19:8000", model="llama", engine="0",
            backend="vllm"),
      alert("EngineKvCacheFull", "L2", "warning", instance="gpu-19:8000", model="llama", engine="0",
            backend="vllm"),
      alert("EngineKvCacheFull", "L2", "warning", instance="gpu-19:8000", model="llama", engine="1",
            backend="vllm"),
      alert("EngineKvCacheFull", "L2", "warning", instance="gpu-19b:8000", model="llama", engine="0",
            backend="vllm")], {1: True, 2: False, 3: False}),
    ([alert("TritonServerDown", "L2", "critical", node="n20", triton="t20"),
      alert("EngineWaitingRequestsGrowing", "L2", "warning", node="n20", triton="t20", instance="t20:8002",
            model="m", version="1", backend="vllm"),
      alert("EngineWaitingRequestsGrowing", "L2", "warning", instance="n20:8000", model="m", engine="0",
            backend="vllm")], {1: True, 2: False}),
]


def _states(am) -> dict[tuple, str]:
    return {tuple(sorted(a["labels"].items())): a["status"]["state"] for a in am.alerts()}


def _key(a: dict) -> tuple:
    return tuple(sorted(a["labels"].items()))


def test_real_alertmanager_inhibits_only_within_scope(alertmanager_factory, tmp_path):
    grouping = {layer: ["alertname", "tenant", "node"] for layer in ("L1", "L2", "L3")}
    with notifier_behind_alertmanager(tmp_path, grouping) as (sims, svc, data):
        config = tmp_path / "alertmanager.yml"
        config.write_text(outputs(spec_from_dict(data))[PATH])
        assert yaml.safe_load(config.read_text())["inhibit_rules"] == inhibit_rules(spec_from_dict(data))
        am = alertmanager_factory(config)
        am.post_alerts([a for alerts, _ in TABLE for a in alerts])
        expected = {_key(alerts[i]): "suppressed" if suppressed else "active"
                    for alerts, checks in TABLE for i, suppressed in checks.items()}
        wait_for(lambda: all(_states(am).get(k) == v for k, v in expected.items()), timeout=30,
                 what="Alertmanager's inhibition states")
        # The reported input: the LLM alert is delivered to WeCom, not silenced by the node-less Triton alert.
        wait_for(lambda: any("LlmTtftP95High" in t and "acme" in t for t in sims.wecom.texts()), timeout=30,
                 what="LlmTtftP95High (tenant acme) on WeCom")
        assert _states(am)[_key(TABLE[0][0][1])] == "active"


@pytest.mark.parametrize("naming", ["external_labels", "cluster.name"])
def test_real_alertmanager_keeps_inhibition_inside_a_cluster(alertmanager_factory, tmp_path, naming):
    """The cluster is named either way in the spec; a root cause in cluster a (a down Triton, a lost GPU)
    silences its symptoms in cluster a only, never the same node's or server's alerts in cluster b."""
    if naming == "cluster.name":
        spec = spec_from_dict({**yaml.safe_load(SPEC.read_text()), "cluster": {"name": "a"}})
    else:
        spec = _spec({"cluster": "prod-a"})
    config = tmp_path / "alertmanager.yml"
    config.write_text(outputs(spec)[PATH])
    am = alertmanager_factory(config)
    down = alert("TritonServerDown", "L2", "critical", cluster="a", node="n1", triton="t1")
    same = alert("TritonQueueTimeP95High", "L2", "warning", cluster="a", node="n1", triton="t1", model="m")
    other = alert("TritonQueueTimeP95High", "L2", "warning", cluster="b", node="n1", triton="t1", model="m")
    lost = alert("GpuLost", "L1", "critical", cluster="a", node="n2", gpu="0", UUID="GPU-1")
    same_node = alert("TritonModelNotReady", "L2", "critical", cluster="a", node="n2", triton="t2", model="m",
                      version="1")
    other_node = alert("TritonModelNotReady", "L2", "critical", cluster="b", node="n2", triton="t2", model="m",
                       version="1")
    am.post_alerts([down, same, other, lost, same_node, other_node])
    expected = {_key(same): "suppressed", _key(other): "active", _key(same_node): "suppressed",
                _key(other_node): "active", _key(down): "active", _key(lost): "active"}
    wait_for(lambda: all(_states(am).get(k) == v for k, v in expected.items()),
             timeout=30, what="inhibition inside cluster a only")
