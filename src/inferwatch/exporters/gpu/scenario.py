"""The GPU simulator's scenario: N GPUs of a named model, values over time, and faults.

A scenario file is YAML; every key is optional (no file = one steady, healthy GPU):

    gpus: 2                              # how many GPUs NVML reports
    model: NVIDIA H100 80GB HBM3         # nvmlDeviceGetName
    driver_version: "550.54.15"
    fans: false                          # true: the GPUs have fans (fan_speed reads fan_speed_pct); false:
                                         # passively cooled, nvmlDeviceGetFanSpeed is NotSupported (default)
    values: {temperature_c: 45}          # steady values for every GPU (over HEALTHY_VALUES)
    mig:                                 # GPU index -> MIG instances (turns MIG mode on for that GPU)
      1: [{profile: 3g.40gb, gi_id: 2, memory_total_mib: 40192, memory_used_mib: 1024}]
    timeline:                            # changes; `at` = seconds since the simulator started
      - {at: 60s, gpu: 0, ramp: {temperature_c: 92}, over: 30s}   # linear from the value at `at`
      - {at: 90s, set: {clocks_event_reasons: [sw_thermal_slowdown]}}   # no `gpu` = every GPU
      - {at: 2m, gpu: 1, not_supported: [memory_temperature]}   # those calls raise NVMLError_NotSupported
      - {at: 2m, gpu: 1, no_permission: [total_ecc_errors]}     # ... NVMLError_NoPermission
      - {at: 3m, gpu: 1, xid: 79}                               # one XID critical-error event
      - {at: 3m, gpu: 1, lost: true}                            # every call raises NVMLError_GpuIsLost
      - {at: 3m, gpu: 1, removed: true, for: 1m}                # leaves the device list (driver unbind, hot
                                                                #   removal): see sim.py
      - {at: 4m, library_lost: driver_not_loaded, for: 20s}     # all calls fail, then need re-init

`for:` bounds any fault or `set` (omitted = until the end). Changes posted at run time (`/sim/events`)
use the same entries, with `at` counted from the moment they arrive. Errors raise SpecError naming the
file and the entry path.

Values are handed out as given (integers stay integers, a float memory temperature stays a float), so a
scenario can make NVML return the blank sentinels real drivers and DCGM produce, e.g.
`{set: {memory_temperature_c: 9223372036854775794}}` (DCGM_INT64_BLANK + 2) or
`{set: {utilization_gpu_pct: 4294967295}}` (NVML_VALUE_NOT_AVAILABLE in an unsigned int). What the real
library could never return is refused instead, naming the field: a value wider than the C type NVML hands it
out in (C_TYPES, from nvml.h: `unsigned int` temperatures, clocks, milliwatts, percentages, counts;
`unsigned long long` bytes, ECC counts and XID event data; `nvmlValue_t` for the memory temperature field),
NaN or infinity in an integer field, a negative value, an XID of 0. Durations (`at`, `over`, `for`) are
finite, non-negative and at most MAX_DURATION_S.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from inferwatch.exporters.gpu.nvml import CLOCKS_EVENT_REASONS
from inferwatch.exporters.gpu.sanity import UINT32_MAX, UINT64_MAX
from inferwatch.specload import Duration, SpecError, load_yaml

# A steady, healthy H100-class GPU under moderate load (units in the names).
HEALTHY_VALUES: dict[str, float] = {
    "temperature_c": 42,
    "memory_temperature_c": 48,
    "power_w": 180.0,
    "utilization_gpu_pct": 35,
    "utilization_memory_pct": 20,
    "fan_speed_pct": 45,
    "memory_total_mib": 81559,
    "memory_used_mib": 20480,
    "memory_reserved_mib": 531,
    "sm_clock_mhz": 1755,
    "mem_clock_mhz": 2619,
    "pcie_replay": 0,
    "ecc_sbe_volatile": 0,
    "ecc_dbe_volatile": 0,
    "ecc_sbe_aggregate": 0,
    "ecc_dbe_aggregate": 0,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "row_remap_pending": 0,
    "row_remap_failure": 0,
}
REASON_BITS = dict(CLOCKS_EVENT_REASONS)
MIB = 1024 * 1024
# Value name -> (the C type NVML returns it in, the largest value of that type, the factor from the scenario's
# unit to the C value's). Unit conversions are the simulator's: watts are returned as milliwatts, MiB as bytes.
C_TYPES: dict[str, tuple[str, int, int]] = {
    "temperature_c": ("unsigned int", UINT32_MAX, 1),
    "memory_temperature_c": ("nvmlValue_t (unsigned long long or double)", UINT64_MAX, 1),
    "power_w": ("unsigned int (milliwatts)", UINT32_MAX, 1000),
    "utilization_gpu_pct": ("unsigned int", UINT32_MAX, 1),
    "utilization_memory_pct": ("unsigned int", UINT32_MAX, 1),
    "fan_speed_pct": ("unsigned int", UINT32_MAX, 1),
    "memory_total_mib": ("unsigned long long (bytes)", UINT64_MAX, MIB),
    "memory_used_mib": ("unsigned long long (bytes)", UINT64_MAX, MIB),
    "memory_reserved_mib": ("unsigned long long (bytes)", UINT64_MAX, MIB),
    "sm_clock_mhz": ("unsigned int", UINT32_MAX, 1),
    "mem_clock_mhz": ("unsigned int", UINT32_MAX, 1),
    "pcie_replay": ("unsigned int", UINT32_MAX, 1),
    "ecc_sbe_volatile": ("unsigned long long", UINT64_MAX, 1),
    "ecc_dbe_volatile": ("unsigned long long", UINT64_MAX, 1),
    "ecc_sbe_aggregate": ("unsigned long long", UINT64_MAX, 1),
    "ecc_dbe_aggregate": ("unsigned long long", UINT64_MAX, 1),
    "remapped_rows_correctable": ("unsigned int", UINT32_MAX, 1),
    "remapped_rows_uncorrectable": ("unsigned int", UINT32_MAX, 1),
    "row_remap_pending": ("unsigned int", UINT32_MAX, 1),
    "row_remap_failure": ("unsigned int", UINT32_MAX, 1),
}
DOUBLE_FIELDS = frozenset({"memory_temperature_c"})  # may be a double: NaN and infinity are values it holds
XID_C_TYPE = ("unsigned long long (nvmlEventData_t.eventData)", UINT64_MAX, 1)
GI_ID_C_TYPE = ("unsigned int", UINT32_MAX, 1)
MAX_DURATION_S = 10 * 365 * 86400  # ten years: longer than any run, small enough for exact arithmetic
# Interface calls a scenario may make unsupported / not permitted (method names of nvml.Nvml).
FAULTABLE_CALLS = frozenset({
    "temperature", "memory_temperature", "power_usage", "total_energy", "utilization", "fan_speed", "memory_info",
    "clock", "clocks_event_reasons", "pcie_replay_counter", "total_ecc_errors", "remapped_rows",
    "mig_enabled", "register_xid_events",
})
LIBRARY_ERRORS = ("driver_not_loaded", "lib_rm_version_mismatch", "uninitialized", "library_not_found")
_ENTRY_KEYS = {"at", "gpu", "set", "ramp", "over", "for", "not_supported", "no_permission", "lost", "xid",
               "library_lost", "removed"}


@dataclasses.dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance: profile name as DCGM reports it (e.g. "1g.10gb"), NVML GPU-instance id, MiB."""

    profile: str
    gi_id: int
    memory_total_mib: float
    memory_used_mib: float = 0.0
    memory_reserved_mib: float = 0.0


