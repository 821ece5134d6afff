"""The streaming reverse proxy: the httptools server of httpserver.py in front; to the upstream, metered (LLM)
requests go through the lean client of upstream.py (each read relayed and metered from its parser callback:
the hot path) and every other request through aiohttp's client.

Responses reach the client byte-for-byte (no decompression, no re-encoding) and each read from the upstream
is written to the client at once, before it is metered, so a stream is never buffered. Non-streamed LLM
responses up to spec.gateway.max_answer_bytes are read whole (they are one JSON document) so that they can
carry `X-Token-Used`; a larger one is forwarded as it arrives, unmetered (exchange.py).

The request target is made canonical first (routes.py): the upstream gets exactly the path that was
classified, so no spelling of a path bypasses metering; an encoded slash or backslash is refused (400).

Failure answers (JSON `{"error": ...}`; the upstream's address and the exception go to the log only, so
clients never learn internal addresses): 400 non-canonical target; 413 body above spec.gateway.max_body_bytes;
502 upstream unreachable or broken; 504 upstream silent for spec.gateway.upstream_timeout (applied to
connecting, to the response headers and to every gap between reads, so a long stream that keeps producing is
never cut). A client that disconnects cancels the request's task (httpserver.py): the upstream connection is
closed, which makes Triton cancel the request, and the request counts as `cancelled`.

`handle` does what needs no waiting at once, in the server's `data_received`: a metered request is classified
and written to an idle upstream connection there, so its way to the upstream costs no loop iteration; the rest
(waiting for the answer, relaying it) is the coroutine it returns.

Credentials in the upstream URL (`http://user:pass@host:8000`) are sent as HTTP Basic auth (unless the client
sent its own Authorization, or `gateway.upstream_authorization` replaces every client credential:
credentials.py) and never appear in a log line, an error text or a metric: the proxy keeps the URL without
them (`Proxy.upstream`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Callable, Coroutine, Sequence

import aiohttp
from yarl import URL

from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.credentials import UpstreamCredential
from inferwatch.exporters.gateway.exchange import Exchange
from inferwatch.exporters.gateway.httpserver import Request, ServerConnection
from inferwatch.exporters.gateway.routes import BadTarget, canonical_target, decoded_path
from inferwatch.exporters.gateway.tenancy import Tenancy, TenantRefused
from inferwatch.exporters.gateway.upstream import Pool, Response, UpstreamError, request_head
from inferwatch.ratelog import ConditionLog

log = logging.getLogger(__name__)

# RFC 9110 §7.6.1 hop-by-hop fields, plus the ones the HTTP stacks set themselves (Host, framing).
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                         "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"))
# Request fields not copied to the upstream: X-Forwarded-For is rebuilt (client's list + peer address).
_NOT_FORWARDED = _HOP_BY_HOP | {"x-forwarded-for"}
CLIENT_CLOSED = 499  # nginx's code for "client closed the request before the answer"
# Client-side buffering of a relayed answer: above _PAUSE_BYTES unsent, the upstream is not read until the
# buffer is down to _RESUME_BYTES (checked every _PAUSED_POLL_S).
_PAUSE_BYTES = 256 * 1024
_RESUME_BYTES = 64 * 1024
_PAUSED_POLL_S = 0.01

Headers = list[tuple[str, str]]


def _json_error(conn: ServerConnection, status: int, message: str) -> None:
    conn.respond(status, json.dumps({"error": message}).encode(), "application/json")


def split_credentials(url: str) -> tuple[str, aiohttp.BasicAuth | None]:
    """(`url` without user-info and trailing slash, its credentials as BasicAuth or None)."""
    parsed = URL(url)
    auth = None
    if parsed.user is not None or parsed.password is not None:
        auth = aiohttp.BasicAuth(parsed.user or "", parsed.password or "")
        parsed = parsed.with_user(None)
    return str(parsed).rstrip("/"), auth


class Proxy:
    """Forward every request to `upstream` (base URL), metering LLM routes through `gateway`. `open()` and
    `close()` in the serving loop; `handle` is httpserver.py's handler."""

    def __init__(self, gateway: Gateway, upstream: str, timeout_s: float | None = None,
                 max_body_bytes: int | None = None):
        settings = gateway.spec.gateway
        self.gateway = gateway
        self.upstream, auth = split_credentials(upstream)  # self.upstream is safe to log
        # The upstream URL's path (`http://h/base` → `/base`) prefixes every forwarded target, metered or not:
        # the target is canonical (dot segments resolved, routes.py) before it is joined, so no request
        # reaches a path outside the base.
        self.base_path = URL(self.upstream).raw_path.rstrip("/")
        self._authorization = auth.encode() if auth is not None else None
        self._credential = UpstreamCredential(gateway.spec)  # gateway.upstream_authorization (credentials.py)
        self.timeout_s = timeout_s if timeout_s is not None else settings.upstream_timeout.seconds
        self.max_body_bytes = max_body_bytes if max_body_bytes is not None else settings.max_body_bytes
        self.tenancy = Tenancy(gateway.spec)  # who a request is billed to (tenancy.py)
        self._refusals = ConditionLog(log)
        self.session: aiohttp.ClientSession | None = None  # unmetered requests
        self.pool: Pool | None = None  # metered requests (upstream.py)
        # Called with the outcome ("error", "timeout") of each failure answered for this upstream (router.py).
        self.on_failure: Callable[[str], None] | None = None

    async def open(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False, ttl_dns_cache=300),
            timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
        self.pool = Pool(self.upstream, self.timeout_s)

    def _pool(self) -> Pool:
        if self.pool is None:
            raise RuntimeError("proxy used before open()")
        return self.pool

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.pool is not None:
            self.pool.close()

    # -------------------------------------------------------------------------------------- handler
    def handle(self, request: Request, conn: ServerConnection) -> Coroutine | None:
        """Answer `request` on `conn`: None when answered at once, else the coroutine that answers it."""
        try:
            target = canonical_target(request.target)
        except BadTarget as exc:
            self._refusals.log(f"target:{str(exc)[:40]}", logging.INFO, "refused %s request: %s", request.method, exc)
            _json_error(conn, 400, f"bad request target: {exc}")
            return None
        path = decoded_path(target)
        try:
            tenant = self.tenancy.resolve(request.headers, request.remote)
        except TenantRefused as exc:
            self._refusals.log(f"tenant:{str(exc)[:40]}", logging.INFO, "refused %s request from %s: %s",
                               request.method, request.remote, exc)
            _json_error(conn, 400, str(exc))
            return None
        fields = request.fields
        if fields.get(self.tenancy.header) != tenant:
            # The one normalised, trusted value (or none) is what is billed and what the upstream sees.
            fields = {k: v for k, v in fields.items() if k != self.tenancy.header}
            if tenant is not None:
                fields[self.tenancy.header] = tenant
            request.fields = fields
        if request.too_large:
            self._refuse(request, conn, path)
            return None
        body = request.body
        ex = self.gateway.exchange(request.method, path, request.fields, body, request.started)
        # A list, so a header the client repeats reaches the upstream repeated, not collapsed to one.
        headers = []
        chain = []
        for k, v in self.tenancy.rewrite(request.headers, tenant):
            lower = k.lower()
            if lower not in _NOT_FORWARDED:
                headers.append((k, v))
            elif lower == "x-forwarded-for":
                chain.append(v)
        forwarded = ", ".join(chain)
        if request.remote:
            forwarded = f"{forwarded}, {request.remote}" if forwarded else request.remote
        if forwarded:
            headers.append(("X-Forwarded-For", forwarded))
        if self._credential.replaces:
            headers = self._credential.apply(headers)
        elif self._authorization is not None and "authorization" not in request.fields:
            headers.append(("Authorization", self._authorization))
        if ex is None:
            return self._unmetered(request, conn, target, body, headers)
        pool = self._pool()
        ex.meter.upstream_begin()
        head = request_head(request.method, self.base_path + target, pool.host_header,
                            [(k, v) for k, v in headers if k.lower() != "expect"], len(body))
        upstream = pool.take()
        if upstream is None:
            return self._connect_then_answer(conn, head, body, ex)
        return _Answer(self, conn, ex, upstream.send(head, body)).run()

    async def _unmetered(self, request: Request, conn: ServerConnection, target: str, body: bytes,
                         headers: Headers) -> None:
        session = self.session
        if session is None:
            raise RuntimeError("proxy used before open()")
        try:
            # encoded=True: the canonical target goes out exactly as classified (yarl would re-normalise it).
            upstream = await session.request(request.method, URL(self.upstream + target, encoded=True),
                                                  data=body, headers=headers, allow_redirects=False)
        except asyncio.TimeoutError:
            return self._fail(conn, None, 504, "timeout", f"upstream did not answer within {self.timeout_s:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return self._fail(conn, None, 502, "error", "upstream unavailable",
                              detail=f"{self.upstream}: {exc.__class__.__name__}: {exc}")
        try:
            await self._pass_through(conn, upstream)
        finally:
            upstream.release()

    async def _pass_through(self, conn: ServerConnection, upstream: aiohttp.ClientResponse) -> None:
        """Forward an unmetered answer read by read."""
        conn.start(upstream.status, upstream.reason, _response_headers(upstream.headers.items()),
                   upstream.content_length)
        outcome = None
        try:
            async for data in upstream.content.iter_any():
                conn.write(data)
                await conn.drain()
            conn.end()
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            outcome = "cancelled"  # the client went away while we wrote
        except asyncio.TimeoutError:
            outcome = "timeout"
        except aiohttp.ClientError as exc:
            log.info("upstream stream broken: %s", exc)
            outcome = "error"
        finally:
            if outcome is not None:
                upstream.close()  # stop the upstream's work
                if outcome in ("timeout", "error"):
                    # Cut the client's stream too: ending it cleanly would present a truncated answer as whole.
                    conn.abort()

    # ------------------------------------------------------------------------------ metered requests
    async def _connect_then_answer(self, conn: ServerConnection, head: bytes, body: bytes, ex: Exchange) -> None:
        """No idle upstream connection: open one, then as `_Answer.run`."""
        try:
            upstream = await self._pool().connect()
        except asyncio.CancelledError:
            ex.finish("cancelled", CLIENT_CLOSED)
            raise
        except asyncio.TimeoutError:
            return self._fail(conn, ex, 504, "timeout", f"upstream did not answer within {self.timeout_s:g}s")
        except OSError as exc:
            return self._fail(conn, ex, 502, "error", "upstream unavailable",
                              detail=f"{self.upstream}: {exc.__class__.__name__}: {exc}")
        await _Answer(self, conn, ex, upstream.send(head, body)).run()

    def _refuse(self, request: Request, conn: ServerConnection, path: str) -> None:
        ex = self.gateway.exchange(request.method, path, request.fields, b"", request.started)
        limit = self.max_body_bytes
        if ex is not None:
            ex.response_start(413, None)
            ex.finish("error", 413)
        length = request.content_length
        got = f"{length} bytes" if length is not None and length > limit else "more"
        _json_error(conn, 413, f"request body too large: {got}, limit {limit} bytes (gateway.max_body_bytes)")

    def _fail(self, conn: ServerConnection, ex: Exchange | None, status: int, outcome: str, message: str,
              detail: str | None = None) -> None:
        """Answer `status` with `message`; `detail` (upstream address, exception) goes to the log only:
        clients must not learn internal addresses."""
        if detail:
            log.warning("%s: %s", message, detail)
        else:
            log.warning("%s", message)
        if ex is not None:
            ex.response_start(status, None)
            ex.finish(outcome, status)
        if self.on_failure is not None:
            self.on_failure(outcome)
        _json_error(conn, status, message)


