"""The generated canary gates decide as they should on real data: the real tritonserver serving classifier
versions 1 (stable) and 2 (canary, the newer), the real Prometheus running the generated prometheus.yml and
recording rules, and each generated Argo Rollouts analysis query filled as the controller fills it
(`{{args.model}}`, `{{args.canary-version}}`, `{{args.stable-version}}`), measured every `gates.interval`
and judged by its own success/failure conditions (tests/gates_support.py, Argo's rules):

| phase | canary v2 | stable v1 | error-ratio gate |
|---|---|---|---|
| bad canary | fails 20 % | healthy | Failed after failureLimit + 1 measurements |
| good canary | healthy | fails 20 % | Successful after `count` measurements |
| too little traffic | under min_request_rate | busy | Inconclusive after inconclusiveLimit + 1 |

At every measurement the gate agrees with the alert it stands for: the error-ratio gate's value is above 0
exactly when TritonCanaryRegression{signal="error_ratio"}'s expression has a sample, both read at the same
evaluation time; the latency gate likewise with the latency alert (whatever the noise of two identical
models makes of it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
import yaml

from gates_support import (
    FAILED,
    INCONCLUSIVE,
    RUNNING,
    SUCCESSFUL,
    adapter_query,
    fill_argo,
    fill_flagger,
    flagger_check,
    measurement,
    run_phase,
)
from inferwatch.deploy.gates import objects
from inferwatch.rules.generate import outputs as rule_outputs
from inferwatch.rules.triton import ERROR_RATIO, REQUESTS
from inferwatch.spec import spec_from_dict
from inferwatch.testing.process import free_port
from inferwatch.traffic import TrafficLoop, infer_classifier

pytestmark = pytest.mark.slow

MIN_RATE = 2.0  # req/s: the canary's low-traffic phase sends less, the busy phases several times more
BUSY_RATE = 12.0
LOW_RATE = 0.5
FAIL = 0.2
ARGS = {"model": "classifier", "canary-version": "2", "stable-version": "1"}


def _spec(server):
    return spec_from_dict({
        "targets": {"triton": [{"name": "triton-0", "url": server.url, "metrics_url": server.metrics_url,
                                "node": "node-a", "metrics_interval_ms": 1000}],
                    "alertmanager": f"http://127.0.0.1:{free_port()}"},
        "prometheus": {"scrape_interval": "1s", "evaluation_interval": "1s", "rate_window": "10s"},
        "layers": {"L2": {"min_request_rate": MIN_RATE}},
        "gates": {"interval": "2s", "count": 3, "failure_limit": 1, "inconclusive_limit": 1}})


def _query_at(prom, expr: str, at: float) -> list[float]:
    body = requests.get(f"{prom.url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return [float(s["value"][1]) for s in body["data"]["result"]]


def _loops(server, canary: tuple[float, float], stable: tuple[float, float]) -> list[TrafficLoop]:
    """Traffic to each version: (requests/s, share failing)."""
    return [TrafficLoop(f"v{v}", lambda v=v, f=fail: infer_classifier(server.url, fail=f, version=v), rate,
                        workers=4).start()
            for v, (rate, fail) in (("2", canary), ("1", stable))]


def _settled(prom, phase: str) -> None:
    """Wait (deadline) until the recording rules show the phase's traffic over a whole rate window."""
    sel = '{model="classifier", version="%s"}'

    def ratio(version: str) -> list[float]:
        return [float(s["value"][1]) for s in prom.query(ERROR_RATIO + sel % version)]

    def rate(version: str) -> float:
        return sum(float(s["value"][1]) for s in prom.query(REQUESTS + sel % version))

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        r2, r1, q2, q1 = ratio("2"), ratio("1"), rate("2"), rate("1")
        if phase == "bad" and r2 and r1 and r2[0] > 0.08 and r1[0] == 0 and min(q1, q2) > MIN_RATE:
            return
        if phase == "good" and r2 and r1 and r1[0] > 0.08 and r2[0] == 0 and min(q1, q2) > MIN_RATE:
            return
        if phase == "low" and 0 < q2 < MIN_RATE and q1 > MIN_RATE and (not r2 or r2[0] == 0):
            return
        time.sleep(0.5)
    pytest.fail(f"phase {phase} never settled: ratios v2 {r2} v1 {r1}, rates v2 {q2} v1 {q1}")