@dataclasses.dataclass(frozen=True)
class Change:
    """One timeline entry, `at`/`until` in simulator seconds; `gpus` None = every GPU."""

    at: float
    gpus: tuple[int, ...] | None = None
    set: dict[str, Any] = dataclasses.field(default_factory=dict)
    ramp: dict[str, float] = dataclasses.field(default_factory=dict)
    over: float = 0.0
    until: float = math.inf
    not_supported: frozenset[str] = frozenset()
    no_permission: frozenset[str] = frozenset()
    lost: bool = False
    xid: int | None = None
    library_lost: str | None = None
    removed: bool = False

    def applies(self, gpu: int) -> bool:
        return self.gpus is None or gpu in self.gpus

    def active(self, t: float) -> bool:
        return self.at <= t < self.until


@dataclasses.dataclass
class Scenario:
    """A parsed scenario. `timeline` is kept sorted by `at` (stable: file order breaks ties)."""

    gpus: int = 1
    model: str = "NVIDIA H100 80GB HBM3"
    driver_version: str = "550.54.15"
    fans: bool = False
    values: dict[str, float] = dataclasses.field(default_factory=lambda: dict(HEALTHY_VALUES))
    mig: dict[int, tuple[MigInstance, ...]] = dataclasses.field(default_factory=dict)
    timeline: list[Change] = dataclasses.field(default_factory=list)

    def add(self, changes: list[Change]) -> None:
        self.timeline.extend(changes)
        self.timeline.sort(key=lambda c: c.at)

    def value(self, gpu: int, name: str, t: float) -> Any:
        """The value of `name` for `gpu` at simulator time `t` (seconds); ramps interpolate linearly."""
        return self._value(gpu, name, t, len(self.timeline))

    def _value(self, gpu: int, name: str, t: float, upto: int) -> Any:
        value = self.values.get(name, 0 if name != "clocks_event_reasons" else ())
        for index, change in enumerate(self.timeline[:upto]):
            if change.at > t:
                break
            if not change.applies(gpu):
                continue
            if name in change.set and t < change.until:
                value = change.set[name]
            elif name in change.ramp:
                start = self._value(gpu, name, change.at, index)
                target = change.ramp[name]
                done = 1.0 if change.over <= 0 else min(1.0, (t - change.at) / change.over)
                value = start + (target - start) * done
        return value

    def faults(self, gpu: int, t: float, kind: str) -> frozenset[str]:
        """Calls made `not_supported` or `no_permission` (kind) for `gpu` at time `t`."""
        out: set[str] = set()
        for change in self.timeline:
            if change.applies(gpu) and change.active(t):
                out |= getattr(change, kind)
        return frozenset(out)

    def lost(self, gpu: int, t: float) -> bool:
        return any(c.lost and c.applies(gpu) and c.active(t) for c in self.timeline)

    def removed(self, gpu: int, t: float) -> bool:
        """True while `gpu` is out of the device list (a `removed` entry is active for it)."""
        return any(c.removed and c.applies(gpu) and c.active(t) for c in self.timeline)

    def library_lost(self, t: float) -> str | None:
        """The library error in force at `t` (one of LIBRARY_ERRORS) or None."""
        for change in self.timeline:
            if change.library_lost and change.active(t):
                return change.library_lost
        return None


