"""Gateway metric families (`gateway_*`) and their bucket lists: the one place they are defined.

Both the streaming proxy and the in-process API / ASGI middleware record through `GatewayMetrics`, so a
dashboard cannot tell which one measured a request. Histograms are in seconds (tokens for output length).

Bucket sources (docs/sources.md#llm-user-experience-metrics): vLLM's TTFT list reaches 2560 s and its
ITL/TPOT list 0.01–80 s; OpenTelemetry GenAI uses 0.001–10 s for TTFT and ×4 steps for token counts. Peers
were criticised for buckets too coarse below 50 ms (a proxy adds ~1 ms; a fast model's ITL is 5–20 ms), so
every latency list here is fine below 50 ms and reaches minutes. TTFT_BUCKETS must hold every SLO threshold
the rules generator may use (0.1, 0.2, 0.25, 0.3, 0.5, 1, 2, 5, 10, 20 s): rules/validate.py rejects a spec
whose TTFT threshold is not a bucket edge.
"""

from __future__ import annotations

import http
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inferwatch.billing import request_cost

if TYPE_CHECKING:
    from inferwatch.billing import Billing
    from inferwatch.exporters.gateway.otlp import OtlpExport
    from inferwatch.spec import GatewayOtlp

TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4,
                0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
               0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 80.0)
TPOT_BUCKETS = ITL_BUCKETS
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.75, 1.0, 2.0, 2.5, 5.0, 10.0,
                    20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
OUTPUT_TOKENS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                         131072)
TOKENS_PER_SECOND_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000, 10000)

LABELS = ("tenant", "model", "tier")
# Token types that are parts of gateway_tokens_total's input or output (gateway_token_details_total{type}), in
# meter.DETAIL_FIELDS order: cached_input and cache_creation_input of input, reasoning of output.
DETAIL_TYPES = ("cached_input", "cache_creation_input", "reasoning")
OUTCOMES = ("ok", "error", "cancelled", "timeout")
# How the output-token count of a request was obtained (gateway_token_count_method_total{method}).
#   usage       – the upstream's OpenAI `usage` object (exact);
#   count_field – a cumulative count the upstream puts in each response, e.g. Triton `output_token_count` (exact);
#   events      – counted from token-bearing events, one per event unless the event says more (an estimate
#                 when an upstream packs several tokens into one event without saying so);
#   none        – a successful response that revealed no count (e.g. non-streamed Triton output without a
#                 count field): such requests are not metered, and this series makes that visible.
METHODS = ("usage", "count_field", "events", "none")
# Why an answer's tokens are unknown (gateway_unmetered_responses_total{reason}):
#   encoding      – a Content-Encoding that cannot be decoded, or bytes that do not decode under it;
#   too_large     – an answer (or one event) above gateway.max_answer_bytes;
#   invalid_count – a count the upstream reported that is not one (counts.py); the stream is still read;
#   meter_error   – an unexpected failure while metering (a bug, logged with its traceback once a minute);
#   duplicate_id  – a gRPC stream carried several requests open at once under one request id: which response
#                   belongs to which request cannot be told, so none of them is billed a count.
UNMETERED_REASONS = ("encoding", "too_large", "invalid_count", "meter_error", "duplicate_id")
# The code label's values: the registered HTTP status codes and nginx's 499 (client closed request); any
# other code, e.g. an upstream error object's "code": "rate_limit_exceeded", is "other".
KNOWN_CODES = frozenset({str(int(s)) for s in http.HTTPStatus} | {"499"})


def observe_counts(child, counts: list[int], total: float) -> None:
    """Add to a Histogram child, in one write per non-empty bucket, the observations gathered as `counts`
    (per bucket of the child's bounds, +Inf last: index bisect_left(bounds, value)) summing to `total`.

    The same result as observe() once per value (the unit tests compare both), at a fraction of the writes:
    under prometheus-client's multiprocess mode each write goes to a memory-mapped file. It uses the child's
    `_buckets` and `_sum` values, which prometheus-client has no public bulk method for."""
    buckets = child._buckets
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
    child._sum.inc(total)


def code_label(code: int | str | None) -> str:
    """The bounded `code` label value for an HTTP status or an upstream error object's code."""
    text = str(code).strip() if code is not None and not isinstance(code, bool) else ""
    return text if text in KNOWN_CODES else "other"


