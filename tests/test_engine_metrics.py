"""The LLM engines' families (TensorRT-LLM and vLLM backends) end to end: the fixtures written from the
backends' sources carry the documented families; served by a small exposition server whose values the test
changes, scraped by the real Prometheus with the generated scrape configuration and engine rules, they give
the recorded series, the alert, the Triton dashboard's engine row and the triage finding.

Three "Tritons" (one per fixture): TensorRT-LLM 25.x, Triton's vLLM backend (vLLM's older KV-cache name
only) and vLLM 0.10 (both spellings of every renamed family; the newer is read, once).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from engine_support import (
    ENGINE_PANELS,
    FAST_ENGINE_SPEC,
    FIXTURES,
    EngineExposition,
    concrete,
    engine_row,
    write_engine_prometheus,
)
from inferwatch.cli import main as cli_main
from inferwatch.dashboards.generate import dashboards
from inferwatch.rules import engine
from inferwatch.rules.generate import RULES_DIR, outputs
from inferwatch.rules.metricrefs import metric_names
from inferwatch.spec import spec_from_dict
from inferwatch.testing.prometheus import start_prometheus
from inferwatch.triage.engine import triage_alert
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.sources import PrometheusSource

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {  # fixture -> (triton, node, model)
    "tensorrt_llm.metrics": ("triton-trt", "node-t", "tensorrt_llm"),
    "vllm_backend.metrics": ("triton-vllm", "node-v", "vllm_model"),
    "vllm-0.10.metrics": ("triton-next", "node-n", "vllm_next"),
}
DEADLINE = 60.0


def families(fixture: str) -> dict[str, set[tuple]]:
    """{family name as written: set of label sets} of a fixture, parsed as Prometheus' text format."""
    out: dict[str, set[tuple]] = {}
    for family in text_string_to_metric_families((FIXTURES / fixture).read_text()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).add(tuple(sorted(sample.labels.items())))
    return out


@pytest.mark.parametrize("fixture, name, kind_label, kinds", [
    ("tensorrt_llm.metrics", "nv_trt_llm_request_metrics", "request_type",
     {"active", "max", "scheduled", "context", "waiting"}),
    ("tensorrt_llm.metrics", "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type",
     {"max", "free", "used", "tokens_per", "reused", "fraction"}),
    ("tensorrt_llm.metrics", "nv_trt_llm_runtime_memory_metrics", "memory_type", {"cpu", "gpu", "pinned"}),
])
def test_tensorrt_llm_fixture_has_the_documented_kinds(fixture, name, kind_label, kinds):
    got = families(fixture)[name]
    assert {dict(labels)[kind_label] for labels in got} == kinds
    assert all({"model", "version"} <= dict(labels).keys() for labels in got)


@pytest.mark.parametrize("fixture, present, absent", [
    ("vllm_backend.metrics", {"vllm:gpu_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_requests_running",
                              "vllm:num_preemptions_total"}, {"vllm:kv_cache_usage_perc"}),
    ("vllm-0.10.metrics", {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_hits_total",
                           "vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_queries_total"}, set()),
])
def test_vllm_fixtures_have_the_documented_names(fixture, present, absent):
    names = set(families(fixture))
    assert present <= names and not absent & names


def test_every_engine_family_the_rules_read_is_in_a_fixture():
    spec = spec_from_dict({})
    read = {n for rel, text in outputs(spec).items() if rel == f"{RULES_DIR}/engine.yml"
            for g in yaml.safe_load(text)["groups"] for r in g["rules"] for n in metric_names(r["expr"])
            if n.startswith(("nv_trt_llm_", "vllm:"))}
    written = {n for f in ENGINES for n in families(f)}
    assert read and read <= written, sorted(read - written)


# ------------------------------------------------------------------------------------ live, real Prometheus
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine")
    servers = {f: EngineExposition(f) for f in ENGINES}
    raw = {
        "targets": {"triton": [{"name": t, "node": n, "url": f"http://{s.address}",
                                "metrics_url": f"http://{s.address}/metrics", "metrics_interval_ms": 1000}
                               for f, s in servers.items() for t, n, _ in [ENGINES[f]]],
                    "triton_collectors": [], "gpu_exporters": [], "gateways": []},
        **FAST_ENGINE_SPEC,
    }
    spec = spec_from_dict(raw)
    config = write_engine_prometheus(spec, tmp, alerting=True)
    try:
        prom = start_prometheus(tmp, config)
    except Exception:
        for s in servers.values():
            s.stop()
        raise
    yield spec, servers, prom
    prom.stop()
    for s in servers.values():
        s.stop()


def wait_value(prom, expr: str, predicate, what: str):
    """The query's samples once `predicate(samples)` holds, polled until the deadline."""
    deadline = time.monotonic() + DEADLINE
    samples: list = []
    while time.monotonic() < deadline:
        samples = prom.query(expr)
        if predicate(samples):
            return samples
        time.sleep(0.5)
    raise AssertionError(f"{what}: {expr} gave {samples} until the deadline")


def one(samples) -> float:
    [s] = samples
    return float(s["value"][1])


