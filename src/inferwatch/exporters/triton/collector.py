"""The Triton collector: polls every target in the background, serves the last snapshots on scrape.

Scrapes never call Triton: `collect()` only turns the latest snapshots into families, so a scrape is fast
and a slow Triton cannot make Prometheus time out. Polls run on one asyncio loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from inferwatch.exporters.triton.configcache import DEFAULT_MAX_AGE_SECONDS
from inferwatch.exporters.triton.families import build_families
from inferwatch.exporters.triton.reader import TargetConfig, TritonReader
from inferwatch.exporters.triton.replicas import (
    Plan,
    Resolver,
    merge_with_address,
    plan,
    probe,
    system_resolver,
    target_families,
)
from inferwatch.exporters.triton.snapshot import TritonSnapshot
from inferwatch.loops import close_stopped_loop
from inferwatch.redaction import redact

log = logging.getLogger(__name__)
# Polls between two probes of an address for several servers behind it (replicas.probe; 4 statistics reads).
REPROBE_POLLS = 30


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
                 bls_steps: Mapping[str, Iterable[str]] | None = None, resolver: Resolver | None = None):
        self.targets = list(targets)
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate Triton target names: {sorted(n for n in set(names) if names.count(n) > 1)}")
        self.interval = interval
        self.timeout = timeout
        self.bls_steps = {parent: tuple(steps) for parent, steps in (bls_steps or {}).items()}
        self._reader_args: dict[str, Any] = dict(timeout=timeout, concurrency=concurrency,
                                                 config_max_age=config_max_age, interval=interval)
        # Every address behind each target's name, resolved at each poll (replicas.py); key (target, address),
        # address "" for a target polled as configured.
        self._resolver = resolver or system_resolver
        self._readers: dict[tuple[str, str], TritonReader] = {}
        self._addresses: dict[str, int | None] = {}
        self._logged_addresses: dict[str, int | None] = {}
        self._load_balanced: dict[tuple[str, str], bool | None] = {}
        self._since_probe: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._snapshots: dict[tuple[str, str], TritonSnapshot] = {}
        self._errors: dict[tuple[str, str], Counter] = {}
        self._config_fetches: dict[tuple[str, str], int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="triton-collector", daemon=True)
        self._thread.start()
        self._task: concurrent.futures.Future[None] | None = None

    # -------------------------------------------------------------------------------------- polling
    async def _poll_all(self) -> list[TritonSnapshot]:
        plans = await asyncio.gather(*(plan(t, self._resolver) for t in self.targets))
        wanted: dict[tuple[str, str], TargetConfig] = {}
        for target, found in zip(self.targets, plans, strict=True):
            self._addresses[target.name] = found.addresses
            self._log_addresses(target, found)
            wanted.update({(target.name, address): cfg for address, cfg in found.polls})
        for key in [k for k in self._readers if k not in wanted]:   # an address gone (a pod gone): its series go
            await self._readers.pop(key).close()
            with self._lock:
                for table in (self._snapshots, self._errors, self._config_fetches, self._load_balanced,
                              self._since_probe):
                    table.pop(key, None)  # type: ignore[attr-defined]
        for key, cfg in wanted.items():
            reader = self._readers.get(key)
            if reader is not None and reader.target != cfg:   # the name moved to another address: a new server
                await reader.close()
                reader = None
                self._since_probe.pop(key, None)
                with self._lock:
                    self._load_balanced.pop(key, None)
            if reader is None:
                self._readers[key] = TritonReader(cfg, **self._reader_args)
        keys = list(wanted)
        snaps = await asyncio.gather(*(self._readers[k].read() for k in keys), return_exceptions=True)
        done = []
        for key, snap in zip(keys, snaps, strict=True):
            if isinstance(snap, BaseException):
                # A bug in reading one target must not stop the others or the loop.
                log.error("triton %s: poll crashed: %r", _named(key), snap)
                snap = TritonSnapshot(key[0], up=False)
            done.append((key, snap))
        await asyncio.gather(*(self._judge(key, wanted[key], snap) for key, snap in done))
        with self._lock:
            for key, snap in done:
                self._snapshots[key] = snap
                self._config_fetches[key] = self._config_fetches.get(key, 0) + snap.config_fetches
                errors = self._errors.setdefault(key, Counter())
                for err in snap.errors:
                    errors[(snap.triton, err.endpoint, err.cause)] += 1
        return [snap for _, snap in done]

    async def _judge(self, key: tuple[str, str], target: TargetConfig, snap: TritonSnapshot) -> None:
        """Whether several servers answer this address (replicas.probe): at the first poll that reaches it,
        then every REPROBE_POLLS polls (counters equal at start, e.g. idle replicas, differ once traffic comes)."""
        since = self._since_probe.get(key, REPROBE_POLLS)
        self._since_probe[key] = since + 1
        # Not while the statistics cannot be read at all (down, restricted without the header): no verdict
        # could come of it, and four failing reads a poll would be wasted.
        if not snap.up or snap.stats is None or since < REPROBE_POLLS:
            return
        verdict = await probe(target, self.timeout)
        if verdict is None:
            return   # a read failed: no verdict, try at the next poll
        self._since_probe[key] = 0
        before = self._load_balanced.get(key)
        if verdict and not before:
            log.warning("triton %s (%s) answers as several servers: its statistics went back between reads on "
                        "separate connections, so a load balancer spreads it over more than one Triton; its "
                        "statistics are not exported (inferwatch_triton_target_load_balanced 1). Poll every "
                        "replica: a headless Service's name (it resolves to every pod) or one URL per pod",
                        _named(key), redact(target.url))
        elif before and not verdict:
            log.info("triton %s answers as one server again; exporting its statistics", _named(key))
        with self._lock:
            self._load_balanced[key] = verdict

    def _log_addresses(self, target: TargetConfig, found: Plan) -> None:
        if self._logged_addresses.get(target.name, -1) == found.addresses:
            return
        self._logged_addresses[target.name] = found.addresses
        if found.addresses is not None and found.addresses > 1:
            log.info("triton %s: %s resolves to %d addresses (%s): polling each as its own server (label "
                     "address)", target.name, redact(target.url), found.addresses,
                     ", ".join(address for address, _ in found.polls))
        elif found.addresses == 0:
            log.warning("triton %s: %s does not resolve", target.name, redact(target.url))

    def poll_once(self, timeout: float | None = None) -> list[TritonSnapshot]:
        """Poll every target once, now; returns the new snapshots (also kept for scrapes)."""
        return asyncio.run_coroutine_threadsafe(self._poll_all(), self._loop).result(timeout)

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await self._poll_all()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def _close_readers(self) -> None:
        await asyncio.gather(*(r.close() for r in self._readers.values()), return_exceptions=True)

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
        close_stopped_loop(self._loop, self._thread)

    # ------------------------------------------------------------------------------------ scraping
    def snapshots(self) -> list[TritonSnapshot]:
        with self._lock:
            return list(self._snapshots.values())

    def poll_errors(self) -> dict[tuple[str, str, str], int]:
        """(triton, endpoint, cause) → failed calls since start, every address of a target together."""
        total: Counter = Counter()
        with self._lock:
            for errors in self._errors.values():
                total.update(errors)
        return dict(total)

    def collect(self):
        with self._lock:
            snaps = dict(self._snapshots)
            errors = {k: dict(v) for k, v in self._errors.items()}
            fetches = dict(self._config_fetches)
            balanced = dict(self._load_balanced)
            addresses = dict(self._addresses)
        groups: dict[str, list[TritonSnapshot]] = {}
        for key, snap in snaps.items():
            # A blend of several servers' counters is no server's: withheld while the address is load-balanced.
            groups.setdefault(key[1], []).append(dataclasses.replace(snap, stats=None) if balanced.get(key) else snap)
        built = {}
        for address, group in sorted(groups.items()):
            keys = [k for k in snaps if k[1] == address]
            group_errors = {e: n for k in keys for e, n in errors.get(k, {}).items()}
            group_fetches = {k[0]: fetches.get(k, 0) for k in keys}
            built[address] = build_families(group, group_errors, self.bls_steps, group_fetches)
        yield from merge_with_address(built) if built else build_families([], {}, self.bls_steps, {})
        yield from target_families(addresses, balanced)

    def describe(self):
        # Families depend on what was polled; an empty describe keeps registration from calling collect().
        return []


def _named(key: tuple[str, str]) -> str:
    return f"{key[0]} at {key[1]}" if key[1] else key[0]
