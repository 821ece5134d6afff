"""The upstream leg of metered requests: a lean HTTP/1.1 client whose parser callbacks relay each read.

Why not aiohttp's client here (it still forwards every unmetered request): per streamed event, aiohttp's
client feeds a StreamReader, wakes the handler's task, and the handler writes through the server's
StreamWriter; measured with benchmarks/gateway_overhead.py, that relay alone cost about 60 ms of CPU per
1,000 events on a 2-core machine, where a byte pipe on uvloop's protocols costs about 22 and nginx about 22
(docs/gateway.md#overhead). Here the response is parsed by httptools (the llhttp parser uvicorn uses) inside the
connection's protocol, and once the handler has sent the response head, each body read goes from the
parser's callback to the client's transport and to the meter, with no task switch per event.

What this module writes itself is only the framing around what the parser reads: the request head
(`METHOD target HTTP/1.1`, the headers given, `Host`, `Content-Length`) and, towards the client, chunk
framing (RFC 9112 §7.1: `size-in-hex CRLF data CRLF`). Connections are kept per upstream and reused when
the upstream allows it (`should_keep_alive`), at most KEEPALIVE_S idle (below the 5 s of the most common
servers' idle timeout, so a reused connection is not one the upstream is closing); a POST is never retried.

Body delivery has two modes: `queue` (the default: reads wait in a list for `read()`, used for answers read
whole) and `relay` (`relay(write)`: queued reads are handed over first, then each read is handed over as it
arrives). Flow control: the relay's `write` returns True when the client's buffer is full; reading from the
upstream pauses until `resume()`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Callable

import httptools
from yarl import URL

KEEPALIVE_S = 4.0  # seconds an idle upstream connection is kept for reuse
MAX_IDLE_CONNECTIONS = 256


class UpstreamError(Exception):
    """The upstream broke the exchange (refused or lost the connection, or sent what does not parse)."""


class Response:
    """One upstream response in progress. `status`, `reason` and `headers` ([(name, value)] as str, as sent)
    are set once `head` is done; `done` completes when the message ends (None) or fails (UpstreamError,
    asyncio.TimeoutError). `content_length` is the upstream's, or None. `last_read`: time.perf_counter() of
    the last body read (in relay mode, stamped by the relay's write)."""

    __slots__ = ("status", "reason", "headers", "content_length", "head", "done", "_parts", "_more", "_write",
                 "_conn", "last_read", "on_head")

    def __init__(self, conn: "Connection", loop: asyncio.AbstractEventLoop):
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.content_length: int | None = None
        self.head: asyncio.Future = loop.create_future()
        self.done: asyncio.Future = loop.create_future()
        self._parts: list[bytes] = []
        self._more: asyncio.Future | None = None
        self._write: Callable[[bytes], bool] | None = None
        self._conn = conn
        self.last_read = time.perf_counter()  # the relay's clock (it stamps each read for the meter too)
        # Called from the parser when the final head is complete, before any body byte is handed over.
        self.on_head: Callable[[], None] | None = None

    # ---------------------------------------------------------------- the handler's side
    async def read(self) -> bytes:
        """The next body bytes (queue mode); b"" at the end. Raises what ended the response otherwise."""
        while not self._parts:
            if self.done.done():
                self.done.result()  # raises the failure, if any
                return b""
            self._more = asyncio.get_running_loop().create_future()
            await asyncio.wait((self._more, self.done), return_when=asyncio.FIRST_COMPLETED)
        data = self._parts.pop(0)
        self._conn.resume()
        return data

    def relay(self, write: Callable[[bytes], bool]) -> None:
        """From now on hand each read to `write(data)` at once (reads already queued first). `write` returns
        True when the reader of the relay cannot take more for now: the upstream is paused until resume()."""
        self._write = write
        parts, self._parts = self._parts, []
        full = False
        for data in parts:
            full = write(data) or full
        if full:
            self._conn.pause()
        else:
            self._conn.resume()  # queue mode may have paused it

    def resume(self) -> None:
        self._conn.resume()

    def detach(self) -> None:
        """Drop the callbacks handed in (`on_head`, the relay's write): they refer back to this response, and
        the cycle would leave each request's objects to the garbage collector instead of reference counting
        (a collection pause per few requests under load)."""
        self.on_head = None
        self._write = None

    def expire(self) -> None:
        """No head in time: the waiter of `head` gets asyncio.TimeoutError (the caller closes)."""
        if not self.head.done():
            self._fail(asyncio.TimeoutError())

    def close(self) -> None:
        """Drop the connection if this response is still on it (the exchange was abandoned: the upstream
        stops its work). A response that ended already left its connection to the pool: nothing to do."""
        if self._conn.response is self:
            self._conn.response = None
            self._conn.close()

    # ---------------------------------------------------------------- the connection's side
    def _body(self, data: bytes) -> None:
        write = self._write
        if write is not None:
            if write(data):  # stamps last_read
                self._conn.pause()
            return
        self.last_read = time.perf_counter()
        self._parts.append(data)
        if len(self._parts) > 64:
            self._conn.pause()  # queue mode: the handler reads; keep at most this many reads ahead
        if self._more is not None and not self._more.done():
            self._more.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        for fut in (self.head, self.done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: a failed head is also reported through done
        if self._more is not None and not self._more.done():
            self._more.set_result(None)


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to the upstream; one request at a time."""

    def __init__(self, pool: "Pool"):
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.reusable = False
        self.idle_since = 0.0
        self._until_close = False
        self._paused = False
        self._body: list[bytes] = []  # body bytes of the read being parsed

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None:  # after connection_lost: nothing left to read into
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._lost(UpstreamError(f"unreadable response: {exc}"))
            self.close()
            return
        self._flush()

    def _flush(self) -> None:
        """Hand the body bytes of this read over as one piece: a read that holds many chunks (a fast
        upstream, a slow reader) is one write to the client and one call to the meter."""
        body = self._body
        if body:
            self._body = []
            r = self.response
            if r is not None:  # else the answer was already failed: its bytes go nowhere
                r._body(body[0] if len(body) == 1 else b"".join(body))

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.parser = None  # it refers back to this protocol: no cycle left for the garbage collector
        self.pool.forget(self)
        r = self.response
        if r is None:
            return
        self._flush()
        if exc is None and r.head.done() and not r.head.exception() and self._until_close:
            # A body with neither a length nor chunks ends when the connection does (RFC 9112 §6.3).
            self.reusable = False
            self.response = None
            if not r.done.done():
                r.done.set_result(None)
            if r._more is not None and not r._more.done():
                r._more.set_result(None)
            return
        self._lost(UpstreamError("upstream closed the connection mid-response" if exc is None else
                                 f"upstream connection lost: {exc.__class__.__name__}: {exc}"))

    # httptools callbacks
    # Raised inside a callback, the parser reports it as HttpParserError: data_received fails the answer.
    def _answering(self) -> Response:
        if self.response is None:
            raise UpstreamError("an answer with no request sent")
        return self.response

    def on_status(self, status: bytes) -> None:
        self._answering().reason += status.decode("utf-8", "surrogateescape")

    def on_header(self, name: bytes, value: bytes) -> None:
        # Decoded as the server decodes requests (httpserver.py), so the head re-encodes to the bytes sent.
        self._answering().headers.append((name.decode("utf-8", "surrogateescape"),
                                          value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        r = self._answering()
        r.status = self.parser.get_status_code() if self.parser is not None else 0
        if 100 <= r.status < 200:  # an interim answer (100 Continue, 103): the final one follows
            r.headers = []
            r.reason = ""
            return
        chunked = False
        for name, value in r.headers:
            lower = name.lower()
            if lower == "content-length" and value.strip().isdigit():
                r.content_length = int(value)
            elif lower == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        self._until_close = r.content_length is None and not chunked
        if not r.head.done():
            r.head.set_result(None)
            if r.on_head is not None:
                r.on_head()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        r = self.response
        if r is None or not r.head.done():
            return  # the end of an interim answer
        self._flush()
        self.response = None
        self.reusable = self.parser is not None and self.parser.should_keep_alive()
        if not r.done.done():
            r.done.set_result(None)
        if r._more is not None and not r._more.done():
            r._more.set_result(None)
        self.pool.release(self)

    # driving
    def send(self, head: bytes, body: bytes) -> Response:
        if self.transport is None:
            raise UpstreamError("upstream connection lost before the request was sent")
        self.response = Response(self, self.loop)
        self.parser = httptools.HttpResponseParser(self)
        self.transport.writelines((head, body) if body else (head,))
        return self.response

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    def _lost(self, exc: BaseException) -> None:
        self._body = []
        r, self.response = self.response, None
        if r is not None:
            r._fail(exc)


class Pool:
    """Connections to one upstream base URL (http or https), reused while the upstream allows it."""

    def __init__(self, base: str, connect_timeout: float):
        url = URL(base)
        if url.host is None or url.port is None:
            raise ValueError(f"upstream URL without a host: {base!r}")
        self.host: str = url.host
        self.port: int = url.port
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.host_header: str = url.host_port_subcomponent or url.host  # brackets IPv6, omits a default port
        self.connect_timeout = connect_timeout
        self.loop = asyncio.get_running_loop()
        self._idle: list[Connection] = []

    def take(self) -> Connection | None:
        """An idle connection still fit for reuse, or None (then `connect`)."""
        now = self.loop.time()
        while self._idle:
            conn = self._idle.pop()
            if conn.transport is not None and not conn.transport.is_closing() and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.close()
        return None

    async def connect(self) -> Connection:
        """An idle connection, or a new one (raises OSError, asyncio.TimeoutError)."""
        conn = self.take()
        if conn is not None:
            return conn
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await self.loop.create_connection(lambda: Connection(self), self.host, self.port, ssl=self.ssl)
        return conn

    def release(self, conn: Connection) -> None:
        if conn.reusable and conn.transport is not None and len(self._idle) < MAX_IDLE_CONNECTIONS:
            conn.resume()
            conn.idle_since = self.loop.time()
            self._idle.append(conn)
        else:
            conn.close()

    def forget(self, conn: Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def request_head(method: str, target: str, host: str, headers, body_length: int) -> bytes:
    """The request line and header section sent upstream. `headers`: (name, value) pairs already stripped of
    hop-by-hop fields, Host and Content-Length (the aiohttp server's parser rejected CR, LF and NUL)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    lines.append(f"Content-Length: {body_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
