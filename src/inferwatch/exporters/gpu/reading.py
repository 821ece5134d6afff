"""One collection pass: NVML calls -> plain data (`GpuReading`, `Snapshot`). The only module doing NVML I/O.

Per NVML error class (nvml.classify):
  absent / transient  the field is None (no series), the error is counted, logged once per (gpu, call, error)
  device_lost         that GPU's reading is `up=False` with nothing else; other GPUs are read as usual
  library_lost        `LibraryLost` is raised: the caller shuts the library down and re-initialises it
A call that succeeds with a blank or impossible number (sanity.py) gives None for that field too, counted
under the class `blank` or `out_of_range`: never exported, never clamped, never the previous reading.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Any, Callable

import pynvml

from inferwatch.exporters.gpu import sanity
from inferwatch.exporters.gpu.nvml import (
    DEVICE_LOST,
    LIBRARY_LOST,
    MemoryInfo,
    Nvml,
    RemappedRows,
    classify,
    error_name,
)
from inferwatch.exporters.gpu.sanity import PERCENT, TEMPERATURE, UINT32, UINT64, Bounds

log = logging.getLogger(__name__)


class LibraryLost(Exception):
    """NVML itself is unusable (driver unloaded, version mismatch, not initialised); `error` is the cause."""

    def __init__(self, error: pynvml.NVMLError):
        super().__init__(str(error))
        self.error = error


class _DeviceLost(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class GpuIdentity:
    """Labels that identify a GPU; kept from discovery so a lost GPU can still be named."""

    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    name: str = ""


@dataclasses.dataclass(frozen=True)
class MigReading:
    """One MIG GPU instance: NVML GPU-instance id, profile (e.g. "1g.10gb"), its own memory (bytes), and
    its MIG device UUID ("MIG-…", the id the kubelet's device plugin hands to pods; "" when unreadable)."""

    gi_id: int
    profile: str
    memory: MemoryInfo | None = None
    uuid: str = ""


@dataclasses.dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant, in NVML units; None = not available (unsupported, no permission, no data)."""

    identity: GpuIdentity
    up: bool
    temperature_c: int | None = None
    memory_temperature_c: int | None = None
    power_mw: int | None = None
    energy_mj: int | None = None
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    fan_speed_pct: int | None = None
    memory: MemoryInfo | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    clocks_event_reasons: int | None = None
    pcie_replay: int | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    remapped_rows: RemappedRows | None = None
    mig: tuple[MigReading, ...] = ()


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Everything one collection produced. `devices` = GPUs NVML reports (0 when NVML is absent)."""

    nvml_up: bool
    devices: int = 0
    driver_version: str = ""
    gpus: tuple[GpuReading, ...] = ()


@dataclasses.dataclass
class Device:
    """A discovered GPU: its handle (None while NVML refuses one, e.g. lost at discovery) and identity."""

    identity: GpuIdentity
    handle: Any = None


class ErrorTally:
    """NVML errors counted by (class, error name); logs each (gpu, call, error) the first time only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._logged: set[tuple[Any, str, str]] = set()

    def record(self, exc: pynvml.NVMLError, gpu: Any, call: str) -> str:
        """Count `exc`, log it once per (gpu, call, error); return its class (nvml.ERROR_CLASSES)."""
        cls, name = classify(exc), error_name(exc)
        with self._lock:
            self.counts[(cls, name)] += 1
            first = (gpu, call, name) not in self._logged
            self._logged.add((gpu, call, name))
        if first:
            level = logging.INFO if cls not in (DEVICE_LOST, LIBRARY_LOST) else logging.WARNING
            log.log(level, "NVML %s on gpu %s: %s (%s); %s", call, gpu, name, cls,
                    "no series for it" if level == logging.INFO else "handled as " + cls)
        return cls

    def record_dropped(self, cls: str, name: str, gpu: Any, call: str, value: Any) -> None:
        """Count a value dropped as `cls` (sanity.BLANK / OUT_OF_RANGE); log it once per (gpu, call, name)."""
        with self._lock:
            self.counts[(cls, name)] += 1
            first = (gpu, call, name) not in self._logged
            self._logged.add((gpu, call, name))
        if first:
            log.warning("NVML %s on gpu %s returned %r (%s: %s); dropped, no series for it", call, gpu, value,
                        cls, name)

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)


def discover(nvml: Nvml, tally: ErrorTally, known: dict[int, GpuIdentity]) -> tuple[str, list[Device]]:
    """After init: driver version and every GPU's handle and identity. Raises LibraryLost.

    `known` holds identities from earlier discoveries, used when a GPU cannot be read now.
    """
    try:
        driver = _call(tally, "-", "driver_version", nvml.driver_version) or ""
        count = _call(tally, "-", "device_count", nvml.device_count) or 0
    except _DeviceLost:  # a device-class error (e.g. Unknown) from a system call: re-initialise later
        raise LibraryLost(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)) from None
    return driver, [open_device(nvml, tally, index, known.get(index)) for index in range(count)]


def open_device(nvml: Nvml, tally: ErrorTally, index: int, known: GpuIdentity | None) -> Device:
    """Handle and identity of GPU `index`; a lost GPU keeps `known` (or a bare index) and no handle."""
    try:
        handle = _call(tally, index, "device_handle", nvml.device_handle, index, strict=True)
        identity = GpuIdentity(
            index=index,
            uuid=_call(tally, index, "uuid", nvml.uuid, handle, strict=True),
            pci_bus_id=_call(tally, index, "pci_bus_id", nvml.pci_bus_id, handle) or "",
            name=_call(tally, index, "name", nvml.name, handle) or "",
        )
        return Device(identity, handle)
    except _DeviceLost:
        return Device(known or GpuIdentity(index), None)


def read_gpu(nvml: Nvml, tally: ErrorTally, device: Device) -> GpuReading:
    """Every field of one GPU. Raises LibraryLost; a lost GPU gives `up=False` and no values."""
    h, gpu = device.handle, device.identity.index

    def get(call: str, fn: Callable, *args: Any, bounds: Bounds = UINT32) -> Any:
        return _checked(tally, gpu, call, _call(tally, gpu, call, fn, *args), bounds)

    try:
        if h is None:
            raise _DeviceLost
        util = _call(tally, gpu, "utilization", nvml.utilization, h) or (None, None)
        ecc = {
            f"ecc_{'dbe' if unc else 'sbe'}_{'aggregate' if agg else 'volatile'}":
                get("total_ecc_errors", nvml.total_ecc_errors, h, unc, agg, bounds=UINT64)
            for unc in (False, True) for agg in (False, True)
        }
        mig: tuple[MigReading, ...] = ()
        if _call(tally, gpu, "mig_enabled", nvml.mig_enabled, h):
            handles = _call(tally, gpu, "mig_handles", nvml.mig_handles, h) or ()
            mig = tuple(m for m in (_read_mig(nvml, tally, gpu, m) for m in handles) if m is not None)
        return GpuReading(
            identity=device.identity, up=True,
            temperature_c=get("temperature", nvml.temperature, h, bounds=TEMPERATURE),
            memory_temperature_c=get("memory_temperature", nvml.memory_temperature, h, bounds=TEMPERATURE),
            power_mw=get("power_usage", nvml.power_usage, h),
            energy_mj=get("total_energy", nvml.total_energy, h, bounds=UINT64),
            utilization_gpu_pct=_checked(tally, gpu, "utilization", util[0], PERCENT),
            utilization_memory_pct=_checked(tally, gpu, "utilization", util[1], PERCENT),
            fan_speed_pct=get("fan_speed", nvml.fan_speed, h),
            memory=_memory(tally, gpu, _call(tally, gpu, "memory_info", nvml.memory_info, h)),
            sm_clock_mhz=get("clock", nvml.clock, h, "sm"),
            mem_clock_mhz=get("clock", nvml.clock, h, "mem"),
            clocks_event_reasons=get("clocks_event_reasons", nvml.clocks_event_reasons, h, bounds=UINT64),
            pcie_replay=get("pcie_replay_counter", nvml.pcie_replay_counter, h),
            remapped_rows=_remapped(tally, gpu, _call(tally, gpu, "remapped_rows", nvml.remapped_rows, h)),
            mig=mig,
            **ecc,
        )
    except _DeviceLost:
        return GpuReading(identity=device.identity, up=False)


def _checked(tally: ErrorTally, gpu: Any, call: str, value: Any, bounds: Bounds) -> Any:
    """`value`, or None (counted and logged) when it is blank or impossible for a field with `bounds`."""
    if value is None:
        return None
    found = sanity.problem(value, bounds)
    if found is None:
        return value
    tally.record_dropped(*found, gpu, call, value)
    return None


def _memory(tally: ErrorTally, gpu: Any, memory: MemoryInfo | None) -> MemoryInfo | None:
    """Frame-buffer figures with each blank or impossible one set to None (the others are still right)."""
    if memory is None:
        return None
    return MemoryInfo(**{f.name: _checked(tally, gpu, "memory_info", getattr(memory, f.name), UINT64)
                         for f in dataclasses.fields(MemoryInfo)})


def _remapped(tally: ErrorTally, gpu: Any, rows: RemappedRows | None) -> RemappedRows | None:
    if rows is None:
        return None
    return dataclasses.replace(rows, correctable=_checked(tally, gpu, "remapped_rows", rows.correctable, UINT32),
                               uncorrectable=_checked(tally, gpu, "remapped_rows", rows.uncorrectable, UINT32))


def _read_mig(nvml: Nvml, tally: ErrorTally, gpu: int, handle: Any) -> MigReading | None:
    gi_id = _checked(tally, gpu, "gpu_instance_id", _call(tally, gpu, "gpu_instance_id", nvml.gpu_instance_id,
                                                          handle), UINT32)
    if gi_id is None:
        return None  # an instance without an id cannot be labelled; skip it rather than mislabel it
    return MigReading(gi_id=gi_id,
                      profile=_call(tally, gpu, "mig_profile", nvml.mig_profile, handle) or "",
                      memory=_memory(tally, gpu, _call(tally, gpu, "memory_info", nvml.memory_info, handle)),
                      uuid=_call(tally, gpu, "mig_uuid", nvml.uuid, handle) or "")


def _call(tally: ErrorTally, gpu: Any, call: str, fn: Callable, *args: Any, strict: bool = False) -> Any:
    """fn(*args), or None for an absent/transient field. Device loss -> _DeviceLost; library -> LibraryLost.

    strict: any failure counts as device loss (identity calls: a GPU we cannot name cannot be exported).
    """
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        cls = tally.record(exc, gpu, call)
        if cls == LIBRARY_LOST:
            raise LibraryLost(exc) from None
        if cls == DEVICE_LOST or strict:
            raise _DeviceLost from None
        return None
