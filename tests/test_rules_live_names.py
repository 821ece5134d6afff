"""Correct names only: every metric a generated rule reads is produced by the real Triton or a real inferwatch
exporter (GPU exporter on the simulated NVML, Triton collector, gateway, notifier), scraped live; and the
generated prometheus.yml + rules run in a real Prometheus against them without evaluation failures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import requests
import yaml

from inferwatch.rules.generate import outputs
from inferwatch.rules.metricrefs import metric_names, rule_metric_names
from inferwatch.spec import load_spec, spec_from_dict
from inferwatch.testing.alertmanager import start_alertmanager
from inferwatch.testing.process import ManagedProcess, StackError, free_port, http_ok
from inferwatch.testing.victoriametrics import start_edge, start_victoria_metrics, start_vmalert
from inferwatch.traffic import infer_classifier

REPO = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).parent / "inferwatch")
# source -> (module that must exist, metric name prefixes it owns)
SOURCES = {
    "triton": (None, ("nv_",)),
    "gpu": ("inferwatch.exporters.gpu.cli", ("DCGM_", "inferwatch_gpu_")),
    "collector": ("inferwatch.exporters.triton.cli", ("inferwatch_triton_",)),
    "gateway": ("inferwatch.exporters.gateway.cli", ("gateway_",)),
    "notifier": ("inferwatch.notifier.cli", ("inferwatch_notifier_",)),
    # The alerting path watching itself (rules/ha.py): a clustered Alertmanager; process_* is every Go
    # program's client_golang process collector, Prometheus' own as well as Alertmanager's.
    "alertmanager": (None, ("alertmanager_", "process_")),
    # The central store's programs (rules/centralstore.py), the Debian victoria-metrics binaries; vmagent's
    # persistent queue shares VictoriaMetrics' vm_ prefix, so vmagent is listed first.
    "vmagent": (None, ("vmagent_", "vm_persistentqueue_")),
    "vmalert": (None, ("vmalert_",)),
    "victoriametrics": (None, ("vm_",)),
}
BUILTIN = {"up", "ALERTS"}  # ALERTS: the series Prometheus writes for its own alerting rules
# Prometheus' own metrics a rule reads (the generated groups' evaluation failures, rules/rulehealth.py): every
# Prometheus exposes them on its /metrics (Prometheus 2.x rules/manager.go), no exporter of ours does.
BUILTIN |= {"prometheus_rule_evaluation_failures_total"}
# Series only dcgm-exporter exposes (the GPU rules read them where it is the GPU source; see rules/gpu.py and the
# dcgm-exporter cases of tests/test_rules_selectors.py): its exporter-owned XID count per code over a window,
# a row of its field list (DCGM_EXP_XID_ERRORS_COUNT, dcgm-exporter internal/pkg/counters/const.go).
# DCGM_FI_PROF_GR_ENGINE_ACTIVE: the profiling field the utilization falls back to on MIG instances (rules/identity.py),
# written by dcgm-exporter with profiling metrics on; inferwatch's exporter has no MIG instances to write it for.
DCGM_EXPORTER_ONLY = {"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
# Series only an LLM engine backend writes on Triton's :8002 (TensorRT-LLM's nv_trt_llm_*; vLLM's vllm:* have a
# colon and are left out above): the CPU Triton here has neither backend, so the families come from the
# fixtures written from the backends' sources (tests/fixtures/engine/, checked in tests/test_engine_metrics.py).
ENGINE_FIXTURES = REPO / "tests" / "fixtures" / "engine"


def exposed_names(text: str) -> set[str]:
    """Series names an exposition offers, including those declared by `# TYPE` with no sample yet."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            names.add(name)
            if kind in ("histogram", "summary"):
                names |= {name + "_sum", name + "_count"}
            if kind == "histogram":
                names.add(name + "_bucket")
            if kind == "counter" and not name.endswith("_total"):
                names.add(name + "_total")
        elif line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


def referenced_names() -> set[str]:
    names: set[str] = set()
    for rel, text in outputs(load_spec(REPO / "inferwatch.yaml")).items():
        if rel.startswith("rules/generated/"):
            for group in yaml.safe_load(text)["groups"]:
                for rule in group["rules"]:
                    names |= rule_metric_names(rule)
    return {n for n in names if ":" not in n}  # recorded series come from the rules themselves


