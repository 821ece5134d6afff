"""The notifier service: aiohttp HTTP server (POST /alerts, GET /metrics, /-/healthy, /-/ready) plus the
delivery worker threads, over one outbox.

POST /alerts answers: 200 after the notification is committed to the outbox (group commit, see committer.py)
or recognised as a redelivery (a copy of a webhook the outbox holds: with a shared PostgreSQL outbox, whichever
replica took it) or as stale (stale.py); 400 for
what is not an Alertmanager payload at all (the message names the field; oversized or badly encoded values
are cut or replaced and accepted, see model.py); 401 missing/wrong
credentials; 408 a body slower than `notifier.body_timeout`; 413 body over `notifier.max_body_bytes`; 503
when the outbox cannot persist — the only 5xx, so Alertmanager (which retries 5xx only) retries exactly when
we did not keep the alert. Every answer is counted in inferwatch_notifier_webhooks_total{outcome}, and every
refusal is logged with its reason (one line per reason and field a minute, ratelog.ConditionLog), 404/405
for a wrong path or method included. /-/ready answers 503 while the outbox cannot be written.
With ha.answer_wait the 200 waits (that long at most) for the webhook's messages to be sent and says how many
reached their channel. Replicas share one PostgreSQL outbox (notifier.outbox.url, docs/ha.md); they never
talk to each other.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import sqlite3
import sys
import threading
import time
from pathlib import Path

from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError

from inferwatch.connections import ACCEPT_BACKLOG, ConnectionGuard, Settings, connection_cap, raise_fd_limit
from inferwatch.errors import UsageError
from inferwatch.loops import close_stopped_loop
from inferwatch.notifier import integrity
from inferwatch.notifier.backend import OutboxBackend, open_postgres, uses_postgres
from inferwatch.notifier.channels import build_channel
from inferwatch.notifier.channels.base import Channel
from inferwatch.notifier.committer import GroupCommitter
from inferwatch.notifier.exposition import metrics_handler
from inferwatch.notifier.intake import plan
from inferwatch.notifier.metrics import NotifierMetrics
from inferwatch.notifier.model import PayloadError, Repair, parse_webhook
from inferwatch.notifier.outbox import Outbox, OutboxError
from inferwatch.notifier.routing import Router
from inferwatch.notifier.stale import stale
from inferwatch.notifier.worker import DeliveryWorker
from inferwatch.ratelog import ConditionLog
from inferwatch.spec import Spec

log = logging.getLogger(__name__)

OUTBOX_FILE = integrity.OUTBOX_FILE
READY_PROBE_INTERVAL_S = 1.0  # while the outbox is unwritable, /-/ready tries a write at most this often
READY_WRITABLE_PROBE_S = 10.0  # while it is writable, at most this often (a disk that filled without a webhook)
PROBE_MIN_BYTES = 64 * 1024  # a readiness probe writes at least this much: a webhook of a few alerts


def open_outbox(path: Path, dedup_window_s: float, move_damaged: bool) -> Outbox:
    """The service's outbox after the integrity check (integrity.py); raises OutboxDamaged or UsageError."""
    damage = integrity.check_data_dir(path, move_damaged)
    if damage is not None:
        moved = integrity.move_aside(path)
        log.error("%s: moved aside to %s (%s); starting with an empty outbox", damage.what,
                  ", ".join(p.name for p in moved), "acknowledged webhooks lost: "
                  + ("unknown" if damage.lost is None else str(damage.lost)))
    try:
        outbox = Outbox(path, dedup_window_s=dedup_window_s, ledger=True)
        if damage is not None:
            integrity.record_loss(outbox._db(), damage, time.time())
    except (sqlite3.Error, OSError) as exc:
        raise UsageError(f"cannot use the outbox {path} in --data-dir {path.parent}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    return outbox


def check_channel_secrets(spec: Spec) -> None:
    """Resolve every channel's secrets (url, routing_key, headers) once at start-up, so a missing variable or
    file stops the notifier now (SpecError naming the field → exit 2), not at the first alert. The values
    are not kept: channels reveal them again at send time (a rotated file is picked up)."""
    for c in spec.channels.values():
        for secret in (c.url, c.routing_key, *c.headers.values()):
            if secret is not None:
                secret.reveal()


class _ServerLog(logging.LoggerAdapter):
    """aiohttp's server logger for the intake: a request its HTTP parser refuses (400 before any handler:
    a scanner, TLS on a plain port, a header over 8190 bytes) is counted and logged once a minute without
    a traceback; anything else (a handler bug) is logged as aiohttp logs it."""

    def __init__(self, service: "NotifierService"):
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.service = service

    def log(self, level, msg, *args, exc_info=None, **kwargs) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1] if exc_info else None
        if isinstance(exc, HttpProcessingError):
            detail = " ".join(str(exc.message).split())[:200]
            self.service.refused(None, "malformed", f"HTTP parser: {exc.code} {type(exc).__name__}: {detail}",
                                 key=type(exc).__name__)
            return
        self.logger.log(level, msg, *args, exc_info=exc_info, **kwargs)


