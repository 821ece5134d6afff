"""I/O: one poll of one Triton through `tritonclient.http.aio` → a `TritonSnapshot` (plain data).

Why asyncio (tritonclient's aiohttp client) rather than a thread pool: a fleet of Tritons with hundreds of
models each means thousands of small calls per interval; coroutines cost far less than threads, and
`asyncio.wait_for` gives every call its own timeout without leaving a stuck worker behind. Concurrency is
bounded per target by a semaphore, so one Triton never gets more than `concurrency` calls at once.

Failure isolation: every call is wrapped; a failure becomes a `PollError(endpoint, cause)` and leaves the
rest of the snapshot intact. A failed config call drops only that model's config figures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from urllib.parse import urlparse

import aiohttp
from tritonclient.http.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from inferwatch.exporters.triton.snapshot import (
    PollError, TritonSnapshot, parse_batch_stats, parse_config, parse_index,
)

log = logging.getLogger(__name__)

# Series names that prove `--metrics-config summary_latencies=true` (metrics.md "Summaries").
SUMMARY_MARKER = b"_summary_us"


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """One Triton to poll. `headers` are resolved values (secrets revealed), sent on every API call."""

    name: str
    url: str
    metrics_url: str = ""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

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
    if isinstance(exc, InferenceServerException):
        status = str(exc.status() or "")
        if status in ("401", "403"):
            return "forbidden"  # restricted API (--http-restricted-api) without or with a wrong header
        if "decoding the response" in (exc.message() or ""):
            return "bad_response"
        return "http_error"
    if isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError, OSError)):
        return "connection"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "http_error"
    if isinstance(exc, (ValueError, KeyError, TypeError)):
        return "bad_response"
    return "other"


class TritonReader:
    """Polls one Triton. Create and use it inside one event loop (aiohttp sessions are loop-bound).

    `timeout`: seconds per call; `concurrency`: calls in flight at once to this Triton.
    """

    def __init__(self, target: TargetConfig, *, timeout: float = 5.0, concurrency: int = 16):
        self.target = target
        self.timeout = timeout
        self.concurrency = concurrency
        self._client: InferenceServerClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None
        self._was_up: bool | None = None
        self._failing: set[tuple[str, str, str]] = set()  # logged once while they keep failing

    def _open(self) -> None:
        parsed = urlparse(self.target.url)
        base = parsed.netloc + parsed.path.rstrip("/")
        self._client = InferenceServerClient(base, ssl=parsed.scheme == "https", conn_limit=self.concurrency,
                                             conn_timeout=self.timeout)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        self._sem = asyncio.Semaphore(self.concurrency)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            await self._session.close()
            self._client = self._session = None

    async def _call(self, endpoint: str, make, errors: list[PollError], what: str = ""):
        async with self._sem:
            try:
                return await asyncio.wait_for(make(), self.timeout)
            except Exception as exc:  # noqa: BLE001 - any failure of one call is isolated and counted
                cause = classify(exc)
                detail = f"{what}: {_describe(exc)}" if what else _describe(exc)
                errors.append(PollError(endpoint, cause, detail))
                return _Failed(cause)

    async def read(self) -> TritonSnapshot:
        """One poll. Never raises for Triton-side failures; they land in `snapshot.errors`."""
        if self._client is None:
            self._open()
        started = time.monotonic()
        errors: list[PollError] = []
        h = self.target.headers or None
        c = self._client
        live = await self._call("live", lambda: c.is_server_live(headers=h), errors)
        snap = TritonSnapshot(self.target.name, up=not isinstance(live, _Failed), errors=errors)
        if snap.up:
            snap.live = bool(live)
            ready, index, stats, summaries = await asyncio.gather(
                self._call("ready", lambda: c.is_server_ready(headers=h), errors),
                self._call("index", lambda: self._index(), errors),
                self._call("stats", lambda: self._stats(), errors),
                self._call("metrics", self._summaries, errors),
            )
            snap.ready = None if isinstance(ready, _Failed) else bool(ready)
            snap.summaries_enabled = None if isinstance(summaries, _Failed) else summaries
            if not isinstance(index, _Failed):
                snap.models = index
                names = sorted({m.name for m in index if m.state == "READY"})
                configs = await asyncio.gather(*(
                    self._call("config", _bind(self._config, n), errors, what=f"model {n}") for n in names))
                snap.configs = {n: cfg for n, cfg in zip(names, configs) if not isinstance(cfg, _Failed)}
            if not isinstance(stats, _Failed):
                known = None if snap.models is None else {(m.name, m.version) for m in snap.models}
                # Only versions the index still lists: a model being unloaded must not linger via stats.
                snap.batch_executions = {k: v for k, v in stats.items() if known is None or k in known}
        snap.duration_seconds = time.monotonic() - started
        snap.timestamp = time.time()
        self._log(snap)
        return snap

    async def _index(self):
        return parse_index(await self._client.get_model_repository_index(headers=self.target.headers or None))

    async def _stats(self):
        return parse_batch_stats(await self._client.get_inference_statistics(headers=self.target.headers or None))

    async def _config(self, name: str):
        return parse_config(await self._client.get_model_config(name, headers=self.target.headers or None))

    async def _summaries(self) -> bool:
        # tritonclient has no call for /metrics; read it with aiohttp, stopping at the first summary line so
        # a large fleet's exposition is usually not read whole.
        async with self._session.get(self.target.resolved_metrics_url(), headers=self.target.headers) as resp:
            resp.raise_for_status()
            tail = b""
            async for chunk in resp.content.iter_chunked(64 * 1024):
                if SUMMARY_MARKER in tail + chunk:
                    return True
                tail = chunk[-len(SUMMARY_MARKER):]
            return False

    def _log(self, snap: TritonSnapshot) -> None:
        if not snap.up and self._was_up is not False:
            log.warning("triton %s (%s) unreachable: %s", self.target.name, self.target.url,
                        snap.errors[0].detail if snap.errors else "no answer")
        elif snap.up and self._was_up is False:
            log.info("triton %s reachable again", self.target.name)
        self._was_up = snap.up
        if not snap.up:
            return
        # One line when a call starts failing and one when it recovers, not one per poll.
        failing = set()
        for err in snap.errors:
            key = (err.endpoint, err.cause, err.detail.split(":", 1)[0] if err.endpoint == "config" else "")
            failing.add(key)
            if key not in self._failing:
                log.warning("triton %s: %s call failed (%s): %s", self.target.name, err.endpoint, err.cause,
                            err.detail)
        for endpoint, cause, what in sorted(self._failing - failing):
            log.info("triton %s: %s call %srecovered from %s", self.target.name, endpoint,
                     f"for {what} " if what else "", cause)
        self._failing = failing


def _bind(fn, arg):
    return lambda: fn(arg)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, InferenceServerException):
        return f"HTTP {exc.status()}: {exc.message()}"[:300]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
