"""OpenTelemetry export of the gateway's metrics under the GenAI semantic conventions (docs/gateway-otlp.md).

Opt-in (`gateway.otlp.endpoint` in the spec). The OpenTelemetry SDK's MeterProvider holds four histograms and
its PeriodicExportingMetricReader sends them, from its own thread, to a collector over OTLP/HTTP protobuf:

- `gen_ai.client.token.usage` ({token}, gen_ai.token.type input|output): the gateway is the client of the
  model server it forwards to, and the conventions define token usage for clients only (Envoy AI Gateway,
  also a proxy, emits the same). Sums equal gateway_tokens_total: the points are recorded in
  RequestMeter.finish next to the Prometheus counter, under the same condition (a known count above 0).
- `gen_ai.server.request.duration` (s, error.type on failed requests): what gateway_request_duration_seconds
  observes, once per request.
- `gen_ai.server.time_to_first_token` (s): streamed requests that succeeded (the conventions: "for
  successful responses"; gateway_time_to_first_token_seconds also counts failed streams that got a token).
- `gen_ai.server.time_per_output_token` (s): what gateway_time_per_output_token_seconds observes.

Bucket boundaries are the conventions' explicit ones (semantic-conventions v1.41.0, docs/sources.md), given
to the SDK as the instruments' advisory. Temporality is cumulative for every instrument: a lost export loses
nothing (the next one carries the totals), Prometheus-compatible backends (and the collector's prometheus
exporters) need it, and it is what the gateway's own counters are. Attributes: gen_ai.operation.name,
gen_ai.provider.name, gen_ai.request.model (the bounded `model` label), error.type, and the custom
`inferwatch.tenant` / `inferwatch.tier` (the bounded `tenant` / `tier` labels: LabelPolicy folds undeclared
values into `other`), so a point's attribute sets are as many as the Prometheus series.

Every worker of `--workers N` exports its own points, with its own `service.instance.id` in the resource
(cumulative streams of two writers must never share an identity); a collector or backend sums them.

A failed export (collector down, refused, an HTTP error) is counted in `gateway_otlp_exports_total
{result="failure"}` and logged once a minute, never with the headers (the SDK never logs them; the revealed
values are redacted from every log line by inferwatch.redaction); it never reaches a request.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Sequence

from prometheus_client import CollectorRegistry, Counter

from inferwatch.ratelog import ConditionLog
from inferwatch.redaction import address

if TYPE_CHECKING:
    from inferwatch.spec import GatewayOtlp

log = logging.getLogger(__name__)

# semantic-conventions v1.41.0, the GenAI metrics page gen-ai-metrics.md (ExplicitBucketBoundaries of each metric).
SEMCONV_VERSION = "1.41.0"
TOKEN_USAGE_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
                       67108864)
REQUEST_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0)

# The API a metered request used (RequestMeter.api) → (gen_ai.operation.name, gen_ai.provider.name by
# dialect). The conventions' well-known values where one applies: chat for the chat-shaped APIs (OpenAI chat
# completions and Responses, Anthropic Messages), text_completion for prompt-in text-out ones (OpenAI
# completions, Triton generate / infer), embeddings; openai / anthropic name the dialect's provider, and
# Triton, not in the conventions' list, is the custom value `triton`.
APIS = {
    "chat": ("chat", "openai"),
    "completions": ("text_completion", "openai"),
    "responses": ("chat", "openai"),
    "messages": ("chat", "anthropic"),
    "embeddings": ("embeddings", "openai"),
    "triton": ("text_completion", "triton"),
}
# error.type of a failed request: its outcome for timeouts and cancellations, else its bounded code label
# (metrics.code_label); the conventions' fallback `_OTHER` for codes outside the registered ones.
OTHER_ERROR = "_OTHER"


def api_of(protocol: str, path_key: str) -> str:
    """The RequestMeter.api of a Route's `protocol` and its route key (routes.route_key of the path): OpenAI
    chat and text completions share protocol "openai" and are told apart by the path."""
    if protocol == "openai":
        return "chat" if path_key.endswith("/chat/completions") else "completions"
    if protocol == "triton":
        return "triton"
    return protocol if protocol in APIS else "chat"


class _Attributes:
    """The attribute sets of one (tenant, model, tier, api), built once."""

    __slots__ = ("base", "input", "output", "errors")

    def __init__(self, key: tuple[str, str, str], api: str, provider: str):
        tenant, model, tier = key
        operation, by_dialect = APIS.get(api, APIS["chat"])
        self.base = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider or by_dialect,
                     "gen_ai.request.model": model, "inferwatch.tenant": tenant, "inferwatch.tier": tier}
        self.input = {**self.base, "gen_ai.token.type": "input"}
        self.output = {**self.base, "gen_ai.token.type": "output"}
        self.errors: dict[str, dict[str, str]] = {}

    def error(self, error_type: str) -> dict[str, str]:
        found = self.errors.get(error_type)
        if found is None:  # bounded: error types are the known codes, _OTHER, timeout and cancelled
            found = self.errors[error_type] = {**self.base, "error.type": error_type}
        return found


class OtlpExport:
    """The GenAI instruments and their periodic OTLP/HTTP export, for one gateway process.

    Built from the spec's `gateway.otlp` (enabled) and the Prometheus `registry` its self-metric
    `gateway_otlp_exports_total{result=success|failure}` goes to. Reveals the headers' secrets (SpecError,
    naming the field, when one cannot be resolved). `record` is called by RequestMeter.finish; `shutdown`
    sends a last export (bounded by the timeout) and stops the reader's thread.
    """

    def __init__(self, settings: "GatewayOtlp", registry: CollectorRegistry):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, Histogram, MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        headers = {name: secret.reveal() for name, secret in settings.headers.items()}
        self.provider_name = settings.provider_name
        self.exports = Counter("gateway_otlp_exports", "OTLP exports of the GenAI metrics by result (success|"
                               "failure: collector unreachable, an HTTP error, the timeout).", ("result",),
                               registry=registry)
        timeout_s = min(settings.timeout.seconds, settings.interval.seconds)
        exporter = OTLPMetricExporter(endpoint=settings.endpoint, headers=headers, timeout=timeout_s,
                                      preferred_temporality=cumulative())
        self._exporter = _Counting(exporter, self.exports, address(settings.endpoint))
        reader = PeriodicExportingMetricReader(self._exporter, export_interval_millis=settings.interval.ms,
                                               export_timeout_millis=timeout_s * 1000,
                                               cardinality_limits={Histogram: settings.max_attribute_sets})
        resource = Resource.create({"service.name": settings.service_name,
                                    "service.instance.id": f"{socket.gethostname()}-{os.getpid()}-"
                                                           f"{uuid.uuid4().hex[:8]}"})
        # No exemplars: the gateway records no spans, and the filter's context lookup costs every record.
        self.provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False,
                                      exemplar_filter=AlwaysOffExemplarFilter())
        meter = self.provider.get_meter("inferwatch.gateway",
                                        schema_url=f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}")
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_USAGE_BUCKETS)
        self.request_duration = meter.create_histogram(
            "gen_ai.server.request.duration", unit="s", description="Generative AI server request duration such "
            "as time-to-last byte or last output token.", explicit_bucket_boundaries_advisory=REQUEST_DURATION_BUCKETS)
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s", description="Time to generate first token for "
            "successful responses.", explicit_bucket_boundaries_advisory=TIME_TO_FIRST_TOKEN_BUCKETS)
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s", description="Time per output token generated after "
            "the first token for successful responses.",
            explicit_bucket_boundaries_advisory=TIME_PER_OUTPUT_TOKEN_BUCKETS)
        self._attributes: dict[tuple, _Attributes] = {}
        self._lock = threading.Lock()
        self._failed_log = ConditionLog(log)

    def record(self, key: tuple[str, str, str], api: str | None, outcome: str, code: str, duration: float,
               ttft: float | None, inputs: int | None, outputs: int | None, tpots: Sequence[float]) -> None:
        """One finished request: `key` its (tenant, model, tier) labels, `api` its APIS key (None: Triton's
        gRPC API), `code` its bounded code label, `duration` / `ttft` / `tpots` seconds, `inputs` / `outputs`
        its metered token counts (None: unknown, then nothing is recorded for that type)."""
        try:
            attrs = self._attributes.get((key, api))
            if attrs is None:
                with self._lock:  # the gRPC listener's threads and the event loop share the cache
                    attrs = self._attributes.setdefault((key, api), _Attributes(key, api or "triton",
                                                                                self.provider_name))
            if outputs:
                self.token_usage.record(outputs, attrs.output)
            if inputs:
                self.token_usage.record(inputs, attrs.input)
            if outcome == "ok":
                self.request_duration.record(duration, attrs.base)
                if ttft is not None:
                    self.ttft.record(ttft, attrs.base)
                for value in tpots:
                    self.tpot.record(value, attrs.base)
            else:
                error = outcome if outcome in ("timeout", "cancelled") else (OTHER_ERROR if code == "other"
                                                                             else code)
                self.request_duration.record(duration, attrs.error(error))
        except Exception:  # noqa: BLE001 - the export is a side show: it must never fail a request
            self._failed_log.log("record", logging.ERROR, "recording a request's OpenTelemetry points failed; "
                                 "further failures within a minute are not logged", exc_info=True)

    def shutdown(self) -> None:
        """Export what is left and stop (idempotent)."""
        try:
            self.provider.shutdown()
        except Exception:  # noqa: BLE001 - the process is ending: a failed last export is only logged
            log.warning("the last OTLP export failed", exc_info=True)


def cumulative() -> dict:
    """Cumulative temporality for every instrument kind (the exporter's default, unless the environment's
    OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE says otherwise: the spec decides, not the environment)."""
    from opentelemetry.sdk.metrics import (
        Counter,
        Histogram,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
        UpDownCounter,
    )
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    kinds = (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge)
    return {kind: AggregationTemporality.CUMULATIVE for kind in kinds}


def _counting_base():
    from opentelemetry.sdk.metrics.export import MetricExporter

    return MetricExporter


class _Counting(_counting_base()):  # type: ignore[misc]
    """The OTLP exporter, with each export's result counted and a failure logged once a minute (the SDK's
    own error lines, one per failed export, are silenced: they would repeat every interval)."""

    def __init__(self, inner, counter: Counter, where: str):
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self._inner = inner
        self._success = counter.labels("success")
        self._failure = counter.labels("failure")
        self._where = where
        self._log = ConditionLog(log)
        logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        from opentelemetry.sdk.metrics.export import MetricExportResult

        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:  # noqa: BLE001 - counted and logged like any other failed export
            result = MetricExportResult.FAILURE
        if result == MetricExportResult.SUCCESS:
            self._success.inc()
        else:
            self._failure.inc()
            self._log.log("failed", logging.WARNING, "OTLP export to %s failed (unreachable, refused or an HTTP "
                          "error); further failures within a minute are only counted in "
                          "gateway_otlp_exports_total{result=\"failure\"}", self._where)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)
