"""Blank and impossible readings: which values NVML (or DCGM) hands back that are not measurements.

A value that fails here is dropped (no sample: never exported, never clamped, never replaced by the previous
reading) and counted in `inferwatch_gpu_nvml_errors_total` under its own class:

  blank         a sentinel meaning "no value", in the families DCGM defines (dcgmvalue.h / dcgmvalue.py of
                NVIDIA DCGM: DCGM_INT32_BLANK 0x7ffffff0, DCGM_INT64_BLANK 0x7ffffffffffffff0, DCGM_FP64_BLANK
                2**47 = 140737488355328.0; +1 NOT_FOUND, +2 NOT_SUPPORTED, +3 NOT_PERMISSIONED, and
                "IS_BLANK" = any value at or above the base), plus NVML's all-ones "not available"
                (NVML_VALUE_NOT_AVAILABLE = -1 written into an unsigned 32- or 64-bit field: 4294967295,
                18446744073709551615) and NaN/infinity.
  out_of_range  a number no GPU can report for that field: a temperature above 150 °C, a utilisation above
                100 %, anything negative, an XID of 0, or more than the field's C type holds.

The int32 family only means "blank" for 32-bit fields: a 64-bit counter (energy in mJ, ECC counts) passes
through 2147483632..2147483647 like any other number. NVML's fan speed is a percentage that "may exceed 100%
in certain cases" (nvmlDeviceGetFanSpeed), so it has no 100 % bound.
"""

from __future__ import annotations

import dataclasses
import math

BLANK = "blank"
OUT_OF_RANGE = "out_of_range"

INT32_BLANK = 0x7FFFFFF0          # 2147483632
INT32_MAX = 0x7FFFFFFF
INT64_BLANK = 0x7FFFFFFFFFFFFFF0  # 9223372036854775792
INT64_MAX = 0x7FFFFFFFFFFFFFFF
FP64_BLANK = 140737488355328.0    # 2**47
UINT32_MAX = 0xFFFFFFFF           # NVML_VALUE_NOT_AVAILABLE in an unsigned int
UINT64_MAX = 0xFFFFFFFFFFFFFFFF   # ... in an unsigned long long
# Offsets from a blank base, as DCGM names them; 4..15 are further blanks without a name of their own.
_BLANK_KINDS = ("Blank", "NotFound", "NotSupported", "NotPermissioned")


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What a field can hold: C width in bits (32 or 64) and the physically possible range (inclusive)."""

    bits: int = 32
    low: float = 0
    high: float | None = None   # None: up to what the C type holds


TEMPERATURE = Bounds(32, 0, 150)     # °C; silicon shuts down long before 150
PERCENT = Bounds(32, 0, 100)
UINT32 = Bounds(32)
UINT64 = Bounds(64)
XID = Bounds(64, 1)                  # nvmlEventData_t.eventData; XID codes start at 1


def _blank_name(family: str, offset: float) -> str:
    return f"Dcgm{family}" + (_BLANK_KINDS[int(offset)] if 0 <= offset < len(_BLANK_KINDS) else "Blank")


def problem(value: float, bounds: Bounds) -> tuple[str, str] | None:
    """(class, error name) when `value` is not a reading for a field with `bounds`, else None.

    Classes: BLANK or OUT_OF_RANGE. Error names: DcgmInt32*, DcgmInt64*, DcgmFp64* (Blank, NotFound,
    NotSupported, NotPermissioned), NvmlValueNotAvailable, NotFinite; AbovePhysicalRange, BelowPhysicalRange.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return BLANK, "NotFinite"
        if value >= FP64_BLANK:
            return BLANK, _blank_name("Fp64", value - FP64_BLANK)
        if value.is_integer():
            value = int(value)
    if isinstance(value, int):
        if value == -1 or value == (UINT32_MAX if bounds.bits == 32 else UINT64_MAX):
            return BLANK, "NvmlValueNotAvailable"
        if INT64_BLANK <= value <= INT64_MAX:
            return BLANK, _blank_name("Int64", value - INT64_BLANK)
        if bounds.bits == 32 and INT32_BLANK <= value <= INT32_MAX:
            return BLANK, _blank_name("Int32", value - INT32_BLANK)
    high = bounds.high if bounds.high is not None else (UINT32_MAX if bounds.bits == 32 else UINT64_MAX)
    if value > high:
        return OUT_OF_RANGE, "AbovePhysicalRange"
    if value < bounds.low:
        return OUT_OF_RANGE, "BelowPhysicalRange"
    return None
