"""Plain readings -> Prometheus metric families. Pure: no I/O, no clock; tested with literal data.

Names, units and labels follow dcgm-exporter's default counters (its default-counters.csv and the label
template of internal/pkg/rendermetrics, NVIDIA/dcgm-exporter) so rules and dashboards work with either
exporter; what dcgm-exporter lacks is under `inferwatch_gpu_`.
Conversions: power mW -> W, frame buffer bytes -> MiB (whole MiB, as DCGM reports), energy stays mJ.
A value NVML did not give (None) produces no sample: never a sentinel, never NaN.
With a `PodMap` (pods.py), the series of a GPU or MIG instance a pod holds carry `namespace`, `pod` and
`container` (dcgm-exporter's names): every DCGM_FI_* series, `inferwatch_gpu_up` and
`inferwatch_gpu_clocks_event_active`. The XID counter never does: a counter whose labels change with the pod
would start a new series and hide the increase that happened as the pod went away.

dcgm-exporter's counters (energy, ECC, PCIe replay, remapped rows) have no `_total` suffix; prometheus_client
would append one to a family typed `counter`, so they are exposed untyped under their exact names (they
still only grow, and `rate()` works on them).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from inferwatch.exporters.gpu.nvml import CLOCKS_EVENT_REASONS, COUNTED_CLASSES
from inferwatch.exporters.gpu.pods import PodMap
from inferwatch.exporters.gpu.reading import GpuReading, MigReading, Snapshot

MIB = 1024 * 1024
GAUGE, UNTYPED = "gauge", "unknown"


@dataclasses.dataclass(frozen=True)
class XidCounts:
    """XID events seen since start: `counts[(gpu index, UUID)][xid]`, and the last XID code per (index, UUID).
    Both outlive the GPU's readings: a lost GPU keeps them (its last XID is often the reason, e.g. 79)."""

    counts: dict[tuple[int, str], dict[int, int]] = dataclasses.field(default_factory=dict)
    last: dict[tuple[int, str], int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CollectionStats:
    """The exporter's own health: last collection duration (s), last success (unix s, None = never),
    NVML errors counted by (class, error name)."""

    duration_seconds: float | None = None
    last_success_unix: float | None = None
    errors: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB


# (name, type, help, value from a GPU reading). Help text states the unit.
GPU_FIELDS: tuple[tuple[str, str, str, Callable[[GpuReading], float | None]], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", GAUGE, "SM clock in MHz.", lambda r: r.sm_clock_mhz),
    ("DCGM_FI_DEV_MEM_CLOCK", GAUGE, "Memory clock in MHz.", lambda r: r.mem_clock_mhz),
    ("DCGM_FI_DEV_GPU_TEMP", GAUGE, "GPU temperature in degrees Celsius.", lambda r: r.temperature_c),
    ("DCGM_FI_DEV_MEMORY_TEMP", GAUGE, "Memory (HBM) temperature in degrees Celsius.",
     lambda r: r.memory_temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", GAUGE, "Power draw in watts.",
     lambda r: None if r.power_mw is None else r.power_mw / 1000.0),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", UNTYPED,
     "Energy used since the driver was loaded, in millijoules (counter).", lambda r: r.energy_mj),
    ("DCGM_FI_DEV_GPU_UTIL", GAUGE, "GPU utilization in percent.", lambda r: r.utilization_gpu_pct),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", GAUGE, "Memory controller utilization in percent.",
     lambda r: r.utilization_memory_pct),
    ("DCGM_FI_DEV_FAN_SPEED", GAUGE, "Fan speed in percent of the fan's maximum (may exceed 100; no series "
     "on passively cooled GPUs).", lambda r: r.fan_speed_pct),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", UNTYPED, "PCIe replays (retries) since boot (counter).",
     lambda r: r.pcie_replay),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", GAUGE,
     "Bitmask of the reasons clocks are held down (NVML clocks-event reasons).", lambda r: r.clocks_event_reasons),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", UNTYPED, "Corrected (single-bit) ECC errors since boot (counter).",
     lambda r: r.ecc_sbe_volatile),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", UNTYPED, "Uncorrected (double-bit) ECC errors since boot (counter).",
     lambda r: r.ecc_dbe_volatile),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", UNTYPED, "Corrected ECC errors over the GPU's lifetime (counter).",
     lambda r: r.ecc_sbe_aggregate),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", UNTYPED, "Uncorrected ECC errors over the GPU's lifetime (counter).",
     lambda r: r.ecc_dbe_aggregate),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", UNTYPED, "Memory rows remapped after correctable errors.",
     lambda r: None if r.remapped_rows is None else r.remapped_rows.correctable),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", UNTYPED, "Memory rows remapped after uncorrectable errors.",
     lambda r: None if r.remapped_rows is None else r.remapped_rows.uncorrectable),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", GAUGE, "1 when a row remap waits for the next GPU reset.",
     lambda r: None if r.remapped_rows is None else int(r.remapped_rows.pending)),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", GAUGE, "1 when remapping a memory row has failed.",
     lambda r: None if r.remapped_rows is None else int(r.remapped_rows.failure)),
)
# Frame-buffer figures exist for the whole GPU and for each MIG instance (with GPU_I_* labels).
MEMORY_FIELDS: tuple[tuple[str, str, Callable], ...] = (
    ("DCGM_FI_DEV_FB_FREE", "Frame buffer free in MiB.", lambda m: _mib(m.free)),
    ("DCGM_FI_DEV_FB_USED", "Frame buffer used in MiB.", lambda m: _mib(m.used)),
    ("DCGM_FI_DEV_FB_RESERVED", "Frame buffer reserved by the driver in MiB.", lambda m: _mib(m.reserved)),
    ("DCGM_FI_DEV_FB_TOTAL", "Frame buffer total in MiB.", lambda m: _mib(m.total)),
)
XID_HELP = "Last XID error code seen on this GPU since the exporter started (0 = none)."