def _response_headers(pairs) -> Headers:
    """The upstream's answer fields the client gets: hop-by-hop ones dropped, and every `X-Token-Used*`
    (any casing or suffix): the billing header is the gateway's alone, an upstream's copy could forge it."""
    # A list keeps repeated fields (Set-Cookie) as the upstream sent them.
    return [(k, v) for k, v in pairs if k.lower() not in _HOP_BY_HOP and not k.lower().startswith("x-token-used")]


def _field(headers: Headers, name: str) -> str | None:
    """The first value of field `name` (lower case) in `headers`, or None."""
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


class _Answer:
    """The answer to one metered request, sent upstream already: waits for its head, then meters and forwards
    it. For a stream, the client's head is written and the relay started from the upstream parser's callback
    (`head`), so that a first event arriving in the same read as the head (Triton sends them together) is
    forwarded from that read, without waiting for this request's task."""

    __slots__ = ("proxy", "conn", "ex", "resp", "timer", "headers", "relay")

    def __init__(self, proxy: Proxy, conn: ServerConnection, ex: Exchange, resp: Response):
        self.proxy = proxy
        self.conn = conn
        self.ex = ex
        self.resp = resp
        self.headers: Headers = []  # the client's response head, set when the upstream's head arrives
        self.relay: _Relay | None = None
        # One timer for the head, cancelled when it arrives (cheaper than a timeout context per request).
        self.timer = asyncio.get_running_loop().call_later(proxy.timeout_s, resp.expire)
        resp.on_head = self.head

    def head(self) -> None:
        """The final head arrived (called from the upstream connection's parser)."""
        self.timer.cancel()
        resp = self.resp
        self.headers = _response_headers(resp.headers)
        self.ex.response_start(resp.status, _field(self.headers, "content-type"),
                               _field(self.headers, "content-encoding"))
        if self.ex.sse and not self.conn.closed:
            self.start_relay(())

    def start_relay(self, head: Sequence[bytes]) -> None:
        """Write the client's head (and `head`: body bytes read and metered already), then relay each read.
        Raises ConnectionResetError when the client is gone."""
        conn, resp, ex = self.conn, self.resp, self.ex
        conn.start(resp.status, resp.reason or None, self.headers, resp.content_length)
        for data in head:
            conn.write(data)
        transport = conn.transport
        if conn.closed or transport is None or transport.is_closing():
            raise ConnectionResetError("client gone")
        self.relay = _Relay(transport, conn.chunked, ex.chunk if ex.reading else None, resp)
        resp.relay(self.relay.write)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.resp.detach()

    async def _run(self) -> None:
        proxy, conn, resp, ex = self.proxy, self.conn, self.resp, self.ex
        try:
            await resp.head
        except asyncio.CancelledError:
            resp.close()
            ex.finish("cancelled", CLIENT_CLOSED)
            raise
        except asyncio.TimeoutError:
            resp.close()
            return proxy._fail(conn, ex, 504, "timeout", f"upstream did not answer within {proxy.timeout_s:g}s")
        except UpstreamError as exc:
            resp.close()
            return proxy._fail(conn, ex, 502, "error", "upstream unavailable", detail=f"{proxy.upstream}: {exc}")
        finally:
            self.timer.cancel()
        if not ex.sse:
            return await self._whole()
        return await self._relay()

    async def _whole(self) -> None:
        """A non-streamed LLM response: read it (up to ex.limit bytes), count its tokens, answer with
        X-Token-Used. A larger answer is relayed unmetered, starting with what was read."""
        proxy, conn, resp, ex, headers = self.proxy, self.conn, self.resp, self.ex, self.headers
        length = resp.content_length
        if length is not None and length > ex.limit:
            ex.stop("too_large", f"answer above {ex.limit} bytes (Content-Length)")
            return await self._relay()
        parts: list[bytes] = []
        try:
            while True:
                async with asyncio.timeout(proxy.timeout_s):
                    data = await resp.read()
                if not data:
                    break
                parts.append(data)
                ex.chunk(data)
                if not ex.reading:  # above the limit (or undecodable): no header to wait for
                    return await self._relay(head=parts)
        except asyncio.CancelledError:
            resp.close()
            ex.finish("cancelled", CLIENT_CLOSED)
            raise
        except asyncio.TimeoutError:
            resp.close()
            return proxy._fail(conn, ex, 504, "timeout", f"upstream stalled for {proxy.timeout_s:g}s")
        except UpstreamError as exc:
            resp.close()
            return proxy._fail(conn, ex, 502, "error", "upstream response broken", detail=f"{proxy.upstream}: {exc}")
        ex.parse_body()
        meter = ex.meter
        output, inputs = meter.output_tokens, meter.input_tokens
        # Unknown is not zero: a count the upstream did not reveal gets no header.
        if output is not None:
            headers.append(("X-Token-Used-Output", str(output)))
        if inputs is not None:
            headers.append(("X-Token-Used-Input", str(inputs)))
        if output is not None and inputs is not None:
            headers.append(("X-Token-Used", str(output + inputs)))
        try:
            conn.start(resp.status, resp.reason or None, headers, sum(len(p) for p in parts))
            for data in parts:
                conn.write(data)
            await conn.drain()
            conn.end()
        except asyncio.CancelledError:
            ex.finish("cancelled", resp.status)
            raise
        except ConnectionError:
            ex.finish("cancelled", resp.status)
            return
        ex.finish()

    async def _relay(self, head: Sequence[bytes] = ()) -> None:
        """Forward the answer read by read (started from the head's callback already, or now with `head`,
        bytes already read and metered) until it ends."""
        conn, resp = self.conn, self.resp
        outcome = None
        try:
            if self.relay is None:
                self.start_relay(head)
            await self._until_end()
            conn.end()
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except ConnectionError:
            outcome = "cancelled"  # the client went away while we wrote
        except asyncio.TimeoutError:
            outcome = "timeout"
        except UpstreamError as exc:
            log.info("upstream stream broken: %s", exc)
            outcome = "error"
        finally:
            if outcome is not None:
                resp.close()  # stop the upstream's work (Triton cancels on disconnect)
                if outcome in ("timeout", "error"):
                    # Cut the client's stream too: ending it cleanly would present a truncated answer as whole.
                    conn.abort()
            # A normal end (outcome None) lets an error object sent under 200 name its own code.
            self.ex.finish(outcome, None if outcome is None else resp.status)

    async def _until_end(self) -> None:
        """Wait until the upstream's answer ended (raises what ended it otherwise): asyncio.TimeoutError after
        `timeout_s` without a read while the client keeps up; while the client's buffer is full the upstream
        is paused (and the timeout with it) until the buffer drains."""
        resp, relay, timeout_s = self.resp, self.relay, self.proxy.timeout_s
        if relay is None:
            raise RuntimeError("waiting for an answer's end before its relay started")
        loop = asyncio.get_running_loop()
        done = resp.done
        stalled = None  # since when the client's buffer has been full
        while not done.done():
            if relay.full:
                if relay.transport.is_closing() or self.conn.closed:
                    raise ConnectionResetError("client gone")
                now = time.perf_counter()
                if relay.transport.get_write_buffer_size() <= _RESUME_BYTES:
                    relay.full = False
                    stalled = None
                    resp.last_read = now
                    resp.resume()
                    continue
                if stalled is None:
                    stalled = now
                elif now - stalled > self.conn.server.bounds.send_timeout_s:
                    self.conn.send_timed_out()
                    raise ConnectionResetError("client took nothing of its answer")
                await asyncio.wait((done,), timeout=_PAUSED_POLL_S)
                continue
            wait = resp.last_read + timeout_s - time.perf_counter()
            if wait <= 0:
                raise asyncio.TimeoutError
            # One future, woken by the end, by the relay when the client's buffer fills up, or by the timer
            # (cheaper than asyncio.wait, which this runs once per request).
            waiter = relay.filled = loop.create_future()
            done.add_done_callback(relay.wake)
            timer = loop.call_later(wait, relay.wake)
            try:
                await waiter
            finally:
                timer.cancel()
                done.remove_done_callback(relay.wake)
                relay.filled = None
        done.result()


