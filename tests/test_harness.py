"""The harness itself: real Triton with every example model, Prometheus scraping it, Alertmanager ready."""

from __future__ import annotations

import requests

from inferwatch.testing.prometheus import write_config
from inferwatch.traffic import infer_classifier, stream_toy_llm


def test_triton_serves_every_example_model(triton):
    index = requests.post(f"{triton.url}/v2/repository/index", timeout=10).json()
    states = {(m["name"], m["version"]): m["state"] for m in index}
    models = [("classifier", "1"), ("classifier", "2"), ("toy_llm", "1"),
              ("chat_ens", "1"), ("tokenize", "1"), ("generate", "1"), ("detokenize", "1")]  # ensemble + steps
    assert states == {m: "READY" for m in models}
    assert requests.get(f"{triton.url}/v2/health/ready", timeout=5).status_code == 200


def test_classifier_config_has_dynamic_batching(triton):
    config = requests.get(f"{triton.url}/v2/models/classifier/config", timeout=10).json()
    assert config["max_batch_size"] == 32
    assert config["dynamic_batching"]["preferred_batch_size"] == [8, 16]


def test_toy_llm_streams_the_requested_tokens_after_the_first_token_delay(triton):
    import time

    started = time.monotonic()
    ok, tokens = stream_toy_llm(triton.url, max_tokens=7, first_token_delay_ms=50, token_delay_ms=5)
    assert ok and tokens == 7
    assert time.monotonic() - started >= 0.05 + 6 * 0.005


def test_toy_llm_fail_ends_the_stream_with_an_error_event(triton):
    ok, tokens = stream_toy_llm(triton.url, max_tokens=6, fail=1.0)
    assert not ok and tokens == 3


def test_classifier_fail_parameter_counts_as_backend_failure(triton):
    def failures():
        text = requests.get(triton.metrics_url, timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith('nv_inference_request_failure{model="classifier",reason="BACKEND"'))

    before = failures()
    assert not infer_classifier(triton.url, fail=1.0)
    assert failures() == before + 1


def test_prometheus_scrapes_triton_and_sees_success_grow(triton, prometheus_factory, tmp_path):
    config = write_config(tmp_path / "prometheus.yml", [
        {"job_name": "triton", "static_configs": [{"targets": [triton.metrics_address]}]}])
    prom = prometheus_factory(config)
    prom.wait_for('up{job="triton"} == 1', timeout=30)
    expr = 'sum(nv_inference_request_success{job="triton",model="classifier"})'
    before = float(prom.wait_for(expr, timeout=30)[0]["value"][1])
    for _ in range(5):
        assert infer_classifier(triton.url, batch=2)
    prom.wait_for(expr, timeout=30, predicate=lambda r: float(r[0]["value"][1]) >= before + 5)


def test_alertmanager_answers_ready(alertmanager_factory, tmp_path):
    config = tmp_path / "alertmanager.yml"
    config.write_text("route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n")
    am = alertmanager_factory(config)
    assert requests.get(f"{am.url}/-/ready", timeout=5).status_code == 200
