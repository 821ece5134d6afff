"""The gateway's client-facing HTTP/1.1 server: requests parsed by httptools inside the connection's protocol.

Why not aiohttp's server (which the gateway used) or uvicorn: measured with benchmarks/gateway_hotpath.py
(docs/gateway.md#overhead; one run at load 1.1), a sequential request to a trivial handler takes 191 µs p50 and
160 µs of server CPU through aiohttp's server, 135 µs and 110 µs through uvicorn 0.54 (httptools, uvloop, a
raw ASGI app), 110 µs and 70 µs through this server, and 52 µs and 30 µs through a bare protocol answering
without parsing. On the gateway's own benchmark, aiohttp's server side was what kept the added TTFT above
budget. uvicorn would also have to be reached into: its ASGI `send` is a coroutine per event (the proxy writes
each upstream read to the client's transport from the upstream parser's callback, with no task switch), it
has no header timeout (a slow-loris client holds a connection for ever) and above its limit it refuses new
requests with 503 instead of closing idle connections.

What this module does, and only this: parse with httptools (llhttp, the parser of Node.js and uvicorn), hand
each complete request to the handler, write the response head and its framing (Content-Length, chunked
transfer coding per RFC 9112 §7.1, or close-delimited for an HTTP/1.0 client), keep the connection alive when
the request allows it, and enforce the limits:
  - request line and each header field at most MAX_LINE_BYTES (8,190 bytes, as aiohttp and gunicorn): 414 /
    431; the whole head at most MAX_HEAD_BYTES: 431; a request httptools refuses: 400; the connection is closed
    after each of these (it cannot be read on), with one log line per kind a minute (no traceback);
  - the body at most `max_body_bytes`: the handler is called at once with `too_large` set (it answers 413) and
    the connection is closed after the answer;
  - header, body and idle timeouts and a connection cap (bounds.py).

The handler, `handler(request, conn)`, is a plain function that returns None when it answered at once, or a
coroutine to run as the request's task. The split keeps the request's way to the upstream free of a loop
iteration: the proxy classifies and sends a metered request to an idle upstream connection inside
`data_received`, and only waiting for the answer runs in a task. A client that goes away cancels that task
(the upstream request is then closed, which makes Triton cancel it). Requests a client pipelines are
answered in order; the body of each waits in memory (at most PIPELINE_DEPTH requests, then reading pauses).
An Upgrade or CONNECT request is answered as a plain request and the connection closed after (the bytes
after it are not HTTP).
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import http
import logging
import time
from typing import Callable, Coroutine, Sequence

import httptools

from inferwatch.exporters.gateway.bounds import ConnectionBounds
from inferwatch.ratelog import ConditionLog

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 8190
MAX_HEAD_BYTES = 64 * 1024
PIPELINE_DEPTH = 8
SHUTDOWN_GRACE_S = 5.0  # requests in progress at shutdown get this long to finish, then are cancelled

# Connection states (bounds.py reads them): waiting for a request, receiving its head, its body, answering it.
IDLE, HEAD, BODY, BUSY = "idle", "head", "body", "busy"
_NO_BODY_STATUS = frozenset((204, 304))
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Request:
    """One parsed request. `target`: the request target as sent (str); `headers`: [(name, value)] as sent,
    repeated fields kept (text is UTF-8 with surrogateescape: any byte round-trips exactly when encoded the
    same way, as the proxy does for the upstream and for the answer's head); `fields`: lower-case name → first value;
    `body`: bytes (b"" when `too_large`); `started`: time.perf_counter() when its head was complete; `remote`: the
    peer's address."""

    __slots__ = ("method", "target", "version", "headers", "fields", "body", "started", "keep_alive", "remote",
                 "too_large", "content_length")

    def __init__(self):
        self.method = ""
        self.target = ""
        self.version = (1, 1)
        self.headers: list[tuple[str, str]] = []
        self.fields: dict[str, str] = {}
        self.body = b""
        self.started = 0.0
        self.keep_alive = True
        self.remote: str | None = None
        self.too_large = False
        self.content_length: int | None = None


Handler = Callable[[Request, "ServerConnection"], "Coroutine | None"]


class _Stop(Exception):
    """Raised in a parser callback: parse nothing more of what was received (the request before is queued)."""


class _Refused(_Stop):
    """Raised in a parser callback: answer `status` and close the connection."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class HttpServer:
    """Serve `handler` on (host, port) with the limits of `bounds` and `max_body_bytes`."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, bounds: ConnectionBounds):
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.bounds = bounds
        self.log = ConditionLog(log)
        self._server: asyncio.AbstractServer | None = None
        self._date = ""
        self._date_at = 0

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Listen; returns the port bound (port 0: the OS picks). Raises OSError when binding fails."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: ServerConnection(self), host, port,
                                                reuse_port=reuse_port or None, backlog=self.bounds.backlog)
        self.bounds.start(loop)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, close idle connections, give requests in progress SHUTDOWN_GRACE_S, cancel the rest."""
        if self._server is not None:
            self._server.close()
        await self.bounds.shutdown(SHUTDOWN_GRACE_S)

    def date(self) -> str:
        """The Date field value (RFC 9110 §6.6.1), formatted once a second."""
        now = int(time.time())
        if now != self._date_at:
            self._date_at = now
            self._date = email.utils.formatdate(now, usegmt=True)
        return self._date


class ServerConnection(asyncio.Protocol):
    """One client connection: parses requests, runs the handler for each in turn, writes the responses.

    The handler answers through `start`/`write`/`drain`/`end` (or `respond` for a whole answer); `transport`
    and `chunked` let a relay write body bytes itself, framed as `chunked` says."""

    def __init__(self, server: HttpServer):
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.remote: str | None = None
        # Read by bounds.py: the state, since when (loop.time()), whether a request ever completed.
        self.state = IDLE
        self.since = self.loop.time()
        self.served = 0
        self.closed = False
        self._request: Request | None = None    # being parsed
        self._in_head = False
        self._url: list[bytes] = []
        self._url_size = 0
        self._head_size = 0     # of the head parsed so far (fields counted once complete)
        self._head_bytes = 0    # bytes read while a head was incomplete
        self._body: list[bytes] = []
        self._body_size = 0
        self._queue: collections.deque[Request] = collections.deque()
        self._current: Request | None = None    # being answered
        self._task: asyncio.Task | None = None
        self._upgrade = False
        self._reading = True
        self._write_ready: asyncio.Future | None = None
        self._writing_paused = False
        # The response in progress.
        self.chunked = False
        self._started = False
        self._ended = False
        self._body_allowed = True
        self._close_after = False

    # ---------------------------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if peer else None
        self.server.bounds.opened(self)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.bounds.lost(self)
        # The parser refers back to this protocol (its callbacks), the transport too: without the cycle,
        # reference counting frees a closed connection (no garbage-collector pause per few connections).
        self.parser = None
        self.transport = None
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        task = self._task
        if task is not None and not task.done():
            # Next iteration: a task created in this one has then run up to its first await (a task cancelled
            # before its first step would skip its own clean-up).
            self.loop.call_soon(task.cancel)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if self.closed or self._upgrade or parser is None:
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade = True  # the request before the switch is complete: answer it, then close
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refused):
                return self._refuse(cause.status, cause.reason, "request")
            if not isinstance(cause, _Stop):  # a bug here, not the client's input: logged whole
                log.error("reading a request failed", exc_info=cause)
                self.close()
                return
        except httptools.HttpParserError as exc:
            return self._refuse(400, f"malformed request: {exc}", "malformed")
        if self._in_head:
            # Counted per read, so a head trickled in forever is cut too (httptools buffers a field until
            # it is complete); a read that also ends the previous request counts whole: a bound, not a size.
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                return self._refuse(431, f"request head above {MAX_HEAD_BYTES} bytes", "request")
        if self._current is None and self._queue:
            self._next()
        else:
            self._update_state()

    # ------------------------------------------------------------------------------- httptools callbacks
    def on_message_begin(self) -> None:
        if self._upgrade:
            raise _Stop()
        self._request = Request()
        self._in_head = True
        self._url = []
        self._url_size = 0
        self._head_size = 0
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url_size += len(url)
        if self._url_size > MAX_LINE_BYTES:
            raise _Refused(414, f"request target above {MAX_LINE_BYTES} bytes")
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        if size > MAX_LINE_BYTES:
            raise _Refused(431, f"header field above {MAX_LINE_BYTES} bytes")
        self._head_size += size + 4
        if self._head_size > MAX_HEAD_BYTES:
            raise _Refused(431, f"request head above {MAX_HEAD_BYTES} bytes")
        r = self._request
        if r is None:
            raise _Refused(400, "header outside a request")
        k, v = name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")
        r.headers.append((k, v))
        r.fields.setdefault(k.lower(), v)

    def on_headers_complete(self) -> None:
        r = self._request
        p = self.parser
        if r is None or p is None:
            raise _Refused(400, "head outside a request")
        r.method = p.get_method().decode("latin-1")
        r.target = b"".join(self._url).decode("utf-8", "surrogateescape")
        r.version = (1, 1) if p.get_http_version() == "1.1" else (1, 0)
        r.keep_alive = p.should_keep_alive()
        r.remote = self.remote
        r.started = time.perf_counter()
        self._in_head = False
        self._body = []
        self._body_size = 0
        length = r.fields.get("content-length")
        if length is not None:
            r.content_length = int(length)  # llhttp accepted it: digits only
            if r.content_length > self.server.max_body_bytes:
                self._too_large(r)
        if (r.fields.get("expect", "").lower() == "100-continue" and r.version >= (1, 1) and self.transport
                and self._current is None and not self._queue):
            # Not while an earlier answer is being written on the connection: the interim answer would land
            # inside it (the client then sends its body after its own wait, RFC 9110 §10.1.1).
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        r = self._request
        if r is None:
            raise _Refused(400, "body outside a request")
        self._body_size += len(body)
        if self._body_size > self.server.max_body_bytes:
            self._too_large(r)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        r = self._request
        if r is None:
            raise _Refused(400, "end outside a request")
        self._request = None
        r.body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        self._body = []
        self._queue.append(r)
        if len(self._queue) >= PIPELINE_DEPTH and self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()

    def _too_large(self, r: Request) -> None:
        """The body is above the limit: stop reading, let the handler answer (413), close after."""
        r.too_large = True
        self._body = []
        self._request = None
        self._queue.append(r)
        self._upgrade = True  # nothing after this on the connection is read
        if self.transport is not None:
            self.transport.pause_reading()
            self._reading = False
        raise _Stop()

    # ------------------------------------------------------------------------------------ the handler
    def _update_state(self) -> None:
        """Tell bounds.py what the connection is doing now: answering (or holding queued requests), receiving
        a body, a head, or nothing."""
        if self._current is not None or self._queue:
            state = BUSY
        elif self._request is not None:
            state = HEAD if self._in_head else BODY
        else:
            state = IDLE
        if state != self.state:
            self.state = state
            self.since = self.loop.time()
            self.server.bounds.changed(self)

    def _next(self) -> None:
        """Answer the next queued request (none while one is being answered)."""
        if self.closed or not self._queue or self._current is not None:
            return
        r = self._current = self._queue.popleft()
        if not self._reading and not self._upgrade and len(self._queue) < PIPELINE_DEPTH:
            self._reading = True
            if self.transport is not None:  # None only once lost, and then closed
                self.transport.resume_reading()
        self.chunked = self._started = self._ended = False
        self._body_allowed = r.method != "HEAD"
        self._close_after = not r.keep_alive or self._upgrade
        self._update_state()
        try:
            pending = self.server.handler(r, self)
        except Exception:  # noqa: BLE001 - a handler bug: answered 500, logged with its traceback
            log.exception("gateway request handler failed")
            self._failed()
            return
        if pending is None:
            self._done()
            return
        self._task = self.loop.create_task(pending)
        self._task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("gateway request handler failed", exc_info=task.exception())
            self._failed()
            return
        self._done()

    def _failed(self) -> None:
        if not self._started and not self.closed:
            self.respond(500, b'{"error": "internal error"}', "application/json")
        self._close_after = True
        self._done()

    def _done(self) -> None:
        """The current request is over: keep the connection for the next one, or close it."""
        self._current = None
        if self.closed:
            return
        if not self._ended or self._close_after:
            self.close()
            return
        self.served += 1
        self._update_state()
        if self._queue:
            self.loop.call_soon(self._next)

    # ------------------------------------------------------------------------------------ the response
    def start(self, status: int, reason: str | None, headers: list[tuple[str, str]],
              length: int | None = None) -> None:
        """Write the response head: `headers` without framing fields (Content-Length, Transfer-Encoding,
        Connection are written here); `length`: the body's size, or None (chunked for an HTTP/1.1 client,
        else until the connection closes). A Date field is added when `headers` has none. Raises RuntimeError
        when no request is being answered."""
        r = self._current
        if r is None:
            raise RuntimeError("a response head with no request being answered")
        self._started = True
        if status in _NO_BODY_STATUS or status < 200:
            self._body_allowed = False
        lines = [f"HTTP/1.1 {status} {reason or _reason(status)}"]
        has_date = False
        for k, v in headers:
            if not has_date and k.lower() == "date":
                has_date = True
            lines.append(f"{k}: {v}")
        if not has_date:
            lines.append(f"Date: {self.server.date()}")
        if length is not None:
            if self._body_allowed or r.method == "HEAD":
                lines.append(f"Content-Length: {length}")
        elif self._body_allowed:
            if r.version >= (1, 1):
                self.chunked = True
                lines.append("Transfer-Encoding: chunked")
            else:
                self._close_after = True  # the body ends when the connection does (RFC 9112 §6.3)
        if self._close_after:
            lines.append("Connection: close")
        elif r.version < (1, 1):
            lines.append("Connection: keep-alive")
        transport = self.transport
        if not self.closed and transport is not None and not transport.is_closing():
            transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape"))

    def write(self, data: bytes) -> None:
        """Write body bytes (framed when chunked). Raises ConnectionResetError when the client is gone."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            raise ConnectionResetError("client gone")
        if data and self._body_allowed:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)

    async def drain(self) -> None:
        """Wait while the client's buffer is above the transport's high-water mark. Raises
        ConnectionResetError when the client is gone, or took nothing for the send timeout (then cut off)."""
        if self._writing_paused and not self.closed:
            try:
                async with asyncio.timeout(self.server.bounds.send_timeout_s):
                    while self._writing_paused and not self.closed:
                        self._write_ready = self.loop.create_future()
                        await self._write_ready
            except TimeoutError:
                self.send_timed_out()
        if self.closed:
            raise ConnectionResetError("client gone")

    def send_timed_out(self) -> None:
        """The client took nothing of its answer for the send timeout: cut it off (bounds.py counts it)."""
        self._close_after = True
        self.server.bounds.send_timed_out(self)
        self.closed = True  # at once: the caller stops writing (connection_lost follows)

    def end(self) -> None:
        """The body is complete."""
        if self.chunked and self.transport is not None and not self.closed:
            self.transport.write(b"0\r\n\r\n")
        self._ended = True

    def respond(self, status: int, body: bytes, content_type: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        """A whole answer at once."""
        if self.closed:
            return
        self.start(status, None, [("Content-Type", content_type), *headers], len(body))
        if body and self._body_allowed and self.transport is not None:
            self.transport.write(body)
        self._ended = True

    def abort(self) -> None:
        """Cut the response (a truncated answer must not look whole to the client)."""
        self._close_after = True
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # ------------------------------------------------------------------------------------- refusals
    def _refuse(self, status: int, reason: str, kind: str | None) -> None:
        """Answer a request the server cannot read on with `status` and close the connection; logged under
        `kind` (once a minute per kind; None: the caller logs)."""
        if kind is not None:
            self.server.log.log(kind, logging.INFO, "refused a request from %s: %d %s", self.remote, status, reason)
        self._upgrade = True
        if self._current is None and self.transport is not None and not self.closed:
            body = b'{"error": "%s"}' % reason.replace('"', "'").encode("latin-1", "replace")
            self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                                 b"Date: %s\r\nConnection: close\r\n\r\n%s"
                                 % (status, _reason(status).encode(), len(body), self.server.date().encode(), body))
        if self._current is None:
            self.close()
        else:
            self._close_after = True

    def timed_out(self, status: int | None, reason: str, abort: bool = False) -> None:
        """Called by bounds.py (which logs): answer `status` (408 for a request half received) and close;
        `abort`: drop what is still buffered for the client (it takes nothing) and close at once."""
        if abort:
            if self.transport is not None:
                self.transport.abort()
        elif status is not None and self._current is None and self._request is not None:
            self._refuse(status, reason, None)
        else:
            self.close()


_REASONS = {int(s): s.phrase for s in http.HTTPStatus}


def _reason(status: int) -> str:
    return _REASONS.get(status, "Unknown")
