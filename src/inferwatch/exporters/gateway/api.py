"""In-process API: record gateway metrics from your own gateway or server, with the proxy's definitions.

    gateway = Gateway(load_spec(), registry=prometheus_client.REGISTRY)
    with gateway.request(tenant="acme", service="chat-web", model="toy_llm") as req:
        for chunk in stream:                   # each token-bearing event
            req.tokens(chunk_token_count)
        req.usage(output_tokens=usage.completion_tokens, input_tokens=usage.prompt_tokens)  # when known
    # leaving the block: ok; an exception: error; asyncio.CancelledError / GeneratorExit: cancelled;
    # TimeoutError: timeout. req.fail() / req.cancel() set the outcome explicitly.

`Gateway.exchange(...)` is the HTTP-level entry the proxy and the ASGI middleware (asgi.py) use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter

from inferwatch.exporters.gateway.counts import InvalidCount, part_count, token_count
from inferwatch.exporters.gateway.exchange import Exchange
from inferwatch.exporters.gateway.labels import LabelPolicy
from inferwatch.exporters.gateway.meter import RequestMeter, Usage
from inferwatch.exporters.gateway.metrics import GatewayMetrics
from inferwatch.exporters.gateway.otlp import APIS, api_of
from inferwatch.exporters.gateway.routes import Classifier, Route, route_key
from inferwatch.ratelog import ConditionLog
from inferwatch.spec import Spec

log = logging.getLogger(__name__)


class Gateway:
    """Metrics, label policy and the usage sink shared by every request.

    `usage_sink(Usage)` is called once per finished request (billing records); it must not block. A record
    the sink refuses (it raises: the usage log's disk is full, its pipe closed) is lost, never retried from a
    buffer: it is counted in `gateway_usage_records_total{result="failed"}` (each written one under
    `result="written"`) and logged once a minute per kind of error, and the request goes on.
    """

    def __init__(self, spec: Spec | None = None, registry: CollectorRegistry | None = None,
                 usage_sink: Callable[[Usage], None] | None = None):
        self.spec = spec if spec is not None else Spec()
        self.metrics = GatewayMetrics(registry, self.spec.billing, self.spec.gateway.otlp)
        self.labels = LabelPolicy(self.spec)
        self.usage_sink: Callable[[Usage], None] | None = None
        if usage_sink is not None:
            self._sink = usage_sink
            self._records = Counter("gateway_usage_records", "Usage-log records (per-request billing records) by "
                                    "result: written, or failed (lost: the usage log could not take it, e.g. "
                                    "its disk is full).", ("result",), registry=self.metrics.registry)
            for result in ("written", "failed"):  # none failed yet is known: 0, not absent
                self._records.labels(result)
            self.usage_sink = self._record
        self._sink_log = ConditionLog(log)
        self.classifier = Classifier(self.spec.gateway.llm_models, self.spec.gateway.routes)
        self.max_answer_bytes = self.spec.gateway.max_answer_bytes
        # One line per (reason, model, detail) a minute; keys bounded by ConditionLog (then shared).
        self._unmetered_log = ConditionLog(log)

    def route(self, method: str, path: str, body: bytes = b"") -> Route | None:
        """The Route of a request (`path` percent-decoded), or None when it is not metered."""
        return self.classifier.classify(method, path, body)

    def exchange(self, method: str, path: str, headers: Mapping[str, str], body: bytes,
                 started: float | None = None) -> Exchange | None:
        """Start metering an HTTP exchange, or None when the path is not an LLM route (pass through).

        `path` is percent-decoded (routes.decoded_path of the canonical target). `headers` must be
        case-insensitive (aiohttp's CIMultiDict, or a dict with lower-case keys looked up through
        `labels.from_headers`); `started` is the arrival time on time.perf_counter's clock.
        """
        route = self.route(method, path, body)
        if route is None:
            return None
        series = self.metrics.series(*self.labels.from_headers(headers, route.model))
        meter = RequestMeter(series, streamed=False, started=started)
        meter.api = api_of(route.protocol, route_key(path))
        return Exchange(route, meter, self.usage_sink, self.max_answer_bytes, self._unmetered)

    def _record(self, usage: Usage) -> None:
        try:
            self._sink(usage)
        except Exception as exc:  # noqa: BLE001 - a usage log that cannot be written must not fail the request
            self._records.labels("failed").inc()
            self._sink_log.log(f"sink:{exc.__class__.__name__}", logging.ERROR, "usage record lost, not written "
                               "(%s: %s); further ones like it within a minute are only counted in "
                               "gateway_usage_records_total{result=\"failed\"}", exc.__class__.__name__, exc)
        else:
            self._records.labels("written").inc()

    def close(self) -> None:
        """Send the OpenTelemetry export's last points and stop its thread (nothing without gateway.otlp)."""
        if self.metrics.otlp is not None:
            self.metrics.otlp.shutdown()

    def _unmetered(self, reason: str, model: str, detail: str, example: str = "") -> None:
        """One log line per kind of unmetered answer a minute (`detail` names the kind, `example` is the
        offending value, repr-escaped by the caller); the counter counts every one."""
        self._unmetered_log.log(f"{reason}\0{model}\0{detail}", logging.WARNING,
                                "model %s: answer forwarded unmetered (%s: %s%s); further ones like it within a "
                                "minute are only counted in gateway_unmetered_responses_total{reason=\"%s\"}",
                                model, reason, detail, f", got {example}" if example else "", reason)

    @contextlib.contextmanager
    def request(self, *, tenant: str | None = None, service: str | None = None, model: str | None = None,
                streamed: bool = True, api: str = "chat") -> Iterator["TrackedRequest"]:
        """Meter one request in your own code (see the module docstring). `api` names the API it serves for
        the OpenTelemetry export's gen_ai.operation.name: a key of otlp.APIS (chat, completions, responses,
        messages, embeddings, triton); raises ValueError for another."""
        if api not in APIS:
            raise ValueError(f"api: expected one of {', '.join(APIS)}, got {api!r}")
        series = self.metrics.series(self.labels.tenant(tenant), self.labels.model(model), self.labels.tier(service))
        meter = RequestMeter(series, streamed)
        meter.api = api
        tracked = TrackedRequest(meter, self._unmetered)
        try:
            yield tracked
        except (asyncio.CancelledError, GeneratorExit):
            tracked._end("cancelled")
            raise
        except TimeoutError:
            tracked._end("timeout")
            raise
        except BaseException:
            tracked._end("error")
            raise
        else:
            tracked._end(tracked.outcome or "ok")
        finally:
            if tracked.result is not None and self.usage_sink is not None:
                self.usage_sink(tracked.result)


class TrackedRequest:
    """Handle given by Gateway.request: feed tokens, exact usage, an explicit outcome and the HTTP code."""

    def __init__(self, meter: RequestMeter, on_unmetered: Callable[[str, str, str, str], None] | None = None):
        self.meter = meter
        self._on_unmetered = on_unmetered
        self.outcome: str | None = None
        self.code = 200
        self.result: Usage | None = None

    def tokens(self, n: int = 1) -> None:
        self.meter.tokens(n)

    def usage(self, output_tokens: int | None = None, input_tokens: int | None = None,
              cached_input_tokens: int | None = None, reasoning_tokens: int | None = None) -> None:
        """The upstream's exact counts (None: not reported); `cached_input_tokens` is a part of `input_tokens`,
        `reasoning_tokens` of `output_tokens`. A value that is not a count (counts.py: negative, bool,
        non-integral, above MAX_TOKENS, a part above its whole) makes this request unmetered (reason
        `invalid_count`: counted and logged, both counts unknown) rather than raising into your handler."""
        try:
            output_tokens = token_count(output_tokens, "output_tokens")
            input_tokens = token_count(input_tokens, "input_tokens")
            cached = part_count({"n": cached_input_tokens}, "n", input_tokens, "cached_input_tokens")
            reasoning = part_count({"n": reasoning_tokens}, "n", output_tokens, "reasoning_tokens")
        except InvalidCount as exc:
            if self.meter.unmetered is None:
                self.meter.stop_metering("invalid_count")
                self.meter.series.count_unmetered("invalid_count")
                if self._on_unmetered is not None:
                    self._on_unmetered("invalid_count", self.meter.series.key[1], str(exc), exc.value)
            return
        if output_tokens is not None:
            self.meter.set_exact_output_tokens(output_tokens, "usage")
        if input_tokens is not None:
            self.meter.input_tokens = input_tokens
        self.meter.set_detail(0, cached)
        self.meter.set_detail(2, reasoning)

    def fail(self, code: int = 500) -> None:
        self.outcome, self.code = "error", code

    def cancel(self) -> None:
        self.outcome = "cancelled"

    def _end(self, outcome: str) -> None:
        code = self.code if outcome == "ok" or self.outcome else (499 if outcome == "cancelled" else 500)
        self.result = self.meter.finish(outcome, code)
