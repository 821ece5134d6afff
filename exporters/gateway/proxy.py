"""The streaming reverse proxy: aiohttp server in front, aiohttp client to the upstream.

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
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.exchange import Exchange
from inferwatch.exporters.gateway.routes import BadTarget, canonical_target, decoded_path

log = logging.getLogger(__name__)

# RFC 9110 §7.6.1 hop-by-hop fields, plus the ones the HTTP stacks set themselves (Host, framing).
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                         "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"))
# Request fields not copied to the upstream: X-Forwarded-For is rebuilt (client's list + peer address).
_NOT_FORWARDED = _HOP_BY_HOP | {"x-forwarded-for"}
CLIENT_CLOSED = 499  # nginx's code for "client closed the request before the answer"


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
        self.session: aiohttp.ClientSession | None = None

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

    async def _close(self, _app) -> None:
        if self.session is not None:
            await self.session.close()

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
            ex.meter.upstream_begin()
        try:
            # encoded=True: the canonical target goes out exactly as classified (yarl would re-normalise it).
            upstream = await self.session.request(request.method, URL(self.upstream + target, encoded=True),
                                                  data=body, headers=headers, allow_redirects=False)
        except asyncio.CancelledError:
            if ex is not None:
                ex.finish("cancelled", CLIENT_CLOSED)
            raise
        except asyncio.TimeoutError:
            return self._fail(ex, 504, "timeout", f"upstream did not answer within {self.timeout_s:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return self._fail(ex, 502, "error", "upstream unavailable",
                              detail=f"{self.upstream}: {exc.__class__.__name__}: {exc}")
        try:
            if ex is not None:
                ex.response_start(upstream.status, upstream.headers.get("Content-Type"),
                                  upstream.headers.get("Content-Encoding"))
                if not ex.sse:
                    return await self._whole(request, upstream, ex)
            return await self._stream(request, upstream, ex)
        finally:
            upstream.release()

    async def _whole(self, request: web.Request, upstream: aiohttp.ClientResponse, ex: Exchange) -> web.StreamResponse:
        """A non-streamed LLM response: read it (up to ex.limit bytes), count its tokens, answer with
        X-Token-Used. A larger answer is streamed through unmetered, starting with what was read."""
        length = upstream.content_length
        if length is not None and length > ex.limit:
            ex.stop("too_large", f"answer above {ex.limit} bytes (Content-Length)")
            return await self._stream(request, upstream, ex)
        parts: list[bytes] = []
        try:
            async for data in upstream.content.iter_any():
                parts.append(data)
                ex.chunk(data)
                if not ex.metering:  # above the limit (or undecodable): no header to wait for
                    return await self._stream(request, upstream, ex, head=parts)
        except asyncio.CancelledError:
            upstream.close()
            ex.finish("cancelled", CLIENT_CLOSED)
            raise
        except asyncio.TimeoutError:
            upstream.close()
            return self._fail(ex, 504, "timeout", f"upstream stalled for {self.timeout_s:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            upstream.close()
            return self._fail(ex, 502, "error", "upstream response broken",
                              detail=f"{self.upstream}: {exc.__class__.__name__}: {exc}")
        ex.parse_body()
        headers = _response_headers(upstream)
        meter = ex.meter
        output, inputs = meter.output_tokens, meter.input_tokens
        # Unknown is not zero: a count the upstream did not reveal gets no header.
        if output is not None:
            headers["X-Token-Used-Output"] = str(output)
        if inputs is not None:
            headers["X-Token-Used-Input"] = str(inputs)
        if output is not None and inputs is not None:
            headers["X-Token-Used"] = str(output + inputs)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        response.content_length = sum(len(p) for p in parts)
        try:
            await response.prepare(request)
            for data in parts:
                await response.write(data)
            await response.write_eof()
        except asyncio.CancelledError:
            ex.finish("cancelled", upstream.status)
            raise
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            ex.finish("cancelled", upstream.status)
            return response
        ex.finish()
        return response

    async def _stream(self, request: web.Request, upstream: aiohttp.ClientResponse,
                      ex: Exchange | None, head: list[bytes] = ()) -> web.StreamResponse:
        """Forward the answer read by read (after `head`, bytes already read and metered)."""
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                      headers=_response_headers(upstream))
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        outcome = None
        try:
            await response.prepare(request)
            write = response.write
            chunk = ex.chunk if ex is not None else None
            perf = time.perf_counter
            for data in head:
                await write(data)
            # readany: whatever the socket delivered, at once — one SSE event per read in the usual case
            # (iter_any() without its iterator layer: this loop runs once per event); b"" is the end.
            readany = upstream.content.readany
            while data := await readany():
                now = perf()
                await write(data)
                if chunk is not None:
                    chunk(data, now)
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
                upstream.close()  # stop the upstream's work (Triton cancels on disconnect)
                if outcome in ("timeout", "error") and request.transport is not None:
                    # Cut the client's stream too: ending it cleanly would present a truncated answer as whole.
                    request.transport.close()
            if ex is not None:
                # A normal end (outcome None) lets an error object sent under 200 name its own code.
                ex.finish(outcome, None if outcome is None else upstream.status)
        return response

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


def _response_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict:
    # A multidict keeps repeated fields (Set-Cookie) as the upstream sent them.
    return CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP)
