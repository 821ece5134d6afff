"""A vLLM server of its own, not on Triton, read through the `engine` selector end to end: two replicas of
one vLLM 0.10 server (tests/fixtures/engine/vllm-server-0.10.metrics: vLLM's own labels model_name and
engine, both spellings of the renamed KV-cache family) scraped by the real Prometheus under their own job
`vllm`, with a spec whose `upstreams` serve the model from an OpenAI-compatible upstream (not Triton).
Each replica is one engine and alerts apart; the newer KV-cache name is the one read; triage of a slow-TTFT
alert on that model skips its Triton evidence yet names `kv-cache-full` from the engines' figures.
(The promtool table of the same shapes, Triton's port included: rules/tests/engine_sources.yml.)
"""

from __future__ import annotations

import time

import pytest

from engine_support import FAST_ENGINE_SPEC, EngineExposition, write_engine_prometheus
from inferwatch.rules import engine
from inferwatch.spec import spec_from_dict
from inferwatch.triage.engine import triage_alert
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.sources import PrometheusSource
from inferwatch.upstreams import kind_of

DEADLINE = 60.0
FIXTURE = "vllm-server-0.10.metrics"


def wait_value(prom, expr: str, predicate, what: str):
    deadline = time.monotonic() + DEADLINE
    samples: list = []
    while time.monotonic() < deadline:
        samples = prom.query(expr)
        if predicate(samples):
            return samples
        time.sleep(0.5)
    raise AssertionError(f"{what}: {expr} gave {samples} until the deadline")


@pytest.fixture
def vllm_fleet(tmp_path, prometheus_factory):
    replicas = [EngineExposition(FIXTURE), EngineExposition(FIXTURE)]
    try:
        raw = {
            "targets": {"triton": [], "triton_collectors": [], "gpu_exporters": [], "gateways": []},
            "upstreams": {"triton": {"url": "http://127.0.0.1:8000", "kind": "triton", "default": True},
                          "vllm": {"url": "http://127.0.0.1:8001", "kind": "openai", "models": ["llama"]}},
            **FAST_ENGINE_SPEC,
        }
        spec = spec_from_dict(raw)
        # As kube-prometheus-stack scrapes a vLLM Deployment: a job of its own, vLLM's labels as written.
        vllm_job = {"job_name": "vllm", "scrape_interval": "1s",
                    "static_configs": [{"targets": [r.address for r in replicas]}]}
        prom = prometheus_factory(write_engine_prometheus(spec, tmp_path, [vllm_job]))
        yield spec, replicas, prom
    finally:
        for r in replicas:
            r.stop()


def test_a_vllm_server_of_its_own_alerts_per_replica_and_triage_names_its_cache(vllm_fleet):
    spec, (a, b), prom = vllm_fleet
    assert kind_of(spec, "llama") == "openai"
    # Both replicas' caches fill (the deprecated name says otherwise: it is not read) and requests wait.
    for replica, waiting in ((a, 7), (b, 3)):
        replica.set("vllm:kv_cache_usage_perc", 0.95)
        replica.set("vllm:gpu_cache_usage_perc", 0.5)
        replica.set("vllm:num_requests_waiting", waiting)
    used = wait_value(prom, f'{engine.KV_USED}{{model="llama"}}',
                      lambda s: len(s) == 2 and all(float(x["value"][1]) == 0.95 for x in s), "KV cache per replica")
    assert {x["metric"]["instance"] for x in used} == {a.address, b.address}
    assert all(x["metric"]["engine"] == "0" and x["metric"]["backend"] == "vllm" and "triton" not in x["metric"]
               and "model_name" not in x["metric"] for x in used)
    firing = wait_value(prom, 'ALERTS{alertname="EngineKvCacheFull", alertstate="firing"}',
                        lambda s: len(s) == 2, "one EngineKvCacheFull per replica")
    assert {(x["metric"]["instance"], x["metric"]["model"], x["metric"]["severity"]) for x in firing} == {
        (a.address, "llama", "warning"), (b.address, "llama", "warning")}

    # Triage of the model's slow first tokens: Triton's evidence does not apply (an openai upstream), the
    # engines' does: both caches at 95 %, 7 + 3 requests waiting in them.
    result = triage_alert("LlmTtftP95High", {"model": "llama", "tier": "realtime"},
                          load_runbooks()["LlmTtftP95High"], PrometheusSource(prom.url), "", spec=spec)
    evidence = {e.result.name: e for e in result.evidence}
    assert evidence["engine_kv_cache_used_ratio"].skipped is None
    assert evidence["engine_kv_cache_used_ratio"].result.value == pytest.approx(0.95)
    assert evidence["engine_waiting_requests"].result.value == pytest.approx(10)
    assert any(e.skipped and "not Triton" in e.skipped for e in result.evidence)
    made = {f.cause: f.summary for f in result.findings}
    assert "kv-cache-full" in made, (made, result.not_judged)
    assert "95" in made["kv-cache-full"] and "10" in made["kv-cache-full"]