def dcgm_labels(r: GpuReading, host: str, driver: str, mig: MigReading | None = None,
                pods: PodMap | None = None) -> dict[str, str]:
    """dcgm-exporter's label set for a GPU (and a MIG instance of it), in its order; `namespace`, `pod` and
    `container` when `pods` says a container holds that GPU (or that instance)."""
    ident = r.identity
    labels = {"gpu": str(ident.index), "UUID": ident.uuid, "pci_bus_id": ident.pci_bus_id,
              "device": f"nvidia{ident.index}", "modelName": ident.name}
    if mig is not None:
        labels.update(GPU_I_PROFILE=mig.profile, GPU_I_ID=str(mig.gi_id))
    labels.update(Hostname=host, DCGM_FI_DRIVER_VERSION=driver)
    holder = None if pods is None else (pods.for_gpu(ident) if mig is None else pods.for_mig(ident, mig))
    if holder is not None:
        labels.update(holder.labels())
    return labels


def build_families(snapshot: Snapshot, host: str, xids: XidCounts, stats: CollectionStats,
                   preset_xids: Iterable[int] = (), pods: PodMap | None = None) -> list[Metric]:
    """All families for one snapshot. `preset_xids`: XID codes whose counters start at 0 for every GPU,
    so the first event is an increase Prometheus can see. `pods`: who holds which GPU (None = no labels)."""
    driver = snapshot.driver_version
    readable = [r for r in snapshot.gpus if r.up]
    # Keyed by index and UUID: a GPU lost from the device list keeps its index while a new one may take it.
    labels = {(r.identity.index, r.identity.uuid): dcgm_labels(r, host, driver, pods=pods) for r in snapshot.gpus}
    out: list[Metric] = []
    for name, typ, help_text, value_of in GPU_FIELDS:
        family = Metric(name, help_text, typ)
        for r in readable:
            value = value_of(r)
            if value is not None:
                family.add_sample(name, labels[(r.identity.index, r.identity.uuid)], value)
        out.append(family)
    for name, help_text, value_of in MEMORY_FIELDS:
        family = Metric(name, help_text, GAUGE)
        for r in readable:
            if r.memory is not None and value_of(r.memory) is not None:
                family.add_sample(name, labels[(r.identity.index, r.identity.uuid)], value_of(r.memory))
            for m in r.mig:
                if m.memory is not None and value_of(m.memory) is not None:
                    family.add_sample(name, dcgm_labels(r, host, driver, m, pods), value_of(m.memory))
        out.append(family)
    # The last XID stays with a lost GPU (named by its remembered identity) while its readings go.
    xid_last = Metric("DCGM_FI_DEV_XID_ERRORS", XID_HELP, GAUGE)
    for r in snapshot.gpus:
        last = xids.last.get((r.identity.index, r.identity.uuid))
        if r.up or last is not None:
            xid_last.add_sample("DCGM_FI_DEV_XID_ERRORS", labels[(r.identity.index, r.identity.uuid)], last or 0)
    out.append(xid_last)
    out.extend(_inferwatch_families(snapshot, host, xids, preset_xids, pods))
    out.extend(_self_families(snapshot, host, stats))
    return out


