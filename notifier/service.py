"""The notifier service: aiohttp HTTP server (POST /alerts, GET /metrics, /-/healthy, /-/ready) plus the
delivery worker threads, over one outbox.

POST /alerts answers: 200 after the notification is committed to the outbox (or recognised as a
redelivery); 400 malformed payload (the message says what is wrong); 401 missing/wrong credentials;
413 body over `notifier.max_body_bytes`; 503 when the outbox cannot persist — the only 5xx, so
Alertmanager (which retries 5xx only) retries exactly when we did not keep the alert.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import threading
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferwatch.notifier.channels import build_channel
from inferwatch.notifier.intake import plan
from inferwatch.notifier.metrics import NotifierMetrics
from inferwatch.notifier.model import PayloadError, parse_webhook
from inferwatch.notifier.outbox import Outbox, OutboxError
from inferwatch.notifier.routing import Router
from inferwatch.notifier.worker import DeliveryWorker
from inferwatch.spec import Spec

log = logging.getLogger(__name__)

OUTBOX_FILE = "outbox.sqlite3"


def check_channel_secrets(spec: Spec) -> None:
    """Resolve every channel's secrets (url, routing_key, headers) once at start-up, so a missing variable or
    file stops the notifier now (SpecError naming the field → exit 2), not at the first alert. The values
    are not kept: channels reveal them again at send time (a rotated file is picked up)."""
    for c in spec.channels.values():
        for secret in (c.url, c.routing_key, *c.headers.values()):
            if secret is not None:
                secret.reveal()


class NotifierService:
    def __init__(self, spec: Spec, data_dir: str | Path | None = None, host: str = "127.0.0.1", port: int = 9410):
        self.spec = spec
        self.host = host
        self.port = port
        self.data_dir = Path(data_dir or spec.notifier.data_dir)
        self.outbox = Outbox(self.data_dir / OUTBOX_FILE, dedup_window_s=spec.notifier.dedup_window.seconds)
        self.router = Router(spec)
        check_channel_secrets(spec)
        self.channels = {name: build_channel(name, c) for name, c in spec.channels.items()}
        self.metrics = NotifierMetrics(list(self.channels), self.outbox)
        enrich = {i: (r.enrich, r.enrich_timeout.seconds) for i, r in enumerate(self.router.routes) if r.enrich}
        self.worker = DeliveryWorker(spec, self.outbox, self.channels, self.metrics, enrich)
        self._credentials = self._expected_credentials()
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.accepted = 0

    def _expected_credentials(self) -> list[str]:
        """Authorization header values we accept (resolved once at start: a missing secret fails start-up)."""
        s = self.spec.notifier
        out = []
        if s.bearer_token is not None:
            out.append("Bearer " + s.bearer_token.reveal())
        if s.basic_auth_user:
            pair = f"{s.basic_auth_user}:{s.basic_auth_password.reveal()}".encode("utf-8")
            out.append("Basic " + base64.b64encode(pair).decode("ascii"))
        return out

    # ------------------------------------------------------------------------------------- handlers
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.spec.notifier.max_body_bytes)
        app.add_routes([web.post("/alerts", self.handle_alerts), web.get("/metrics", self.handle_metrics),
                        web.get("/-/healthy", self.handle_health), web.get("/-/ready", self.handle_health)])
        return app

    def _authorized(self, request: web.Request) -> bool:
        if not self._credentials:
            return True
        given = request.headers.get("Authorization", "").encode("utf-8", "replace")
        # Constant-time comparison: the token must not be guessable byte by byte from response times.
        return any(hmac.compare_digest(given, c.encode("utf-8")) for c in self._credentials)

    async def handle_alerts(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "missing or wrong credentials"}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="inferwatch-notifier"'})
        limit = self.spec.notifier.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return web.json_response({"error": f"body larger than {limit} bytes"}, status=413)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.json_response({"error": f"body larger than {limit} bytes"}, status=413)
        try:
            message = parse_webhook(body)
        except PayloadError as exc:
            return web.json_response({"error": f"malformed Alertmanager webhook: {exc}"}, status=400)
        now = time.time()
        unrouted = not self.router.match(message.labels)
        planned = plan(self.spec, self.router, message, now)
        try:
            accepted, ids = await asyncio.get_running_loop().run_in_executor(
                None, self.outbox.accept, message, planned, now)
        except OutboxError as exc:
            log.error("could not persist a notification (%s); answering 503 so Alertmanager retries", exc)
            return web.json_response({"error": "outbox unavailable, retry"}, status=503)
        if not accepted:
            return web.json_response({"status": "duplicate", "deliveries": 0})
        self.accepted += 1
        for p in planned:
            self.worker.wake(p.channel)
        if unrouted:
            self.metrics.unrouted.inc()
            dead = [p for p in planned if p.dead_reason]
            if dead:
                self.metrics.dead_letters.labels(dead[0].channel, dead[0].dead_reason).inc()
                log.error("no route matched %s (labels %s) and no channel can take it: kept as a dead letter "
                          "(set notifier.unrouted_receivers)", message.group_key, message.labels)
            else:
                log.warning("no route matched %s (labels %s): sent to the catch-all %s", message.group_key,
                            message.labels, ", ".join(p.channel for p in planned) or "(resolved: nothing to say)")
        body = {"status": "accepted", "deliveries": len(ids)}
        if unrouted:
            body["unrouted"] = True
        return web.json_response(body)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        data = await asyncio.get_running_loop().run_in_executor(None, generate_latest, self.metrics.registry)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    # ------------------------------------------------------------------------------------ lifecycle
    async def _start_http(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:
            self.port = self._runner.addresses[0][1]

    def serve_forever(self) -> None:
        """Run in the foreground until SIGINT/SIGTERM (the CLI)."""
        import signal

        async def main():
            await self._start_http()
            self.worker.start()
            log.info("notifier listening on http://%s:%d (outbox %s, channels: %s)", self.host, self.port,
                     self.outbox.path, ", ".join(self.channels) or "none")
            if not self._credentials:
                log.warning("no notifier.bearer_token or basic auth in the spec: POST /alerts accepts anyone")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            await self._runner.cleanup()

        try:
            asyncio.run(main())
        finally:
            self.worker.stop()

    def start(self) -> "NotifierService":
        """Run in a background thread (tests, benchmarks, the demo); port 0 picks a free port."""
        started = threading.Event()
        errors: list[BaseException] = []

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

        self._thread = threading.Thread(target=run, name="notifier-http", daemon=True)
        self._thread.start()
        started.wait(30)
        if errors:
            raise errors[0]
        self.worker.start()
        return self

    def stop(self) -> None:
        self.worker.stop()
        if self._loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
        self.outbox.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