class NotifierService:
    def __init__(self, spec: Spec, data_dir: str | Path | None = None, host: str = "127.0.0.1", port: int = 9410,
                 shared_port: int | None = None, *, move_damaged: bool = False):
        """Raises OutboxDamaged (integrity.py) when the outbox is damaged or incomplete, unless `move_damaged`
        (then it is moved aside and the notifier starts empty, the loss recorded), and UsageError when the data
        directory cannot hold an outbox (read-only, not a directory)."""
        self.spec = spec
        self.host = host
        self.port = port
        # Also accept on this port, bound with SO_REUSEPORT: notifier replicas on one host share it and the
        # kernel spreads new connections over the live ones (a killed replica's socket is gone at once).
        self.shared_port = shared_port
        self.data_dir = Path(data_dir or spec.notifier.data_dir)
        # A shared PostgreSQL (notifier.outbox.url, replicas) or SQLite in the data folder (the default).
        self.outbox: OutboxBackend = (open_postgres(spec) if uses_postgres(spec) else
                                      open_outbox(self.data_dir / OUTBOX_FILE, spec.notifier.dedup_window.seconds,
                                                  move_damaged))
        # Readiness probes write this much (a webhook's size, not a token row): the largest body seen, at least
        # PROBE_MIN_BYTES, at most notifier.max_body_bytes.
        self.probe_bytes = min(PROBE_MIN_BYTES, spec.notifier.max_body_bytes)
        # A write now, so readiness and inferwatch_notifier_outbox_writable are true from the start (a full disk
        # after a restart is known before the first webhook gets 503); a failure is logged once by the outbox.
        self._probe_ok = self.outbox.probe(self.probe_bytes)  # the last readiness probe's result
        self.router = Router(spec)
        check_channel_secrets(spec)
        self.channels: dict[str, Channel] = {name: build_channel(name, c) for name, c in spec.channels.items()}
        self.metrics = NotifierMetrics(list(self.channels), self.outbox)
        if isinstance(self.outbox, Outbox):  # the SQLite outbox's own record of a damaged file moved aside
            self.metrics.registry.register(integrity.LossCollector(self.outbox._db()))
        enrich = {i: (r.enrich, r.enrich_timeout.seconds) for i, r in enumerate(self.router.routes) if r.enrich}
        self.worker = DeliveryWorker(spec, self.outbox, self.channels, self.metrics, enrich)
        self.committer = GroupCommitter(self.outbox, metrics=self.metrics)
        self._credentials = self._expected_credentials()
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.guard: ConnectionGuard | None = None
        self._log = ConditionLog(log)
        self._last_probe = 0.0
        self.accepted = 0
        self.started_at = time.time()
    def warn_replicas(self) -> None:
        """Log speccheck.replica_findings: replicas configured without a shared PostgreSQL outbox."""
        from inferwatch.speccheck import replica_findings

        for finding in replica_findings(self.spec):
            log.warning("%s", finding)

    def _expected_credentials(self) -> list[str]:
        """Authorization header values we accept (resolved once at start: a missing secret fails start-up)."""
        s = self.spec.notifier
        out = []
        if s.bearer_token is not None:
            out.append("Bearer " + s.bearer_token.reveal())
        if s.basic_auth_user and s.basic_auth_password is not None:  # the spec requires the pair
            pair = f"{s.basic_auth_user}:{s.basic_auth_password.reveal()}".encode("utf-8")
            out.append("Basic " + base64.b64encode(pair).decode("ascii"))
        return out

    # ------------------------------------------------------------------------------------- handlers
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.spec.notifier.max_body_bytes, middlewares=[self._count_http_errors])
        app.add_routes([web.post("/alerts", self.handle_alerts),
                        web.get("/metrics", metrics_handler(self.metrics.registry)),
                        web.get("/-/healthy", self.handle_health), web.get("/-/ready", self.handle_ready)])
        return app

    @web.middleware
    async def _count_http_errors(self, request: web.Request, handler):
        """404/405 from aiohttp's router (a wrong URL or method in Alertmanager's webhook_config) are
        refusals like any other: logged and counted."""
        try:
            return await handler(request)
        except (ConnectionResetError, ClientPayloadError, HttpProcessingError) as exc:
            # The sender closed the connection (or broke its framing) before its body was complete: Alertmanager
            # does so when a replica stalls. One line per kind a minute, no traceback; nobody reads the answer.
            self.refused(request, "aborted", f"{request.method} {request.path[:200]}: body not received whole "
                         f"({type(exc).__name__})", key=type(exc).__name__)
            return web.Response(status=400, text="request body incomplete\n")
        except web.HTTPException as exc:
            if exc.status in (404, 405):
                self.refused(request, "wrong_endpoint", f"{exc.status} {request.method} {request.path[:200]} "
                             "(Alertmanager posts to /alerts)", key=f"{exc.status}")
            raise

    def refused(self, request: web.Request | None, outcome: str, detail: str, *, key: str = "") -> None:
        """Count a refused webhook and log it: one line per (outcome, key) a minute, repeats counted in it."""
        self.metrics.webhooks.labels(outcome).inc()
        peer = request.remote if request is not None else "?"
        self._log.log(f"{outcome}:{key}", logging.WARNING, "refused a request from %s (%s): %s", peer, outcome, detail)

    def _refuse(self, request: web.Request, status: int, outcome: str, error: str, *, key: str = "",
                headers: dict | None = None) -> web.Response:
        self.refused(request, outcome, f"{status} {error}", key=key)
        return web.json_response({"error": error}, status=status, headers=headers)

    def _authorized(self, request: web.Request) -> bool:
        if not self._credentials:
            return True
        given = request.headers.get("Authorization", "").encode("utf-8", "replace")
        # Constant-time comparison: the token must not be guessable byte by byte from response times.
        return any(hmac.compare_digest(given, c.encode("utf-8")) for c in self._credentials)

    async def handle_alerts(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._refuse(request, 401, "unauthorized", "missing or wrong credentials",
                                headers={"WWW-Authenticate": 'Bearer realm="inferwatch-notifier"'})
        limit = self.spec.notifier.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._refuse(request, 413, "too_large", f"body larger than {limit} bytes")
        try:
            body = await asyncio.wait_for(request.read(), self.spec.notifier.body_timeout.seconds)
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(request, 413, "too_large", f"body larger than {limit} bytes")
        except asyncio.TimeoutError:
            return self._refuse(request, 408, "malformed",
                                f"body not received within {self.spec.notifier.body_timeout}", key="timeout")
        repairs: list[Repair] = []
        try:
            message = parse_webhook(body, repairs)
        except PayloadError as exc:
            return self._refuse(request, 400, "malformed", f"malformed Alertmanager webhook: {exc}",
                                key=str(exc).split(":", 1)[0])
        # A readiness probe as large as the largest webhook seen (bounded by max_body_bytes already). Only
        # a webhook: a malformed body is never retried, and a probe of its size would hold that much of the
        # disk (the probe row, and as much again in the WAL) for good.
        self.probe_bytes = max(self.probe_bytes, len(body))
        self._report_repairs(message.group_key, repairs)
        now = time.time()
        if await self._stale_here(message):
            return await self._stale(message, now)
        unrouted = not self.router.match(message.labels)
        planned = plan(self.spec, self.router, message, now)
        try:
            accepted, ids = await asyncio.wrap_future(self.committer.submit(message, planned, now))
        except OutboxError as exc:
            self.metrics.webhooks.labels("unavailable").inc()
            if self.outbox.writable:  # else the outbox has said it, once, with what it means
                self._log.log("unavailable", logging.ERROR, "could not persist a notification (%s); answering "
                              "503 so Alertmanager retries", exc)
            return web.json_response({"error": "outbox unavailable, retry"}, status=503)
        self._log.clear("unavailable")
        if not accepted:
            self.metrics.webhooks.labels("duplicate").inc()
            return web.json_response({"status": "duplicate", "deliveries": 0})
        self.accepted += 1
        self.metrics.webhooks.labels("accepted").inc()
        waiting = await self._watch(ids, now)
        for p in planned:
            self.worker.wake(p.channel)
        if unrouted:
            self.metrics.unrouted.inc()
            dead = [p for p in planned if p.dead_reason]
            # One line per group a minute: a storm of unrouted alerts is counted, not a line each.
            if dead:
                self.metrics.dead_letters.labels(dead[0].channel, dead[0].dead_reason).inc()
                self._log.log(f"unrouted:{message.group_key}", logging.ERROR, "no route matched %s (labels %s) and "
                              "no channel can take it: kept as a dead letter (set notifier.unrouted_receivers)",
                              message.group_key, message.labels)
            else:
                self._log.log(f"unrouted:{message.group_key}", logging.WARNING, "no route matched %s (labels %s): "
                              "sent to the catch-all %s", message.group_key, message.labels,
                              ", ".join(p.channel for p in planned) or "(resolved: nothing to say)")
        answer: dict[str, object] = {"status": "accepted", "deliveries": len(ids)}
        if waiting is not None:
            answer["delivered"] = await self._delivered(waiting)
        if unrouted:
            answer["unrouted"] = True
        return web.json_response(answer)

    async def _stale_here(self, message) -> bool:
        """Is `message` stale by the outbox's resolutions (stale.py), so the answer says "stale"? The PostgreSQL
        outbox checks it again in the insert's own transaction (pgoutbox.py: a resolution another replica
        commits meanwhile is seen there); an unreadable outbox is no verdict (the commit that follows reports it)."""
        if message.status != "firing":
            return False
        try:
            resolved = await asyncio.get_running_loop().run_in_executor(None, self.outbox.resolutions,
                                                                        message.group_key)
        except (sqlite3.Error, OutboxError):
            return False
        return stale(message, resolved)

    async def _stale(self, message, now: float) -> web.Response:
        """Keep a stale firing notification (auditable, and its retries deduplicated) without delivering it."""
        try:
            await asyncio.wrap_future(self.committer.submit(message, [], now))
        except OutboxError:
            self.metrics.webhooks.labels("unavailable").inc()
            return web.json_response({"error": "outbox unavailable, retry"}, status=503)
        self.metrics.webhooks.labels("stale").inc()
        self._log.log(f"stale:{message.group_key}", logging.INFO, "not delivered: a firing notification for %s whose "
                      "alerts were all reported resolved already (an Alertmanager peer's late copy)",
                      message.group_key[:200])
        return web.json_response({"status": "stale", "deliveries": 0})

    async def _watch(self, ids: list[int], now: float):
        """With ha.answer_wait: a future for the deliveries sent at once (deferred escalations left out)."""
        if self.spec.ha.answer_wait.seconds <= 0 or not ids:
            return None
        try:
            due = await asyncio.get_running_loop().run_in_executor(None, self.outbox.due_of, ids, now)
        except (sqlite3.Error, OutboxError):  # stored: the answer says so without waiting for the channel
            return None
        return self.worker.watch(due) if due else None

    async def _delivered(self, waiting) -> int:
        """How many of the watched deliveries reached their channel within ha.answer_wait (the rest stay in the
        outbox and are sent as usual: the 2xx then means "stored", as without answer_wait)."""
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(waiting)),
                                          self.spec.ha.answer_wait.seconds)
        except asyncio.TimeoutError:
            return 0

    def _report_repairs(self, group_key: str, repairs: list[Repair]) -> None:
        # Logged before the webhook is stored: the line must not say "accepted" (a full outbox still 503s it).
        for r in repairs:
            self.metrics.repairs.labels(r.kind).inc()
        if repairs:
            first = repairs[0]
            more = f" and {len(repairs) - 1} more change(s)" if len(repairs) > 1 else ""
            self._log.log(f"repair:{first.kind}", logging.WARNING, "webhook %s repaired on reading (%s: %s (%s)%s)",
                          group_key[:200], first.kind, first.path[:200], first.detail, more)

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def handle_ready(self, request: web.Request) -> web.Response:
        """Ready while webhooks can be accepted: the outbox can be written — probed with a write as large as
        the largest webhook seen (at least PROBE_MIN_BYTES), at most once a second while it cannot and every
        READY_WRITABLE_PROBE_S while it can — and the intake committer runs."""
        # Ready needs the last webhook-sized probe to have succeeded: a small write that succeeds meanwhile (a
        # delivery outcome) clears the outbox's write error but says nothing of a webhook's room.
        healthy = self._probe_ok and self.outbox.writable
        every = READY_WRITABLE_PROBE_S if healthy else READY_PROBE_INTERVAL_S
        if time.monotonic() - self._last_probe >= every:
            self._last_probe = time.monotonic()
            self._probe_ok = await asyncio.get_running_loop().run_in_executor(None, self.outbox.probe,
                                                                              self.probe_bytes)
        if not self.outbox.writable or not self._probe_ok:
            return web.Response(status=503,
                                text=f"not ready: the outbox cannot be written ({self.outbox.write_error})\n")
        if not self.committer.running:
            return web.Response(status=503, text="not ready: intake is not running\n")
        return web.Response(text="ok\n")

    # ------------------------------------------------------------------------------------ lifecycle
    async def _start_http(self) -> None:
        n = self.spec.notifier
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=2.0, logger=_ServerLog(self),
                                     keepalive_timeout=n.idle_timeout.seconds)
        await self._runner.setup()
        cap = connection_cap(n.max_connections, raise_fd_limit())
        self.guard = ConnectionGuard(self._runner.server, max_connections=cap,
                                     header_timeout_s=n.header_timeout.seconds,
                                     idle_timeout_s=n.idle_timeout.seconds, metrics=self.metrics,
                                     settings=Settings("notifier.max_connections", "notifier.header_timeout"))
        self.guard.start()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=ACCEPT_BACKLOG)
        await site.start()
        if self.port == 0:
            self.port = self._runner.addresses[0][1]
        if self.shared_port is not None:
            await web.TCPSite(self._runner, self.host, self.shared_port, backlog=ACCEPT_BACKLOG,
                              reuse_port=True).start()

    async def _stop_http(self) -> None:
        if self.guard is not None:
            await self.guard.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def serve_forever(self) -> None:
        """Run in the foreground until SIGINT/SIGTERM (the CLI)."""
        import signal

        async def main():
            self.committer.start()
            await self._start_http()
            self.worker.start()
            shared = f" and on shared port {self.shared_port}" if self.shared_port is not None else ""
            log.info("notifier listening on http://%s:%d%s (outbox %s, channels: %s; at most %d connections)",
                     self.host, self.port, shared, self.outbox.path, ", ".join(self.channels) or "none",
                     self.guard.max_connections)
            self.warn_replicas()
            if not self._credentials:
                log.warning("no notifier.bearer_token or basic auth in the spec: POST /alerts accepts anyone")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            await self._stop_http()

        try:
            asyncio.run(main())
        finally:
            self.committer.stop()
            self.worker.stop()
            self.outbox.close_all()

    def start(self) -> "NotifierService":
        """Run in a background thread (tests, benchmarks, the demo); port 0 picks a free port."""
        started = threading.Event()
        errors: list[BaseException] = []
        self.committer.start()

        def run():
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self._start_http())
            except BaseException as exc:  # noqa: BLE001 - reported to the caller below
                errors.append(exc)
                started.set()
                return
            started.set()
            self._loop.run_forever()

        self.warn_replicas()
        self._thread = threading.Thread(target=run, name="notifier-http", daemon=True)
        self._thread.start()
        started.wait(30)
        if errors:
            self.committer.stop()
            self._thread.join(15)
            close_stopped_loop(self._loop, self._thread)
            self.outbox.close_all()  # a failed start holds no file, as a stopped service does
            raise errors[0]
        self.worker.start()
        return self

    def stop(self) -> None:
        if self._loop is not None and self._runner is not None and self._thread is not None:
            asyncio.run_coroutine_threadsafe(self._stop_http(), self._loop).result(15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
            close_stopped_loop(self._loop, self._thread)
        self.committer.stop()
        self.worker.stop()
        self.outbox.close_all()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
