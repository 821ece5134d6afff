"""The exact share is triage's headline where a condition compares a histogram quantile with a target that is a
bucket edge (inferwatch/triage/share.py): the share of first tokens within the tier's target, exact from the
bucket counts, before the P95 estimate. Pure rows for the parts, then LlmTtftP95High end to end against a real
Prometheus serving backfilled gateway histograms."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from conftest import REPO_ROOT
from inferwatch.spec import load_spec
from inferwatch.testing.backfill import counter, gauge, serve_series
from inferwatch.triage.engine import triage_alert
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.share import compared_with, exact_share, quantile_of, share_text
from inferwatch.triage.sources import PrometheusSource


def _buckets(pairs):
    return [({"le": le}, v) for le, v in pairs]


# id -> (cumulative bucket rates, threshold, divisor, exact share)
SHARES = {
    # The example: every first token at 0.903 s or more, all inside the 0.75-1.0 bucket; the
    # standard tier's 1 s target is an edge, so the share within it is exact: all of them.
    "all-in-0.75-1.0-target-1s": (_buckets([("0.75", 0), ("1.0", 6), ("1.5", 6), ("+Inf", 6)]), 1.0, 1, 1.0),
    "go-client-spelling-le-1": (_buckets([("0.75", 0), ("1", 6), ("+Inf", 6)]), 1.0, 1, 1.0),
    "realtime-91.2pct-within-0.3s": (_buckets([("0.25", 50), ("0.3", 91.2), ("0.4", 99), ("+Inf", 100)]), 0.3, 1,
                                     0.912),
    "exactly-95pct": (_buckets([("0.3", 19), ("0.5", 20), ("+Inf", 20)]), 0.3, 1, 0.95),
    "milliseconds-histogram-read-in-seconds": (_buckets([("250", 3), ("500", 9), ("+Inf", 10)]), 0.5, 1000, 0.9),
    "target-between-edges-no-exact-share": (_buckets([("0.3", 5), ("0.4", 9), ("+Inf", 10)]), 0.35, 1, None),
    "no-observation-unknown-not-0": (_buckets([("0.3", 0), ("+Inf", 0)]), 0.3, 1, None),
    "no-inf-bucket": (_buckets([("0.3", 5), ("0.4", 9)]), 0.3, 1, None),
}


@pytest.mark.parametrize("row", list(SHARES))
def test_exact_share_from_the_bucket_at_the_target(row):
    buckets, threshold, divisor, expected = SHARES[row]
    got = exact_share(buckets, threshold, divisor)
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("share, shown, q, text", [
    (0.912, "300 ms", 0.95, "91.2 % of observations within 300 ms (exact, from the histogram's bucket at 300 ms); "
                            "the P95 target needs 95 %"),
    (1.0, "1.00 s", 0.95, "100.0 % of observations within 1.00 s"),
    (0.9496, "300 ms", 0.95, "94.9 % of observations"),   # never rounded up to the 95 % it misses
    (0.95, "300 ms", 0.95, "95.0 % of observations"),
    (0.985, "2.00 s", 0.99, "98.5 % of observations within 2.00 s (exact, from the histogram's bucket at 2.00 s); "
                            "the P99 target needs 99 %"),
])
def test_share_text(share, shown, q, text):
    assert share_text(share, shown, q).startswith(text)


@pytest.mark.parametrize("when, expected", [
    ("ttft_p95_seconds > ttft_target_seconds and request_rate > min_request_rate", "ttft_target_seconds"),
    ("ttft_target_seconds < ttft_p95_seconds", "ttft_target_seconds"),
    ("ttft_p95_seconds >= ttft_target_seconds", "ttft_target_seconds"),
    ("request_rate > min_request_rate", None),
    ("ttft_p95_seconds_other > ttft_target_seconds", None),
])
def test_the_threshold_a_quantile_is_compared_with(when, expected):
    assert compared_with(when, "ttft_p95_seconds", ["min_request_rate", "ttft_target_seconds"]) == expected


@pytest.mark.parametrize("expr, q", [
    ("histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m])))", 0.95),
    ("histogram_quantile(0.5, sum by (le) (rate(x_bucket[5m]))) / 1000", 0.5),
    ("max(x{quantile=\"0.95\"})", None),
    ("histogram_quantile(1.5, x)", None),
])
def test_quantile_of(expr, q):
    assert quantile_of(expr) == q


# ------------------------------------------------------------------------ end to end: LlmTtftP95High
SPEC = load_spec(REPO_ROOT / "inferwatch.yaml")   # realtime P95 target 0.3 s, standard 1 s
AGO_S = 60
SPAN_S = 20 * 60
EDGES = ("0.25", "0.3", "0.4", "0.5", "0.75", "1.0", "1.5", "+Inf")

# tier -> (per-second rate of observations at or below each edge of EDGES)
TIERS = {
    # realtime: 2 req/s, 90 % within 0.3 s: the P95 estimate lies in 0.3-0.4, the exact share is 90 %.
    "realtime": (1.0, 1.8, 1.9, 1.96, 2.0, 2.0, 2.0, 2.0),
    # standard: the example, every first token in 0.75-1.0: P95 reads 0.99 s, 100 % within 1 s.
    "standard": (0, 0, 0, 0, 0, 1.0, 1.0, 1.0),
}


def _series(end: float):
    out, start = [], end - SPAN_S
    scrape = {"job": "inferwatch-gateway", "instance": "gw:9402", "node": "node-a"}
    out.append(gauge("up", scrape, 1, start, end))
    for tier, rates in TIERS.items():
        labels = {**scrape, "tenant": "acme", "model": "toy_llm", "tier": tier}
        for le, rate in zip(EDGES, rates, strict=True):
            out.append(counter("gateway_time_to_first_token_seconds_bucket", {**labels, "le": le}, rate, start, end))
        out.append(counter("gateway_time_to_first_token_seconds_count", labels, rates[-1], start, end))
        out.append(counter("gateway_requests_total", {**labels, "code": "200", "outcome": "ok"}, rates[-1],
                           start, end))
    return out


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("exact-share-prom")
    end = time.time() - AGO_S
    server = serve_series(_series(end), work)
    yield SimpleNamespace(url=server.url, end=end)
    server.stop()


# tier, labels beyond the tier, exact share, condition holds, words of the condition's summary (headline first)
CASES = [
    ("realtime", {"tenant": "acme", "model": "toy_llm"}, 0.9, True,
     ["90.0 % of observations within 300 ms (exact", "the P95 target needs 95 %. TTFT P95 ≈",
      "a histogram estimate between 300 ms and 400 ms"]),
    ("standard", {"model": "toy_llm"}, 1.0, False,
     ["100.0 % of observations within 1.00 s (exact", "TTFT P95 ≈ 988 ms, a histogram estimate between 750 ms "
                                                       "and 1.00 s"]),
]


@pytest.mark.parametrize("tier, extra, share, holds, words", CASES, ids=[c[0] for c in CASES])
def test_the_exact_share_heads_the_condition(prometheus, tier, extra, share, holds, words):
    labels = {"alertname": "LlmTtftP95High", "tier": tier, **extra}
    source = PrometheusSource(prometheus.url, at=prometheus.end)
    r = triage_alert("LlmTtftP95High", labels, load_runbooks()["LlmTtftP95High"], source, "", spec=SPEC)
    assert [(x.query, x.threshold_name) for x in r.exact_shares] == [("ttft_p95_seconds", "ttft_target_seconds")]
    assert r.exact_shares[0].share == pytest.approx(share)
    assert r.condition is not None and r.condition.holds is holds, r.to_dict()
    assert r.condition.summary.startswith(words[0]), r.condition.summary
    for word in words:
        assert word in r.condition.summary, r.condition.summary
    doc = r.to_dict()["exact_shares"][0]
    assert (doc["threshold"], doc["quantile"]) == ("ttft_target_seconds", 0.95)
    assert doc["share"] == pytest.approx(share)
