"""Identity labels from the spec (`identity`): rules, inhibitions and dashboards key on the user's labels.

A Triton scraped by the user's own ServiceMonitor carries the Prometheus Operator's target labels
(`namespace`, `service`, `endpoint`, `pod`, `container`) and a node label from its relabelling; dcgm-exporter
under the GPU Operator writes `Hostname`, `gpu`, `UUID`, `namespace`, `pod`. Each row of IDENTITIES renders
every rule with one identity (the defaults one row) and shows, in promtool (Prometheus' rule engine):

- two Triton pods behind one Service that both stop answering are two TritonServerDown alerts, one per pod;
- a model failing on both pods is two TritonModelErrorRatioHigh alerts, one per pod, never one summed alert;
  a healthy third pod gives none;
- pods the collector polls through a headless Service (its series labelled `address`, no pod name) are named
  with the user's labels from Triton's own scrape: a hung pod is one TritonServerDown, a pod not ready one
  TritonServerNotReady;

with a real Alertmanager fed the generated configuration, that TritonServerDown holds back the model alerts of
its own server and node, named with the user's labels, and never another server's; and that the Triton
dashboard's variables, joins and legends use the spec's names."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.dashboards.generate import outputs as dashboard_outputs
from inferwatch.deploy.alertmanager import PATH, inhibit_rules
from inferwatch.deploy.alertmanager import outputs as alertmanager_outputs
from inferwatch.rules.generate import RULES_DIR
from inferwatch.rules.generate import outputs as rule_outputs
from inferwatch.rules.names import ALERTS
from inferwatch.spec import SpecError, spec_from_dict
from notifier_support import notifier_behind_alertmanager, wait_for
from selector_support import OPERATOR, REPO
from test_rules import promtool

RUNBOOKS = "https://github.com/inferwatch/inferwatch/blob/main/runbooks/"
SERVICE = "triton-metrics"  # OPERATOR's Triton Service: the value of the server label in every row

# (row id, spec `identity`, spec `selectors`, the labels one Triton pod's series carry but its identity).
IDENTITIES = [
    ("defaults", None, None, {"job": "triton", "instance": "{pod}:8002"}),
    # The user's ServiceMonitor; the node from a relabelling to `node`; dcgm-exporter's `Hostname`.
    ("operator", {"triton": {"server": "service", "replica": "pod", "node": "node"}, "gpu": {"node": "Hostname"}},
     OPERATOR, {"job": SERVICE, "namespace": "triton", "endpoint": "metrics", "container": "triton",
                "instance": "{pod}:8002"}),
    # The same, with the node relabelled to another name on Triton's and the GPU's series alike.
    ("operator-hostname", {"triton": {"server": "service", "replica": "pod", "node": "hostname"},
                           "gpu": {"node": "hostname"}},
     OPERATOR, {"job": SERVICE, "namespace": "triton", "endpoint": "metrics", "container": "triton",
                "instance": "{pod}:8002"}),
]
IDS = [row[0] for row in IDENTITIES]


def _spec(identity: dict | None, selectors: dict | None):
    data = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    if selectors:
        data["selectors"] = dict(selectors)
    if identity:
        data["identity"] = identity
    return spec_from_dict(data)


def _names(identity: dict | None) -> tuple[str, str, str]:
    """(server, replica, node) label names of a row."""
    t = (identity or {}).get("triton", {})
    return t.get("server", "triton"), t.get("replica", "pod"), t.get("node", "node")


def _pod_labels(row, pod: str, node: str) -> dict[str, str]:
    _, identity, _, extra = row
    server, replica, node_label = _names(identity)
    labels = {k: v.format(pod=pod) for k, v in extra.items()}
    labels.update({server: SERVICE, replica: pod, node_label: node})
    return labels


def _series(name: str, labels: dict) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _run_promtool(root: Path, name: str, tests: list[dict]) -> None:
    files = ("gpu", "triton", "llm", "notifier")
    groups = [g["name"] for f in files for g in yaml.safe_load((root / f"{f}.yml").read_text())["groups"]]
    order = [g for g in groups if g.endswith(".rules")] + [g for g in groups if not g.endswith(".rules")]
    path = root / f"{name}.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [f"{f}.yml" for f in files], "evaluation_interval": "1m",
                                    "group_eval_order": order, "tests": tests}, sort_keys=False, width=10**6))
    out = subprocess.run([promtool(), "test", "rules", path.name], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "SUCCESS" in out.stdout


def _expected(alert: str, labels: dict, description: str) -> dict:
    return {"exp_labels": labels, "exp_annotations": {"summary": ALERTS[alert].summary, "description": description,
                                                      "runbook_url": f"{RUNBOOKS}{alert}.md"}}


@pytest.fixture(scope="module", params=IDENTITIES, ids=IDS)
def row(request, tmp_path_factory):
    """(row, spec, directory of the rule files generated with the row's identity)."""
    spec = _spec(request.param[1], request.param[2])
    root = tmp_path_factory.mktemp(f"identity-{request.param[0]}")
    for rel, text in rule_outputs(spec).items():
        if rel.startswith(RULES_DIR):
            (root / Path(rel).name).write_text(text)
    return request.param, spec, root


def test_two_pods_behind_one_service_are_two_server_down_alerts(row):
    params, spec, root = row
    server, replica, node = _names(params[1])
    pods = {"triton-0": "gpu-a", "triton-1": "gpu-b"}
    inputs = [{"series": _series("up", _pod_labels(params, pod, host)), "values": "1 1 1 0x30"}
              for pod, host in pods.items()]
    alerts = [_expected("TritonServerDown", {"layer": "L2", "severity": "critical", server: SERVICE, replica: pod,
                                             node: host},
                        f"Triton {SERVICE} pod {pod} on node {host} does not answer (metrics endpoint down or liveness "
                        f"failing): every model it serves is unavailable.")
              for pod, host in pods.items()]
    _run_promtool(root, "server-down", [{
        "interval": "1m", "input_series": inputs,
        "alert_rule_test": [{"eval_time": "1m", "alertname": "TritonServerDown", "exp_alerts": []},
                            {"eval_time": "20m", "alertname": "TritonServerDown", "exp_alerts": alerts}]}])


def test_a_model_failing_on_two_pods_is_two_alerts_never_summed(row):
    params, spec, root = row
    server, replica, node = _names(params[1])
    # Per minute: pods 0 and 1 serve 60 and fail 60 (BACKEND: a server error), pod 2 serves 60 and fails none.
    pods = {"triton-0": ("gpu-a", 60), "triton-1": ("gpu-b", 60), "triton-2": ("gpu-c", 0)}
    inputs = []
    for pod, (host, failed) in pods.items():
        labels = {**_pod_labels(params, pod, host), "model": "simple", "version": "1"}
        inputs.append({"series": _series("up", _pod_labels(params, pod, host)), "values": "1x40"})
        inputs.append({"series": _series("nv_inference_request_success", labels), "values": "0+60x40"})
        inputs.append({"series": _series("nv_inference_request_failure", {**labels, "reason": "BACKEND"}),
                       "values": f"0+{failed}x40"})
    alerts = [_expected("TritonModelErrorRatioHigh",
                        {"layer": "L2", "severity": "critical", server: SERVICE, replica: pod, node: host,
                         "model": "simple", "version": "1"},
                        f"Model simple version 1 on {SERVICE} pod {pod} (node {host}) fails 50% of its requests "
                        f"over 5m (failures by reason: BACKEND 1/s).")
              for pod, (host, failed) in pods.items() if failed]
    _run_promtool(root, "model-errors", [{
        "interval": "1m", "input_series": inputs,
        "alert_rule_test": [{"eval_time": "30m", "alertname": "TritonModelErrorRatioHigh", "exp_alerts": alerts}]}])


def test_pods_polled_through_a_headless_service_are_named_with_the_spec_labels(row):
    params, spec, root = row
    server, replica, node = _names(params[1])
    # (pod, node, IP): triton-0 hangs (both sources see it), triton-1 is live but not ready.
    pods = [("triton-0", "gpu-a", "10.0.0.5"), ("triton-1", "gpu-b", "10.0.0.6")]
    # The collector's own labels: its source's (the generated Kubernetes monitor's `job`, or the user's monitor's
    # namespace and Service), and `node` as the generated monitor writes it (the Service, not a node).
    polled = {"job": "inferwatch-triton", **spec.selectors.of("triton_collector").labels, "instance": "10.0.9.2:9401",
              "node": SERVICE, "triton": SERVICE}
    inputs = []
    for pod, host, ip in pods:
        hung = pod == "triton-0"
        own = {**_pod_labels(params, pod, host), "instance": f"{ip}:8002"}
        collector = {**polled, "address": f"{ip}:8000"}
        inputs += [{"series": _series("up", own), "values": "1 0x20" if hung else "1x20"},
                   {"series": _series("inferwatch_triton_up", collector), "values": "1 0x20" if hung else "1x20"},
                   {"series": _series("inferwatch_triton_server_ready", collector),
                    "values": "1 stale" if hung else "1 0x20"}]
    down = [_expected("TritonServerDown", {"layer": "L2", "severity": "critical", server: SERVICE,
                                           replica: "triton-0", node: "gpu-a"},
                      f"Triton {SERVICE} pod triton-0 on node gpu-a does not answer (metrics endpoint down or liveness "
                      f"failing): every model it serves is unavailable.")]
    # The collector's labels stay (its `node` too where the spec's node label is another); the replica and
    # node labels are Triton's.
    ready_labels = {**polled, server: SERVICE, "address": "10.0.0.6:8000", replica: "triton-1", node: "gpu-b",
                    "layer": "L2", "severity": "critical"}
    ready = [_expected("TritonServerNotReady", ready_labels,
                       f"Triton {SERVICE} pod triton-1 on node gpu-b is live but not ready (strict readiness: a model "
                       f"failed to load or is loading); load balancers stop sending it traffic.")]
    _run_promtool(root, "headless", [{
        "interval": "1m", "input_series": inputs,
        "alert_rule_test": [{"eval_time": "10m", "alertname": "TritonServerDown", "exp_alerts": down},
                            {"eval_time": "10m", "alertname": "TritonServerNotReady", "exp_alerts": ready}]}])


def test_inhibitions_key_on_the_spec_identity_labels(row):
    params, spec, _ = row
    server, replica, node = _names(params[1])
    gpu_node = ((params[1] or {}).get("gpu") or {}).get("node", "node")
    rules = inhibit_rules(spec)
    down = [r for r in rules if 'alertname="TritonServerDown"' in r["source_matchers"]]
    assert [r["equal"] for r in down] == [[node, server]]
    from_gpu = [r["equal"] for r in rules if any("GpuLost" in m and "=~" in m for m in r["source_matchers"])]
    # One node label on both sides, or no GPU-to-Triton rule (Alertmanager's `equal` compares one name).
    assert from_gpu == ([[node]] if gpu_node == node else [])
    every = {label for r in rules for label in r["equal"]}
    assert server in every and node in every
    if server != "triton":
        assert "triton" not in every


def _alert(name: str, layer: str, severity: str, **labels) -> dict:
    return {"labels": {"alertname": name, "layer": layer, "severity": severity, **labels},
            "annotations": {"summary": f"{name}.", "description": f"{name} {labels}",
                            "runbook_url": f"https://runbooks.example/{name}.md"},
            "generatorURL": "http://prometheus.example/graph"}


def _key(a: dict) -> tuple:
    return tuple(sorted(a["labels"].items()))


def test_real_alertmanager_server_down_inhibits_its_model_alerts(row, alertmanager_factory, tmp_path):
    params, _, _ = row
    server, replica, node = _names(params[1])
    tag = params[0]
    # (alerts, {index: suppressed?}); values carry the row's name so rows never meet in one Alertmanager.
    table = [
        ([_alert("TritonServerDown", "L2", "critical", **{server: f"s-{tag}", replica: "p0", node: "n1"}),
          _alert("TritonModelErrorRatioHigh", "L2", "critical",
                 **{server: f"s-{tag}", replica: "p0", node: "n1", "model": "m", "version": "1"}),
          _alert("TritonModelErrorRatioHigh", "L2", "critical",
                 **{server: f"other-{tag}", replica: "p0", node: "n1", "model": "m", "version": "1"})],
         {0: False, 1: True, 2: False}),
        # The same server name on another node: another replica's fault, not explained.
        ([_alert("TritonServerDown", "L2", "critical", **{server: f"s2-{tag}", replica: "p1", node: "n2"}),
          _alert("TritonQueueTimeP95High", "L2", "warning",
                 **{server: f"s2-{tag}", replica: "p2", node: "n3", "model": "m", "version": "1"})],
         {1: False}),
    ]
    grouping = {layer: ["alertname", "node"] for layer in ("L1", "L2", "L3")}
    with notifier_behind_alertmanager(tmp_path, grouping) as (_sims, _svc, data):
        if params[1]:
            data["identity"] = params[1]
        if params[2]:
            data["selectors"] = dict(params[2])
        spec = spec_from_dict(data)
        config = tmp_path / "alertmanager.yml"
        config.write_text(alertmanager_outputs(spec)[PATH])
        am = alertmanager_factory(config)
        am.post_alerts([a for alerts, _ in table for a in alerts])
        expected = {_key(alerts[i]): "suppressed" if s else "active" for alerts, checks in table
                    for i, s in checks.items()}

        def states() -> dict:
            return {_key(a): a["status"]["state"] for a in am.alerts()}
        wait_for(lambda: all(states().get(k) == v for k, v in expected.items()), timeout=30,
                 what=f"inhibition states with {params[0]} identity labels")


def test_triton_dashboard_uses_the_spec_identity_labels(row):
    params, spec, _ = row
    server, replica, node = _names(params[1])
    board = json.loads(dashboard_outputs(spec)["dashboards/generated/inferwatch-triton.json"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    query = variables["node"]["query"]
    text = query if isinstance(query, str) else query.get("query", "")
    assert text.endswith(f", {node})"), text
    query = variables["triton"]["query"]
    text = query if isinstance(query, str) else query.get("query", "")
    assert text.endswith(f", {server})") and f'{node}=~"$node"' in text, text
    panels = {p["title"]: p for p in board["panels"] if "targets" in p}
    main = panels["Requests by model version"]["targets"][0]
    assert main["legendFormat"].startswith(f"{{{{model}}}} v{{{{version}}}} ({{{{{server}}}}})"), main
    assert f"sum by ({node}, {server}, model, version)" in main["expr"], main["expr"]
    ready = panels["Triton servers ready"]["targets"][0]["expr"]
    assert f"on ({server}) group_left ()" in ready, ready
    if server != "triton":
        # The collector's `triton` copied to the spec's server label before the join.
        assert 'label_replace(inferwatch_triton_server_ready{' in ready and f'"{server}", "$1", "triton"' in ready


@pytest.mark.parametrize("identity, message", [
    ({"triton": {"server": "pod"}}, "three different labels"),
    ({"triton": {"node": "__name__"}}, "label name"),
    ({"triton": {"replica": "my-pod"}}, "label name"),
    ({"gpu": {"node": "kubernetes_node"}}, "GPU identity labels"),
])
def test_bad_identity_is_a_clear_spec_error(identity, message):
    with pytest.raises(SpecError, match=message):
        _spec(identity, None)


def _query(variable: dict) -> str:
    query = variable["query"]
    return query if isinstance(query, str) else query.get("query", "")


def test_gpu_overview_and_engine_panels_use_the_spec_identity_labels(row):
    params, spec, root = row
    server, replica, node = _names(params[1])
    gpu_node = ((params[1] or {}).get("gpu") or {}).get("node", "node")
    boards = {k.rsplit("/", 1)[1]: json.loads(v) for k, v in dashboard_outputs(spec).items()}
    gpu = boards["inferwatch-gpu.json"]
    variables = {v["name"]: v for v in gpu["templating"]["list"]}
    assert _query(variables["node"]).endswith(f", {gpu_node})"), _query(variables["node"])
    temps = next(p for p in gpu["panels"] if p.get("title") == "GPU temperature")["targets"]
    assert all(t["legendFormat"].startswith(f"{{{{{gpu_node}}}}} GPU") for t in temps), temps
    firing = next(p for p in boards["inferwatch-overview.json"]["panels"] if p.get("title") == "Firing alerts")
    where = firing["targets"][0]["expr"]
    assert f"{node}, " in where and f", {server}, model, tier)" in where and f" {gpu_node}," in where, where
    engine_row = [t for p in boards["inferwatch-triton.json"]["panels"] if p.get("title") == "KV cache used"
                  for t in p["targets"]]
    assert engine_row and all(f'{server}=~"$triton"' in t["expr"] for t in engine_row), engine_row
    assert all(f"({{{{{server}}}}} {{{{instance}}}}" in t["legendFormat"] for t in engine_row), engine_row
    # The engine recordings keep one engine per replica under the spec's names.
    engine_rules = (root / "engine.yml").read_text()
    assert f"max by ({node}, {server}, {replica}, model, version, instance, engine)" in engine_rules


def test_every_rule_file_with_the_row_identity_parses_in_promtool(row):
    _, _, root = row
    files = sorted(p.name for p in root.glob("*.yml") if not p.name.endswith(".test.yml"))
    assert "engine.yml" in files and "triton.yml" in files, files
    out = subprocess.run([promtool(), "check", "rules", *files], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]


EXPOSITION = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="simple",version="1"} 0
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="simple",version="1",reason="BACKEND"} 0
"""
FAST = {"prometheus": {"scrape_interval": "1s", "evaluation_interval": "1s", "rate_window": "5s"},
        "layers": {"L2": {"for": "2s"}}}


@pytest.mark.parametrize("params", [IDENTITIES[0], IDENTITIES[1]], ids=IDS[:2])
def test_real_prometheus_keeps_one_alert_per_pod(params, tmp_path):
    """A real Prometheus scraping three pods behind one Service, labelled as the row's monitor labels them:
    the two failing pods are two TritonModelErrorRatioHigh alerts with their own `pod`, the healthy one none."""
    from engine_support import EngineExposition
    from inferwatch.testing.prometheus import start_prometheus

    data = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    data["prometheus"] = {**data["prometheus"], **FAST["prometheus"]}
    data["layers"]["L2"]["for"] = FAST["layers"]["L2"]["for"]
    data["targets"] = {**data["targets"], "triton": []}  # scraped here as the row's monitor does, not generated
    if params[1]:
        data["identity"] = params[1]
    if params[2]:
        data["selectors"] = dict(params[2])
    spec = spec_from_dict(data)
    server, replica, node = _names(params[1])
    (tmp_path / "triton.yml").write_text(rule_outputs(spec)[f"{RULES_DIR}/triton.yml"])
    fixture = tmp_path / "triton.metrics"
    fixture.write_text(EXPOSITION)
    pods = {"triton-0": 10.0, "triton-1": 10.0, "triton-2": 0.0}
    servers = {pod: EngineExposition(str(fixture)) for pod in pods}
    prom = None
    try:
        static = []
        for pod, failing in pods.items():
            servers[pod].ramp("nv_inference_request_success", 10.0)
            servers[pod].ramp("nv_inference_request_failure", failing)
            labels = {k: v for k, v in _pod_labels(params, pod, f"node-{pod[-1]}").items()
                      if k not in ("job", "instance")}
            static.append({"targets": [servers[pod].address], "labels": labels})
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "triton.yml")],
            "scrape_configs": [{"job_name": params[3]["job"], "static_configs": static}]}))
        prom = start_prometheus(tmp_path, tmp_path / "prometheus.yml")
        firing = prom.wait_for('ALERTS{alertname="TritonModelErrorRatioHigh", alertstate="firing"}', timeout=90,
                               predicate=lambda r: len(r) >= 2)
        assert sorted(a["metric"][replica] for a in firing) == ["triton-0", "triton-1"], firing
        assert all(a["metric"][server] == "triton-metrics" and a["metric"][node] for a in firing), firing
        if server != "triton":
            assert all("triton" not in a["metric"] for a in firing), firing
    finally:
        if prom is not None:
            prom.stop()
        for s in servers.values():
            s.stop()