def source_of(name: str) -> str | None:
    for source, (_, prefixes) in SOURCES.items():
        if name.startswith(prefixes):
            return source
    return None


@pytest.fixture(scope="module")
def live(triton, tmp_path_factory):
    """Start every exporter that exists; yield {source: (address, exposition text)}."""
    work = tmp_path_factory.mktemp("live-names")
    procs: list[ManagedProcess] = []
    found: dict[str, str] = {"triton": triton.metrics_address}

    def start(name: str, argv: list[str], port: int) -> None:
        proc = ManagedProcess(name, [CLI, *argv], work / f"{name}.log",
                              ready=lambda: http_ok(f"http://127.0.0.1:{port}/metrics"))
        try:
            proc.start(timeout=60)
        except StackError as exc:
            pytest.fail(str(exc), pytrace=False)
        procs.append(proc)
        found[name] = f"127.0.0.1:{port}"

    def exists(source: str) -> bool:
        module = SOURCES[source][0]
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            return False

    gateway_port = free_port()
    notifier_spec = work / "notifier.yaml"
    notifier_spec.write_text("channels:\n  chat: {type: slack, url: 'http://127.0.0.1:9/hook'}\n"
                             "routes:\n  - {match: {layer: L1}, receivers: [chat]}\n")
    try:
        if exists("gpu"):
            port = free_port()
            start("gpu", ["exporter", "gpu", "--nvml", "sim", "--interval", "500ms", "--port", str(port)], port)
        if exists("collector"):
            port = free_port()
            start("collector", ["exporter", "triton", "--triton-url", triton.url, "--no-spec-targets",
                                "--interval", "1s", "--port", str(port)], port)
        if exists("gateway"):
            port = free_port()
            start("gateway", ["exporter", "gateway", "--upstream", triton.url, "--port", str(gateway_port),
                              "--metrics-port", str(port), "--spec", str(REPO / "inferwatch.yaml")], port)
            for _ in range(3):  # streamed requests give the TTFT/ITL histograms their first series
                with requests.post(f"http://127.0.0.1:{gateway_port}/v2/models/toy_llm/generate_stream",
                                   json={"text_input": "hi", "max_tokens": 4}, stream=True, timeout=30,
                                   headers={"X-Tenant-ID": "acme", "X-Service-Name": "chat-web"}) as resp:
                    assert resp.status_code == 200
                    for _line in resp.iter_lines():
                        pass
        if exists("notifier"):
            port = free_port()
            start("notifier", ["notifier", "--spec", str(notifier_spec), "--port", str(port),
                               "--data-dir", str(work / "outbox")], port)
        config = work / "alertmanager.yml"
        config.write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
        cluster = f"127.0.0.1:{free_port()}"  # a cluster of one: its cluster metrics exist
        am = start_alertmanager(work, config, cluster=[f"--cluster.listen-address={cluster}",
                                                       f"--cluster.advertise-address={cluster}"])
        procs.append(am.process)
        found["alertmanager"] = f"127.0.0.1:{am.port}"
        # VictoriaMetrics, a vmagent writing to it and vmalert sending to the Alertmanager above, with the
        # generated command lines (a rule that fires, so its send counters exist).
        vm = start_victoria_metrics(work)
        procs.append(vm.process)
        central = spec_from_dict({"cluster": {"name": "live"}, "central_store": {"url": vm.url},
                                  "targets": {"alertmanager": am.url}})
        (work / "edge-scrape.yml").write_text("scrape_configs: []\n")
        edge = start_edge(work, central, work / "edge-scrape.yml")
        procs.append(edge.process)
        (work / "vmalert-rules.yml").write_text("groups:\n- name: live\n  rules:\n  - alert: Live\n"
                                               "    expr: vector(1)\n")
        vmalert = start_vmalert(work, central, str(work / "vmalert-rules.yml"))
        procs.append(vmalert.process)
        found.update(victoriametrics=f"127.0.0.1:{vm.port}", vmagent=f"127.0.0.1:{edge.port}",
                     vmalert=f"127.0.0.1:{vmalert.port}")
        for _ in range(3):
            assert infer_classifier(triton.url, batch=2)
        yield found
    finally:
        for proc in procs:
            proc.stop()


def scrape(address: str) -> str:
    path = "/metrics"
    resp = requests.get(f"http://{address}{path}", timeout=10)
    resp.raise_for_status()
    return resp.text


