"""Local HTTP servers that answer as PagerDuty Events v2, a Slack incoming webhook, a WeCom group robot and
a voice-call webhook do — failures included — and record what each received.

Used by the tests, the benchmark and the demo (which prints what each channel received). One aiohttp
server on one loopback port serves all four; each provider keeps its own state and `mode`:
  "ok"          answer as the provider does on success (and enforce its documented limits)
  "down"        HTTP 503 (an outage)
  "hang"        hold the request for `hang_s` seconds (a provider that stops answering), then 503
  "rate_limit"  the provider's throttling answer (429, or WeCom errcode 45009); `retry_after` (a string) is
                sent as its Retry-After header when set (Slack sends "1" by default)
  "bad_key"     the provider's answer to a wrong key/URL
  "big"         HTTP 503 with an answer of `answer_bytes` bytes, streamed (`answer_sent` counts what the
                client took before it left): a provider or proxy answering with a huge error page
  "trickle"     HTTP 200 whose body arrives one byte every `trickle_s` seconds (200 bytes)
  "trickle_head" the status line and headers themselves one byte every `trickle_s` seconds
`latency_s` makes a provider answer that much later (a slow one that still accepts).
Size limits are attributes a test may lower, to play a provider that measures more strictly than it
documents: `SlackSim.max_total_chars` (`msg_blocks_too_long`), `WeComSim.max_markdown_bytes` /
`max_text_bytes` (errcode 40058), `PagerDutySim.max_event_bytes` (400 "Event object is too large");
`reset()` restores the documented limits and mode "ok".
Each accepted request is recorded with its raw bytes, what a person would see and who it mentions
(inferwatch/testing/channel_text.py models how Slack and WeCom read a message).
Facts: PagerDuty Events API v2, Slack incoming webhooks and WeCom group robot documentation (limits and
error answers as named constants in inferwatch/notifier/channels/).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import uuid
from collections import deque

from aiohttp import web

from inferwatch.loops import close_stopped_loop
from inferwatch.testing.channel_text import slack_block_ok, slack_display, slack_text_chars, wecom_display

MODES = ("ok", "down", "hang", "rate_limit", "bad_key", "big", "trickle", "trickle_head")
HOSTILE_ANSWERS = ("big", "trickle", "trickle_head")  # answered the same way by every provider


@dataclasses.dataclass
class Received:
    """One request a simulated provider accepted (only accepted ones: what a human would have seen)."""

    at: float
    provider: str
    path: str
    body: dict
    text: str  # the human-visible text (Slack blocks flattened, WeCom markdown, PagerDuty summary)
    raw: bytes = b""                    # the request body exactly as sent
    mentions: tuple[str, ...] = ()      # who the message notifies (Slack/WeCom mentions)
    headers: dict = dataclasses.field(default_factory=dict)
    peer: tuple = ()                    # the client's (host, port): the same port means a reused connection


class _Provider:
    name = ""

    def __init__(self):
        self.mode = "ok"
        self.latency_s = 0.0
        self.hang_s = 30.0
        self.received: list[Received] = []
        self.attempts = 0            # every request, accepted or not
        self.rejected: list[tuple[float, str]] = []  # (time, answer) of every non-accepted request
        self.lock = threading.Lock()
        self.in_flight = threading.Event()  # set while a "hang" request is being held
        _Provider.reset(self)  # the attributes reset() restores (subclasses' reset may need their own state)

    def reset(self) -> None:
        """Mode "ok" and the provider's documented limits (subclasses restore theirs)."""
        self.mode = "ok"
        self.retry_after: str | None = None  # Retry-After of a "rate_limit" answer (None: the provider's own)
        self.answer_bytes = 1 << 30          # size of a "big" answer
        self.answer_sent = 0                 # bytes of "big" answers the clients took
        self.trickle_s = 0.5                 # "trickle" / "trickle_head": seconds between two bytes
        self.latency_s = 0.0  # a slow provider that still answers: every request waits this long first

    def set_mode(self, mode: str, hang_s: float | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        if hang_s is not None:
            self.hang_s = hang_s

    def texts(self) -> list[str]:
        with self.lock:
            return [r.text for r in self.received]

    def _accept(self, request: web.Request, body: dict, text: str, raw: bytes = b"",
                mentions: tuple[str, ...] = ()) -> None:
        with self.lock:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            self.received.append(Received(time.time(), self.name, request.path_qs, body, text, raw,
                                          tuple(mentions), dict(request.headers), tuple(peer or ())))

    async def hostile(self, request: web.Request) -> web.StreamResponse:
        """The answer of a "big", "trickle" or "trickle_head" mode (see the module docstring)."""
        self.attempts += 1
        self._reject(self.mode)
        await request.read()
        if self.mode == "trickle_head":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
            for i in range(len(head)):
                if request.transport is None or request.transport.is_closing():
                    break
                request.transport.write(head[i:i + 1])
                await asyncio.sleep(self.trickle_s)
            if request.transport is not None:
                request.transport.close()
            raise asyncio.CancelledError  # the answer was written by hand; aiohttp writes nothing more
        big = self.mode == "big"
        resp = web.StreamResponse(status=503 if big else 200, headers={"Content-Type": "text/plain"})
        resp.content_length = self.answer_bytes if big else 200
        await resp.prepare(request)
        try:
            if big:
                chunk = b"service_unavailable " + b"." * (65536 - 20)
                left = self.answer_bytes
                while left > 0:
                    n = min(left, len(chunk))
                    await resp.write(chunk[:n])
                    left -= n
                    self.answer_sent += n
            else:
                for _ in range(200):
                    await resp.write(b"o")
                    await asyncio.sleep(self.trickle_s)
        except (ConnectionError, RuntimeError):
            pass  # the client left (what a bounded client does)
        return resp

    def _retry_after(self, default: str | None = None) -> dict:
        value = self.retry_after if self.retry_after is not None else default
        return {} if value is None else {"Retry-After": value}

    def _reject(self, answer: str) -> None:
        with self.lock:
            self.rejected.append((time.time(), answer))

    async def _gate(self) -> str | None:
        """Common failure modes; returns the mode to answer with, or None to proceed normally."""
        self.attempts += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.mode == "hang":
            self.in_flight.set()
            try:
                await asyncio.sleep(self.hang_s)
            finally:
                self.in_flight.clear()
            return "down"
        return None if self.mode == "ok" else self.mode


class PagerDutySim(_Provider):
    """POST /v2/enqueue. 202 on success; 400 invalid event; 429 throttled (Events API v2)."""

    name = "pagerduty"
    SEVERITIES = ("critical", "error", "warning", "info")

    def __init__(self, routing_key: str = "R" * 32):
        super().__init__()
        self.routing_key = routing_key
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.max_event_bytes = 512_000
        self.open: dict[str, dict] = {}  # dedup_key → last trigger: the incidents PagerDuty would show

    async def handle(self, request: web.Request) -> web.Response:
        mode = await self._gate()
        if mode == "down":
            self._reject("503")
            return web.Response(status=503, text="Service Unavailable")
        if mode == "rate_limit":
            self._reject("429")
            return web.json_response({"status": "throttle exceeded", "message": "Requests for this service are "
                                      "arriving too quickly.  Please retry later."}, status=429,
                                     headers=self._retry_after())
        try:
            event = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._invalid(["Could not parse JSON"])
        errors = []
        if mode == "bad_key" or event.get("routing_key") != self.routing_key:
            errors.append("Invalid routing key")
        action = event.get("event_action")
        if action not in ("trigger", "acknowledge", "resolve"):
            errors.append("'event_action' is invalid")
        dedup = event.get("dedup_key") or str(uuid.uuid4())
        if len(dedup) > 255:
            errors.append("'dedup_key' must be at most 255 characters")
        if action == "trigger":
            payload = event.get("payload") or {}
            if not payload.get("summary") or len(payload["summary"]) > 1024:
                errors.append("'payload.summary' is missing or longer than 1024 characters")
            if not payload.get("source"):
                errors.append("'payload.source' is missing")
            if payload.get("severity") not in self.SEVERITIES:
                errors.append("'payload.severity' is invalid")
        raw = await request.read()
        if len(raw) > self.max_event_bytes:
            errors.append("Event object is too large")
        if errors:
            return self._invalid(errors)
        text = (event.get("payload") or {}).get("summary", f"{action} {dedup}")
        with self.lock:
            if action == "trigger":
                self.open[dedup] = event
            elif action == "resolve":
                self.open.pop(dedup, None)
        self._accept(request, event, text, raw)
        return web.json_response({"status": "success", "message": "Event processed", "dedup_key": dedup}, status=202)

    def _invalid(self, errors: list[str]) -> web.Response:
        self._reject("400 " + "; ".join(errors))
        return web.json_response({"status": "invalid event", "message": "Event object is invalid",
                                  "errors": errors}, status=400)


class SlackSim(_Provider):
    """POST /services/T.../B.../X... . 200 `ok`; 400 invalid_payload / no_text / invalid_blocks;
    403 invalid_token; 404 no_service; 429 rate limited with Retry-After."""

    name = "slack"

    def __init__(self, hook_path: str = "/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX"):
        super().__init__()
        self.hook_path = hook_path
        self.reset()

    def reset(self) -> None:
        super().reset()
        # Slack documents no cumulative limit but answers msg_blocks_too_long near 12,000-13,000 characters
        # of block text (slackapi/bolt-js#2509, #2867).
        self.max_total_chars = 12_000

    async def handle(self, request: web.Request) -> web.Response:
        mode = await self._gate()
        if mode == "down":
            self._reject("503")
            return web.Response(status=503, text="service_unavailable")
        if mode == "rate_limit":
            self._reject("429")
            return web.Response(status=429, text="rate_limited", headers=self._retry_after("1"))
        if mode == "bad_key" or request.path != self.hook_path:
            self._reject("403 invalid_token")
            return web.Response(status=403, text="invalid_token")
        try:
            msg = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._reject("400 invalid_payload")
            return web.Response(status=400, text="invalid_payload")
        if not isinstance(msg, dict) or not (msg.get("text") or msg.get("blocks")):
            self._reject("400 no_text")
            return web.Response(status=400, text="no_text")
        blocks = msg.get("blocks") or []
        if not isinstance(blocks, list) or len(blocks) > 50 or any(not slack_block_ok(b) for b in blocks):
            self._reject("400 invalid_blocks")
            return web.Response(status=400, text="invalid_blocks")
        if slack_text_chars(blocks) > self.max_total_chars:
            self._reject("400 msg_blocks_too_long")
            return web.Response(status=400, text="msg_blocks_too_long")
        if len(msg.get("text", "")) > 40_000:
            self._reject("400 msg_too_long")
            return web.Response(status=400, text="msg_too_long")
        text, mentions = slack_display(msg)
        self._accept(request, msg, text, await request.read(), mentions)
        return web.Response(status=200, text="ok")


class WeComSim(_Provider):
    """POST /cgi-bin/webhook/send?key=KEY. Always HTTP 200; errcode 0 ok, 40058 markdown over 4096 bytes,
    45009 more than 20 messages in a minute for this robot, 93000 invalid webhook key, 40035 bad body."""

    name = "wecom"
    LIMIT_PER_MINUTE = 20

    def __init__(self, keys: tuple[str, ...] = ("00000000-0000-4000-8000-000000000000",)):
        super().__init__()
        self.keys = set(keys)
        self._recent: dict[str, deque] = {}
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.max_markdown_bytes = 4096
        self.max_text_bytes = 2048

    def messages_for(self, key: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if f"key={key}" in r.path]

    async def handle(self, request: web.Request) -> web.Response:
        mode = await self._gate()
        if mode == "down":
            self._reject("503")
            return web.Response(status=503, text="Service Unavailable")
        key = request.query.get("key", "")
        if mode == "bad_key" or key not in self.keys:
            return self._err(93000, "invalid webhook url, hint: [x], from ip: 127.0.0.1")
        if mode == "rate_limit":
            return self._err(45009, "api freq out of limit")
        now = time.time()
        recent = self._recent.setdefault(key, deque())
        while recent and recent[0] <= now - 60:
            recent.popleft()
        if len(recent) >= self.LIMIT_PER_MINUTE:
            return self._err(45009, "api freq out of limit")
        recent.append(now)  # WeCom counts every well-formed call against the robot, even rejected ones
        try:
            msg = await request.json()
            content = msg["markdown"]["content"] if msg.get("msgtype") == "markdown" else msg["text"]["content"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            return self._err(40035, "invalid parameter")
        markdown = msg.get("msgtype") == "markdown"
        limit = self.max_markdown_bytes if markdown else self.max_text_bytes
        if len(content.encode("utf-8")) > limit:
            return self._err(40058, f"{msg.get('msgtype')}.content exceed max length {limit}")
        shown, mentions = wecom_display(msg)
        self._accept(request, msg, content if markdown else shown, await request.read(), mentions)
        return web.json_response({"errcode": 0, "errmsg": "ok"})

    def _err(self, code: int, text: str) -> web.Response:
        self._reject(f"errcode {code}")
        return web.json_response({"errcode": code, "errmsg": text})


class VoiceSim(_Provider):
    """POST /voice/call: a generic call gateway. 200 {"Code":"OK","CallId":...}; 401 bad token."""

    name = "voice"

    def __init__(self, token: str = "voice-token-0123456789"):
        super().__init__()
        self.token = token

    async def handle(self, request: web.Request) -> web.Response:
        mode = await self._gate()
        if mode == "down":
            self._reject("503")
            return web.Response(status=503, text="busy")
        if mode == "rate_limit":
            self._reject("429")
            return web.json_response({"Code": "Throttling", "Message": "too many calls"}, status=429,
                                     headers=self._retry_after())
        if mode == "bad_key" or request.headers.get("Authorization") != f"Bearer {self.token}":
            self._reject("401")
            return web.json_response({"Code": "InvalidAccessKey", "Message": "unauthorized"}, status=401)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._reject("400")
            return web.json_response({"Code": "InvalidParameter", "Message": "body is not JSON"}, status=400)
        self._accept(request, body, str(body.get("text", "")), await request.read())
        return web.json_response({"Code": "OK", "CallId": str(uuid.uuid4())})


def _hostile_or(provider: _Provider):
    async def handle(request: web.Request) -> web.StreamResponse:
        if provider.mode in HOSTILE_ANSWERS:
            return await provider.hostile(request)
        return await provider.handle(request)
    return handle


class ProviderSimulators:
    """All four simulated providers on one loopback port, served from a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port
        self.pagerduty = PagerDutySim()
        self.slack = SlackSim()
        self.wecom = WeComSim(("00000000-0000-4000-8000-000000000000", "11111111-1111-4111-8111-111111111111"))
        self.voice = VoiceSim()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def providers(self) -> list[_Provider]:
        return [self.pagerduty, self.slack, self.wecom, self.voice]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # Destination URLs/keys for a spec's channels.
    @property
    def pagerduty_url(self) -> str:
        return f"{self.url}/v2/enqueue"

    @property
    def slack_url(self) -> str:
        return self.url + self.slack.hook_path

    def wecom_url(self, index: int = 0) -> str:
        return f"{self.url}/cgi-bin/webhook/send?key={sorted(self.wecom.keys)[index]}"

    @property
    def voice_url(self) -> str:
        return f"{self.url}/voice/call"

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.add_routes([web.post("/v2/enqueue", _hostile_or(self.pagerduty)),
                        web.post("/services/{tail:.*}", _hostile_or(self.slack)),
                        web.post("/cgi-bin/webhook/send", _hostile_or(self.wecom)),
                        web.post("/voice/call", _hostile_or(self.voice))])
        return app

    def start(self) -> "ProviderSimulators":
        ready = threading.Event()

        async def up():
            self._runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=1.0)
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, self.port).start()
            self.port = self._runner.addresses[0][1]

        def run():
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(up())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="provider-simulators", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("provider simulators did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)
        close_stopped_loop(self._loop, self._thread)
        self._loop = None

    def set_mode(self, mode: str, hang_s: float | None = None) -> None:
        for p in self.providers:
            p.set_mode(mode, hang_s)

    def reset(self) -> None:
        """Every provider back to mode "ok" and its documented limits."""
        for p in self.providers:
            p.reset()

    def clear(self) -> None:
        """Forget what every provider received and refused (a scenario's clean start); limits and modes stay."""
        for p in self.providers:
            with p.lock:
                p.received.clear()
                p.rejected.clear()
                p.attempts = 0

    def report(self) -> str:
        """What each channel received, for humans (the demo prints this)."""
        lines = []
        for p in self.providers:
            lines.append(f"== {p.name}: {len(p.received)} message(s) accepted, {len(p.rejected)} rejected")
            for r in p.received:
                first = r.text.strip().splitlines()[0] if r.text.strip() else ""
                lines.append(f"   {time.strftime('%H:%M:%S', time.localtime(r.at))}  {first[:150]}")
        return "\n".join(lines)

    def __enter__(self) -> "ProviderSimulators":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
