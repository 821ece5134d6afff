"""Exchange: one metered HTTP exchange, driven by HTTP-level events from the proxy or the ASGI middleware.

It turns "response started", "body bytes arrived" and "ended (how)" into RequestMeter calls through the
protocol readers, and decides the outcome:
- `cancelled` (client went away) and `timeout` (upstream too slow) are given by the caller;
- `error`: HTTP status ≥ 400, an error event or error body, or an OpenAI stream that ended without `[DONE]`
  or a stream the upstream cut;
- `ok` otherwise.
"""

from __future__ import annotations

import time

from inferwatch.exporters.gateway.meter import RequestMeter, Usage
from inferwatch.exporters.gateway.protocols import Route, reader_for
from inferwatch.exporters.gateway.sse import SseSplitter

# Non-streamed bodies are parsed for usage; beyond this size they are forwarded but not parsed.
MAX_PARSED_BODY = 16 * 1024 * 1024


class Exchange:
    __slots__ = ("route", "meter", "reader", "status", "sse", "splitter", "_body", "_body_size", "_sink")

    def __init__(self, route: Route, meter: RequestMeter, sink=None):
        self.route = route
        self.meter = meter
        self.reader = reader_for(route, meter)
        self.status = 0
        self.sse = False
        self.splitter: SseSplitter | None = None
        self._body: list[bytes] = []
        self._body_size = 0
        self._sink = sink

    def response_start(self, status: int, content_type: str | None) -> None:
        """The upstream (or app) answered `status` with `content_type`."""
        self.status = status
        self.sse = status < 400 and (content_type or "").startswith("text/event-stream")
        self.meter.streamed = self.sse
        if self.sse:
            self.splitter = SseSplitter()

    def chunk(self, data: bytes, now: float | None = None) -> None:
        """Response body bytes, in the order sent. For SSE each completed event is read as it arrives."""
        if self.sse:
            if now is None:
                now = time.perf_counter()
            event = self.reader.event
            for payload in self.splitter.feed(data):
                event(payload, now)
        elif self._body_size <= MAX_PARSED_BODY:
            self._body.append(bytes(data))
            self._body_size += len(data)

    def parse_body(self, now: float | None = None) -> None:
        """Read a non-streamed body received so far (once): its token counts and error, for X-Token-Used."""
        if not self.sse and self._body and self.status < 400 and self._body_size <= MAX_PARSED_BODY:
            self.reader.body(b"".join(self._body), time.perf_counter() if now is None else now)
        self._body = []

    def finish(self, outcome: str | None = None, code: int | None = None, now: float | None = None) -> Usage | None:
        """End the exchange. `outcome` None means the response ended normally; `code` defaults to the status."""
        now = time.perf_counter() if now is None else now
        self.meter.upstream_end(now)
        self.parse_body(now)
        if outcome is None:
            if self.status >= 400 or self.reader.error:
                outcome = "error"
            elif self.sse and not self.reader.complete:
                outcome = "error"
            else:
                outcome = "ok"
        if self.meter.method is None and 200 <= self.status < 300 and outcome == "ok":
            self.meter.method = "none"
        usage = self.meter.finish(outcome, code if code is not None else self.status, now)
        if usage is not None and self._sink is not None:
            self._sink(usage)
        return usage