def _run(prom, metric: dict, alert_expr: str) -> tuple[str, list[str], list[list[float]]]:
    """One Argo analysis of `metric` from now: a measurement every interval until the metric's phase is
    final; each compared with the alert's expression at the same evaluation time."""
    query = fill_argo(metric["provider"]["prometheus"]["query"], ARGS)
    interval = 2.0
    start = time.time()
    phases: list[str] = []
    values: list[list[float]] = []
    while run_phase(metric, phases) == RUNNING:
        at = start + len(phases) * interval
        while time.time() < at + 1.0:  # the controller's schedule; +1 s: Prometheus has evaluated `at`
            time.sleep(0.1)
        result = _query_at(prom, query, at)
        phases.append(measurement(metric, result))
        values.append(result)
        fired = _query_at(prom, alert_expr, at)
        assert bool(fired) == (bool(result) and result[0] > 0), (metric["name"], at, result, fired)
    return run_phase(metric, phases), phases, values


def test_argo_gates_judge_a_real_canary_like_the_alert(triton, prometheus_factory, tmp_path):
    spec = _spec(triton)
    for rel, body in rule_outputs(spec).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    alerts = {r["labels"]["signal"]: r["expr"]
              for g in yaml.safe_load((tmp_path / "rules/generated/triton.yml").read_text())["groups"]
              for r in g["rules"] if r.get("alert") == "TritonCanaryRegression"}
    prom = prometheus_factory(tmp_path / "deploy/prometheus/prometheus.yml")
    template = objects.analysis_template(spec, "versions")
    metrics = {m["name"]: m for m in template["spec"]["metrics"]}
    assert set(metrics) == {"error-ratio", "latency"}
    g = spec.gates
    outcomes = {}
    for phase, canary, stable, expected, after in (
            ("bad", (BUSY_RATE, FAIL), (BUSY_RATE, 0.0), FAILED, g.failure_limit + 1),
            ("good", (BUSY_RATE, 0.0), (BUSY_RATE, FAIL), SUCCESSFUL, g.count),
            ("low", (LOW_RATE, 0.0), (BUSY_RATE, 0.0), INCONCLUSIVE, g.inconclusive_limit + 1)):
        loops = _loops(triton, canary, stable)
        try:
            _settled(prom, phase)
            final, phases, values = _run(prom, metrics["error-ratio"], alerts["error_ratio"])
            latency = _run(prom, metrics["latency"], alerts["latency"])
        finally:
            for loop in loops:
                loop.stop()
        outcomes[phase] = (final, phases, values)
        assert final == expected, (phase, phases, values)
        assert len(phases) == after, (phase, phases)
        if phase == "low":
            # Too little traffic is never a verdict on any signal: no sample, Inconclusive.
            assert latency[0] == INCONCLUSIVE and all(v == [] for v in latency[2]), latency
    # The bad canary's excess is about its 20 % failures (over a healthy stable: 0 x 1.05 + 0.001).
    assert all(0.05 < v[0] < 0.4 for v in outcomes["bad"][2]), outcomes["bad"]
    # The good canary is below the failing stable's limit by about 1.05 x 20 %.
    assert all(-0.4 < v[0] < -0.05 for v in outcomes["good"][2]), outcomes["good"]


# Two sets of pods serving the same model, named as their controllers name them: Flagger's primary (stable)
# and canary Deployments, which are also an Argo Rollout's stable and canary ReplicaSets by their hash.
STABLE_POD, CANARY_POD = "triton-primary-5d8f9c7b6-x7k2p", "triton-6f7c8d9b5-q9z4m"
POD_ARGS = {"model": "classifier", "canary-hash": "6f7c8d9b5", "stable-hash": "5d8f9c7b6"}