# ------------------------------------------------------------------------------------------ parsing
def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises SpecError (file, entry path, what was expected)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError("", f"cannot read scenario: {exc.strerror}", str(path)) from None
    raw = load_yaml(data, str(path)) or {}  # SpecError: not UTF-8, not YAML, duplicate key
    try:
        return parse_scenario(raw)
    except SpecError as exc:
        raise exc.with_file(str(path)) from None


def parse_scenario(raw: Any) -> Scenario:
    """Build a Scenario from already-parsed YAML data (see the module docstring for the shape)."""
    if not isinstance(raw, dict):
        raise SpecError("", f"expected a mapping at the top, got {type(raw).__name__}")
    unknown = set(raw) - {"gpus", "model", "driver_version", "fans", "values", "mig", "timeline"}
    if unknown:
        raise SpecError(sorted(unknown)[0], "unknown key (expected gpus, model, driver_version, fans, values, mig, "
                                            "timeline)")
    gpus = raw.get("gpus", 1)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= 1024:
        raise SpecError("gpus", f"expected a whole number 0..1024, got {gpus!r}")
    fans = raw.get("fans", False)
    if not isinstance(fans, bool):
        raise SpecError("fans", f"expected true or false, got {fans!r}")
    scenario = Scenario(gpus=gpus, model=str(raw.get("model", Scenario.model)),
                        driver_version=str(raw.get("driver_version", Scenario.driver_version)), fans=fans)
    scenario.values.update(_values(raw.get("values") or {}, "values", rampable=False))
    for key, instances in (raw.get("mig") or {}).items():
        gpu = _gpu_index(key, f"mig.{key}", gpus)
        scenario.mig[gpu] = tuple(_mig(item, f"mig.{key}[{i}]") for i, item in enumerate(instances or []))
    scenario.add(parse_changes(raw.get("timeline") or [], 0.0, gpus, "timeline"))
    return scenario


