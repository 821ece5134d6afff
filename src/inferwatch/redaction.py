"""No secret in any output: one process-wide set of secret values, `redact()` for any text, and the logging
filter `setup_logging` puts on every handler (so third-party loggers such as urllib3's `-v` debug lines and
aiohttp's are covered too).

Where the secrets come from: every spec `Secret.reveal()` registers its value (`${ENV}`, `*_file` or inline),
so each service's secrets are known before its first request; `register()` adds others. A URL secret is
registered with the parts libraries print on their own: urllib3 logs `"POST /services/T0/B0/XXXX HTTP/1.1"`
(path and query, no host), so the user-info (whole, its password, and its Basic credential), each key-like
query value and a token-like last path segment count as secrets as well. `address(url)` is the form of a URL
that may become a label or a scrape target: host:port, never its user-info.

Each secret is also redacted in any letter case and in the encodings a provider's error text may quote it
in (base64, base64url, percent-encoding: `encodings()`).

Patterns redacted even when no value was registered (an error body quoting some other URL): query
credentials (`key=`, `token=`, ...), JSON credential fields, `Authorization:` values, URL user-info and Slack
webhook tokens.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from typing import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

REDACTED = "<redacted>"
MIN_SECRET_CHARS = 4        # shorter values are too common to replace in text (and too weak to be secrets)
MIN_PATH_TOKEN_CHARS = 16   # a URL's last path segment this long is a token (Slack: 24 chars, Discord: 68)
MIN_QUERY_TOKEN_CHARS = 8   # a query value this long is a key (WeCom: a 36-char UUID); `?format=json` is not

_PATTERNS = [
    # Query credentials: WeCom ?key=, DingTalk access_token=/sign=, generic token=/password=.
    (re.compile(r"(?i)((?:key|token|access_token|routing_key|sign|signature|password|secret)=)[^&\s\"'<>]+"),
     r"\1" + REDACTED),
    # JSON or header-like credential fields: "routing_key": "...", "token": "...".
    (re.compile(r"(?i)(\"(?:routing_key|integration_key|token|password|secret|api_key)\"\s*:\s*\")[^\"]*"),
     r"\1" + REDACTED),
    # Authorization headers, keeping the scheme: "Authorization: Bearer X", "'Authorization': 'Basic X'".
    (re.compile(r"(?i)((?<![\w.-])authorization['\"]?\s*[:=]\s*['\"]?(?:bearer\s+|basic\s+|token\s+)?)"
                r"[^\s'\",}]+"), r"\1" + REDACTED),
    # A field named after the header (`upstream_authorization: Bearer X`) holds a credential only after a
    # scheme: without one the next word is the error's prose ("upstream_authorization: environment variable
    # ... is not set"), which must stay readable.
    (re.compile(r"(?i)([\w.-]authorization['\"]?\s*[:=]\s*['\"]?(?:bearer|basic|token)\s+)[^\s'\",}]+"),
     r"\1" + REDACTED),
    # URL user-info: scheme://user:password@host or scheme://token@host.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"<>]+@"), r"\1" + REDACTED + "@"),
    # Slack incoming webhooks: /services/T.../B.../<token>, with or without the host.
    (re.compile(r"(/services/[A-Za-z0-9]+/[A-Za-z0-9]+/)[A-Za-z0-9]+"), r"\1" + REDACTED),
]

_lock = threading.Lock()
_secrets: set[str] = set()
_secrets_re: re.Pattern | None = None


def secret_parts(value: str) -> set[str]:
    """`value` and, for a URL, the pieces of it that are as secret as the whole (see the module docstring)."""
    parts = {value}
    if "://" not in value:
        return parts
    try:
        url = urlsplit(value)
        password = url.password
    except ValueError:
        return parts
    userinfo = url.netloc.rpartition("@")[0]
    if userinfo:
        # The whole user-info, so no part of it is left beside a redacted password; alone it is a token
        # (https://TOKEN@host).
        parts.add(userinfo)
    if password:
        # HTTP clients send user-info as a Basic credential: base64("user:password") is as secret, made of the
        # percent-decoded parts (as aiohttp and requests decode them) when they are encoded.
        for user, secret in {(url.username or "", password), (unquote(url.username or ""), unquote(password))}:
            parts.update((secret, base64.b64encode(f"{user}:{secret}".encode()).decode()))
    parts.update(v for _, v in parse_qsl(url.query) if len(v) >= MIN_QUERY_TOKEN_CHARS)
    last = url.path.rstrip("/").rsplit("/", 1)[-1]
    if len(last) >= MIN_PATH_TOKEN_CHARS:
        parts.add(last)
    return parts


def address(url: str) -> str:
    """`host:port` (`host` alone without a port; IPv6 in brackets) of `url`, without its user-info: what
    may name a target in a label, a log line or a scrape config. Raises ValueError for a malformed URL."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port}" if parts.port is not None else host


def register(value: str | None) -> None:
    """Treat `value` (and, for a URL, its secret parts) as a secret in every later redact() and log line."""
    if value:
        _add(secret_parts(value))


def register_url_credentials(url: str | None) -> None:
    """Treat the credentials `url` carries (its user-info, password and Basic credential; key-like query
    values; a token-like last path segment) as secrets, but not the URL itself: for a server's address
    (a Triton target), whose log lines must still say which server they are about."""
    if url:
        _add(secret_parts(url) - {url})


def encodings(value: str) -> set[str]:
    """`value` and the forms a provider's error text may quote it in: base64 and base64url (RFC 4648 §4,
    §5; padded and not) of its UTF-8 bytes, and URL percent-encoding (RFC 3986 §2.1; `quote_plus` too).
    Matching is case-insensitive on top (a routing key quoted lowercased), see `_pattern`."""
    raw = value.encode("utf-8")
    forms = {value, quote(value, safe=""), quote_plus(value, safe="")}
    for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
        forms.update((encoded, encoded.rstrip("=")))
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS}


def _pattern(values: Iterable[str]) -> re.Pattern | None:
    """One case-insensitive alternation of `values`, longest first (a whole URL before its parts)."""
    ordered = sorted(set(values), key=len, reverse=True)
    return re.compile("|".join(re.escape(v) for v in ordered), re.IGNORECASE) if ordered else None


def _add(parts: set[str]) -> None:
    global _secrets_re
    new = {p for p in parts if len(p) >= MIN_SECRET_CHARS} - _secrets
    if not new:
        return
    with _lock:
        _secrets.update(new)
        _secrets_re = _pattern(form for s in _secrets for form in encodings(s))


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every registered secret, each of `secrets` (each in any letter case, base64, base64url or
    percent-encoded, see `encodings`) and the credential patterns replaced by `<redacted>`."""
    if not text:
        return text
    given = _pattern(form for value in secrets if value and len(value) >= MIN_SECRET_CHARS
                     for form in encodings(value))
    if given is not None:
        text = given.sub(REDACTED, text)
    pattern = _secrets_re
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    for regex, replacement in _PATTERNS:
        text = regex.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """A handler filter that redacts the formatted message, the exception text and the stack of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string: the handler reports it as logging does
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


FILTER = RedactingFilter()


def all_handlers() -> list[logging.Handler]:
    """Every handler of every logger known now, the root's and logging's last resort included."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    handlers = [h for lg in loggers for h in lg.handlers]
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    return handlers


def install() -> None:
    """Put the one RedactingFilter on every handler (idempotent)."""
    for handler in all_handlers():
        if FILTER not in handler.filters:
            handler.addFilter(FILTER)