def _pods_settled(prom, phase: str) -> None:
    def of(record: str) -> dict[str, float]:
        return {s["metric"].get("pod", ""): float(s["value"][1])
                for s in prom.query(record + '{model="classifier", version="2"}')}

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ratio, rate = of(ERROR_RATIO), of(REQUESTS)
        c, s = ratio.get(CANARY_POD), ratio.get(STABLE_POD)
        rc, rs = rate.get(CANARY_POD, 0.0), rate.get(STABLE_POD, 0.0)
        if phase == "bad" and c is not None and c > 0.08 and s == 0 and min(rc, rs) > MIN_RATE:
            return
        if phase == "good" and s is not None and s > 0.08 and c == 0 and min(rc, rs) > MIN_RATE:
            return
        if phase == "low" and 0 < rc < MIN_RATE and rs > MIN_RATE and (c is None or c == 0):
            return
        time.sleep(0.5)
    pytest.fail(f"phase {phase} never settled: ratios {ratio}, rates {rate}")


def test_pod_gates_judge_a_real_canary_workload(triton, triton_factory, prometheus_factory, tmp_path):
    """The pods way: a stable and a canary Triton (the `pod` label Kubernetes discovery writes), the Flagger
    MetricTemplate filled as Flagger fills it and judged by the Canary analysis' thresholdRange, the Argo
    pods template filled from the pod-template-hashes."""
    canary_server = triton_factory(ready_path="/v2/health/ready")
    servers = {STABLE_POD: triton, CANARY_POD: canary_server}
    spec = spec_from_dict({
        "targets": {"triton": [{"name": f"triton-{i}", "url": s.url, "metrics_url": s.metrics_url,
                                "node": f"node-{i}", "metrics_interval_ms": 1000}
                               for i, s in enumerate(servers.values())],
                    "alertmanager": f"http://127.0.0.1:{free_port()}"},
        "prometheus": {"scrape_interval": "1s", "evaluation_interval": "1s", "rate_window": "10s"},
        "layers": {"L2": {"min_request_rate": MIN_RATE}}})
    for rel, body in rule_outputs(spec).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    config_path = tmp_path / "deploy/prometheus/prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "triton")
    for static, pod in zip(job["static_configs"], servers, strict=True):
        static["labels"]["pod"] = pod
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    prom = prometheus_factory(config_path)

    flagger = {t["metadata"]["name"]: t["spec"]["query"] for t in objects.metric_templates(spec)}
    analysis = {m["name"]: m for m in objects.canary_analysis(spec, "classifier")["metrics"]}
    argo = {m["name"]: m for m in objects.analysis_template(spec, "pods")["spec"]["metrics"]}
    error_template = objects.FLAGGER_TEMPLATE.format("error-ratio")
    for phase, canary, stable, flagger_expected, argo_expected in (
            ("bad", (BUSY_RATE, FAIL), (BUSY_RATE, 0.0), "fail", FAILED),
            ("good", (BUSY_RATE, 0.0), (BUSY_RATE, FAIL), "pass", SUCCESSFUL),
            ("low", (LOW_RATE, 0.0), (BUSY_RATE, 0.0), "halt", INCONCLUSIVE)):
        loops = [TrafficLoop(pod, lambda s=servers[pod], f=fail: infer_classifier(s.url, fail=f, version="2"), rate,
                             workers=4).start()
                 for pod, (rate, fail) in ((CANARY_POD, canary), (STABLE_POD, stable))]
        try:
            _pods_settled(prom, phase)
            # Now: the latest evaluation at or before it is the one _pods_settled saw (or a later one).
            at = time.time()
            metric = analysis["error-ratio"]
            query = fill_flagger(flagger[error_template], target="triton", namespace="triton",
                                 interval=metric["interval"], variables=metric["templateVariables"])
            values = _query_at(prom, query, at)
            argo_values = _query_at(prom, fill_argo(argo["error-ratio"]["provider"]["prometheus"]["query"],
                                                    POD_ARGS), at)
        finally:
            for loop in loops:
                loop.stop()
        assert flagger_check(metric, values) == flagger_expected, (phase, values)
        assert measurement(argo["error-ratio"], argo_values) == argo_expected, (phase, argo_values)
        assert values == argo_values  # the same pods compared by either controller's names


