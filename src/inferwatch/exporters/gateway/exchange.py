"""Exchange: one metered HTTP exchange, driven by HTTP-level events from the proxy or the ASGI middleware.

It turns "response started", "body bytes arrived" and "ended (how)" into RequestMeter calls through the
protocol readers, and decides the outcome:
- `cancelled` (client went away) and `timeout` (upstream too slow) are given by the caller; a client that
  goes away once its whole answer was relayed (protocols.py `answered`: the end marker, or what ends a
  complete answer) cancelled nothing, and the exchange ends as if the body had ended there;
- `error`: HTTP status ≥ 400, an error event or error body, a stream that did not end well (protocols.py:
  an OpenAI stream with neither `[DONE]` nor a finish_reason, error_type `truncated`) or a stream the
  upstream cut;
- `ok` otherwise.

The body is read from a copy: a Content-Encoding is undone on the copy (decoding.py). What cannot be read,
an encoding that does not decode or an answer (or one event) above `max_answer_bytes`, stops the metering
of that exchange only: the answer still reaches the client, the request is counted with its HTTP outcome,
its tokens are unknown, and gateway_unmetered_responses_total{reason} counts it. So does a count the upstream
reports that is not one (counts.py: negative, not an integer, above MAX_TOKENS; reason `invalid_count`).

Metering never costs the client its answer: an unexpected exception while metering (a bug) stops the
metering of that exchange (reason `meter_error`, logged with its traceback at most once a minute) and the
relay, the usage record and the connection's next request go on.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from inferwatch.exporters.gateway.counts import InvalidCount
from inferwatch.exporters.gateway.decoding import Decoder, TooLarge, Undecodable, decoder_for
from inferwatch.exporters.gateway.meter import RequestMeter, Usage
from inferwatch.exporters.gateway.readers import reader_for
from inferwatch.exporters.gateway.routes import Route
from inferwatch.exporters.gateway.sse import EventTooLarge, SseSplitter
from inferwatch.ratelog import ConditionLog

log = logging.getLogger(__name__)
_bugs = ConditionLog(log)  # one line (with traceback) per kind of metering failure a minute, per process

DEFAULT_MAX_ANSWER_BYTES = 16 * 1024 * 1024


class Exchange:
    __slots__ = ("route", "meter", "reader", "status", "sse", "splitter", "decoder", "limit", "reading", "_body",
                 "_body_size", "_sink", "_on_unmetered")

    def __init__(self, route: Route, meter: RequestMeter, sink: Callable[[Usage], None] | None = None,
                 limit: int = DEFAULT_MAX_ANSWER_BYTES,
                 on_unmetered: Callable[[str, str, str, str], None] | None = None):
        """`limit`: most bytes held to read a non-streamed answer or one event; `on_unmetered(reason, model,
        detail, example)` is told when metering stops (the proxy logs the first of each kind)."""
        self.route = route
        self.meter = meter
        self.reader = reader_for(route, meter)
        self.status = 0
        self.sse = False
        self.splitter: SseSplitter | None = None
        self.decoder: Decoder | None = None
        self.limit = limit
        self.reading = True  # False once the answer can no longer be read (its counts and its end unknown)
        self._body: list[bytes] = []
        self._body_size = 0
        self._sink = sink
        self._on_unmetered = on_unmetered

    @property
    def metering(self) -> bool:
        return self.meter.unmetered is None

    def response_start(self, status: int, content_type: str | None, content_encoding: str | None = None) -> None:
        """The upstream (or app) answered `status` with `content_type` and `content_encoding`."""
        self.status = status
        self.sse = status < 400 and (content_type or "").startswith("text/event-stream")
        self.meter.streamed = self.sse
        if self.sse:
            self.splitter = SseSplitter(self.limit)
        try:
            self.decoder = decoder_for(content_encoding)
        except Undecodable as exc:
            self.stop("encoding", str(exc))

    def stop(self, reason: str, detail: str, example: str = "", keep_reading: bool = False) -> None:
        """Make this answer's counts unknown (`reason`: metrics.UNMETERED_REASONS); counted once for the
        exchange. `detail` is what the log line names (bounded: it keys the line), `example` the offending
        value. Unless `keep_reading`, the rest of the answer is not read either (then whether a stream
        ended well is unknown too, and it is not called truncated)."""
        if not keep_reading:
            self.reading = False
            self._body = []
            self.splitter = None
        if not self.metering:
            return
        self.meter.stop_metering(reason)
        self.meter.series.count_unmetered(reason)
        if self._on_unmetered is not None:
            self._on_unmetered(reason, self.meter.series.key[1], detail, example)

    def _invalid(self, exc: InvalidCount) -> None:
        # The stream is still read: an error event or a missing end marker after it still decides the outcome.
        self.stop("invalid_count", str(exc), exc.value, keep_reading=True)

    def _failed(self, exc: Exception, where: str) -> None:
        """A bug while metering: this exchange goes unmetered, the answer and the connection go on."""
        _bugs.log(f"{where}:{exc.__class__.__name__}", logging.ERROR, "metering failed in %s (%s: %s); the answer "
                  "was forwarded, its counts are unknown (gateway_unmetered_responses_total{reason=\"meter_error\"})",
                  where, exc.__class__.__name__, exc, exc_info=exc)
        try:
            self.stop("meter_error", f"{where}: {exc.__class__.__name__}")
        except Exception:  # noqa: BLE001 - the counter itself failed: the relay still goes on
            self.meter.stop_metering("meter_error")

    def chunk(self, data: bytes, now: float | None = None) -> None:
        """Response body bytes, in the order sent. For SSE each completed event is read as it arrives.
        Never raises: what cannot be metered is counted unmetered (see the module docstring)."""
        if not self.reading:
            return
        try:
            self._chunk(data, now)
        except InvalidCount as exc:
            self._invalid(exc)
        except Exception as exc:  # noqa: BLE001 - see _failed
            self._failed(exc, "chunk")

    def _chunk(self, data: bytes, now: float | None) -> None:
        if self.decoder is not None:
            budget = self.limit if self.sse else self.limit - self._body_size
            try:
                data = self.decoder.feed(data, budget)
            except Undecodable as exc:
                self.stop("encoding", f"{exc}")
                return
            except TooLarge:
                self.stop("too_large", f"decoded answer above {self.limit} bytes")
                return
        if self.sse:
            if now is None:
                now = time.perf_counter()
            event = self.reader.event
            splitter = self.splitter
            if splitter is None:  # stopped: the rest of the answer is not read
                return
            try:
                events = splitter.feed(data)
            except EventTooLarge:
                self.stop("too_large", f"stream event above {self.limit} bytes")
                return
            for payload in events:
                try:
                    event(payload, now)
                except InvalidCount as exc:  # the events after it (its end marker too) are still read
                    self._invalid(exc)
        elif data:
            self._body_size += len(data)
            if self._body_size > self.limit:
                self.stop("too_large", f"answer above {self.limit} bytes")
                return
            self._body.append(bytes(data))

    def parse_body(self, now: float | None = None) -> None:
        """Read a non-streamed body received so far (once): its token counts and error, for X-Token-Used.
        Never raises (as `chunk`)."""
        if not self.sse and self._body and self.reading:
            body = b"".join(self._body)
            try:
                if self.status < 400:
                    self.reader.body(body, time.perf_counter() if now is None else now)
                else:
                    self.reader.error_body(body)
            except InvalidCount as exc:
                self._invalid(exc)
            except Exception as exc:  # noqa: BLE001 - see _failed
                self._failed(exc, "parse_body")
        self._body = []

    def finish(self, outcome: str | None = None, code: int | None = None, now: float | None = None) -> Usage | None:
        """End the exchange. `outcome` None means the response ended normally; `code` defaults to the status."""
        now = time.perf_counter() if now is None else now
        self.meter.upstream_end(now)
        self.parse_body(now)
        reader = self.reader
        if outcome == "cancelled" and self.sse and self.reading and reader.answered:
            # The client left after its whole answer was relayed (the `openai` client closes the response at
            # `data: [DONE]`, before the body's end): nothing was cancelled, the exchange ended as sent.
            outcome = code = None
        if outcome is None:
            if self.status >= 400 or reader.error:
                outcome = "error"
            elif self.sse and self.reading and not reader.ended_well:
                outcome = "error"
                reader.error_type = reader.error_type or "truncated"
            else:
                outcome = "ok"
        if self.meter.method is None and 200 <= self.status < 300 and outcome == "ok":
            self.meter.method = "none"
        label_code = None
        if reader.error or (outcome == "error" and reader.error_type):
            self.meter.error_code, self.meter.error_type = reader.error_code, reader.error_type
            if code is None and self.status < 400:
                # An error object sent under 200 (mid-stream): its own code is the truer one.
                label_code = reader.error_code
        code = code if code is not None else self.status
        try:
            usage = self.meter.finish(outcome, code, now, label_code)
        except Exception as exc:  # noqa: BLE001 - see _failed; the request still gets its record
            self._failed(exc, "finish")
            usage = self.meter.usage(outcome, code, now - self.meter.started)
        if usage is not None and self._sink is not None:
            try:
                self._sink(usage)  # Gateway's sink counts and logs a record it cannot write; any other raising
            except Exception as exc:  # noqa: BLE001 - sink must not cost the answer or the next request
                _bugs.log(f"sink:{exc.__class__.__name__}", logging.ERROR, "usage record not written (%s: %s)",
                          exc.__class__.__name__, exc)
        return usage
