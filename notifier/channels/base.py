"""What every channel shares: the delivery result, the one HTTP-answer classifier, truncation by runes or
UTF-8 bytes with a visible marker, and redaction of secrets from anything that may reach a log.

Channels never retry or sleep (the outbox worker owns retries, backoff and deadlines, as Alertmanager's
`notify/` does); they turn one Notification into one HTTP request and classify the answer.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Protocol

import requests

from inferwatch.notifier.model import Notification

# Failure reasons form a closed set: they label metrics (dead letters) and must not grow with input.
REASONS = (
    "timeout",          # no answer within the channel's timeout (retryable)
    "connection",       # refused / reset / DNS (retryable)
    "http_5xx",         # provider error (retryable)
    "rate_limited",     # HTTP 429 or a provider rate errcode such as WeCom 45009 (retryable)
    "too_long",         # provider says the message is too long (retryable once shrunk)
    "bad_key",          # 401/403/404 or an invalid-key errcode: the destination is wrong (permanent)
    "invalid_payload",  # other 4xx or a provider validation error (permanent)
    "provider_error",   # a non-zero errcode we do not know (permanent)
    "secret_missing",   # the URL/key reference could not be resolved (retryable: the file may appear)
    "max_age",          # retried until notifier.max_delivery_age, then given up (dead letter)
)


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
        assert reason in REASONS, reason
        return cls(False, retryable, reason, detail, retry_after)


class Channel(Protocol):
    """One delivery adapter. `send` performs one request and never raises for provider trouble."""

    name: str
    kind: str

    def send(self, notification: Notification) -> DeliveryResult: ...


# ------------------------------------------------------------------------------------------ HTTP answers
def classify_http(status: int, body: str = "", retry_after: str | None = None) -> DeliveryResult:
    """Classify an HTTP answer: 2xx ok; 5xx, 408 and 429 retryable; 401/403/404 bad key; other 4xx permanent.

    Provider-specific checks (WeCom's errcode inside HTTP 200, Slack's `ok` body) run after this.
    """
    snippet = short(body)
    if 200 <= status < 300:
        return DeliveryResult.success(snippet)
    after = _parse_retry_after(retry_after)
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
    """A requests exception as a retryable failure (the message never includes the URL: it may hold a key)."""
    if isinstance(exc, requests.Timeout):
        return DeliveryResult.fail("timeout", type(exc).__name__, retryable=True)
    return DeliveryResult.fail("connection", type(exc).__name__, retryable=True)


def post_json(url: str, body: dict, *, timeout: float, headers: dict | None = None,
              secrets: Iterable[str] = ()) -> tuple[requests.Response | None, DeliveryResult]:
    """POST `body` as JSON; return (response, classification). Exceptions become retryable results."""
    try:
        resp = requests.post(url, json=body, timeout=timeout, headers=headers or {})
    except requests.RequestException as exc:
        return None, classify_exception(exc)
    result = classify_http(resp.status_code, resp.text, resp.headers.get("Retry-After"))
    if result.detail:
        result = dataclasses.replace(result, detail=redact(result.detail, secrets))
    return resp, result


def _parse_retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: ignore, our own backoff applies


# ------------------------------------------------------------------------------------------ truncation
MARKER = "…"


def truncate_runes(text: str, limit: int, marker: str = MARKER) -> str:
    """`text` cut to at most `limit` code points (runes), ending with `marker` when cut."""
    if len(text) <= limit:
        return text
    if limit <= len(marker):
        return marker[:limit]
    return text[: limit - len(marker)] + marker


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def truncate_bytes(text: str, limit: int, marker: str = MARKER) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, never inside a character, ending with `marker` when cut."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    room = limit - utf8_len(marker)
    if room < 0:
        return ""
    # errors="ignore" drops a trailing partial character, so a CJK character (3 bytes) is never split.
    return raw[:room].decode("utf-8", errors="ignore") + marker


def fit_lines(head: str, lines: list[str], limit: int, more: "callable", measure=len, sep: str = "\n") -> tuple[str, int]:
    """Join `head` and as many whole `lines` as fit in `limit` (by `measure`), then `more(n_left)`.

    Whole lines only, so a link or an escape sequence is never cut in half. Returns (text, lines omitted).
    """
    out = head
    for i, line in enumerate(lines):
        left = len(lines) - i
        candidate = out + sep + line
        # Room must remain for the "…and N more" line unless this is the last line.
        tail = "" if left == 1 else sep + more(left - 1)
        if measure(candidate + tail) > limit:
            return out + sep + more(left), left
        out = candidate
    return out, 0


# ------------------------------------------------------------------------------------------ redaction
_URL_SECRET = re.compile(r"(?i)((?:key|token|access_token|routing_key|sign)=)[^&\s\"']+")
_SLACK_HOOK = re.compile(r"(hooks\.slack\.com/services/)[A-Za-z0-9/_-]+")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with each secret value, URL query credentials and Slack hook paths replaced by `<redacted>`."""
    for value in secrets:
        if value and len(value) >= 4:
            text = text.replace(value, "<redacted>")
    text = _URL_SECRET.sub(r"\1<redacted>", text)
    return _SLACK_HOOK.sub(r"\1<redacted>", text)


def short(text: str, limit: int = 200) -> str:
    return truncate_runes(" ".join((text or "").split()), limit)
