"""What every channel shares: the delivery result, the one HTTP-answer classifier, the HTTP session with
inferwatch's User-Agent, secret resolution, the size a provider accepted, and redaction of secrets.

Channels never retry or sleep (the outbox worker owns retries, backoff and deadlines, as Alertmanager's
`notify/` does); they turn one Notification into one HTTP request and classify the answer. Each channel
is a subclass of HttpChannel, built the way Alertmanager builds its integrations (`notify/<provider>`):
one HTTP client per integration with a `User-Agent: Alertmanager/<version>` header, the provider's rate
declared next to its code, and every error answer logged with its reason.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
from typing import ClassVar, Iterable, Protocol

import requests
from urllib3.exceptions import InvalidHeader
from urllib3.util.retry import Retry

from inferwatch import redaction
from inferwatch.notifier.channels.answer import Answer, DeadlineExceeded, bounded_session, post_within
from inferwatch.notifier.channels.text import utf8_len  # noqa: F401 - re-exported for older imports
from inferwatch.notifier.model import Notification

# The channels redact through the one mechanism: each value given, every registered secret, the credential
# patterns (URL query keys, Slack hook paths, user-info, Authorization values).
from inferwatch.redaction import redact  # noqa: F401 - re-exported for the channels
from inferwatch.spec import Channel as ChannelSpec
from inferwatch.specload import Secret

log = logging.getLogger(__name__)

# Failure reasons form a closed set: they label metrics (dead letters) and must not grow with input.
REASONS = (
    "timeout",          # no complete answer within the channel's timeout, the whole send's deadline (retryable)
    "connection",       # refused / reset / DNS (retryable)
    "http_5xx",         # provider error (retryable)
    "rate_limited",     # HTTP 429 or a provider rate errcode such as WeCom 45009 (retryable)
    "too_long",         # provider says the message is too long (retryable: the next one is smaller)
    "bad_key",          # 401/403/404 or an invalid-key errcode: the destination is wrong (permanent)
    "invalid_payload",  # other 4xx or a provider validation error (permanent)
    "provider_error",   # a non-zero errcode we do not know (permanent)
    "secret_missing",   # the URL/key reference could not be resolved (retryable: the file may appear)
    "max_age",          # retried until notifier.max_delivery_age, then given up (dead letter)
)


def _version() -> str:
    try:
        return importlib.metadata.version("inferwatch")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without installing
        return "unknown"


USER_AGENT = f"inferwatch/{_version()}"


@dataclasses.dataclass(frozen=True)
class DeliveryResult:
    """The outcome of one send. `reason` is one of REASONS (empty when ok); `detail` is redacted text."""

    ok: bool
    retryable: bool = False
    reason: str = ""
    detail: str = ""
    retry_after: float | None = None  # seconds the provider asked us to wait (HTTP Retry-After)

    @classmethod
    def success(cls, detail: str = "") -> "DeliveryResult":
        return cls(True, False, "", detail)

    @classmethod
    def fail(cls, reason: str, detail: str, *, retryable: bool, retry_after: float | None = None) -> "DeliveryResult":
        assert reason in REASONS, reason  # noqa: S101 - a programming error, caught by the channel tests
        return cls(False, retryable, reason, detail, retry_after)


class Channel(Protocol):
    """One delivery adapter. `send` performs one request and never raises for provider trouble."""

    name: str

    @property
    def kind(self) -> str: ...  # read-only: a class constant of each provider's channel

    def send(self, notification: Notification) -> DeliveryResult: ...


class SecretMissing(Exception):
    """A channel secret could not be resolved now. The message names the field, never a value."""


def reveal(secret: Secret | None, default: str | None = None) -> str:
    """The value of `secret`, or `default` when it is not configured. Raises SecretMissing when it cannot
    be resolved (variable unset, file unreadable): retryable, since a mounted secret file may appear."""
    if secret is None:
        if default is None:
            raise SecretMissing("not configured")
        return default
    try:
        return secret.reveal()
    except Exception as exc:  # noqa: BLE001 - SpecError names the field and the variable or file, never the value
        raise SecretMissing(str(exc)) from None


class HttpChannel:
    """Base of every channel: one `requests.Session` (connection reuse, `User-Agent: inferwatch/<version>`),
    the provider's rate (`rate_per_minute`, the default of the worker's per-destination limiter), the
    secret helper, one log line per error answer, and the size the provider accepted.

    Size: a provider may measure a message differently from its documentation (Slack answers
    `msg_blocks_too_long` near 12,000 characters of text although no cumulative limit is documented).
    After a "too long" answer the channel remembers half the size it had sent (`size_limit`), and after a
    smaller resend that worked, that size; every later message is rendered within it (until a restart), so
    retries do not start again at full size. The session is used by the one worker thread of this channel
    (requests sessions are not shared across threads).
    """

    kind: ClassVar[str] = ""
    rate_per_minute: ClassVar[int] = 60
    size_unit: ClassVar[str] = "characters"   # what `size_limit` counts (for log lines)
    min_size: ClassVar[int] = 500             # never learn a limit below this: it would say nothing

    def __init__(self, name: str, spec: ChannelSpec):
        self.name = name
        self.spec = spec
        self.session = bounded_session(USER_AGENT)
        self.size_limit: int | None = None
        self.last_size = 0     # size of the last message rendered (what a "too long" answer refers to)
        self.last_budget = 0   # the size it was rendered within
        self.destination = ""  # host:port of the current send's URL (redaction.address), once it is known

    def close(self) -> None:
        """Close the session's kept-alive connections; a later send opens new ones."""
        self.session.close()

    def send(self, notification: Notification) -> DeliveryResult:
        """Render and send `notification`; never raises for provider trouble or a missing secret."""
        self.destination = ""
        try:
            result = self.deliver(notification)
        except SecretMissing as exc:
            result = DeliveryResult.fail("secret_missing", str(exc), retryable=True)
        if not result.ok and self.destination:
            # Named in the result, so that every line about it (this one, the worker's retry and dead-letter
            # lines, the outbox's last error) says where the send went; only host:port (the path and query
            # of a chat webhook URL are its secret).
            result = dataclasses.replace(result, detail=f"{result.detail} (destination {self.destination})")
        if result.reason == "too_long":
            result = self._learn_too_long(result)
        elif result.ok and self.size_limit is not None and self.last_budget < self.size_limit:
            self.size_limit = self.last_budget  # a smaller resend (the worker's half budget) worked: keep it
        if not result.ok:
            log.warning("channel %s (%s): %s, %s", self.name, self.kind, result.reason, result.detail)
        return result

    def deliver(self, notification: Notification) -> DeliveryResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def budget(self, documented: int, notification: Notification) -> int:
        """The size to render within: the documented limit, the learned one if smaller, times the
        notification's budget_factor (the worker halves it for its immediate resend after "too long")."""
        limit = documented if self.size_limit is None else min(documented, self.size_limit)
        self.last_budget = max(1, int(limit * notification.budget_factor))
        return self.last_budget

    def _learn_too_long(self, result: DeliveryResult) -> DeliveryResult:
        learned = max(self.min_size, self.last_size // 2)
        if self.size_limit is None or learned < self.size_limit:
            self.size_limit = learned
        return dataclasses.replace(result, detail=f"{result.detail} (sent {self.last_size:,} {self.size_unit}; "
                                                  f"now rendering within {self.size_limit:,})")

    def post(self, url: str, body: dict | bytes, *, secrets: Iterable[str] = (),
             headers: dict | None = None) -> tuple[Answer | None, DeliveryResult]:
        """POST `body` (a dict is sent as compact UTF-8 JSON, see json_bytes); return (answer,
        classification). The whole send (connect, request, answer) has the channel's `timeout` as its
        deadline and at most MAX_ANSWER_BYTES of the answer is read (see answer.py). Exceptions become
        retryable results; every detail is redacted of `secrets`."""
        try:
            self.destination = redaction.address(url)
        except ValueError:
            self.destination = "(a malformed URL)"
        data = json_bytes(body) if isinstance(body, dict) else body
        all_headers = {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
        try:
            resp = post_within(self.session, url, data, all_headers, self.spec.timeout.seconds)
        except requests.RequestException as exc:
            result = classify_exception(exc)
            return None, dataclasses.replace(result, detail=redact(result.detail, secrets))
        result = classify_http(resp.status_code, resp.text, resp.headers.get("Retry-After"))
        if result.detail:
            result = dataclasses.replace(result, detail=redact(result.detail, secrets))
        return resp, result


def json_bytes(body) -> bytes:
    """The exact bytes sent for a JSON body: UTF-8 (CJK is 3 bytes, not a 6-byte \\u escape), no spaces.
    Sizes are measured on these bytes, so what is measured is what the provider receives."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# ------------------------------------------------------------------------------------------ HTTP answers
def classify_http(status: int, body: str = "", retry_after: str | None = None) -> DeliveryResult:
    """Classify an HTTP answer: 2xx ok; 5xx, 408 and 429 retryable; 401/403/404 bad key; other 4xx permanent.

    Provider-specific checks (WeCom's errcode inside HTTP 200, Slack's too-long errors) run after this.
    """
    snippet = short(body)
    if 200 <= status < 300:
        return DeliveryResult.success(snippet)
    after = parse_retry_after(retry_after)
    if status == 429:
        return DeliveryResult.fail("rate_limited", f"HTTP 429 {snippet}", retryable=True, retry_after=after)
    if status == 408:
        return DeliveryResult.fail("timeout", f"HTTP 408 {snippet}", retryable=True)
    if status >= 500:
        return DeliveryResult.fail("http_5xx", f"HTTP {status} {snippet}", retryable=True, retry_after=after)
    if status in (401, 403, 404, 410):
        return DeliveryResult.fail("bad_key", f"HTTP {status} {snippet}", retryable=False)
    return DeliveryResult.fail("invalid_payload", f"HTTP {status} {snippet}", retryable=False)


def classify_exception(exc: Exception) -> DeliveryResult:
    """A requests exception as a retryable failure: `ConnectionError: [Errno 111] Connection refused`. The
    detail is the exception's type and the operating system's error under it (os_error), never the
    exception's own message: requests and urllib3 put the URL, which may hold a key, in theirs."""
    if isinstance(exc, DeadlineExceeded):  # its message names the deadline, never the URL
        return DeliveryResult.fail("timeout", f"{type(exc).__name__}: {exc}", retryable=True)
    cause = os_error(exc)
    detail = type(exc).__name__ + (f": {cause}" if cause else "")
    if isinstance(exc, requests.Timeout):
        return DeliveryResult.fail("timeout", detail, retryable=True)
    return DeliveryResult.fail("connection", detail, retryable=True)


def os_error(exc: BaseException) -> str:
    """`[Errno 111] Connection refused`, `[Errno -2] Name or service not known`: the first error with an
    errno in the chain under `exc` (its args, urllib3's `reason`, `__cause__`, `__context__`); '' when none.
    requests' and urllib3's own exceptions are OSErrors without an errno, so they are passed over."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None and e.strerror:
            return f"[Errno {e.errno}] {e.strerror}"
        todo += [*e.args, getattr(e, "reason", None), e.__cause__, e.__context__]
    return ""


def too_long(result: DeliveryResult) -> DeliveryResult:
    """`result` re-classified as "too long": retryable, since the next rendering is smaller."""
    return DeliveryResult.fail("too_long", result.detail, retryable=True)


_RETRY_AFTER = Retry()  # only for its Retry-After parser


def parse_retry_after(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks to wait (RFC 9110 §10.2.3: delta-seconds or an HTTP-date; a date in
    the past is 0), or None when absent or malformed (negative, fractional, words): our own backoff applies.
    Parsed by urllib3's `Retry.parse_retry_after`. Not clamped here: the delivery worker clamps it to
    `notifier.retry_max` and the row's `max_delivery_age`."""
    if not value:
        return None
    try:
        return float(_RETRY_AFTER.parse_retry_after(value))
    except (InvalidHeader, ValueError, OverflowError):
        return None


# ------------------------------------------------------------------------------------------ redaction
# urllib3 logs each request line at DEBUG (`"POST /cgi-bin/webhook/send?key=... HTTP/1.1" 200`,
# `"POST /services/T/B/X ..."`): the one redaction filter on its logger too, so a channel used without the
# CLI's handlers (a library, a test) cannot print a WeCom key or a Slack webhook token either.
logging.getLogger("urllib3.connectionpool").addFilter(redaction.FILTER)


def short(text: str, limit: int = 200) -> str:
    """One line of at most `limit` characters (an error body in a log line or an error text)."""
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
