"""The narrow NVML interface the exporter reads through, and the classification of NVML errors.

Every method raises `pynvml.NVMLError` subclasses (`NVMLError_NotSupported`, `NVMLError_GpuIsLost`, ...)
exactly as the official bindings do; the real implementation (`nvml_real.RealNvml`) and the simulator
(`sim.SimNvml`) both satisfy `Nvml`. Units are NVML's own (mW, mJ, bytes, MHz, °C); conversion to the
exported units happens in `metrics`.

Error classes group NVML's return codes (nvmlReturn_t in nvml.h; NVML_ERROR_* in pynvml.py):
  absent       the field does not exist here (not supported, no permission, symbol missing): no series
  transient    no data yet / not ready: no series this cycle
  device_lost  the GPU fell off the bus, needs a reset or vanished: that GPU's `up` goes to 0
  library_lost the library or driver is gone or mismatched: shut down and re-initialise with backoff
Calls that succeed with a blank or impossible number are counted under two more classes, `blank` and
`out_of_range` (sanity.py); the error counter's `class` label takes any of COUNTED_CLASSES.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable, Protocol

import pynvml

ABSENT = "absent"
TRANSIENT = "transient"
DEVICE_LOST = "device_lost"
LIBRARY_LOST = "library_lost"
ERROR_CLASSES = (ABSENT, TRANSIENT, DEVICE_LOST, LIBRARY_LOST)
COUNTED_CLASSES = (*ERROR_CLASSES, "blank", "out_of_range")


def _codes(*names: str) -> frozenset[int]:
    # getattr: older bindings lack some newer codes; a missing constant simply cannot occur there.
    return frozenset(getattr(pynvml, n) for n in names if hasattr(pynvml, n))


_CLASS_BY_CODE: dict[int, str] = {}
for _cls, _names in (
    (ABSENT, ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND",
              "NVML_ERROR_DEPRECATED", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")),
    (TRANSIENT, ("NVML_ERROR_NOT_FOUND", "NVML_ERROR_NO_DATA", "NVML_ERROR_NOT_READY",
                 "NVML_ERROR_INSUFFICIENT_SIZE", "NVML_ERROR_TIMEOUT")),
    (DEVICE_LOST, ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED", "NVML_ERROR_GPU_NOT_FOUND",
                   "NVML_ERROR_IRQ_ISSUE", "NVML_ERROR_CORRUPTED_INFOROM", "NVML_ERROR_INSUFFICIENT_POWER",
                   "NVML_ERROR_UNKNOWN")),
    (LIBRARY_LOST, ("NVML_ERROR_UNINITIALIZED", "NVML_ERROR_DRIVER_NOT_LOADED",
                    "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "NVML_ERROR_LIBRARY_NOT_FOUND",
                    "NVML_ERROR_OPERATING_SYSTEM")),
):
    for _code in _codes(*_names):
        _CLASS_BY_CODE[_code] = _cls


def classify(exc: pynvml.NVMLError) -> str:
    """One of ERROR_CLASSES for an NVML error; unknown codes count as device_lost (a GPU in a bad state)."""
    code = getattr(exc, "value", None)
    return _CLASS_BY_CODE.get(code, DEVICE_LOST) if isinstance(code, int) else DEVICE_LOST


def error_name(exc: pynvml.NVMLError) -> str:
    """The pynvml class suffix, e.g. "NotSupported" for NVMLError_NotSupported (a bounded label value)."""
    name = type(exc).__name__
    return name.removeprefix("NVMLError_") if name != "NVMLError" else f"code_{getattr(exc, 'value', 'unknown')}"


# Clocks-event reason bits, named as NVML names them (nvmlClocksEventReason*, pynvml.py; DCGM's
# DCGM_EXP_CLOCK_EVENTS_COUNT uses the same bits). Order = bit order.
CLOCKS_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)


@dataclasses.dataclass(frozen=True)
class MemoryInfo:
    """Frame-buffer memory in bytes; `reserved` is None where only the v1 call exists, any figure None
    when it was blank (reading.py drops such figures one by one)."""

    total: int | None
    free: int | None
    used: int | None
    reserved: int | None = None


@dataclasses.dataclass(frozen=True)
class RemappedRows:
    """nvmlDeviceGetRemappedRows: rows remapped for correctable/uncorrectable errors, pending and failure flags."""

    correctable: int | None   # None: blank (dropped by reading.py)
    uncorrectable: int | None
    pending: bool
    failure: bool


@dataclasses.dataclass(frozen=True)
class XidEvent:
    """One XID critical-error event: `device_key` matches `Nvml.device_key(handle)` of the registered GPU."""

    device_key: Hashable
    xid: int


class Nvml(Protocol):
    """The NVML calls the exporter makes. Handles are opaque; all methods may raise pynvml.NVMLError_*."""

    def init(self) -> None: ...                                   # nvmlInit
    def shutdown(self) -> None: ...                               # nvmlShutdown
    def driver_version(self) -> str: ...                          # nvmlSystemGetDriverVersion
    def device_count(self) -> int: ...                            # nvmlDeviceGetCount
    def device_handle(self, index: int) -> Any: ...               # nvmlDeviceGetHandleByIndex
    def device_key(self, handle: Any) -> Hashable: ...            # identity to match event.device
    def name(self, handle: Any) -> str: ...                       # nvmlDeviceGetName
    def uuid(self, handle: Any) -> str: ...                       # nvmlDeviceGetUUID ("GPU-…"; "MIG-…" for MIG)
    def pci_bus_id(self, handle: Any) -> str: ...                 # nvmlDeviceGetPciInfo().busId
    def temperature(self, handle: Any) -> int: ...                # °C, nvmlDeviceGetTemperature(GPU)
    def memory_temperature(self, handle: Any) -> float: ...       # °C, field NVML_FI_DEV_MEMORY_TEMP (int or float)
    def power_usage(self, handle: Any) -> int: ...                # mW
    def total_energy(self, handle: Any) -> int: ...               # mJ since driver load
    def utilization(self, handle: Any) -> tuple[int, int]: ...    # (gpu %, memory %)
    def fan_speed(self, handle: Any) -> int: ...                  # % of max; NotSupported without fans
    def memory_info(self, handle: Any) -> MemoryInfo: ...         # bytes
    def clock(self, handle: Any, which: str) -> int: ...          # MHz; which = "sm" | "mem"
    def clocks_event_reasons(self, handle: Any) -> int: ...       # bitmask, CLOCKS_EVENT_REASONS
    def pcie_replay_counter(self, handle: Any) -> int: ...
    def total_ecc_errors(self, handle: Any, uncorrected: bool, aggregate: bool) -> int: ...
    def remapped_rows(self, handle: Any) -> RemappedRows: ...
    def mig_enabled(self, handle: Any) -> bool: ...               # nvmlDeviceGetMigMode current
    def mig_handles(self, handle: Any) -> list[Any]: ...          # populated MIG device slots
    def gpu_instance_id(self, mig_handle: Any) -> int: ...
    def mig_profile(self, mig_handle: Any) -> str: ...            # e.g. "1g.10gb"
    def event_set_create(self) -> Any: ...
    def register_xid_events(self, handle: Any, event_set: Any) -> None: ...
    def wait_xid_event(self, event_set: Any, timeout_ms: int) -> XidEvent: ...  # NVMLError_Timeout if none
    def event_set_free(self, event_set: Any) -> None: ...