class _Relay:
    """The hot path: each upstream read is written to the client's transport (chunk-framed when the
    response is chunked, RFC 9112 §7.1) and then metered. `write` returns True when the client's buffer is
    above _PAUSE_BYTES (the upstream is then paused)."""

    __slots__ = ("transport", "framed", "chunk", "resp", "full", "filled")

    def __init__(self, transport, framed: bool, chunk, resp: Response):
        self.transport = transport
        self.framed = framed
        self.chunk = chunk
        self.resp = resp
        self.full = False
        self.filled: asyncio.Future | None = None  # the handler waits on it while the client keeps up

    def write(self, data: bytes) -> bool:
        self.resp.last_read = now = time.perf_counter()
        transport = self.transport
        if transport.is_closing():
            return self._fill()  # the client is gone: stop reading (the handler is cancelled, or sees it)
        # One buffer, one write: a small event costs less copied once than as three buffers.
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.framed else data)
        if self.chunk is not None:
            self.chunk(data, now)
        if transport.get_write_buffer_size() > _PAUSE_BYTES:
            return self._fill()
        return self.full

    def _fill(self) -> bool:
        self.full = True
        self.wake()
        return True

    def wake(self, _done=None) -> None:
        if self.filled is not None and not self.filled.done():
            self.filled.set_result(None)
