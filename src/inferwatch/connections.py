"""Bounded client connections for inferwatch's aiohttp servers (the notifier's intake, the GPU exporter's and
the Triton collector's /metrics), so idle or slow sockets cannot lock Alertmanager or Prometheus out.

aiohttp alone keeps a connection that never sends a request for an hour (keepalive_timeout 3630 s) and
accepts until the process runs out of file descriptors; then every accept() fails, asyncio logs a
traceback per failed accept, and no request gets through. ConnectionGuard adds:
  - a header timeout: a connection that has not sent a complete request head within `header_timeout_s`
    of opening is closed (slowloris, idle sockets);
  - an idle timeout: a kept-alive connection idle for `idle_timeout_s` is closed (aiohttp's keep-alive
    timer, set to the same value);
  - a cap: beyond `max_connections` open connections, the oldest idle ones are closed first (a request in
    progress is never cut), and only when none is idle is the new one refused. The cap stays below the
    process's file-descriptor limit (less FD_RESERVE for the outbox, the channels and the loop), so accept()
    itself never fails;
  - one log line per condition and minute (ratelog.ConditionLog), also for asyncio's own accept errors.
Each service names where its bounds are set (`settings`), so the log line says what to change: the
notifier's `notifier.max_connections` ..., the exporters' `--max-connections` ... (httpserver.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource

from inferwatch.ratelog import ConditionLog

log = logging.getLogger(__name__)

# asyncio accepts up to `backlog` connections per wake-up and a closed one frees its descriptor only on the
# next loop iteration, so a burst can hold cap + ACCEPT_BACKLOG descriptors for a moment.
ACCEPT_BACKLOG = 128
# Descriptors kept free besides the cap: an accept burst, SQLite (3 per thread), channel requests, the loop.
FD_RESERVE = ACCEPT_BACKLOG + 128
SWEEP_INTERVAL_S = 1.0


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (as Go's runtime does since 1.19); returns
    the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def log_accept_errors(loop: asyncio.AbstractEventLoop, condition_log: ConditionLog, limit: int) -> None:
    """Have `loop` report a failed accept() once a minute through `condition_log`; its other errors go to the
    handler it had. asyncio reports a failed accept() (EMFILE/ENFILE/ENOBUFS) with a traceback each time and
    retries a second later: under a connection flood, a traceback per second."""
    default = loop.get_exception_handler()

    def on_loop_error(loop, context):
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            condition_log.log("accept", logging.ERROR, "cannot accept connections: %s (limit: %d connections)",
                              context.get("exception"), limit)
            return
        if default is not None:
            default(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(on_loop_error)


def connection_cap(configured: int, fd_limit: int, extra_reserve: int = 0) -> int:
    """The cap in force: the configured one, lowered to leave FD_RESERVE descriptors free, plus
    `extra_reserve` a service holds on its own (the Triton collector's client connections); at least 16."""
    return max(16, min(configured, fd_limit - FD_RESERVE - extra_reserve))


@dataclasses.dataclass
class _Conn:
    opened: float
    active: float          # last time a request was seen in progress (or the connection opened)
    requests: int = 0      # request heads aiohttp has parsed on it


def _busy(handler) -> bool:
    """A request is being handled on this aiohttp RequestHandler (reads aiohttp internals, in one place)."""
    return bool(getattr(handler, "_request_in_progress", False)) or \
        getattr(handler, "_current_request", None) is not None


def _requests(handler) -> int:
    return int(getattr(handler, "_request_count", 0))


@dataclasses.dataclass(frozen=True)
class Settings:
    """Where a service's bounds are set, as its log lines name them."""

    max_connections: str   # e.g. "notifier.max_connections", "--max-connections"
    header_timeout: str


class ConnectionGuard:
    """Attach to an aiohttp `web.Server` (runner.server) before the site starts; `start()` in its loop.

    `metrics`, when given, has `connections` (a Gauge: open connections) and `connections_closed` (a Counter
    labelled by reason: connection_cap, header_timeout, idle_timeout)."""

    def __init__(self, server, *, max_connections: int, header_timeout_s: float, idle_timeout_s: float,
                 settings: Settings, metrics=None, loop: asyncio.AbstractEventLoop | None = None):
        self.server = server
        self.settings = settings
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.metrics = metrics
        self._conns: dict[object, _Conn] = {}
        self._log = ConditionLog(log)
        self._task: asyncio.Task | None = None
        self._loop = loop
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler, transport):
            made(handler, transport)
            self._opened(handler)

        def connection_lost(handler, exc):
            self._conns.pop(handler, None)
            self._gauge()
            lost(handler, exc)

        server.connection_made = connection_made
        server.connection_lost = connection_lost

    def start(self) -> None:
        loop = self._loop or asyncio.get_running_loop()
        self._task = loop.create_task(self._sweep_forever())
        log_accept_errors(loop, self._log, self.max_connections)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    @property
    def open(self) -> int:
        return len(self._conns)

    # ------------------------------------------------------------------------------------------ events
    def _now(self) -> float:
        return (self._loop or asyncio.get_running_loop()).time()

    def _opened(self, handler) -> None:
        now = self._now()
        self._conns[handler] = _Conn(opened=now, active=now)
        if len(self._conns) > self.max_connections:
            self._shed(handler)
        self._gauge()

    def _shed(self, newest) -> None:
        """Over the cap: close the oldest idle connections (the newest one last) until at the cap."""
        self._refresh(self._now())
        idle = sorted((c.active, id(h), h) for h, c in self._conns.items() if not _busy(h))
        over = len(self._conns) - self.max_connections
        closed = 0
        for _, _, handler in idle[:over]:
            self._close(handler, "connection_cap")
            closed += 1
        if closed:
            self._log.log("cap", logging.WARNING, "connection cap reached (%d open): closing the oldest idle "
                          "connections first (%s)", self.max_connections, self.settings.max_connections)
        if len(self._conns) > self.max_connections and newest in self._conns:
            self._close(newest, "connection_cap")
            self._log.log("cap-busy", logging.WARNING, "connection cap reached (%d) with every connection busy: "
                          "refusing new connections", self.max_connections)

    def _close(self, handler, reason: str) -> None:
        self._conns.pop(handler, None)
        try:
            handler.force_close()
        except Exception:  # noqa: BLE001, S110 - a connection already torn down
            pass
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason).inc()

    def _refresh(self, now: float) -> None:
        for handler, c in self._conns.items():
            n = _requests(handler)
            if n != c.requests or _busy(handler):
                c.requests, c.active = n, now

    # ------------------------------------------------------------------------------------------- sweep
    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the sweeper must outlive a bad pass
                self._log.log("sweep", logging.ERROR, "connection sweep failed", exc_info=True)

    def sweep(self) -> None:
        now = self._now()
        self._refresh(now)
        slow = []
        idle = []
        for handler, c in list(self._conns.items()):
            if _busy(handler):
                continue
            if c.requests == 0 and now - c.opened > self.header_timeout_s:
                slow.append(handler)
            elif c.requests and now - c.active > self.idle_timeout_s:
                idle.append(handler)
        for handler in slow:
            self._close(handler, "header_timeout")
        for handler in idle:
            self._close(handler, "idle_timeout")
        if slow:
            self._log.log("header", logging.WARNING, "closed %d connection(s) that sent no complete request within "
                          "%gs (%s)", len(slow), self.header_timeout_s, self.settings.header_timeout)
        self._gauge()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.connections.set(len(self._conns))
