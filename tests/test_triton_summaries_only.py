"""A Triton with summaries and no latency counters (`--metrics-config counter_latencies=false`): the generated
rules take the mean request, queue and compute times from the summaries' own `_sum / _count`, so the queue
time's fallback (a NaN quantile) and the averages exist with this Triton as with the default one.

The real tritonserver and the real Prometheus running the generated prometheus.yml and rules."""

from __future__ import annotations

import threading

import pytest
import requests

from inferwatch.rules.generate import outputs
from inferwatch.rules.triton import COMPUTE_AVG, QUEUE_AVG, QUEUE_P95, REQUEST_AVG
from inferwatch.spec import spec_from_dict
from inferwatch.testing.process import free_port
from inferwatch.traffic import infer_classifier

pytestmark = pytest.mark.slow


def test_summaries_only_triton_has_every_mean(triton_factory, prometheus_factory, tmp_path):
    server = triton_factory(extra_args=["--metrics-config=counter_latencies=false"],
                            ready_path="/v2/health/ready")
    infer_classifier(server.url, batch=2)
    text = requests.get(server.metrics_url, timeout=10).text
    # The premise: this Triton exports the summaries and none of the `_us` latency counters.
    assert "nv_inference_queue_summary_us_sum{" in text
    assert "nv_inference_request_summary_us_count{" in text
    assert "nv_inference_queue_duration_us{" not in text
    assert "nv_inference_request_duration_us{" not in text

    spec = spec_from_dict({
        "targets": {"triton": [{"name": "triton-0", "url": server.url, "metrics_url": server.metrics_url,
                                "node": "node-a", "metrics_interval_ms": 1000}],
                    "alertmanager": f"http://127.0.0.1:{free_port()}"},
        "prometheus": {"scrape_interval": "1s", "evaluation_interval": "1s", "rate_window": "10s"}})
    for rel, body in outputs(spec).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    prom = prometheus_factory(tmp_path / "deploy/prometheus/prometheus.yml")

    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            infer_classifier(server.url, batch=2)
            stop.wait(0.05)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        selector = '{model="classifier",node="node-a",triton="triton-0"}'
        means = {}
        for record in (QUEUE_AVG, REQUEST_AVG, COMPUTE_AVG, QUEUE_P95):
            result = prom.wait_for(record + selector, timeout=90)
            means[record] = [float(s["value"][1]) for s in result]
    finally:
        stop.set()
        sender.join(timeout=10)
    # Real means of a tiny model: non-negative seconds, well under one second; a request lasts at least
    # as long as its compute.
    for record, values in means.items():
        assert values and all(0 <= v < 1 for v in values), (record, values)
    assert max(means[REQUEST_AVG]) > 0
    assert max(means[REQUEST_AVG]) >= min(means[COMPUTE_AVG])
