"""The HTTP server of the exporters' /metrics (GPU exporter, Triton collector): aiohttp on one event loop in
one thread, with the connection bounds the notifier's intake has (connections.py), so idle or slow-loris
sockets cannot take the threads or file descriptors Prometheus's scrapes need.

A thread per connection (prometheus-client's and wsgiref's servers) holds a thread and a descriptor for as
long as a client keeps its socket open, with no timeout: 1,100 idle connections exhaust a 1,024-fd process
and every scrape fails. Here connections cost a descriptor and a little memory each, and:
  - a connection that sends no complete request head within `header_timeout_s` is closed (slow-loris);
  - a kept-alive connection idle for `idle_timeout_s` is closed (above Prometheus's default scrape interval
    of 1 m, so its kept-alive scrape connection is reused, not reopened);
  - beyond `max_connections` (lowered below the fd limit) the oldest idle connections are closed first;
  - one log line per condition a minute, naming the flag that sets the bound; a request aiohttp's parser
    refuses (a scanner, TLS on the plain port) is answered 400 and logged the same way, without traceback.
Work that takes CPU (rendering an exposition) runs in a pool of `render_threads` threads, so the loop keeps
accepting and sweeping; the process's threads are the loop's, the pool's and the service's own.

Flags (`add_bound_args`): --max-connections (default 512), --header-timeout (10s), --idle-timeout (120s).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import gzip
import logging
import sys
import threading
from typing import Any, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import choose_encoder, gzip_accepted

from inferwatch.connections import (
    ACCEPT_BACKLOG,
    SWEEP_INTERVAL_S,
    ConnectionGuard,
    Settings,
    connection_cap,
    raise_fd_limit,
)
from inferwatch.errors import UsageError
from inferwatch.loops import close_stopped_loop
from inferwatch.ratelog import ConditionLog
from inferwatch.specload import Duration

log = logging.getLogger(__name__)

SETTINGS = Settings("--max-connections", "--header-timeout")
CLOSE_REASONS = ("connection_cap", "header_timeout", "idle_timeout")
MIN_CONNECTIONS = 16


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Connection bounds of one server: `max_connections` (before lowering to the fd limit), seconds."""

    max_connections: int = 512
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0


def add_bound_args(parser: argparse.ArgumentParser, defaults: Bounds = Bounds()) -> None:
    """--max-connections, --header-timeout and --idle-timeout (read back with `bounds_from_args`)."""
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections, metavar="N",
                        help="open client connections at most; beyond, the oldest idle ones are closed first "
                             "(a scrape in progress is never cut). Lowered to the file-descriptor limit - 256 "
                             f"when that is smaller; at least {MIN_CONNECTIONS} (default {defaults.max_connections})")
    parser.add_argument("--header-timeout", default=f"{defaults.header_timeout_s:g}s", metavar="DURATION",
                        help="a connection that has not sent a complete request head this long after opening "
                             f"is closed (slow-loris, idle sockets; default {defaults.header_timeout_s:g}s)")
    parser.add_argument("--idle-timeout", default=f"{defaults.idle_timeout_s:g}s", metavar="DURATION",
                        help="a kept-alive connection idle this long is closed; keep it above the scrape "
                             f"interval so Prometheus reuses its connection (default {defaults.idle_timeout_s:g}s)")


def bounds_from_args(args: argparse.Namespace) -> Bounds:
    """The Bounds of --max-connections/--header-timeout/--idle-timeout. Raises UsageError naming the flag."""
    if args.max_connections < MIN_CONNECTIONS:
        raise UsageError(f"--max-connections: expected at least {MIN_CONNECTIONS}, got {args.max_connections}")
    seconds = {}
    for flag, text in (("--header-timeout", args.header_timeout), ("--idle-timeout", args.idle_timeout)):
        try:
            seconds[flag] = Duration.parse(text).seconds
        except ValueError as exc:  # SpecError is a ValueError
            raise UsageError(f"{flag}: {exc}") from None
        if seconds[flag] <= 0:
            raise UsageError(f"{flag}: expected a positive duration, got {text!r}")
    return Bounds(args.max_connections, seconds["--header-timeout"], seconds["--idle-timeout"])


class ConnectionMetrics:
    """`<prefix>_http_connections` (open now) and `<prefix>_http_connections_closed_total{reason}` (closed by
    the server: connection_cap, header_timeout, idle_timeout), every reason created at 0."""

    def __init__(self, registry: CollectorRegistry, prefix: str):
        self.connections = Gauge(f"{prefix}_http_connections", "Client connections open to this /metrics "
                                 "server.", registry=registry)
        self.connections_closed = Counter(f"{prefix}_http_connections_closed_total", "Client connections the "
                                          "server closed itself, by reason (connection_cap: over "
                                          "--max-connections, the oldest idle first; header_timeout; "
                                          "idle_timeout).", ["reason"], registry=registry)
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason)


