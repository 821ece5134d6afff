"""Every quantile triage writes says it is a histogram estimate and names the bucket it lies in: pure tables of
the parsing and bucketing, and the issue's example through a real Prometheus (every first token at ≥ 0.903 s,
all in the 0.75–1.0 s bucket, read as "P95 0.99 s")."""

from __future__ import annotations

import math
import time

import pytest

from conftest import REPO_ROOT
from inferwatch.spec import load_spec
from inferwatch.testing.backfill import counter, serve_series
from inferwatch.triage.engine import shown_value, triage_alert
from inferwatch.triage.estimates import bucket_of, split_quantile
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.sources import PrometheusSource

INNER = 'sum by (le) (rate(x_bucket{job="a"}[5m]))'


@pytest.mark.parametrize("expr, expected", [
    (f"histogram_quantile(0.95, {INNER})", (INNER, 1.0)),
    (f"histogram_quantile(0.95, {INNER})\n/ 1000", (INNER, 1000.0)),     # Triton's milliseconds
    (f"histogram_quantile(0.5, {INNER}) / 1e6", (INNER, 1e6)),
    (f"histogram_quantile(0.95, {INNER}) or vector(0)", None),         # not a plain quantile
    ('max(nv_inference_queue_summary_us{quantile="0.95"})', None),       # a summary's quantile: Triton's own
    ("sum(rate(x[5m]))", None),
])
def test_split_quantile(expr, expected):
    assert split_quantile(expr) == expected


EDGES = [0.5, 0.75, 1.0, 1.5, 2.0, math.inf]


@pytest.mark.parametrize("value, bucket", [
    (0.9875, (0.75, 1.0)),     # the "P95 0.99 s"
    (0.875, (0.75, 1.0)),      # and its "P50 0.875 s"
    (1.97, (1.5, 2.0)),        # the demo's 1.97 s for an injected 1.5 s delay
    (1.0, (0.75, 1.0)),        # on an edge: the bucket it closes
    (0.2, (0.0, 0.5)),
    (2.0001, (2.0, math.inf)),
])
def test_bucket_of(value, bucket):
    assert bucket_of(value, EDGES) == bucket


@pytest.mark.parametrize("value, unit, bucket, text", [
    (0.9875, "seconds", (0.75, 1.0), "≈ 988 ms, a histogram estimate between 750 ms and 1.00 s"),
    (1.97, "seconds", (1.5, 2.0), "≈ 1.97 s, a histogram estimate between 1.50 s and 2.00 s"),
    (2.5, "seconds", (2.0, math.inf), "≈ 2.50 s, a histogram estimate above the last bucket edge 2.00 s"),
    (0.9875, "seconds", None, "988 ms"),    # not a quantile: shown as measured
    (None, "seconds", (0.75, 1.0), "no data"),
])
def test_shown_value(value, unit, bucket, text):
    assert shown_value(value, unit, bucket) == text


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    end = time.time() - 30
    start = end - 30 * 60
    gw = {"job": "inferwatch-gateway", "instance": "gw:9402", "node": "node-gw", "tenant": "acme",
          "model": "llm-estimate", "tier": "realtime"}
    # Every first token between 0.903 s and 1.0 s: the 0.75 s bucket holds none, the 1.0 s bucket all of them.
    series = [counter("gateway_time_to_first_token_seconds_bucket", {**gw, "le": le}, rate, start, end)
              for le, rate in (("0.5", 0.0), ("0.75", 0.0), ("1.0", 10.0), ("1.5", 10.0), ("+Inf", 10.0))]
    series += [counter("gateway_time_to_first_token_seconds_count", gw, 10.0, start, end),
               counter("gateway_requests_total", {**gw, "outcome": "success", "code": "200"}, 10.0, start, end)]
    work = tmp_path_factory.mktemp("estimates-prom")
    server = serve_series(series, work)
    server.end = end
    yield server
    server.stop()


def test_triage_calls_the_p95_an_estimate_and_names_its_bucket(prometheus):
    labels = {"alertname": "LlmTtftP95High", "model": "llm-estimate", "tier": "realtime", "tenant": "acme"}
    r = triage_alert("LlmTtftP95High", labels, load_runbooks()["LlmTtftP95High"],
                     PrometheusSource(prometheus.url, at=prometheus.end), "",
                     spec=load_spec(REPO_ROOT / "inferwatch.yaml"))
    [p95] = [e for e in r.evidence if e.result.name == "ttft_p95_seconds"]
    assert p95.result.value == pytest.approx(0.9875)
    assert p95.bucket == (0.75, 1.0)
    words = "a histogram estimate between 750 ms and 1.00 s"
    assert p95.shown == f"≈ 988 ms, {words}"
    assert r.condition.holds is True and words in r.condition.summary, r.condition.summary
    assert r.to_dict()["evidence"][[e.result.name for e in r.evidence].index("ttft_p95_seconds")][
        "estimate_bucket"] == [0.75, 1.0]
    # A measured value (the request rate) is shown as it is.
    [rate] = [e for e in r.evidence if e.result.name == "request_rate"]
    assert rate.bucket is None and "estimate" not in rate.shown
