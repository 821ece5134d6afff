"""I/O: one poll of one Triton over its HTTP API (aiohttp) → a `TritonSnapshot` (plain data).

Why asyncio: a fleet of Tritons with hundreds of models each means many small calls per interval; coroutines
cost far less than threads, and `asyncio.wait_for` gives every call its own timeout without leaving a stuck
worker behind. Concurrency is bounded per target by a semaphore (and the connection pool), so one Triton
never gets more than `concurrency` calls at once.

Why aiohttp rather than tritonclient: every answer is read with a size bound (answers.py) and decoded without
floats (exact uint64 counts, stats.py); tritonclient reads whole bodies and offers neither.

Failure isolation: every call is wrapped; a failure becomes a `PollError(endpoint, cause)` and leaves the
rest of the snapshot intact. A failed config call drops only that model's config figures; a malformed
statistics entry drops only that model version's statistics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from urllib.parse import quote, urlparse

import aiohttp

from inferwatch.exporters.triton.answers import (
    CHUNK_BYTES,
    DEFAULT_MAX_ANSWER_BYTES,
    AnswerTooLarge,
    HttpStatusError,
    decode_json,
    error_text,
    read_capped,
)
from inferwatch.exporters.triton.configcache import DEFAULT_MAX_AGE_SECONDS, ConfigCache, index_keys
from inferwatch.exporters.triton.snapshot import PollError, TritonSnapshot, parse_config, parse_index
from inferwatch.exporters.triton.stats import parse_stats
from inferwatch.redaction import redact

log = logging.getLogger(__name__)

# What a refused call means and what to do about it (log lines of cause "forbidden").
FORBIDDEN_HINT = ("; a restricted API (tritonserver --http-restricted-api): configure its header "
                  "(--header NAME=VALUE or the spec target's headers)")
# Series names that prove `--metrics-config summary_latencies=true` (metrics.md "Summaries").
SUMMARY_MARKER = b"_summary_us"


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """One Triton to poll. `headers` are resolved values (secrets revealed), sent on every API call;
    `max_answer_bytes` bounds every answer read from it (answers.py); `pinned_address`: connect to this IP
    for the URL's host name (one replica behind the name, replicas.py), "" to resolve it as usual."""

    name: str
    url: str
    metrics_url: str = ""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    pinned_address: str = ""

    def connector(self, **kwargs) -> aiohttp.TCPConnector:
        """A connector for this target's calls (pinned to `pinned_address` when set)."""
        if self.pinned_address:
            from inferwatch.exporters.triton.pinning import PinnedResolver

            kwargs["resolver"] = PinnedResolver(urlparse(self.url).hostname or "", self.pinned_address)
        return aiohttp.TCPConnector(**kwargs)

    def resolved_metrics_url(self) -> str:
        if self.metrics_url:
            return self.metrics_url
        parsed = urlparse(self.url)
        return f"{parsed.scheme}://{parsed.hostname}:8002/metrics"


class _Failed:
    def __init__(self, cause: str):
        self.cause = cause