def _inferwatch_families(snapshot: Snapshot, host: str, xids: XidCounts, preset_xids: Iterable[int],
                         pods: PodMap | None) -> list[Metric]:
    up = Metric("inferwatch_gpu_up", "1 when the GPU answered NVML in the last collection, 0 when it is lost "
                "or unreadable.", GAUGE)
    reasons = Metric("inferwatch_gpu_clocks_event_active", "1 while this clocks-event (throttle) reason holds "
                     "the GPU's clocks, else 0; reasons as NVML names them.", GAUGE)
    for r in snapshot.gpus:
        base = {"gpu": str(r.identity.index), "UUID": r.identity.uuid, "Hostname": host}
        holder = pods.for_gpu(r.identity) if pods is not None else None
        if holder is not None:
            base.update(holder.labels())
        up.add_sample("inferwatch_gpu_up", base, 1 if r.up else 0)
        if r.up and r.clocks_event_reasons is not None:
            for reason, bit in CLOCKS_EVENT_REASONS:
                reasons.add_sample("inferwatch_gpu_clocks_event_active", {**base, "reason": reason},
                                   1 if r.clocks_event_reasons & bit else 0)
    xid_total = CounterMetricFamily("inferwatch_gpu_xid_errors", "XID critical-error events by code, read "
                                    "from NVML events.", labels=["gpu", "UUID", "Hostname", "xid"])
    seen = {(r.identity.index, r.identity.uuid) for r in snapshot.gpus} | set(xids.counts)
    preset = sorted(set(preset_xids))
    for gpu, uuid in sorted(seen):
        counts = xids.counts.get((gpu, uuid), {})
        for code in sorted(set(preset) | set(counts)):
            xid_total.add_metric([str(gpu), uuid, host, str(code)], counts.get(code, 0))
    return [up, reasons, xid_total]


def _self_families(snapshot: Snapshot, host: str, stats: CollectionStats) -> list[Metric]:
    devices = GaugeMetricFamily("inferwatch_gpu_devices", "GPUs NVML reports on this host (0 when no NVML "
                                "library or driver is visible).", value=snapshot.devices)
    # The node-level signal for a lost library (driver unloaded or reloading, version mismatch): one series
    # per node, so one alert per node instead of one GpuLost per GPU.
    nvml_up = GaugeMetricFamily("inferwatch_gpu_nvml_up", "1 when the NVML library answered the last "
                                "collection, 0 while it is absent, lost or being re-initialised (every GPU "
                                "of the node then reads inferwatch_gpu_up 0).", labels=["Hostname"])
    nvml_up.add_metric([host], 1 if snapshot.nvml_up else 0)
    out: list[Metric] = [devices, nvml_up]
    if stats.duration_seconds is not None:
        out.append(GaugeMetricFamily("inferwatch_gpu_collection_duration_seconds",
                                     "Wall time of the last NVML collection in seconds.",
                                     value=stats.duration_seconds))
    if stats.last_success_unix is not None:
        out.append(GaugeMetricFamily("inferwatch_gpu_last_collection_success_timestamp_seconds",
                                     "Unix time of the last collection that reached NVML.",
                                     value=stats.last_success_unix))
    errors = CounterMetricFamily("inferwatch_gpu_nvml_errors", "NVML calls that failed or returned no "
                                 f"reading, by class ({', '.join(COUNTED_CLASSES)}) and error name (NVML "
                                 "error, blank sentinel or range).", labels=["class", "error"])
    for (cls, name), count in sorted(stats.errors.items()):
        errors.add_metric([cls, name], count)
    out.append(errors)
    return out


__all__ = ["build_families", "dcgm_labels", "XidCounts", "CollectionStats", "GPU_FIELDS", "MEMORY_FIELDS"]
