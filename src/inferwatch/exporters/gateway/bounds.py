"""Bounded client connections for the gateway's server (httpserver.py): idle or slow sockets cannot take the
file descriptors that streams need.

A server that keeps a connection open as long as its client likes (aiohttp's default keep-alive: 3,630 s)
and accepts until the process runs out of descriptors can be locked by a few thousand idle or slow-loris
sockets: every accept() then fails and no stream gets through. The bounds (spec `gateway:`):
  - header timeout (`header_timeout`, 10 s): a request head must be complete within this of its first byte,
    and a new connection that sends nothing is closed this long after opening (408 when part of a head
    arrived, else closed without an answer);
  - body timeout (`body_timeout`, 60 s): a request body must arrive within this of its head (else 408);
  - idle timeout (`idle_timeout`, 75 s): a kept-alive connection without a request this long is closed;
  - send timeout (`send_timeout`, 60 s): a client that takes nothing of its answer this long (the gateway's
    buffer towards it full) is cut off and its upstream request closed (the proxy checks it while it waits);
  - a cap (`max_connections`, 4,096): beyond it the connections that are idle or still sending a head are
    closed, the one idle longest first; a request whose head has arrived is never cut; only when no connection
    is idle is the new one closed. The cap is lowered so that it stays below the process's file-descriptor
    limit with each connection's upstream connection counted (a request in progress holds two descriptors):
    (limit − FD_RESERVE) / 2. accept() itself then never fails;
  - one log line per condition a minute (ConditionLog), also for the event loop's own accept errors.
Timeouts are checked once a second (SWEEP_INTERVAL_S), so each is enforced within a second of its value.
Counted in gateway_client_connections and gateway_client_connections_closed_total{reason}.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from inferwatch.connections import ACCEPT_BACKLOG, SWEEP_INTERVAL_S, log_accept_errors, raise_fd_limit
from inferwatch.ratelog import ConditionLog


class Tracked(Protocol):
    """What the bounds read of a connection (httpserver.ServerConnection): its state ("head", "body", "busy",
    idle otherwise), loop.time() it entered it, the requests it has served; close() ends it."""

    state: str
    since: float
    served: int

    def close(self) -> None: ...

log = logging.getLogger(__name__)

# Descriptors kept free besides two per capped connection: an accept burst (up to the backlog per wake-up,
# each closed at once above the cap), the lean upstream client's idle connections (upstream.py
# MAX_IDLE_CONNECTIONS) and the process's own (logs, /metrics, its render's pipes, the loop).
FD_RESERVE = ACCEPT_BACKLOG + 256 + 64
CLOSE_REASONS = ("header_timeout", "body_timeout", "idle_timeout", "send_timeout", "connection_cap")


def connection_cap(configured: int, fd_limit: int) -> int:
    """The cap in force: `configured`, lowered to (fd_limit − FD_RESERVE) / 2 (at least 16)."""
    return max(16, min(configured, (fd_limit - FD_RESERVE) // 2))


class ConnectionMetrics:
    """gateway_client_connections{} and gateway_client_connections_closed_total{reason} on `registry`."""

    def __init__(self, registry: CollectorRegistry):
        self.open = Gauge("gateway_client_connections", "Open client connections to the gateway's proxy port.",
                          registry=registry, multiprocess_mode="livesum")
        self.closed = Counter("gateway_client_connections_closed", "Client connections the gateway closed itself, "
                              "by reason (header_timeout|body_timeout|idle_timeout|send_timeout|connection_cap).",
                              ("reason",),
                              registry=registry)
        for reason in CLOSE_REASONS:
            self.closed.labels(reason)


class ConnectionBounds:
    """Tracks every connection of an HttpServer and enforces the timeouts and the cap (module docstring).

    Connections report `opened`, `changed` (their `state`: idle|head|body|busy, `since`, `served`) and
    `lost`; they offer `timed_out(status, reason)` and `close()`."""

    def __init__(self, *, max_connections: int, header_timeout_s: float, body_timeout_s: float,
                 idle_timeout_s: float, send_timeout_s: float = 60.0, metrics: ConnectionMetrics | None = None,
                 fd_limit: int | None = None):
        self.configured = max_connections
        self.max_connections = connection_cap(max_connections, fd_limit if fd_limit is not None else raise_fd_limit())
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.send_timeout_s = send_timeout_s
        self.backlog = ACCEPT_BACKLOG
        self.metrics = metrics
        self.log = ConditionLog(log)
        self._open: dict[Tracked, None] = {}
        # Connections idle or sending a head, the one in that set longest first: the first to close.
        self._idle: collections.OrderedDict[Tracked, None] = collections.OrderedDict()
        self._sweeper: asyncio.Task | None = None

    @property
    def open(self) -> int:
        return len(self._open)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweeper is not None:
            return
        self._sweeper = loop.create_task(self._sweep_forever())
        # Below the cap accept() does not fail; another process's descriptors (or a lowered limit) can still
        # make it: one line a minute then.
        log_accept_errors(loop, self.log, self.max_connections)

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections now, busy ones once done or after `grace_s` (their handlers are cancelled)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self._open:
            for conn in list(self._open):
                if conn.state != "busy" or loop.time() >= deadline:
                    conn.close()
            if loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        # connection_lost arrives on the next iterations; cancelled handlers then finish their clean-up.
        for _ in range(10):
            if not self._open:
                break
            await asyncio.sleep(0.01)

    # ---------------------------------------------------------------------------------- connection events
    def opened(self, conn) -> None:
        self._open[conn] = None
        self._idle[conn] = None
        if self.metrics is not None:
            self.metrics.open.inc()
        if len(self._open) > self.max_connections:
            self._shed(conn)

    def changed(self, conn) -> None:
        if conn.state in ("idle", "head"):
            if conn not in self._idle and conn in self._open:
                self._idle[conn] = None
        else:
            self._idle.pop(conn, None)

    def lost(self, conn) -> None:
        if conn in self._open:
            del self._open[conn]
            if self.metrics is not None:
                self.metrics.open.dec()
        self._idle.pop(conn, None)

    def _shed(self, newest) -> None:
        """Over the cap: close the connections idle longest (the newest one last) until at the cap."""
        over = len(self._open) - self.max_connections
        victims: list[Tracked] = []
        for conn in self._idle:
            if len(victims) >= over:
                break
            if conn is not newest:
                victims.append(conn)
        if len(victims) < over and newest in self._idle:
            victims.append(newest)
            self.log.log("cap-busy", logging.WARNING, "connection cap reached (%d) with every connection busy: "
                         "closing new connections (gateway.max_connections)", self.max_connections)
        elif victims:
            self.log.log("cap", logging.WARNING, "connection cap reached (%d open): closing the connections idle "
                         "longest first (gateway.max_connections)", self.max_connections)
        for conn in victims:
            self._close(conn, None, "connection_cap")

    def send_timed_out(self, conn) -> None:
        """`conn`'s client took nothing of its answer for send_timeout_s: count, log (once a minute), cut."""
        self.log.log("send", logging.WARNING, "cut off a client that took nothing of its answer for %gs "
                     "(gateway.send_timeout)", self.send_timeout_s)
        self._close(conn, None, "send_timeout", abort=True)

    def _close(self, conn, status: int | None, reason: str, message: str = "", abort: bool = False) -> None:
        # Out of the tables now (connection_lost comes on a later iteration): the cap counts what is open.
        self.lost(conn)
        if self.metrics is not None:
            self.metrics.closed.labels(reason).inc()
        conn.timed_out(status, message, abort)

    # ----------------------------------------------------------------------------------------- sweep
    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                self.sweep(loop.time())
            except Exception:  # noqa: BLE001 - the sweeper must outlive a bad pass
                self.log.log("sweep", logging.ERROR, "connection sweep failed", exc_info=True)

    def sweep(self, now: float) -> None:
        """Close the connections past a timeout (loop.time() `now`)."""
        late: dict[str, list] = {"header_timeout": [], "idle_timeout": [], "body_timeout": []}
        for conn in list(self._idle):
            waited = now - conn.since
            if conn.state == "head" or conn.served == 0:
                if waited > self.header_timeout_s:
                    late["header_timeout"].append(conn)
            elif waited > self.idle_timeout_s:
                late["idle_timeout"].append(conn)
        for conn in self._open:
            if conn.state == "body" and now - conn.since > self.body_timeout_s:
                late["body_timeout"].append(conn)
        for reason, conns in late.items():
            status = 408 if reason != "idle_timeout" else None
            what = "head" if reason == "header_timeout" else "body"
            limit = self.header_timeout_s if reason == "header_timeout" else self.body_timeout_s
            for conn in conns:
                self._close(conn, status, reason, f"request {what} not received within {limit:g}s")
        if late["header_timeout"]:
            self.log.log("header", logging.WARNING, "closed %d connection(s) that sent no complete request head "
                         "within %gs (gateway.header_timeout)", len(late["header_timeout"]), self.header_timeout_s)
        if late["body_timeout"]:
            self.log.log("body", logging.WARNING, "closed %d connection(s) whose request body did not arrive "
                         "within %gs (gateway.body_timeout): 408", len(late["body_timeout"]), self.body_timeout_s)
