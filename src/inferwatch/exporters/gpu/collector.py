"""The GPU collector: a background loop reads NVML every interval; scrapes serve the last result.

`GpuCollector` is a prometheus_client custom collector (register it on a CollectorRegistry). Its
`collect()` only hands out metric families built after the last collection, so a scrape never waits on
NVML. NVML comes in through the constructor (`nvml.Nvml`), and so
do the clocks, so tests drive it with the simulator and a fake clock and call `collect_once()` themselves.

Library lifecycle: when NVML reports the library gone (driver unloaded,
version mismatch, uninitialised) the collector shuts it down and re-initialises it with exponential backoff
(`backoff_base_s` doubling up to `backoff_max_s`), serving `inferwatch_gpu_nvml_up 0` and every known GPU
with `up 0` meanwhile. /metrics stays up throughout.

Pod attribution (pods.py, kubelet.py), when given, is refreshed once per collection, so a pod that starts or
goes away changes the labels at the next collection. Every change of the published families bumps `version`
and calls the `on_publish` listeners (the HTTP layer renders its cached exposition there).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator, Protocol

import pynvml
from prometheus_client.core import Metric

from inferwatch.exporters.gpu import sanity
from inferwatch.exporters.gpu.devicelist import SeenGpus
from inferwatch.exporters.gpu.metrics import CollectionStats, XidCounts, build_families
from inferwatch.exporters.gpu.nvml import Nvml, error_name
from inferwatch.exporters.gpu.pods import PodMap
from inferwatch.exporters.gpu.reading import (
    Device,
    ErrorTally,
    GpuIdentity,
    GpuReading,
    LibraryLost,
    Snapshot,
    discover,
    read_gpu,
)

log = logging.getLogger(__name__)

# XIDs whose counters exist at 0 from the start, so the first event is a visible increase: the critical
# list of the spec's default (layers.L1.critical_xids) — 48 DBE, 63/64 row remap, 74 NVLink, 79 off the bus,
# 94/95 contained/uncontained ECC, 119/120 GSP.
DEFAULT_PRESET_XIDS = (48, 63, 64, 74, 79, 94, 95, 119, 120)


class PodSource(Protocol):
    """Who holds which GPU (kubelet.PodAttribution): `refresh()` once per collection, then `current`."""

    def refresh(self) -> None: ...

    @property
    def current(self) -> PodMap: ...


class GpuCollector:
    """Collects GPU readings in the background and exposes them as metric families.

    nvml: the NVML interface (real or simulated). host: the `Hostname` label. interval_s: seconds between
    collections. wall: unix-time clock (for the last-success timestamp); monotonic: clock for durations
    and backoff. pods: pod attribution (None = no namespace/pod/container labels). Thread-safe: `collect()`
    may run concurrently with the loop and the XID thread.
    """

    def __init__(self, nvml: Nvml, host: str, interval_s: float = 5.0,
                 preset_xids: tuple[int, ...] = DEFAULT_PRESET_XIDS,
                 wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 backoff_base_s: float = 1.0, backoff_max_s: float = 60.0, pods: PodSource | None = None):
        self.nvml = nvml
        self.pods = pods
        self.host = host
        self.interval_s = interval_s
        self.preset_xids = preset_xids
        self.tally = ErrorTally()
        self._wall, self._monotonic = wall, monotonic
        self._backoff_base_s, self._backoff_max_s = backoff_base_s, backoff_max_s
        self._lock = threading.RLock()
        self._initialized = False
        self._failures = 0            # consecutive failed inits, for the backoff
        self._next_init_at = 0.0
        self._logged_init_errors: set[str] = set()
        self.generation = 0           # bumped whenever the device list changes (the XID thread re-registers)
        self._driver = ""
        self._devices: list[Device] = []
        self._known: dict[int, GpuIdentity] = {}
        self._seen = SeenGpus()       # every GPU opened since start, by UUID (devicelist.py)
        self._xid_counts: dict[tuple[int, str], dict[int, int]] = {}
        self._xid_last: dict[tuple[int, str], int] = {}
        self._snapshot = Snapshot(nvml_up=False)
        self._stats = CollectionStats()
        self._families: list[Metric] = []
        self.version = 0              # bumped after every change of the published families
        self.on_publish: list[Callable[[], None]] = []
        self.yield_to: Any = None     # exposition.Scrapes: collection steps aside between GPUs for scrapes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rebuild()

    # ------------------------------------------------------------------------------- prometheus API
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = self._families
        return iter(families)

    @property
    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    # ----------------------------------------------------------------------------------- the loop
    def start(self) -> None:
        """Collect once now (so the first scrape has data), then every interval in a daemon thread."""
        self.collect_once()
        self._thread = threading.Thread(target=self._loop, name="gpu-collector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        with self._lock:
            if self._initialized:
                self._shutdown_library()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.collect_once()
            except Exception:  # a bug must not end collection for the process's lifetime
                log.exception("GPU collection failed unexpectedly; next attempt in %.1fs", self.interval_s)

    def collect_once(self) -> Snapshot:
        """One collection: refresh pod attribution, (re-)initialise NVML if due, read every GPU, publish."""
        if self.pods is not None:
            self.pods.refresh()   # outside the lock: a slow kubelet never holds up a scrape
        snapshot = self._collect()
        self._notify()
        return snapshot

    def _collect(self) -> Snapshot:
        started = self._monotonic()
        with self._lock:
            if not self._initialized and not self._try_init(started):
                snapshot = self._library_down_snapshot()
                self._publish(snapshot, self._monotonic() - started, success=False)
                return snapshot
            try:
                listing = self._seen.enumerate(self.nvml, self.tally)
                self._set_devices(list(listing.present))
                # A GPU seen before that NVML no longer lists or opens is lost (up 0) until it comes back.
                lost = tuple(GpuReading(identity=ident, up=False) for ident in listing.lost)
                readings = tuple(self._read_all()) + lost
                snapshot = Snapshot(nvml_up=True, devices=listing.count, driver_version=self._driver,
                                    gpus=readings)
                success = True
            except LibraryLost as exc:
                log.warning("NVML library lost (%s); shutting it down, re-initialising with backoff",
                            error_name(exc.error))
                self._shutdown_library()
                self._schedule_retry(self._monotonic())
                snapshot, success = self._library_down_snapshot(), False
            self._publish(snapshot, self._monotonic() - started, success=success)
            return snapshot

    def _read_all(self) -> Iterator[GpuReading]:
        if self.yield_to is not None:
            self.yield_to.reset()
        for device in self._devices:
            if self.yield_to is not None:
                self.yield_to.pause()
            yield read_gpu(self.nvml, self.tally, device)

    # ------------------------------------------------------------------------------ library state
    def _try_init(self, now: float) -> bool:
        if now < self._next_init_at:
            return False
        try:
            self.nvml.init()
            self._driver, self._devices = discover(self.nvml, self.tally, self._known)
        except (pynvml.NVMLError, LibraryLost) as exc:
            error = exc.error if isinstance(exc, LibraryLost) else exc
            name = error_name(error)
            if isinstance(exc, pynvml.NVMLError):
                self.tally.record(exc, "-", "init")
            level = logging.WARNING if name not in self._logged_init_errors else logging.DEBUG
            self._logged_init_errors.add(name)
            delay = self._schedule_retry(now)
            log.log(level, "NVML not available (%s: %s): no GPU visible, exporting inferwatch_gpu_devices %d; "
                    "retrying in %.0fs", name, error, len(self._known), delay)
            if isinstance(exc, LibraryLost):
                self._shutdown_library(quiet=True)
            return False
        self._initialized = True
        self._failures = 0
        self._logged_init_errors.clear()
        self._known.update({d.identity.index: d.identity for d in self._devices if d.handle is not None})
        self._seen.remember(self._devices)
        self.generation += 1
        log.info("NVML initialised: driver %s, %d GPU(s)", self._driver or "?", len(self._devices))
        return True

    def _schedule_retry(self, now: float) -> float:
        self._failures += 1
        delay = min(self._backoff_max_s, self._backoff_base_s * 2 ** (self._failures - 1))
        self._next_init_at = now + delay
        return delay

    def _shutdown_library(self, quiet: bool = False) -> None:
        self._initialized = False
        self.generation += 1
        try:
            self.nvml.shutdown()
        except pynvml.NVMLError as exc:  # shutting down a lost library often fails; it is still gone
            if not quiet:
                log.debug("nvmlShutdown: %s", error_name(exc))

    def _set_devices(self, devices: list[Device]) -> None:
        """Read `devices` from now on; a change of which GPUs have handles (or of the handles) bumps
        `generation`, so the XID thread registers the new list."""
        def key(ds: list[Device]) -> list[tuple[GpuIdentity, Any]]:
            return [(d.identity, None if d.handle is None else self.nvml.device_key(d.handle)) for d in ds]

        if key(devices) != key(self._devices):
            self.generation += 1
        self._devices = devices
        for d in devices:
            if d.handle is not None:
                self._known[d.identity.index] = d.identity

    def _library_down_snapshot(self) -> Snapshot:
        # Every GPU seen since start (by UUID), else those known by index (nothing was ever named).
        known = sorted(self._seen.by_uuid.values(), key=lambda i: (i.index, i.uuid)) or \
            [ident for _, ident in sorted(self._known.items())]
        gpus = tuple(GpuReading(identity=ident, up=False) for ident in known)
        return Snapshot(nvml_up=False, devices=len(gpus), driver_version=self._driver, gpus=gpus)

    # ----------------------------------------------------------------------------------- results
    def _publish(self, snapshot: Snapshot, duration_s: float, success: bool) -> None:
        last = self._wall() if success else self._stats.last_success_unix
        self._snapshot = snapshot
        self._stats = CollectionStats(duration_seconds=duration_s, last_success_unix=last)
        self._rebuild()

    def _rebuild(self) -> None:
        with self._lock:
            stats = CollectionStats(self._stats.duration_seconds, self._stats.last_success_unix,
                                    self.tally.snapshot())
            xids = XidCounts({k: dict(v) for k, v in self._xid_counts.items()}, dict(self._xid_last))
            pods = self.pods.current if self.pods is not None else None
            self._families = build_families(self._snapshot, self.host, xids, stats, self.preset_xids, pods)
            self.version += 1

    def _notify(self) -> None:
        """Run the on_publish listeners; called with the lock released, so scrapes and XIDs never wait on them."""
        for listener in list(self.on_publish):
            listener()

    # ------------------------------------------------------------------------------ for the XID thread
    def devices_for_events(self) -> tuple[int, list[Device] | None]:
        """(generation, devices with handles) while NVML is initialised, else (generation, None)."""
        with self._lock:
            if not self._initialized:
                return self.generation, None
            return self.generation, [d for d in self._devices if d.handle is not None]

    def record_xid(self, identity: GpuIdentity, xid: int) -> None:
        """Count one XID event for a GPU and republish (XIDs are rare; a rebuild is cheap). An XID that is
        no code (sanity.XID: 0, NVML's "not available", wider than the event's unsigned long long) is dropped
        and counted like any impossible reading, never exported."""
        found = sanity.problem(xid, sanity.XID)
        if found is not None:
            self.tally.record_dropped(*found, identity.index, "xid_events", xid)
            return
        with self._lock:
            per_gpu = self._xid_counts.setdefault((identity.index, identity.uuid), {})
            per_gpu[xid] = per_gpu.get(xid, 0) + 1
            self._xid_last[(identity.index, identity.uuid)] = xid
            self._rebuild()
        self._notify()
        log.warning("XID %d on gpu %d (%s)", xid, identity.index, identity.uuid)