def parse_changes(entries: Any, offset: float, gpus: int, path: str = "events") -> list[Change]:
    """Timeline entries -> Changes, `at` shifted by `offset` seconds. Raises SpecError on the first bad entry."""
    if not isinstance(entries, list):
        raise SpecError(path, f"expected a list of entries, got {type(entries).__name__}")
    return [_change(entry, offset, gpus, f"{path}[{i}]") for i, entry in enumerate(entries)]


def _change(entry: Any, offset: float, gpus: int, path: str) -> Change:
    if not isinstance(entry, dict):
        raise SpecError(path, f"expected a mapping, got {entry!r}")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise SpecError(f"{path}.{sorted(unknown)[0]}", f"unknown key (expected one of {sorted(_ENTRY_KEYS)})")
    at = offset + _duration(entry.get("at", 0), f"{path}.at")
    until = math.inf
    if "for" in entry:
        until = at + _duration(entry["for"], f"{path}.for")
    target = entry.get("gpu", "all")
    if target == "all":
        selected = None
    elif isinstance(target, list):
        selected = tuple(_gpu_index(g, f"{path}.gpu", gpus) for g in target)
    else:
        selected = (_gpu_index(target, f"{path}.gpu", gpus),)
    xid = entry.get("xid")
    if xid is not None and (not isinstance(xid, int) or isinstance(xid, bool) or not 0 < xid <= XID_C_TYPE[1]):
        raise SpecError(f"{path}.xid", f"expected a positive XID code that fits {XID_C_TYPE[0]} (at most "
                                       f"{XID_C_TYPE[1]}), got {_short(xid)}")
    lost = entry.get("lost", False)
    if not isinstance(lost, bool):
        raise SpecError(f"{path}.lost", f"expected true or false, got {_short(lost)}")
    removed = entry.get("removed", False)
    if not isinstance(removed, bool):
        raise SpecError(f"{path}.removed", f"expected true or false, got {_short(removed)}")
    library = entry.get("library_lost")
    if library is True:
        library = "driver_not_loaded"
    if library not in (None, False) and library not in LIBRARY_ERRORS:
        raise SpecError(f"{path}.library_lost", f"expected true or one of {list(LIBRARY_ERRORS)}, got {library!r}")
    change = Change(
        at=at, gpus=selected, until=until,
        set=_values(entry.get("set") or {}, f"{path}.set", rampable=False),
        ramp=_values(entry.get("ramp") or {}, f"{path}.ramp", rampable=True),
        over=_duration(entry.get("over", 0), f"{path}.over"),
        not_supported=_calls(entry.get("not_supported"), f"{path}.not_supported"),
        no_permission=_calls(entry.get("no_permission"), f"{path}.no_permission"),
        lost=lost, xid=xid, library_lost=library or None, removed=removed,
    )
    if not (change.set or change.ramp or change.not_supported or change.no_permission or change.lost
            or change.xid or change.library_lost or change.removed):
        raise SpecError(path, "entry changes nothing: give set, ramp, not_supported, no_permission, lost, xid, "
                              "library_lost or removed")
    return change