def test_every_metric_a_rule_reads_is_exposed_by_a_live_source(live):
    import time

    exposed = set(BUILTIN)
    deadline = time.monotonic() + 30
    # The collector fills its families on its first poll: scrape until it has model figures (or time is up).
    while True:
        texts = {source: scrape(address) for source, address in live.items()}
        if "collector" not in texts or "inferwatch_triton_model_ready{" in texts["collector"] \
                or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for text in texts.values():
        exposed |= exposed_names(text)
    engine_only = {n for path in ENGINE_FIXTURES.glob("*.metrics") for n in exposed_names(path.read_text())}
    referenced = referenced_names() - BUILTIN - DCGM_EXPORTER_ONLY - engine_only
    assert sorted(n for n in referenced if source_of(n) is None) == [], "names no source is meant to expose"
    missing_source = sorted({source_of(n) for n in referenced} - set(live))
    checked = {n for n in referenced if source_of(n) in live}
    unknown = sorted(n for n in checked if n not in exposed)
    assert unknown == [], f"rules read metrics no live source exposes: {unknown}"
    # A name from articles that no Triton release has must be caught by the same check.
    assert "nv_inference_queue_duration_usecs_bucket" not in exposed
    assert metric_names("histogram_quantile(0.95, rate(nv_inference_queue_duration_usecs_bucket[5m]))") == {
        "nv_inference_queue_duration_usecs_bucket"}
    if missing_source:
        pytest.fail(f"sources not built yet, their names unchecked: {missing_source}", pytrace=False)


def test_generated_config_and_rules_run_in_prometheus_without_failures(live, triton, prometheus_factory, tmp_path):
    """The generated prometheus.yml (from a spec naming the live addresses) scrapes every job with its node
    label, and the generated rules evaluate against live data: recorded series appear, no evaluation fails."""
    targets: dict = {"triton": [{"name": "triton-0", "url": triton.url, "metrics_url": triton.metrics_url,
                                 "node": "node-a", "metrics_interval_ms": 1000}],
                     "alertmanager": f"http://127.0.0.1:{free_port()}"}
    for source, kind in (("gpu", "gpu_exporters"), ("gateway", "gateways"), ("notifier", "notifiers")):
        targets[kind] = [{"address": live[source], "node": "node-a"}] if source in live else []
    targets["triton_collectors"] = [live["collector"]] if "collector" in live else []
    spec = spec_from_dict({"targets": targets, "prometheus": {
        "scrape_interval": "1s", "evaluation_interval": "1s", "rate_window": "10s"}})
    for rel, text in outputs(spec).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    prom = prometheus_factory(tmp_path / "deploy/prometheus/prometheus.yml")
    jobs = {"triton", "inferwatch-triton", "inferwatch-gpu", "inferwatch-gateway", "inferwatch-notifier"}
    expected_jobs = {j for j in jobs if j == "triton" or {"inferwatch-triton": "collector", "inferwatch-gpu": "gpu",
                                                           "inferwatch-gateway": "gateway",
                                                           "inferwatch-notifier": "notifier"}[j] in live}
    prom.wait_for('count(up == 1)', timeout=60,
                  predicate=lambda r: int(float(r[0]["value"][1])) == len(expected_jobs))
    # The alerting path's own jobs scrape an Alertmanager and a Prometheus this test does not run (up 0); their
    # first scrape may come a little after the others'.
    all_jobs = expected_jobs | {"inferwatch-alertmanager", "inferwatch-prometheus"}
    up = prom.wait_for("up", timeout=60, predicate=lambda r: {s["metric"]["job"] for s in r} >= all_jobs)
    assert {s["metric"]["job"] for s in up} == all_jobs
    assert all(s["metric"].get("node") for s in up)
    for _ in range(5):
        infer_classifier(triton.url, batch=2)
    prom.wait_for('model_version:nv_inference_request_success:rate{model="classifier",node="node-a"}', timeout=60)
    if "gpu" in live:
        prom.wait_for("gpu:DCGM_FI_DEV_FB_USED:ratio", timeout=60)
    if "gateway" in live:
        prom.wait_for("tenant_model_tier:gateway_requests:rate", timeout=60)
    rules = [r for g in requests.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
             for r in g["rules"]]
    assert len(rules) > 50
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert bad == [], bad
