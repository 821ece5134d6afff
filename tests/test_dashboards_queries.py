"""Every dashboard query against a real Prometheus fed by the real parts: Triton (example models, real
traffic), the gateway exporter in front of it (streamed toy_llm traffic with tenant/service headers), the
Triton collector, the GPU exporter on its simulated NVML with its GPU held by a pod (a kubelet answering the
PodResources API on a unix socket), and the generated recording rules. Three times: with the default selectors,
with selectors as the Prometheus Operator writes them (the generated scrape configuration then names the jobs
and writes the labels those selectors ask for; rules and dashboards are generated from the same spec), and with
a cluster named in the spec, every series carrying its `cluster` label as they do in a central store (the
dashboards then have a cluster variable and every query selects it).

- every panel query and variable query parses (Prometheus answers `success`, not `bad_data`);
- the main panel of each dashboard returns finite data, and the variables that select nodes, models, tenants
  and tiers have values.

Grafana variables are substituted as Grafana would: `All` is `.*` (the variables' allValue), $__rate_interval
is 10s (Grafana: max(4 x scrape interval, step + scrape interval) = 4s at the 1s scrape used here, plus margin
for Triton's 2s metrics interval), $__range is 1h.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import requests
import yaml

from gpu_support import fake_kubelet
from inferwatch.dashboards.generate import DASHBOARDS, dashboards
from inferwatch.deploy.prometheus import prometheus_config, scrape_jobs
from inferwatch.rules.generate import RULES_DIR, outputs
from inferwatch.spec import spec_from_dict
from inferwatch.testing.process import ManagedProcess, free_port, http_ok
from inferwatch.testing.prometheus import start_prometheus
from inferwatch.traffic import TrafficLoop, infer_classifier, stream_toy_llm
from selector_support import OPERATOR

ROOT = Path(__file__).resolve().parents[1]
RATE_INTERVAL = "10s"
LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$", re.S)
TENANTS = [({"X-Tenant-ID": "acme", "X-Service-Name": "chat-web"}), ({"X-Tenant-ID": "globex",
                                                                     "X-Service-Name": "summarizer"})]


def substitute(expr: str) -> str:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", "1h")
    return re.sub(r"\$\{?[a-z_]+\}?", ".*", expr)


def variable_expr(query: str) -> tuple[str, str]:
    """label_values(selector, label) -> (PromQL listing the label's values, label)."""
    m = LABEL_VALUES.match(query)
    assert m, f"unsupported variable query {query!r}"
    return f"count by ({m.group(2)}) ({substitute(m.group(1))})", m.group(2)


def _exporter(tmp: Path, name: str, args: list[str], metrics_port: int) -> ManagedProcess:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    return ManagedProcess(name, [sys.executable, "-m", "inferwatch", "exporter", *args], tmp / f"{name}.log",
                          ready=lambda: http_ok(url)).start(timeout=60)


POD = ("inference", "llm-0", "triton")  # holds the simulated GPU 0


CLUSTER = "a"


@pytest.fixture(scope="module", params=["default", "operator", "cluster"])
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def selectors(variant) -> dict | None:
    return OPERATOR if variant == "operator" else None


@pytest.fixture(scope="module")
def kubelet():
    with fake_kubelet() as (fake, path):
        namespace, pod, container = POD
        fake.pods = [(namespace, pod, [(container, "nvidia.com/gpu", ["nvidia0"])])]
        yield path


@pytest.fixture(scope="module")
def spec_data(selectors, variant, tmp_path_factory):
    """The repository's spec with `selectors` (and a cluster name in the cluster variant), and rule files
    generated from it."""
    tmp = tmp_path_factory.mktemp("spec")
    raw = yaml.safe_load((ROOT / "inferwatch.yaml").read_text())
    if selectors:
        raw["selectors"] = dict(selectors)
    if variant == "cluster":
        raw["cluster"] = {"name": CLUSTER}
    rules = tmp / "rules"
    rules.mkdir()
    for rel, text in outputs(spec_from_dict(raw)).items():
        if rel.startswith(RULES_DIR):
            (rules / Path(rel).name).write_text(text)
    raw.setdefault("prometheus", {})["rule_files"] = [str(rules / "*.yml")]
    return raw


@pytest.fixture(scope="module")
def stack(triton, kubelet, spec_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboards")
    ports = {k: free_port() for k in ("gpu", "collector", "gateway", "gateway_metrics")}
    raw = dict(spec_data)
    raw["targets"] = {
        "triton": [{"name": "triton-0", "url": triton.url, "metrics_url": triton.metrics_url, "node": "node-a"}],
        "gpu_exporters": [{"address": f"127.0.0.1:{ports['gpu']}", "node": "node-a"}],
        "triton_collectors": [f"127.0.0.1:{ports['collector']}"],
        "gateways": [{"address": f"127.0.0.1:{ports['gateway_metrics']}", "node": "node-a"}],
        "notifiers": [],
    }
    raw["prometheus"] = {**raw["prometheus"], "scrape_interval": "1s", "evaluation_interval": "1s"}
    spec_path = tmp / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    spec = spec_from_dict(raw, str(spec_path))
    config = prometheus_config(spec)
    config["scrape_configs"] = [job for source, job in scrape_jobs(spec) if source != "notifier"]
    if spec.cluster.enabled:  # series as a central store holds them: each carries its cluster
        for job in config["scrape_configs"]:
            for static in job["static_configs"]:
                static["labels"] = {**static.get("labels", {}), spec.cluster.label: spec.cluster.name}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    procs = []
    loops = []
    try:
        procs.append(_exporter(tmp, "gpu", ["gpu", "--nvml", "sim", "--interval", "1s", "--hostname", "node-a",
                                            "--pod-resources-socket", kubelet, "--port", str(ports["gpu"])],
                               ports["gpu"]))
        procs.append(_exporter(tmp, "collector", ["triton", "--spec", str(spec_path), "--interval", "1s",
                                                  "--port", str(ports["collector"])], ports["collector"]))
        procs.append(_exporter(tmp, "gateway", ["gateway", "--upstream", triton.url, "--spec", str(spec_path),
                                                "--port", str(ports["gateway"]),
                                                "--metrics-port", str(ports["gateway_metrics"])],
                               ports["gateway_metrics"]))
        prometheus = start_prometheus(tmp / "prom", tmp / "prometheus.yml")
        procs.append(prometheus.process)
        gateway = f"http://127.0.0.1:{ports['gateway']}"
        loops = [
            TrafficLoop("classifier", lambda: (infer_classifier(triton.url, batch=2), 0), 8.0, workers=2).start(),
            TrafficLoop("llm-acme", lambda: stream_toy_llm(gateway, max_tokens=8, headers=TENANTS[0]), 4.0,
                        workers=2).start(),
            TrafficLoop("llm-globex", lambda: stream_toy_llm(gateway, max_tokens=8, headers=TENANTS[1]), 2.0,
                        workers=2).start(),
        ]
        # Enough history for rate() over $__rate_interval and for the 5m-window recording rules to have 2 points.
        prometheus.wait_for('histogram_quantile(0.5, sum by (le) (rate(gateway_time_to_first_token_seconds_bucket'
                            f'[{RATE_INTERVAL}])))', timeout=120,
                            predicate=lambda r: not math.isnan(float(r[0]["value"][1])))
        prometheus.wait_for("model_version:nv_inference_request_error:ratio", timeout=60)
        yield prometheus
    finally:
        for loop in loops:
            loop.stop()
        for proc in reversed(procs):
            proc.stop()


@pytest.fixture(scope="module")
def boards(spec_data):
    return dashboards(spec_from_dict(spec_data))


def _query(prometheus, expr: str) -> dict:
    return requests.get(f"{prometheus.url}/api/v1/query", params={"query": expr}, timeout=10).json()


def _finite(body: dict) -> list[float]:
    return [float(s["value"][1]) for s in body["data"]["result"] if math.isfinite(float(s["value"][1]))]


@pytest.mark.parametrize("key", list(DASHBOARDS))
def test_every_query_parses(stack, boards, key):
    errors = []
    exprs = [t["expr"] for p in boards[key]["panels"] for t in p.get("targets", [])]
    exprs += [variable_expr(v["query"])[0] for v in boards[key]["templating"]["list"] if v["type"] == "query"]
    assert exprs
    for expr in exprs:
        body = _query(stack, substitute(expr))
        if body.get("status") != "success":
            errors.append(f"{body.get('errorType')}: {body.get('error')}\n  in {expr}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("key", list(DASHBOARDS))
def test_main_panel_returns_data(stack, boards, key):
    panel = next(p for p in boards[key]["panels"] if p["title"] == DASHBOARDS[key].MAIN_PANEL)
    values = [v for t in panel["targets"] for v in _finite(_query(stack, substitute(t["expr"])))]
    assert values, f"{key}: main panel {panel['title']!r} returned no finite value"


@pytest.mark.parametrize("key", [k for k in DASHBOARDS if k != "overview"])
def test_variables_have_values(stack, boards, key):
    for v in boards[key]["templating"]["list"]:
        if v["type"] != "query":
            continue
        expr, label = variable_expr(v["query"])
        values = {s["metric"].get(label) for s in _query(stack, expr)["data"]["result"]}
        assert values - {None}, f"{key}: variable {v['name']} ({v['query']}) has no values"


def test_panels_with_data_report(stack, boards, capsys):
    """Not every panel can have data here (no firing alerts, no XID, no 7 days of history); prints which do,
    and requires most of each layer dashboard's panels to be live."""
    for key, data in boards.items():
        panels = [p for p in data["panels"] if p["type"] != "row"]
        live = [p["title"] for p in panels
                if any(_finite(_query(stack, substitute(t["expr"]))) for t in p["targets"])]
        with capsys.disabled():
            print(f"\n{key}: {len(live)}/{len(panels)} panels with data; without: "
                  f"{sorted(set(p['title'] for p in panels) - set(live))}")
        if key != "overview":
            assert len(live) >= len(panels) // 2, (key, live)


def test_targets_are_scraped_under_the_selectors(stack, spec_data):
    """Every scraped target is picked by its source's selector (the operator's job and namespace/service labels
    when those are the selectors), and the GPU's namespace/pod variables offer the pod holding the GPU."""
    spec = spec_from_dict(spec_data)
    up = _query(stack, "up")["data"]["result"]
    # Triton, collector, GPU exporter, gateway; the alerting path's own Alertmanager and Prometheus
    assert len(up) == 6, up
    assert {s["metric"].get("cluster") for s in up} == ({CLUSTER} if spec.cluster.enabled else {None})
    for source in ("gpu", "triton", "triton_collector", "gateway", "alertmanager", "prometheus"):
        picked = [s["metric"] for s in up if spec.selectors.of(source).matches(s["metric"])]
        assert len(picked) == 1, (source, up)
    gpu = dashboards(spec)["gpu"]
    for name, value in zip(("namespace", "pod"), POD, strict=False):
        query = next(v["query"] for v in gpu["templating"]["list"] if v["name"] == name)
        expr, label = variable_expr(query)
        assert {s["metric"].get(label) for s in _query(stack, expr)["data"]["result"]} == {value}


def test_with_a_cluster_every_query_selects_it(spec_data, boards):
    """In the cluster variant every panel and variable query selects `cluster=~"$cluster"` on each of its
    vector selectors and the cluster variable comes right after the data source; without it none does."""
    spec = spec_from_dict(spec_data)
    for key, data in boards.items():
        variables = data["templating"]["list"]
        exprs = [t["expr"] for p in data["panels"] for t in p.get("targets", [])]
        exprs += [LABEL_VALUES.match(v["query"]).group(1) for v in variables
                  if v["type"] == "query" and v["name"] != "cluster"]
        names = [v["name"] for v in variables]
        if not spec.cluster.enabled:
            assert "cluster" not in names and not any("cluster" in e for e in exprs), key
            continue
        assert names[:2] == ["datasource", "cluster"], (key, names)
        for expr in exprs:
            selectors = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*\{[^{}]*\}", expr)
            assert selectors and all('{cluster=~"$cluster"' in s for s in selectors), (key, expr)