class GatewayMetrics:
    """The gateway_* families registered on `registry` (default: a fresh CollectorRegistry).

    `series(tenant, model, tier)` returns the bound children for one label set, cached: label values are
    already folded to a bounded set (labels.LabelPolicy), so the cache is bounded too.
    """

    def __init__(self, registry: CollectorRegistry | None = None, billing: "Billing | None" = None,
                 otlp: "GatewayOtlp | None" = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.billing = billing
        r = self.registry
        self.requests = Counter("gateway_requests", "LLM requests seen by the gateway, by HTTP code and outcome "
                                "(ok|error|cancelled|timeout).", LABELS + ("code", "outcome"), registry=r)
        self.duration = Histogram("gateway_request_duration_seconds", "Request arrival at the gateway to the last "
                                  "byte sent to the client.", LABELS, buckets=DURATION_BUCKETS, registry=r)
        self.upstream_duration = Histogram("gateway_upstream_request_duration_seconds", "Upstream request sent to "
                                           "upstream response fully received.", LABELS, buckets=DURATION_BUCKETS,
                                           registry=r)
        self.ttft = Histogram("gateway_time_to_first_token_seconds", "Streamed requests only: arrival to the first "
                              "event that carries a token.", LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("gateway_inter_token_latency_seconds", "Gap between token-bearing events of one sequence "
                             "divided by the tokens the later event carries, observed once per token; only for "
                             "events whose token count is known (else see gateway_time_per_output_chunk_seconds).",
                             LABELS,
                             buckets=ITL_BUCKETS, registry=r)
        self.chunk_time = Histogram("gateway_time_per_output_chunk_seconds", "Streamed requests: gap between "
                                    "consecutive output chunks of one sequence (choice), observed once per chunk "
                                    "after the first (OpenTelemetry gen_ai.client.operation.time_per_output_chunk); "
                                    "the per-token figure where a chunk's token count is unknown.", LABELS,
                                    buckets=ITL_BUCKETS, registry=r)
        self.tpot = Histogram("gateway_time_per_output_token_seconds", "Per successful streamed request: (last token "
                              "- first token) / (output tokens - 1).", LABELS, buckets=TPOT_BUCKETS, registry=r)
        self.output_tokens = Histogram("gateway_output_tokens", "Output tokens per successful request.", LABELS,
                                       buckets=OUTPUT_TOKENS_BUCKETS, registry=r)
        self.tokens_per_second = Histogram("gateway_output_tokens_per_second", "Per successful request: output "
                                           "tokens / request duration.", LABELS,
                                           buckets=TOKENS_PER_SECOND_BUCKETS, registry=r)
        self.tokens = Counter("gateway_tokens", "Tokens metered (type=input|output), every outcome included: the "
                              "billing counter.", LABELS + ("type",), registry=r)
        self.token_details = Counter("gateway_token_details", "Token types the upstream's usage reported, parts of "
                                     "gateway_tokens_total (type=cached_input|cache_creation_input of input, "
                                     "reasoning of output): never add them to it.", LABELS + ("type",), registry=r)
        # Money has no Prometheus base unit and a spec has one currency: the unit is the `currency` label (ISO
        # 4217), not a name suffix that would be wrong for every other currency (e.g. _dollars).
        self.cost = Counter("gateway_cost", "Cost of the requests metered, in the currency label's units, from the "
                            "spec's billing.prices per million tokens (billing.py); a request whose "
                            "input or output count is unknown adds nothing and is counted in "
                            "gateway_cost_unknown_requests_total.", LABELS + ("currency",), registry=r)
        self.cost_unknown = Counter("gateway_cost_unknown_requests", "Requests whose cost is unknown: reason="
                                    "unknown_tokens (an input or output count unknown) or no_price (a model "
                                    "without a price).", ("model", "reason"), registry=r)
        # livesum: with --workers, the sum over live workers (a dead worker's requests are no longer in flight).
        self.in_flight = Gauge("gateway_requests_in_flight", "LLM requests in progress at the gateway.", LABELS,
                               registry=r, multiprocess_mode="livesum")
        self.count_method = Counter("gateway_token_count_method", "Requests by how their output tokens were counted "
                                    "(usage|count_field exact, events counted).", ("model", "method"), registry=r)
        self.unmetered = Counter("gateway_unmetered_responses", "LLM answers forwarded with their tokens unknown: "
                                 "reason=encoding (a Content-Encoding that cannot be decoded), too_large (above "
                                 "gateway.max_answer_bytes), invalid_count (the upstream reported a count that "
                                 "is not one: negative, not an integer, too large) or meter_error (a metering "
                                 "failure).", ("model", "reason"), registry=r)
        self._series: dict[tuple[str, str, str], Series] = {}
        # The GenAI OpenTelemetry export (spec gateway.otlp), fed by RequestMeter.finish beside these families.
        self.otlp: "OtlpExport | None" = None
        if otlp is not None and otlp.enabled:
            from inferwatch.exporters.gateway.otlp import OtlpExport

            self.otlp = OtlpExport(otlp, self.registry)

    def series(self, tenant: str, model: str, tier: str) -> "Series":
        key = (tenant, model, tier)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = Series(self, key)
        return found


class Series:
    """Children of every family for one (tenant, model, tier): label lookups happen once, not per token."""

    __slots__ = ("metrics", "key", "duration", "upstream_duration", "ttft", "itl", "chunk_time", "tpot",
                 "output_tokens", "tokens_per_second", "_tokens", "in_flight", "_requests", "_methods",
                 "_details", "_rates", "_cost")

    def __init__(self, metrics: GatewayMetrics, key: tuple[str, str, str]):
        self.metrics = metrics
        self.key = key
        self.duration = metrics.duration.labels(*key)
        self.upstream_duration = metrics.upstream_duration.labels(*key)
        self.ttft = metrics.ttft.labels(*key)
        self.itl = metrics.itl.labels(*key)
        self.chunk_time = metrics.chunk_time.labels(*key)
        self.tpot = metrics.tpot.labels(*key)
        self.output_tokens = metrics.output_tokens.labels(*key)
        self.tokens_per_second = metrics.tokens_per_second.labels(*key)
        # Token counters are created on first use: a series never told a count has no sample (not 0).
        self._tokens: dict[str, Counter] = {}
        # Children of the per-request counters, found once (a label lookup takes the family's lock).
        self._requests: dict[tuple, Counter] = {}
        self._methods: dict[str, Counter] = {}
        self.in_flight = metrics.in_flight.labels(*key)
        self._details: list | None = None  # token-type children, created on a first report
        # The model's per-token rates, looked up once per label set (billing.Price.rates); None: unpriced.
        billing = metrics.billing
        price = billing.prices.get(key[1]) if billing is not None and billing.enabled else None
        self._rates = price.rates() if price is not None else None
        self._cost = metrics.cost.labels(*key, billing.currency) if billing is not None and price is not None \
            else None

    def add_details(self, details: list) -> None:
        """Add the reported token types ([cached_input, cache_creation_input, reasoning], None: not reported)."""
        children = self._details
        if children is None:
            children = self._details = [None, None, None]
        for i, n in enumerate(details):
            if n:
                child = children[i]
                if child is None:
                    child = children[i] = self.metrics.token_details.labels(*self.key, DETAIL_TYPES[i])
                child.inc(n)

    def add_cost(self, inputs: int | None, outputs: int | None, details) -> float | None:
        """Add one request's cost (billing.request_cost) to gateway_cost_total and return it; None (and
        counted in gateway_cost_unknown_requests_total) when it is unknown. Nothing when billing is off."""
        billing = self.metrics.billing
        if billing is None or not billing.enabled:
            return None
        rates, child = self._rates, self._cost
        if rates is None or child is None:
            self.metrics.cost_unknown.labels(self.key[1], "no_price").inc()
            return None
        cost = request_cost(rates, inputs, outputs, details) if any(rates) else 0.0  # a free model costs 0
        if cost is None:
            self.metrics.cost_unknown.labels(self.key[1], "unknown_tokens").inc()
            return None
        child.inc(cost)
        return cost

    def count_request(self, code: int | str, outcome: str) -> None:
        key = (code, outcome)
        child = self._requests.get(key)
        if child is None:  # bounded: codes fold to KNOWN_CODES | {"other"}, outcomes are four
            if len(self._requests) > 256:
                self._requests.clear()  # raw codes that fold alike (other) do not grow it without end
            child = self._requests[key] = self.metrics.requests.labels(*self.key, code_label(code), outcome)
        child.inc()

    def add_tokens(self, kind: str, n: int) -> None:
        """Add `n` tokens of `kind` (input|output) to gateway_tokens_total."""
        child = self._tokens.get(kind)
        if child is None:
            child = self._tokens[kind] = self.metrics.tokens.labels(*self.key, kind)
        child.inc(n)

    def count_unmetered(self, reason: str) -> None:
        self.metrics.unmetered.labels(self.key[1], reason).inc()

    def count_method(self, method: str) -> None:
        child = self._methods.get(method)
        if child is None:
            child = self._methods[method] = self.metrics.count_method.labels(self.key[1], method)
        child.inc()