SLOW_REPOSITORY = Path(__file__).resolve().parent / "fixtures/gates/model_repository"


def _slow(url: str, delay_ms: int) -> bool:
    body = {"inputs": [{"name": "INPUT", "shape": [1], "datatype": "FP32", "data": [1.0]}],
            "parameters": {"delay_ms": delay_ms}}
    try:
        return requests.post(f"{url}/v2/models/slow/infer", json=body, timeout=30).status_code == 200
    except requests.RequestException:
        return False


def test_queue_trigger_is_below_activation_at_rest_and_crosses_threshold_in_a_surge(
        triton_factory, prometheus_factory, tmp_path):
    """The KEDA triggers on the real Triton's queue (P95 queue time, pending requests): one client at a time on
    a slow model queues nothing (below activationThreshold); eight concurrent clients queue behind its one
    instance (above threshold)."""
    server = triton_factory(model_repository=SLOW_REPOSITORY, ready_path="/v2/health/ready")
    spec = spec_from_dict({
        "targets": {"triton": [{"name": "triton-0", "url": server.url, "metrics_url": server.metrics_url,
                                "node": "node-a", "metrics_interval_ms": 1000}],
                    "alertmanager": f"http://127.0.0.1:{free_port()}"},
        "prometheus": {"scrape_interval": "1s", "evaluation_interval": "1s", "rate_window": "10s"},
        "models": ["slow"],
        "layers": {"L2": {"queue_p95_seconds": 0.2, "pending_requests": 4}}})
    for rel, body in rule_outputs(spec).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    prom = prometheus_factory(tmp_path / "deploy/prometheus/prometheus.yml")
    scaled = objects.scaled_object(spec)
    assert scaled is not None
    triggers = {t["name"]: t["metadata"] for t in scaled["spec"]["triggers"]}
    assert set(triggers) == {"queue-p95-slow", "pending-slow"}
    limits = {name: (float(t["threshold"]), float(t["activationThreshold"])) for name, t in triggers.items()}
    assert limits == {"queue-p95-slow": (0.2, 0.1), "pending-slow": (4.0, 2.0)}

    rest = TrafficLoop("rest", lambda: _slow(server.url, 20), 4.0, workers=1).start()
    try:
        for t in triggers.values():
            prom.wait_for(t["query"], timeout=90)
        settled = time.time()
        while time.time() < settled + 6:  # five evaluations at rest, read afterwards at their own instants
            time.sleep(0.2)
        at_rest = {name: [v for i in range(5) for v in _query_at(prom, t["query"], settled + i)]
                   for name, t in triggers.items()}
    finally:
        rest.stop()
    for name, values in at_rest.items():
        assert len(values) == 5 and max(values) < limits[name][1], (name, values)

    surge = TrafficLoop("surge", lambda: _slow(server.url, 100), 80.0, workers=8).start()
    try:
        crossed = {name: prom.wait_for(t["query"], timeout=90,
                                       predicate=lambda r, n=name: float(r[0]["value"][1]) > limits[n][0])
                   for name, t in triggers.items()}
    finally:
        surge.stop()
    for name, result in crossed.items():
        assert float(result[0]["value"][1]) > limits[name][0], name
    # An HPA over prometheus-adapter reads the same numbers: each external rule's query, filled as the adapter
    # fills it for the HPA's selector, equals its KEDA trigger's at the same instant.
    rules = {r["name"]["as"]: r for r in objects.adapter_config(spec)["externalRules"]}
    at = time.time() - 1.0
    for trigger_name, rule_name in (("queue-p95-slow", "inferwatch_triton_queue_p95_seconds"),
                                    ("pending-slow", "inferwatch_triton_pending_requests")):
        keda = _query_at(prom, triggers[trigger_name]["query"], at)
        adapter = _query_at(prom, adapter_query(rules[rule_name], {"model": "slow"}), at)
        assert keda and adapter == keda, (trigger_name, keda, adapter)