def exposition(registry: Any, accept: str | None, accept_encoding: str | None) -> tuple[str, bool, bytes]:
    """(Content-Type, gzipped?, body) of `registry` for a scrape with these headers, negotiated as
    prometheus-client's own handler does (OpenMetrics or the 0.0.4 text format; gzip when accepted)."""
    encoder, content_type = choose_encoder(accept or "")
    compress = gzip_accepted(accept_encoding or "")
    body = encoder(registry)
    return content_type, compress, gzip.compress(body) if compress else body


def metrics_response(content_type: str, gzipped: bool, body: bytes) -> web.Response:
    headers = {"Content-Type": content_type}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


class _ParserLog(logging.LoggerAdapter):
    """aiohttp's server logger: a request its HTTP parser refuses (answered 400 before any handler: a scanner,
    TLS on the plain port, a header line over 8190 bytes) is logged once a minute per kind, without traceback;
    anything else is logged as aiohttp logs it."""

    def __init__(self, conditions: ConditionLog):
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.conditions = conditions

    def log(self, level, msg, *args, exc_info=None, **kwargs) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1] if exc_info else None
        if isinstance(exc, HttpProcessingError):
            detail = " ".join(str(exc.message).split())[:200]
            self.conditions.log(f"malformed:{type(exc).__name__}", logging.WARNING,
                                "refused a malformed request (%s: %s)", type(exc).__name__, detail)
            return
        self.logger.log(level, msg, *args, exc_info=exc_info, **kwargs)


class BoundedServer:
    """`app` served on `host`:`port` (0: a free port, `.port` after start) from its own thread and loop.

    `metrics`: a ConnectionMetrics to count in; `fd_reserve`: descriptors the service needs besides the
    server's reserve (lowers the cap); `render_threads`: the pool `run_blocking` uses. `start()` binds and
    returns once listening (raises OSError when the address cannot be had); `stop()` closes everything.
    """

    def __init__(self, app: web.Application, host: str, port: int, bounds: Bounds = Bounds(), *,
                 name: str = "http", metrics: ConnectionMetrics | None = None, fd_reserve: int = 0,
                 render_threads: int = 2):
        self.app, self.host, self.port, self.bounds = app, host, port, bounds
        self.name = name
        self.metrics = metrics
        self.fd_reserve = fd_reserve
        self.max_connections = bounds.max_connections
        self.guard: ConnectionGuard | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(render_threads, thread_name_prefix=f"{name}-render")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._conditions = ConditionLog(log)

    async def run_blocking(self, fn: Callable, *args) -> Any:
        """`fn(*args)` in the render pool (CPU-bound work that must not stall the loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _start(self) -> None:
        b = self.bounds
        # aiohttp's own keep-alive timer only backs the guard's sweep up, so idle closes are counted.
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0, handle_signals=False,
                                     keepalive_timeout=b.idle_timeout_s + 2 * SWEEP_INTERVAL_S,
                                     logger=_ParserLog(self._conditions))
        await self._runner.setup()
        self.max_connections = connection_cap(b.max_connections, raise_fd_limit(), self.fd_reserve)
        self.guard = ConnectionGuard(self._runner.server, max_connections=self.max_connections,
                                     header_timeout_s=b.header_timeout_s, idle_timeout_s=b.idle_timeout_s,
                                     settings=SETTINGS, metrics=self.metrics)
        self.guard.start()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=ACCEPT_BACKLOG)
        try:
            await site.start()
        except BaseException:
            await self._stop()
            raise
        if self.port == 0:
            self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self.guard is not None:
            await self.guard.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def start(self) -> "BoundedServer":
        started = threading.Event()
        errors: list[BaseException] = []
        loop = self._loop = asyncio.new_event_loop()

        def run() -> None:
            try:
                loop.run_until_complete(self._start())
            except BaseException as exc:  # noqa: BLE001 - reported to the caller of start()
                errors.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"{self.name}-http", daemon=True)
        self._thread.start()
        started.wait()
        if errors:
            self._thread.join(5)
            self._loop.close()
            self._pool.shutdown(wait=False)
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)
        close_stopped_loop(self._loop, self._thread)
        self._pool.shutdown(wait=False)

    @property
    def open_connections(self) -> int:
        return self.guard.open if self.guard is not None else 0