def classify(exc: BaseException) -> str:
    """Map an exception from a call to a cause of the closed set in snapshot.CAUSES."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, AnswerTooLarge):
        return "too_large"
    if isinstance(exc, HttpStatusError):
        # restricted API (--http-restricted-api) without or with a wrong header
        return "forbidden" if exc.status in (401, 403) else "http_error"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "http_error"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "bad_response"  # a body cut or malformed on the wire
    if isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError, OSError)):
        return "connection"
    if isinstance(exc, (ValueError, KeyError, TypeError)):
        return "bad_response"
    return "other"


class TritonReader:
    """Polls one Triton. Create and use it inside one event loop (aiohttp sessions are loop-bound).

    `timeout`: seconds per call; `concurrency`: calls in flight at once to this Triton; `config_max_age` and
    `interval` (seconds) drive which model configurations are fetched (configcache.py).
    """

    def __init__(self, target: TargetConfig, *, timeout: float = 5.0, concurrency: int = 16,
                 config_max_age: float = DEFAULT_MAX_AGE_SECONDS, interval: float = 10.0):
        self.target = target
        self.timeout = timeout
        self.concurrency = concurrency
        self.configs = ConfigCache(config_max_age, interval)
        self._base = target.url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None
        self._was_up: bool | None = None
        self._failing: set[tuple[str, str, str, bool]] = set()  # logged once while they keep failing

    def _open(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=self.target.connector(limit=self.concurrency),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            headers=self.target.headers or None)
        self._sem = asyncio.Semaphore(self.concurrency)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, endpoint: str, make, errors: list[PollError], what: str = ""):
        """make()'s result, or _Failed with a PollError about `what` (a model name, "" for the call) added."""
        async with self._sem:
            try:
                return await asyncio.wait_for(make(), self.timeout)
            except Exception as exc:  # noqa: BLE001 - any failure of one call is isolated and counted
                cause = classify(exc)
                errors.append(PollError(endpoint, cause, _describe(exc), what))
                return _Failed(cause)

    async def read(self) -> TritonSnapshot:
        """One poll. Never raises for Triton-side failures; they land in `snapshot.errors`."""
        if self._session is None:
            self._open()
        started = time.monotonic()
        errors: list[PollError] = []
        live = await self._call("live", lambda: self._ok("GET", "/v2/health/live"), errors)
        # A refusal (401/403: --http-restricted-api covering health, without or with a wrong header) is an
        # answer: the server is up, and whether it is live is unknown (absent), not "not live".
        answered = not isinstance(live, _Failed) or live.cause == "forbidden"
        snap = TritonSnapshot(self.target.name, up=answered, errors=errors)
        if not snap.up:
            self.configs.clear()  # a restart may bring other configurations with the same versions
        else:
            snap.live = None if isinstance(live, _Failed) else bool(live)
            ready, index, stats, summaries = await asyncio.gather(
                self._call("ready", lambda: self._ok("GET", "/v2/health/ready"), errors),
                self._call("index", lambda: self._json("POST", "/v2/repository/index", b"{}"), errors),
                self._call("stats", lambda: self._json("GET", "/v2/models/stats"), errors),
                self._call("metrics", self._summaries, errors),
            )
            snap.ready = None if isinstance(ready, _Failed) else bool(ready)
            snap.summaries_enabled = None if isinstance(summaries, _Failed) else summaries
            if not isinstance(index, _Failed):
                index = self._parsed("index", parse_index, index, errors)
            if not isinstance(index, _Failed):
                index, problems = index
                errors.extend(PollError("index", "bad_response", text, name, True) for name, text in problems)
                snap.models = index
                await self._read_configs(snap, errors)
            if not isinstance(stats, _Failed):
                stats = self._parsed("stats", parse_stats, stats, errors)
            if not isinstance(stats, _Failed):
                parsed, problems = stats
                errors.extend(PollError("stats", "bad_response", text, name, True) for name, text in problems)
                known = None if snap.models is None else {(m.name, m.version) for m in snap.models}
                # Only versions the index still lists: a model being unloaded must not linger via stats.
                snap.stats = {k: v for k, v in parsed.items() if known is None or k in known}
        snap.duration_seconds = time.monotonic() - started
        snap.timestamp = time.time()
        self._log(snap)
        return snap

    async def _read_configs(self, snap: TritonSnapshot, errors: list[PollError]) -> None:
        ready = {m.name for m in snap.models if m.state == "READY"}
        keys = {name: key for name, key in index_keys(snap.models).items() if name in ready}
        due = self.configs.due(keys, time.monotonic())
        answers = await asyncio.gather(*(
            self._call("config", _bind(self._config, n), errors, what=n) for n in due))
        now = time.monotonic()
        for name, figures in zip(due, answers, strict=True):
            if isinstance(figures, _Failed):
                self.configs.drop(name)
            else:
                self.configs.store(name, keys[name], figures, now)
        snap.configs = self.configs.figures(sorted(keys))
        snap.config_fetches = len(due)

    @staticmethod
    def _parsed(endpoint: str, parse, answer, errors: list[PollError]):
        try:
            return parse(answer)
        except ValueError as exc:
            errors.append(PollError(endpoint, "bad_response", str(exc)[:300]))
            return _Failed("bad_response")

    async def _ok(self, method: str, path: str) -> bool:
        """True when `path` answers 200 (health: 400 means not live/ready; any answer means up). Raises
        HttpStatusError on 401/403: Triton's answer to a restricted API (`--http-restricted-api`, protocol
        docs "restricted APIs") called without its header, which says nothing about health."""
        async with self._session.request(method, self._base + path) as resp:
            body = await read_capped(resp, self.target.max_answer_bytes)
            if resp.status in (401, 403):
                raise HttpStatusError(resp.status, error_text(body))
            return resp.status == 200

    async def _json(self, method: str, path: str, data: bytes | None = None) -> object:
        async with self._session.request(method, self._base + path, data=data) as resp:
            body = await read_capped(resp, self.target.max_answer_bytes)
            if resp.status != 200:
                raise HttpStatusError(resp.status, error_text(body))
            return decode_json(body)

    async def _config(self, name: str):
        return parse_config(await self._json("GET", f"/v2/models/{quote(name, safe='')}/config"))

    async def _summaries(self) -> bool:
        # Stop at the first summary line, so a large fleet's exposition is usually not read whole; never read
        # more than the answer limit.
        limit = self.target.max_answer_bytes
        async with self._session.get(self.target.resolved_metrics_url()) as resp:
            if resp.status != 200:
                raise HttpStatusError(resp.status, error_text(await read_capped(resp, limit)))
            tail, seen = b"", 0
            async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                if SUMMARY_MARKER in tail + chunk:
                    return True
                seen += len(chunk)
                if seen > limit:
                    raise AnswerTooLarge(f"metrics answer longer than the limit of {limit} bytes")
                tail = chunk[-len(SUMMARY_MARKER):]
            return False

    @property
    def _who(self) -> str:
        """The target's name in log lines, with the replica's address when pinned to one (replicas.py)."""
        pinned = self.target.pinned_address
        return f"{self.target.name} at {pinned}" if pinned else self.target.name

    def _log(self, snap: TritonSnapshot) -> None:
        """Log lines on changes only. What Triton said (model names, error texts) is escaped: one line each,
        whatever characters it holds, so an answer cannot forge log lines."""
        if not snap.up and self._was_up is not False:
            log.warning("triton %s (%s) unreachable: %s", self._who, redact(self.target.url),
                        one_line(snap.errors[0].detail) if snap.errors else "no answer")
        elif snap.up and self._was_up is False:
            log.info("triton %s reachable again", self._who)
        self._was_up = snap.up
        if not snap.up:
            return
        # One line when a call starts failing and one when it recovers, not one per poll.
        failing = set()
        for err in snap.errors:
            key = (err.endpoint, err.cause, err.subject, err.entry)
            failing.add(key)
            if key not in self._failing:
                log.warning("triton %s: %s call%s failed (%s): %s%s", self._who, err.endpoint,
                            _about(err.subject, err.entry), err.cause, one_line(err.detail),
                            FORBIDDEN_HINT if err.cause == "forbidden" else "")
        for endpoint, cause, subject, entry in sorted(self._failing - failing):
            log.info("triton %s: %s call%s recovered from %s", self._who, endpoint, _about(subject, entry),
                     cause)
        self._failing = failing


def one_line(text: str) -> str:
    """`text` when every character is printable, else escaped as Python's repr does (line breaks, control
    and terminal escape characters, and then backslashes too, without the quotes), so it stays on one log line
    and cannot pass for another."""
    return text if text.isprintable() else repr(text)[1:-1]


def _about(subject: str, entry: bool = False) -> str:
    if subject:
        return f" for model {subject!r}"
    return " for an entry without a model name" if entry else ""


def _bind(fn, arg):
    return lambda: fn(arg)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (HttpStatusError, AnswerTooLarge)):
        return str(exc)[:300]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