def test_live_recordings_alert_dashboard_and_triage(live):
    spec, servers, prom = live
    trt, vllm_old, vllm_next = (servers[f] for f in ENGINES)
    # Healthy first: a quarter of the TensorRT-LLM cache used, nobody waits, vLLM's old name read as 0.4.
    kv = engine.KV_USED
    wait_value(prom, f'{kv}{{triton="triton-trt", backend="tensorrt_llm"}}',
               lambda s: len(s) == 1 and abs(one(s) - 0.25) < 1e-9, "TensorRT-LLM used / max blocks")
    wait_value(prom, f'{kv}{{triton="triton-vllm", backend="vllm"}}',
               lambda s: len(s) == 1 and abs(one(s) - 0.4) < 1e-9, "vLLM's older KV-cache name")
    # vLLM 0.10 writes both names: one series, from the newer name (set apart to see which one is read).
    vllm_next.set("vllm:gpu_cache_usage_perc", 0.99)
    vllm_next.set("vllm:kv_cache_usage_perc", 0.55)
    wait_value(prom, f'{kv}{{triton="triton-next"}}', lambda s: len(s) == 1 and abs(one(s) - 0.55) < 1e-9,
               "the newer vLLM name preferred")
    assert prom.query('ALERTS{alertname="EngineKvCacheFull"}') == []
    # The cache fills and 37 requests wait: the alert, warning then critical (for 3s).
    trt.set("nv_trt_llm_kv_cache_block_metrics", 6200, kv_cache_block_type="used")
    trt.set("nv_trt_llm_kv_cache_block_metrics", 40, kv_cache_block_type="free")
    trt.set("nv_trt_llm_request_metrics", 37, request_type="waiting")
    trt.set("nv_trt_llm_request_metrics", 64, request_type="active")
    vllm_old.ramp("vllm:num_preemptions_total", 2.0)
    vllm_next.ramp("vllm:prefix_cache_queries_total", 100.0)
    vllm_next.ramp("vllm:prefix_cache_hits_total", 25.0)
    firing = wait_value(prom, 'ALERTS{alertname="EngineKvCacheFull", alertstate="firing"}',
                        lambda s: {x["metric"]["severity"] for x in s} == {"warning", "critical"}, "EngineKvCacheFull")
    assert {(x["metric"]["triton"], x["metric"]["model"], x["metric"]["backend"]) for x in firing} == {
        ("triton-trt", "tensorrt_llm", "tensorrt_llm")}
    wait_value(prom, 'ALERTS{alertname="EnginePreemptionsHigh", alertstate="firing"}',
               lambda s: [x["metric"]["triton"] for x in s] == ["triton-vllm"], "EnginePreemptionsHigh")
    # Every query of the dashboard's engine row returns data now.
    panels = engine_row(dashboards(spec)["triton"])
    assert [p["title"] for p in panels] == ENGINE_PANELS
    for panel in panels:
        for target in panel["targets"]:
            wait_value(prom, concrete(target["expr"]), lambda s: len(s) > 0, f"panel {panel['title']}")
    hits = wait_value(prom, f'{engine.PREFIX_HITS}{{triton="triton-next"}}', lambda s: len(s) == 1,
                      "prefix-cache hit ratio")
    assert one(hits) == pytest.approx(0.25, rel=0.1)
    # Triage of a queue-time alert on the full engine names the KV cache with its figures; on the vLLM
    # engine (cache 40 % used) it names no engine cause, and a model no engine reports for stays silent.
    runbooks = load_runbooks()
    source = PrometheusSource(prom.url)

    def causes(labels):
        result = triage_alert("TritonQueueTimeP95High", labels, runbooks["TritonQueueTimeP95High"], source, "",
                              spec=spec)
        return ({f.cause: f.summary for f in result.findings},
                {f.cause for f in result.not_judged})

    made, unjudged = causes({"node": "node-t", "triton": "triton-trt", "model": "tensorrt_llm", "version": "1"})
    assert "kv-cache-full" in made and "37" in made["kv-cache-full"] and "99.4 %" in made["kv-cache-full"]
    assert "engine-saturated" in made and "64" in made["engine-saturated"]
    made, unjudged = causes({"node": "node-v", "triton": "triton-vllm", "model": "vllm_model", "version": "1"})
    assert not {"kv-cache-full", "engine-saturated"} & (set(made) | unjudged)
    made, unjudged = causes({"node": "node-a", "triton": "triton-0", "model": "classifier", "version": "1"})
    assert not {"kv-cache-full", "engine-saturated"} & (set(made) | unjudged)


# ------------------------------------------------------------------------------------------ spec validation
@pytest.mark.parametrize("engine_spec, field, words", [
    ("{kv_cache_warning_ratio: 0.99, kv_cache_critical_ratio: 0.98}", "layers.L2.engine.kv_cache_warning_ratio",
     "at most kv_cache_critical_ratio"),
    ("{kv_cache_critical_ratio: 1.5}", "layers.L2.engine.kv_cache_critical_ratio", "ratio in (0, 1]"),
    ("{min_waiting_requests: 0}", "layers.L2.engine.min_waiting_requests", "positive"),
    ("{waiting_growth_for: 5m}", "layers.L2.engine.waiting_growth_for", "longer than prometheus.rate_window"),
    ("{fill_lookback: 1m}", "layers.L2.engine.fill_lookback", "at least prometheus.rate_window"),
])
def test_generate_refuses_engine_thresholds_it_cannot_honour(tmp_path, capsys, engine_spec, field, words):
    path = tmp_path / "spec.yaml"
    path.write_text(f"layers: {{L2: {{engine: {engine_spec}}}}}\n")
    code = cli_main(["generate", "--spec", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{field}: " in err and words in err, err
    assert not (tmp_path / "out").exists()
