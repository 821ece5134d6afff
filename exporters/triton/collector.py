"""The Triton collector: polls every target in the background, serves the last snapshots on scrape.

Scrapes never call Triton: `collect()` only turns the latest snapshots into families, so a scrape is fast
and a slow Triton cannot make Prometheus time out. Polls run on one asyncio loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping

from inferwatch.exporters.triton.configcache import DEFAULT_MAX_AGE_SECONDS
from inferwatch.exporters.triton.families import build_families
from inferwatch.exporters.triton.reader import TargetConfig, TritonReader
from inferwatch.exporters.triton.snapshot import TritonSnapshot

log = logging.getLogger(__name__)


class TritonCollector:
    """A prometheus_client collector over several Tritons.

    `targets`: what to poll; `interval`: seconds between poll starts; `timeout`: seconds per API call;
    `concurrency`: API calls in flight per target; `config_max_age`: seconds after which an unchanged model's
    configuration is read again (configcache.py; 0: every poll); `bls_steps`: for models that call others
    from their code (Python-backend BLS), parent model → the models it calls, which the configuration cannot
    tell. Use `start()` for the background loop, or `poll_once()` (tests, benchmarks) for one synchronous
    poll of every target. `close()` stops the loop.
    """

    def __init__(self, targets: Iterable[TargetConfig], *, interval: float = 10.0, timeout: float = 5.0,
                 concurrency: int = 16, config_max_age: float = DEFAULT_MAX_AGE_SECONDS,
                 bls_steps: Mapping[str, Iterable[str]] | None = None):
        self.targets = list(targets)
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate Triton target names: {sorted(n for n in set(names) if names.count(n) > 1)}")
        self.interval = interval
        self.bls_steps = {parent: tuple(steps) for parent, steps in (bls_steps or {}).items()}
        self._readers = [TritonReader(t, timeout=timeout, concurrency=concurrency, config_max_age=config_max_age,
                                      interval=interval) for t in self.targets]
        self._lock = threading.Lock()
        self._snapshots: dict[str, TritonSnapshot] = {}
        self._errors: Counter = Counter()
        self._config_fetches: Counter = Counter()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="triton-collector", daemon=True)
        self._thread.start()
        self._task: asyncio.Future | None = None

    # -------------------------------------------------------------------------------------- polling
    async def _poll_all(self) -> list[TritonSnapshot]:
        snaps = await asyncio.gather(*(r.read() for r in self._readers), return_exceptions=True)
        done = []
        for reader, snap in zip(self._readers, snaps, strict=True):
            if isinstance(snap, BaseException):
                # A bug in reading one target must not stop the others or the loop.
                log.error("triton %s: poll crashed: %r", reader.target.name, snap)
                snap = TritonSnapshot(reader.target.name, up=False)
            done.append(snap)
        with self._lock:
            for snap in done:
                self._snapshots[snap.triton] = snap
                self._config_fetches[snap.triton] += snap.config_fetches
                for err in snap.errors:
                    self._errors[(snap.triton, err.endpoint, err.cause)] += 1
        return done

    def poll_once(self, timeout: float | None = None) -> list[TritonSnapshot]:
        """Poll every target once, now; returns the new snapshots (also kept for scrapes)."""
        return asyncio.run_coroutine_threadsafe(self._poll_all(), self._loop).result(timeout)

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await self._poll_all()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def _close_readers(self) -> None:
        await asyncio.gather(*(r.close() for r in self._readers), return_exceptions=True)

    def start(self) -> "TritonCollector":
        """Start polling every `interval` seconds in the background."""
        self._task = asyncio.run_coroutine_threadsafe(self._run(), self._loop)
        return self

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        asyncio.run_coroutine_threadsafe(self._close_readers(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------------------------ scraping
    def snapshots(self) -> list[TritonSnapshot]:
        with self._lock:
            return list(self._snapshots.values())

    def poll_errors(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._errors)

    def collect(self):
        with self._lock:
            snaps = list(self._snapshots.values())
            errors = dict(self._errors)
            fetches = dict(self._config_fetches)
        yield from build_families(snaps, errors, self.bls_steps, fetches)

    def describe(self):
        # Families depend on what was polled; an empty describe keeps registration from calling collect().
        return []

