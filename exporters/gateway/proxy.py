"""The streaming reverse proxy: aiohttp server in front; to the upstream, metered (LLM) requests go through
the lean client of upstream.py (each read relayed and metered from its parser callback: the hot path) and
every other request through aiohttp's client.

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
never cut). A client that disconnects cancels the handler (aiohttp handler_cancellation): the upstream
connection is closed, which makes Triton cancel the request, and the request counts as `cancelled`.

Credentials in the upstream URL (`http://user:pass@host:8000`) are sent as HTTP Basic auth (unless the client
sent its own Authorization) and never appear in a log line, an error text or a metric: the proxy keeps the
URL without them (`Proxy.upstream`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
from aiohttp import HttpVersion11, web
from multidict import CIMultiDict
from yarl import URL

from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.exchange import Exchange
from inferwatch.exporters.gateway.routes import BadTarget, canonical_target, decoded_path
from inferwatch.exporters.gateway.upstream import Pool, Response, UpstreamError, request_head

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


def _json_error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=json.dumps({"error": message}).encode(),
                        content_type="application/json")


def split_credentials(url: str) -> tuple[str, aiohttp.BasicAuth | None]:
    """(`url` without user-info and trailing slash, its credentials as BasicAuth or None)."""
    parsed = URL(url)
    auth = None
    if parsed.user is not None or parsed.password is not None:
        auth = aiohttp.BasicAuth(parsed.user or "", parsed.password or "")
        parsed = parsed.with_user(None)
    return str(parsed).rstrip("/"), auth


class Proxy:
    """Forward every request to `upstream` (base URL), metering LLM routes through `gateway`."""

    def __init__(self, gateway: Gateway, upstream: str, timeout_s: float | None = None,
                 max_body_bytes: int | None = None):
        settings = gateway.spec.gateway
        self.gateway = gateway
        self.upstream, auth = split_credentials(upstream)  # self.upstream is safe to log
        self._authorization = auth.encode() if auth is not None else None
        self.timeout_s = timeout_s if timeout_s is not None else settings.upstream_timeout.seconds
        self.max_body_bytes = max_body_bytes if max_body_bytes is not None else settings.max_body_bytes
        self.session: aiohttp.ClientSession | None = None  # unmetered requests
        self.pool: Pool | None = None  # metered requests (upstream.py)

    # ------------------------------------------------------------------------------------------ app
    def app(self) -> web.Application:
        # client_max_size makes aiohttp itself refuse a larger body while reading it (chunked uploads too).
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False, ttl_dns_cache=300),
            timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
        self.pool = Pool(self.upstream, self.timeout_s)

    async def _close(self, _app) -> None:
        if self.session is not None:
            await self.session.close()
        if self.pool is not None:
            self.pool.close()

    # -------------------------------------------------------------------------------------- handler
    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            target = canonical_target(request.raw_path)
        except BadTarget as exc:
            log.info("refused %s request: %s", request.method, exc)
            return _json_error(400, f"bad request target: {exc}")
        path = decoded_path(target)
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            return self._refuse(request, path, started, length)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(request, path, started, None)
        ex = self.gateway.exchange(request.method, path, request.headers, body, started)
        # A multidict, so a header the client repeats reaches the upstream repeated, not collapsed to one.
        headers = CIMultiDict((k, v) for k, v in request.headers.items()
                              if k.lower() not in _NOT_FORWARDED)
        forwarded = ", ".join(request.headers.getall("X-Forwarded-For", ()))
        if request.remote:
            forwarded = f"{forwarded}, {request.remote}" if forwarded else request.remote
        if forwarded:
            headers["X-Forwarded-For"] = forwarded
        if self._authorization is not None and "Authorization" not in headers:
            headers["Authorization"] = self._authorization
        if ex is not None:
            return await self._metered(request, target, body, headers, ex)
        try:
            # encoded=True: the canonical target goes out exactly as classified (yarl would re-normalise it).
            upstream = await self.session.request(request.method, URL(self.upstream + target, encoded=True),
                                                  data=body, headers=headers, allow_redirects=False)
        except asyncio.TimeoutError:
            return self._fail(None, 504, "timeout", f"upstream did not answer within {self.timeout_s:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return self._fail(None, 502, "error", "upstream unavailable",
                              detail=f"{self.upstream}: {exc.__class__.__name__}: {exc}")
        try:
            return await self._pass_through(request, upstream)
        finally:
            upstream.release()

    async def _pass_through(self, request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        """Forward an unmetered answer read by read."""
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                      headers=_response_headers(upstream.headers.items()))
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        outcome = None
        try:
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                await response.write(data)
            await response.write_eof()
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
                if outcome in ("timeout", "error") and request.transport is not None:
                    # Cut the client's stream too: ending it cleanly would present a truncated answer as whole.
                    request.transport.close()
        return response

    # ------------------------------------------------------------------------------ metered requests
    async def _metered(self, request: web.Request, target: str, body: bytes, headers: CIMultiDict,
                       ex: Exchange) -> web.StreamResponse:
        """Forward a metered request through the lean upstream client (upstream.py) and meter its answer."""
        ex.meter.upstream_begin()
        head = request_head(request.method, target, self.pool.host_header,
                            [(k, v) for k, v in headers.items() if k.lower() != "expect"], len(body))
        try:
            conn = await self.pool.connect()
        except asyncio.CancelledError:
            ex.finish("cancelled", CLIENT_CLOSED)
            raise
        except asyncio.TimeoutError:
            return self._fail(ex, 504, "timeout", f"upstream did not answer within {self.timeout_s:g}s")
        except OSError as exc:
            return self._fail(ex, 502, "error", "upstream unavailable",
                              detail=f"{self.upstream}: {exc.__class__.__name__}: {exc}")
        resp = conn.send(head, body)
        # One timer, cancelled when the head arrives (cheaper than a timeout context per request).
        timer = asyncio.get_running_loop().call_later(self.timeout_s, resp.expire)
        try:
            await resp.head
        except asyncio.CancelledError:
            resp.close()
            ex.finish("cancelled", CLIENT_CLOSED)
            raise
        except asyncio.TimeoutError:
            resp.close()
            return self._fail(ex, 504, "timeout", f"upstream did not answer within {self.timeout_s:g}s")
        except UpstreamError as exc:
            resp.close()
            return self._fail(ex, 502, "error", "upstream unavailable", detail=f"{self.upstream}: {exc}")
        finally:
            timer.cancel()
        headers_out = _response_headers(resp.headers)
        ex.response_start(resp.status, headers_out.get("Content-Type"), headers_out.get("Content-Encoding"))
        if not ex.sse:
            return await self._whole(request, resp, ex, headers_out)
        return await self._relay(request, resp, ex, headers_out)

    async def _whole(self, request: web.Request, resp: Response, ex: Exchange,
                     headers: CIMultiDict) -> web.StreamResponse:
        """A non-streamed LLM response: read it (up to ex.limit bytes), count its tokens, answer with
        X-Token-Used. A larger answer is relayed unmetered, starting with what was read."""
        length = resp.content_length
        if length is not None and length > ex.limit:
            ex.stop("too_large", f"answer above {ex.limit} bytes (Content-Length)")
            return await self._relay(request, resp, ex, headers)
        parts: list[bytes] = []
        try:
            while True:
                async with asyncio.timeout(self.timeout_s):
                    data = await resp.read()
                if not data:
                    break
                parts.append(data)
                ex.chunk(data)
                if not ex.metering:  # above the limit (or undecodable): no header to wait for
                    return await self._relay(request, resp, ex, headers, head=parts)
        except asyncio.CancelledError:
            resp.close()
            ex.finish("cancelled", CLIENT_CLOSED)
            raise
        except asyncio.TimeoutError:
            resp.close()
            return self._fail(ex, 504, "timeout", f"upstream stalled for {self.timeout_s:g}s")
        except UpstreamError as exc:
            resp.close()
            return self._fail(ex, 502, "error", "upstream response broken", detail=f"{self.upstream}: {exc}")
        ex.parse_body()
        meter = ex.meter
        output, inputs = meter.output_tokens, meter.input_tokens
        # Unknown is not zero: a count the upstream did not reveal gets no header.
        if output is not None:
            headers["X-Token-Used-Output"] = str(output)
        if inputs is not None:
            headers["X-Token-Used-Input"] = str(inputs)
        if output is not None and inputs is not None:
            headers["X-Token-Used"] = str(output + inputs)
        response = web.StreamResponse(status=resp.status, reason=resp.reason or None, headers=headers)
        response.content_length = sum(len(p) for p in parts)
        try:
            await response.prepare(request)
            for data in parts:
                await response.write(data)
            await response.write_eof()
        except asyncio.CancelledError:
            ex.finish("cancelled", resp.status)
            raise
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            ex.finish("cancelled", resp.status)
            return response
        ex.finish()
        return response

    async def _relay(self, request: web.Request, resp: Response, ex: Exchange, headers: CIMultiDict,
                     head: list[bytes] = ()) -> web.StreamResponse:
        """Forward the answer read by read, each read written to the client from the upstream connection's
        parser callback and metered after (`head`: bytes already read and metered)."""
        response = web.StreamResponse(status=resp.status, reason=resp.reason or None, headers=headers)
        framed = False
        if resp.content_length is not None:
            response.content_length = resp.content_length
        elif request.version >= HttpVersion11:
            response.enable_chunked_encoding()
            framed = True  # aiohttp frames what goes through it; the relay frames its own writes
        outcome = None
        try:
            await response.prepare(request)
            for data in head:
                await response.write(data)
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("client gone")
            relay = _Relay(transport, framed, ex.chunk if ex.metering else None, resp)
            resp.relay(relay.write)
            await self._until_end(resp, relay)
            await response.write_eof()
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            outcome = "cancelled"  # the client went away while we wrote
        except asyncio.TimeoutError:
            outcome = "timeout"
        except UpstreamError as exc:
            log.info("upstream stream broken: %s", exc)
            outcome = "error"
        finally:
            if outcome is not None:
                resp.close()  # stop the upstream's work (Triton cancels on disconnect)
                if outcome in ("timeout", "error") and request.transport is not None:
                    # Cut the client's stream too: ending it cleanly would present a truncated answer as whole.
                    request.transport.close()
            # A normal end (outcome None) lets an error object sent under 200 name its own code.
            ex.finish(outcome, None if outcome is None else resp.status)
        return response

    async def _until_end(self, resp: Response, relay: "_Relay") -> None:
        """Wait until the upstream's answer ended (raises what ended it otherwise): asyncio.TimeoutError after
        `timeout_s` without a read while the client keeps up; while the client's buffer is full the upstream
        is paused (and the timeout with it) until the buffer drains."""
        loop = asyncio.get_running_loop()
        done = resp.done
        while not done.done():
            if relay.full:
                if relay.transport.is_closing():
                    raise ConnectionResetError("client gone")
                if relay.transport.get_write_buffer_size() <= _RESUME_BYTES:
                    relay.full = False
                    resp.last_read = time.perf_counter()
                    resp.resume()
                    continue
                await asyncio.wait((done,), timeout=_PAUSED_POLL_S)
                continue
            wait = resp.last_read + self.timeout_s - time.perf_counter()
            if wait <= 0:
                raise asyncio.TimeoutError
            relay.filled = loop.create_future()  # set by the relay when the client's buffer fills up
            await asyncio.wait((done, relay.filled), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            relay.filled = None
        done.result()

    def _refuse(self, request: web.Request, path: str, started: float, length: int | None) -> web.Response:
        ex = self.gateway.exchange(request.method, path, request.headers, b"", started)
        limit = self.max_body_bytes
        if ex is not None:
            ex.response_start(413, None)
            ex.finish("error", 413)
        got = f"{length} bytes" if length is not None else "more"
        return _json_error(413, f"request body too large: {got}, limit {limit} bytes (gateway.max_body_bytes)")

    def _fail(self, ex: Exchange | None, status: int, outcome: str, message: str,
              detail: str | None = None) -> web.Response:
        """Answer `status` with `message`; `detail` (upstream address, exception) goes to the log only:
        clients must not learn internal addresses."""
        if detail:
            log.warning("%s: %s", message, detail)
        else:
            log.warning("%s", message)
        if ex is not None:
            ex.response_start(status, None)
            ex.finish(outcome, status)
        return _json_error(status, message)


def _response_headers(pairs) -> CIMultiDict:
    # A multidict keeps repeated fields (Set-Cookie) as the upstream sent them.
    return CIMultiDict((k, v) for k, v in pairs if k.lower() not in _HOP_BY_HOP)


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
        if self.filled is not None and not self.filled.done():
            self.filled.set_result(None)
        return True
