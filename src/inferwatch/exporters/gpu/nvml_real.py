"""`Nvml` over the official NVIDIA bindings (`nvidia-ml-py`, module `pynvml`).

A thin layer: each method is one pynvml call (or a documented fallback) with ctypes results turned into
plain Python values. Errors pass through unchanged as pynvml.NVMLError_* subclasses.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any, Hashable

import pynvml

from inferwatch.exporters.gpu.nvml import MemoryInfo, RemappedRows, XidEvent

_CLOCKS = {"sm": pynvml.NVML_CLOCK_SM, "mem": pynvml.NVML_CLOCK_MEM}
# Union member per nvmlValueType_t (nvml.h); used to read nvmlDeviceGetFieldValues results.
_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
_MIG_PROFILE = re.compile(r"MIG\s+(\S+)")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _is(exc: pynvml.NVMLError, *codes: int) -> bool:
    return getattr(exc, "value", None) in codes


class RealNvml:
    """The `Nvml` interface backed by libnvidia-ml through pynvml."""

    def init(self) -> None:
        pynvml.nvmlInit()

    def shutdown(self) -> None:
        pynvml.nvmlShutdown()

    def driver_version(self) -> str:
        return _text(pynvml.nvmlSystemGetDriverVersion())

    def device_count(self) -> int:
        return int(pynvml.nvmlDeviceGetCount())

    def device_handle(self, index: int) -> Any:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def device_key(self, handle: Any) -> Hashable:
        # Event data carries a fresh c_nvmlDevice_t object; the pointer value identifies the device.
        return ctypes.cast(handle, ctypes.c_void_p).value

    def name(self, handle: Any) -> str:
        return _text(pynvml.nvmlDeviceGetName(handle))

    def uuid(self, handle: Any) -> str:
        return _text(pynvml.nvmlDeviceGetUUID(handle))

    def pci_bus_id(self, handle: Any) -> str:
        return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)

    def temperature(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))

    def memory_temperature(self, handle: Any) -> int:
        # nvmlDeviceGetFieldValues succeeds as a call and reports failure per field (nvmlReturn of each).
        value = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])[0]
        if value.nvmlReturn != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(value.nvmlReturn)
        # As typed (a double stays a float), so sanity.py can tell an FP64 blank from an integer.
        return getattr(value.value, _VALUE_MEMBER.get(value.valueType, "uiVal"))

    def power_usage(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetPowerUsage(handle))

    def total_energy(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))

    def utilization(self, handle: Any) -> tuple[int, int]:
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        return int(rates.gpu), int(rates.memory)

    def fan_speed(self, handle: Any) -> int:
        # Fan 0, as DCGM_FI_DEV_FAN_SPEED; NVMLError_NotSupported on passively cooled (most data-centre) GPUs.
        return int(pynvml.nvmlDeviceGetFanSpeed(handle))

    def memory_info(self, handle: Any) -> MemoryInfo:
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            return MemoryInfo(total=mem.total, free=mem.free, used=mem.used, reserved=mem.reserved)
        except pynvml.NVMLError as exc:
            # Drivers older than the v2 struct: fall back to v1, which has no `reserved`.
            if not _is(exc, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                raise
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return MemoryInfo(total=mem.total, free=mem.free, used=mem.used)

    def clock(self, handle: Any, which: str) -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, _CLOCKS[which]))

    def clocks_event_reasons(self, handle: Any) -> int:
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except pynvml.NVMLError_FunctionNotFound:
            # Drivers before the throttle->event rename (535) only have the legacy symbol; same bits.
            return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def pcie_replay_counter(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetPcieReplayCounter(handle))

    def total_ecc_errors(self, handle: Any, uncorrected: bool, aggregate: bool) -> int:
        error_type = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED if uncorrected
                      else pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED)
        counter = pynvml.NVML_AGGREGATE_ECC if aggregate else pynvml.NVML_VOLATILE_ECC
        return int(pynvml.nvmlDeviceGetTotalEccErrors(handle, error_type, counter))

    def remapped_rows(self, handle: Any) -> RemappedRows:
        corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
        return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))

    def mig_enabled(self, handle: Any) -> bool:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        return current == pynvml.NVML_DEVICE_MIG_ENABLE

    def mig_handles(self, handle: Any) -> list[Any]:
        found = []
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                found.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
            except pynvml.NVMLError_NotFound:
                continue  # an empty slot, not an error
        return found

    def gpu_instance_id(self, mig_handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetGpuInstanceId(mig_handle))

    def mig_profile(self, mig_handle: Any) -> str:
        # MIG device names read "<parent name> MIG 1g.10gb"; the suffix is the profile DCGM reports.
        name = self.name(mig_handle)
        match = _MIG_PROFILE.search(name)
        if match:
            return match.group(1)
        attrs = pynvml.nvmlDeviceGetAttributes(mig_handle)
        return f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"

    def event_set_create(self) -> Any:
        return pynvml.nvmlEventSetCreate()

    def register_xid_events(self, handle: Any, event_set: Any) -> None:
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)

    def wait_xid_event(self, event_set: Any, timeout_ms: int) -> XidEvent:
        data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        return XidEvent(device_key=self.device_key(data.device), xid=int(data.eventData))

    def event_set_free(self, event_set: Any) -> None:
        pynvml.nvmlEventSetFree(event_set)