def _values(raw: Any, path: str, rampable: bool) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SpecError(path, f"expected a mapping of value names, got {raw!r}")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name == "clocks_event_reasons" and not rampable:
            reasons = value if isinstance(value, list) else [value]
            bad = [r for r in reasons if r not in REASON_BITS]
            if bad:
                raise SpecError(f"{path}.{name}", f"unknown reason {bad[0]!r} (expected {sorted(REASON_BITS)})")
            out[name] = tuple(reasons)
        elif name not in HEALTHY_VALUES:
            allowed = sorted(HEALTHY_VALUES) + ([] if rampable else ["clocks_event_reasons"])
            raise SpecError(f"{path}.{name}", f"unknown value name (expected one of {allowed})")
        else:
            out[name] = _number(value, f"{path}.{name}", *C_TYPES[name], name in DOUBLE_FIELDS)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any, path: str, c_type: str, most: int, scale: int = 1, double: bool = False) -> Any:
    """`value` when the real library could return `value * scale` in `c_type` (0..`most`); raises SpecError
    naming `path`."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise SpecError(path, f"expected a non-negative number, got {_short(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        if double:
            return value
        raise SpecError(path, f"expected a finite number ({c_type} holds no NaN or infinity), got {value!r}")
    if value < 0:
        raise SpecError(path, f"expected a non-negative number, got {_short(value)}")
    scaled = value * scale  # ints multiply exactly; a float is judged as the simulator rounds it
    if scaled > most and (math.isinf(scaled) or round(scaled) > most):
        raise SpecError(path, f"out of range: {c_type} holds at most {most}"
                              + (f" (= {most / scale:.15g} here)" if scale != 1 else "") + f", got {_short(value)}")
    return value


def _duration(raw: Any, path: str) -> float:
    """Seconds of a duration field (a number of seconds or '30s', '5m', ...): finite, 0..MAX_DURATION_S."""
    if isinstance(raw, float) and not math.isfinite(raw):
        raise SpecError(path, f"expected a finite duration, got {raw!r}")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and not 0 <= raw <= MAX_DURATION_S:
        raise SpecError(path, f"expected a duration of 0 to {MAX_DURATION_S} seconds, got {_short(raw)}")
    seconds = Duration.parse(raw, path).seconds
    if seconds > MAX_DURATION_S:
        raise SpecError(path, f"expected a duration of at most {MAX_DURATION_S} seconds, got {_short(raw)}")
    return seconds


def _calls(raw: Any, path: str) -> frozenset[str]:
    if raw is None:
        return frozenset()
    calls = raw if isinstance(raw, list) else [raw]
    bad = [c for c in calls if c not in FAULTABLE_CALLS]
    if bad:
        raise SpecError(path, f"unknown NVML call {bad[0]!r} (expected {sorted(FAULTABLE_CALLS)})")
    return frozenset(calls)


def _gpu_index(raw: Any, path: str, gpus: int) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw < gpus:
        raise SpecError(path, f"expected a GPU index 0..{gpus - 1}, got {raw!r}")
    return raw


def _mig(raw: Any, path: str) -> MigInstance:
    if not isinstance(raw, dict) or "profile" not in raw or "gi_id" not in raw or "memory_total_mib" not in raw:
        raise SpecError(path, "expected a mapping with profile, gi_id, memory_total_mib (memory_used_mib, "
                              "memory_reserved_mib optional)")
    gi_id = raw["gi_id"]
    if not isinstance(gi_id, int) or isinstance(gi_id, bool) or not 0 <= gi_id <= GI_ID_C_TYPE[1]:
        raise SpecError(f"{path}.gi_id", f"expected a GPU-instance id that fits {GI_ID_C_TYPE[0]}, got "
                                         f"{_short(gi_id)}")
    memory = {name: float(_number(raw.get(name, 0), f"{path}.{name}", *C_TYPES[name]))
              for name in ("memory_total_mib", "memory_used_mib", "memory_reserved_mib")}
    return MigInstance(profile=str(raw["profile"]), gi_id=gi_id, **memory)
