"""Simulated NVML behind the `nvml.Nvml` interface, driven by a `Scenario` over time.

It fails the way the real library does: every failure is a real `pynvml.NVMLError_*` instance built with
`pynvml.NVMLError(code)` (pynvml turns the code into the matching subclass). What it reproduces:
  - not initialised (before init, after shutdown, after the library came back) -> NVMLError_Uninitialized
  - library lost (driver unloaded / version mismatch) -> that error from every call, init included
  - a lost GPU -> NVMLError_GpuIsLost from every call on it, including nvmlDeviceGetHandleByIndex
  - a GPU removed from the device list (driver unbind after XID 79, hot removal) -> nvmlDeviceGetCount no
    longer counts it, the GPUs after it move down one index (NVML numbers the devices it enumerates, in PCI
    order), and a handle taken before answers NVMLError_InvalidArgument, NVML's answer for a handle that is
    not a valid device (nvml.h: "NVML_ERROR_INVALID_ARGUMENT if device is invalid")
  - unsupported / not permitted calls -> NVMLError_NotSupported / NVMLError_NoPermission
  - MIG mode on a GPU -> utilization is NVMLError_NotSupported (as on real MIG-enabled GPUs)
  - no fans (the default, like passively cooled data-centre GPUs) -> fan_speed is NVMLError_NotSupported
  - values exactly as the scenario gives them, blank sentinels included (scenario.py)
  - XID events only for registered GPUs, never replayed to an event set created after them,
    nvmlEventSetWait_v2 blocks up to its timeout and then raises NVMLError_Timeout
Thread-safe: the collector and the XID thread call it concurrently, as they do the real library.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid as uuidlib
from typing import Any, Callable, Hashable

import pynvml

from inferwatch.exporters.gpu.nvml import MemoryInfo, RemappedRows, XidEvent
from inferwatch.exporters.gpu.scenario import MIB, REASON_BITS, Change, MigInstance, Scenario, parse_changes
from inferwatch.specload import SpecError

MAX_TIMELINE = 10_000   # timeline entries the simulator holds; POSTs beyond it are refused (bounded memory)
_LIBRARY_CODES = {
    "driver_not_loaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    "lib_rm_version_mismatch": pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    "uninitialized": pynvml.NVML_ERROR_UNINITIALIZED,
    "library_not_found": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
}


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclasses.dataclass(frozen=True)
class _Device:
    index: int
    generation: int  # handles from before a re-init are stale, as after a real nvmlShutdown


@dataclasses.dataclass(frozen=True)
class _MigDevice:
    parent: _Device
    instance: MigInstance


@dataclasses.dataclass
class _EventSet:
    created_at: float
    devices: set[int] = dataclasses.field(default_factory=set)


class SimNvml:
    """`Nvml` simulated from a Scenario. `clock` gives seconds (monotonic); sim time 0 = construction."""

    def __init__(self, scenario: Scenario | None = None, clock: Callable[[], float] = time.monotonic):
        self.scenario = scenario or Scenario()
        self._clock = clock
        self._start = clock()
        self._cond = threading.Condition(threading.RLock())
        self._initialized = False
        self._stale = False       # library was lost while initialised: needs shutdown/init again
        self._generation = 0
        self._delivered: set[tuple[int, int]] = set()   # (timeline entry id, gpu) XIDs already delivered
        self._energy_mj = {i: 5_000_000.0 + 1000.0 * i for i in range(self.scenario.gpus)}
        self._energy_at = {i: 0.0 for i in range(self.scenario.gpus)}
        self.calls = 0  # how many interface calls were made (benchmarks and tests read it)

    # ----------------------------------------------------------------------------- time and control
    def now(self) -> float:
        """Seconds since the simulator started."""
        return self._clock() - self._start

    def add_events(self, entries: Any) -> list[Change]:
        """Add timeline entries at run time; their `at` counts from now. Raises SpecError on a bad entry or
        when the timeline would exceed MAX_TIMELINE entries (nothing is added then)."""
        changes = parse_changes(entries, self.now(), self.scenario.gpus, "events")
        with self._cond:
            if len(self.scenario.timeline) + len(changes) > MAX_TIMELINE:
                raise SpecError("events", f"the simulator holds at most {MAX_TIMELINE} timeline entries; "
                                          f"{len(self.scenario.timeline)} are there already")
            self.scenario.add(changes)
            self._cond.notify_all()
        return changes

    # ------------------------------------------------------------------------------------- checks
    def _ready(self) -> float:
        """Raise what the real library would before any device call; return the sim time."""
        self.calls += 1
        t = self.now()
        lost = self.scenario.library_lost(t)
        if lost:
            if self._initialized:
                self._stale = True
            raise _error(_LIBRARY_CODES[lost])
        if not self._initialized or self._stale:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        return t

    def _device(self, handle: Any, call: str) -> float:
        t = self._ready()
        device = handle.parent if isinstance(handle, _MigDevice) else handle
        if not isinstance(device, _Device) or device.generation != self._generation:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.scenario.removed(device.index, t):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.scenario.lost(device.index, t):
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in self.scenario.faults(device.index, t, "not_supported"):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if call in self.scenario.faults(device.index, t, "no_permission"):
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        return t

    def _value(self, handle: _Device, name: str, t: float) -> Any:
        return self.scenario.value(handle.index, name, t)

    # ---------------------------------------------------------------------------------- lifecycle
    def init(self) -> None:
        with self._cond:
            self.calls += 1
            lost = self.scenario.library_lost(self.now())
            if lost:
                raise _error(_LIBRARY_CODES[lost])
            self._initialized = True
            self._stale = False
            self._generation += 1

    def shutdown(self) -> None:
        with self._cond:
            self.calls += 1
            if not self._initialized:
                raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
            self._initialized = False
            self._stale = False

    def driver_version(self) -> str:
        with self._cond:
            self._ready()
            return self.scenario.driver_version

    def _listed(self, t: float) -> list[int]:
        """The scenario's GPUs NVML enumerates at `t`, in order: NVML index -> scenario GPU."""
        return [gpu for gpu in range(self.scenario.gpus) if not self.scenario.removed(gpu, t)]

    def device_count(self) -> int:
        with self._cond:
            return len(self._listed(self._ready()))

    def device_handle(self, index: int) -> Any:
        with self._cond:
            t = self._ready()
            listed = self._listed(t)
            if not 0 <= index < len(listed):
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if self.scenario.lost(listed[index], t):
                raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
            return _Device(listed[index], self._generation)

    def device_key(self, handle: Any) -> Hashable:
        return handle.index

    # ----------------------------------------------------------------------------------- identity
    def name(self, handle: Any) -> str:
        with self._cond:
            self._device(handle, "name")
            if isinstance(handle, _MigDevice):
                return f"{self.scenario.model} MIG {handle.instance.profile}"
            return self.scenario.model

    def uuid(self, handle: Any) -> str:
        with self._cond:
            self._device(handle, "uuid")
            if isinstance(handle, _MigDevice):   # MIG devices have UUIDs of their own, "MIG-" + a UUID
                parent = handle.parent.index
                name = f"inferwatch-sim-mig-{parent}-{handle.instance.gi_id}"
                return f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name)}"
            base = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"inferwatch-sim-{self.scenario.model}-{handle.index}")
            return f"GPU-{base}"

    def pci_bus_id(self, handle: Any) -> str:
        with self._cond:
            self._device(handle, "pci_bus_id")
            return f"00000000:{0x18 + handle.index:02X}:00.0"

    # ------------------------------------------------------------------------------------- values
    def temperature(self, handle: Any) -> int:
        with self._cond:
            t = self._device(handle, "temperature")
            return int(round(self._value(handle, "temperature_c", t)))

    def memory_temperature(self, handle: Any) -> float:
        with self._cond:
            t = self._device(handle, "memory_temperature")
            # A field value (nvmlDeviceGetFieldValues): an integer, or a double when the scenario gives a float.
            return self._value(handle, "memory_temperature_c", t)

    def power_usage(self, handle: Any) -> int:
        with self._cond:
            t = self._device(handle, "power_usage")
            return int(round(self._value(handle, "power_w", t) * 1000))

    def total_energy(self, handle: Any) -> int:
        with self._cond:
            t = self._device(handle, "total_energy")
            # Energy integrates power between reads (mJ = W * s * 1000), so it only ever grows.
            elapsed = max(0.0, t - self._energy_at[handle.index])
            self._energy_mj[handle.index] += self._value(handle, "power_w", t) * elapsed * 1000
            self._energy_at[handle.index] = t
            return int(self._energy_mj[handle.index])

    def utilization(self, handle: Any) -> tuple[int, int]:
        with self._cond:
            t = self._device(handle, "utilization")
            if self.scenario.mig.get(handle.index):
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)   # as on a real MIG-enabled GPU
            return (int(round(self._value(handle, "utilization_gpu_pct", t))),
                    int(round(self._value(handle, "utilization_memory_pct", t))))

    def fan_speed(self, handle: Any) -> int:
        with self._cond:
            t = self._device(handle, "fan_speed")
            if not self.scenario.fans:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)   # passively cooled, as most data-centre GPUs
            return int(round(self._value(handle, "fan_speed_pct", t)))

    def memory_info(self, handle: Any) -> MemoryInfo:
        with self._cond:
            t = self._device(handle, "memory_info")
            if isinstance(handle, _MigDevice):
                inst = handle.instance
                total, used, reserved = inst.memory_total_mib, inst.memory_used_mib, inst.memory_reserved_mib
            else:
                total = self._value(handle, "memory_total_mib", t)
                used = self._value(handle, "memory_used_mib", t)
                reserved = self._value(handle, "memory_reserved_mib", t)
            free = max(0.0, total - used - reserved)
            return MemoryInfo(total=int(total * MIB), free=int(free * MIB), used=int(used * MIB),
                              reserved=int(reserved * MIB))

    def clock(self, handle: Any, which: str) -> int:
        with self._cond:
            t = self._device(handle, "clock")
            return int(round(self._value(handle, "sm_clock_mhz" if which == "sm" else "mem_clock_mhz", t)))

    def clocks_event_reasons(self, handle: Any) -> int:
        with self._cond:
            t = self._device(handle, "clocks_event_reasons")
            mask = 0
            for reason in self._value(handle, "clocks_event_reasons", t):
                mask |= REASON_BITS[reason]
            return mask

    def pcie_replay_counter(self, handle: Any) -> int:
        with self._cond:
            t = self._device(handle, "pcie_replay_counter")
            return int(self._value(handle, "pcie_replay", t))

    def total_ecc_errors(self, handle: Any, uncorrected: bool, aggregate: bool) -> int:
        with self._cond:
            t = self._device(handle, "total_ecc_errors")
            name = f"ecc_{'dbe' if uncorrected else 'sbe'}_{'aggregate' if aggregate else 'volatile'}"
            return int(self._value(handle, name, t))

    def remapped_rows(self, handle: Any) -> RemappedRows:
        with self._cond:
            t = self._device(handle, "remapped_rows")
            return RemappedRows(int(self._value(handle, "remapped_rows_correctable", t)),
                                int(self._value(handle, "remapped_rows_uncorrectable", t)),
                                bool(self._value(handle, "row_remap_pending", t)),
                                bool(self._value(handle, "row_remap_failure", t)))

    # ---------------------------------------------------------------------------------------- MIG
    def mig_enabled(self, handle: Any) -> bool:
        with self._cond:
            self._device(handle, "mig_enabled")
            return bool(self.scenario.mig.get(handle.index))

    def mig_handles(self, handle: Any) -> list[Any]:
        with self._cond:
            self._device(handle, "mig_handles")
            return [_MigDevice(handle, inst) for inst in self.scenario.mig.get(handle.index, ())]

    def gpu_instance_id(self, mig_handle: Any) -> int:
        with self._cond:
            self._device(mig_handle, "gpu_instance_id")
            return mig_handle.instance.gi_id

    def mig_profile(self, mig_handle: Any) -> str:
        with self._cond:
            self._device(mig_handle, "mig_profile")
            return mig_handle.instance.profile

    # ------------------------------------------------------------------------------------- events
    def event_set_create(self) -> Any:
        with self._cond:
            return _EventSet(created_at=self._ready())

    def register_xid_events(self, handle: Any, event_set: Any) -> None:
        with self._cond:
            self._device(handle, "register_xid_events")
            event_set.devices.add(handle.index)

    def wait_xid_event(self, event_set: Any, timeout_ms: int) -> XidEvent:
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            while True:
                t = self._ready()
                for change in self.scenario.timeline:
                    if change.xid is None or change.at > t or change.at < event_set.created_at:
                        continue  # future, or before this set existed (NVML keeps no history)
                    for gpu in sorted(event_set.devices):
                        key = (id(change), gpu)
                        if change.applies(gpu) and key not in self._delivered:
                            self._delivered.add(key)
                            return XidEvent(device_key=gpu, xid=change.xid)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _error(pynvml.NVML_ERROR_TIMEOUT)
                # Short waits: a scheduled XID becomes due by the clock, not by a notification.
                self._cond.wait(min(remaining, 0.1))

    def event_set_free(self, event_set: Any) -> None:
        with self._cond:
            event_set.devices.clear()
