"""L1 rules: GPUs, from dcgm-exporter compatible series (`DCGM_FI_DEV_*`) and the inferwatch GPU exporter's
extras (`inferwatch_gpu_up`, `inferwatch_gpu_xid_errors_total`, `inferwatch_gpu_clocks_event_active`).

Either exporter is a first-class source (spec `selectors.gpu` selects its series). What dcgm-exporter lacks is
replaced where it has an equivalent, each such branch limited to targets that are not an inferwatch exporter
(`unless on (job, instance) inferwatch_gpu_devices`), so one fault never fires twice:
- the XID counter: dcgm-exporter's `DCGM_EXP_XID_ERRORS_COUNT{xid}` (XIDs per code over its window, when
  enabled), else its `DCGM_FI_DEV_XID_ERRORS` gauge (the last XID: only a change to a listed code counts);
- `inferwatch_gpu_up`: a GPU whose series vanished while its exporter still answers (`up == 1`);
- `inferwatch_gpu_clocks_event_active`: the bits of `DCGM_FI_DEV_CLOCKS_EVENT_REASONS` (NVML's bitmask; not in
  dcgm-exporter's default field list, add field 112 to it).
The NVML library lost (`inferwatch_gpu_nvml_up`) has none: dcgm-exporter exits when it loses DCGM, which is
`GpuExporterDown`.

Alerts are reduced to their subject's identity (`rules/identity.py`): device-wide fields to the physical GPU
(`max by`, so MIG instances' copies make one alert), per-instance fields (framebuffer) to the MIG instance;
never the pod's labels, so a rescheduled pod neither restarts `for` nor opens a second incident; the
description names the pods holding the GPU instead. Thresholds and `for`s come from `spec.layers.L1`.
"""

from __future__ import annotations

from inferwatch.rules import identity
from inferwatch.rules.builders import exporter_down, indent, num, ratio, regex_alternation
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.selectors import Selector, label_arg
from inferwatch.spec import Spec

MEMORY_RATIO = "gpu:DCGM_FI_DEV_FB_USED:ratio"
UTILIZATION = "gpu:DCGM_FI_DEV_GPU_UTIL:ratio"
GPU_BY = identity.by(identity.GPU)
# dcgm-exporter names the host label `Hostname` up to 4.8.2 and `hostname` from 4.8.3; `node` is the
# scrape label the generated configuration and the Kubernetes monitors add.
HOST = "{{ or $labels.node $labels.Hostname $labels.hostname }}"
GPU = "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on node " + HOST
MIG_INSTANCE = ("{{ with $labels.GPU_I_ID }} (MIG instance {{ . }}"
                "{{ with $labels.GPU_I_PROFILE }}, {{ . }}{{ end }}){{ end }}")
# XIDs that mean the GPU is gone, which GpuLost reports (and GpuXidCritical leaves to it, so one fault pages
# once): 79 "GPU has fallen off the bus" (NVIDIA "XID Errors", r555). The only such code in that catalogue.
LOST_XIDS = (79,)
# Labels a GPU's last XID is followed by: not err_code/err_msg (they change with the value) nor the pod's.
XID_GAUGE_BY = "job, instance, node, gpu, UUID, Hostname, hostname, modelName"
# Labels a vanished GPU is named by (dcgm-exporter: no per-GPU `up`); any of them may be absent.
VANISHED_BY = "job, instance, node, gpu, UUID, Hostname, hostname"
# Labels every branch of GpuLost is reduced to, so one lost GPU is one alert whichever branch fires first
# (XID 79, then `up` 0): not `xid` (only the XID branch has it) nor the pod's (only `up` has them, and they go
# with the pod); the runbook finds the pod from the GPU's DCGM_FI_* series by UUID.
LOST_BY = VANISHED_BY


def not_inferwatch(gpu: Selector, *others: str) -> str:
    """`unless on (job, instance) (...)`: keep a branch for targets that are not an inferwatch GPU exporter (nor
    one exporting any of `others`)."""
    guards = " or ".join([gpu("inferwatch_gpu_devices"), *(gpu(o) for o in others)])
    return f"unless on (job, instance)\n({guards})" if others else f"unless on (job, instance)\n{guards}"


def changed(expr: str, window: str) -> str:
    """`expr`'s series whose value changed within `window` (an instant vector, the newest value): the max of a
    subquery over `window` above its min. Not `changes(...) > 0`: MetricsQL's changes() counts a series' first
    sample as a change (MetricsQL docs, `changes` against `changes_prometheus`), so under
    vmalert a GPU first seen holding an old XID (a new exporter, a node joining) would read as a new XID; a
    max above the min is "not every value alike" in both engines."""
    return f"max_over_time(({expr})[{window}:]) > min_over_time(({expr})[{window}:])"


def xid_events(gpu: Selector, xids: list[int], window: str, excluded: tuple[int, ...] = ()) -> str:
    """XID events of the listed codes in the last `window`, from whichever counter the exporter has: the
    inferwatch counter (label xid), dcgm-exporter's windowed count (label xid), or dcgm-exporter's last-XID
    gauge changing to a listed code (no xid label; its value is the code). dcgm-exporter labels that gauge
    with the code itself (`err_code`, `err_msg`), so a new XID starts a new series: the change is taken per
    GPU over those series (a subquery), not per series. `excluded`: codes of `xids` left to another alert
    (written as `xid!~`, so the rule still shows the spec's whole list)."""
    codes = f'xid=~"{regex_alternation(sorted(xids))}"'
    if excluded:
        codes += f', xid!~"{regex_alternation(sorted(excluded))}"'
    last = f"max by ({XID_GAUGE_BY}) ({gpu('DCGM_FI_DEV_XID_ERRORS')})"
    values = " or ".join(f"{last} == {x}" for x in sorted(xids) if x not in excluded)
    return (f"increase({gpu('inferwatch_gpu_xid_errors_total', codes)}[{window}]) > 0\n"
            f"or\n{gpu('DCGM_EXP_XID_ERRORS_COUNT', codes)} > 0\n"
            f"or\n(\n  ({values})\n  and\n  {changed(last, window)}\n"
            f"{indent(not_inferwatch(gpu, 'DCGM_EXP_XID_ERRORS_COUNT'))}\n)")


def vanished(gpu: Selector, lookback: str, absent_for: str) -> str:
    """GPUs an exporter other than inferwatch's reported within `lookback` and has not for `absent_for` while
    it still answers: dcgm-exporter's lost GPU (it has no per-GPU `up`). It resolves when the GPU reports
    again or `lookback` after it vanished."""
    temp = gpu("DCGM_FI_DEV_GPU_TEMP")
    gone = (f"(\n  max by ({VANISHED_BY}) (max_over_time({temp}[{lookback}]))\n"
            f"  unless on (job, instance, UUID)\n  max_over_time({temp}[{absent_for}])\n)")
    return f"(\n{indent(gone)}\n  and on (job, instance)\n  {gpu('up')} == 1\n{indent(not_inferwatch(gpu))}\n)"


def throttle_bits(gpu: Selector, reasons: list[str]) -> str:
    """One series per active reason from `DCGM_FI_DEV_CLOCKS_EVENT_REASONS` (a bitmask; bit values as NVML
    defines them), labelled `reason` like inferwatch_gpu_clocks_event_active, for exporters other than
    inferwatch's (which exports both)."""
    from inferwatch.exporters.gpu.nvml import CLOCKS_EVENT_REASONS

    if not reasons:
        return ""
    bits = dict(CLOCKS_EVENT_REASONS)
    mask = gpu("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    parts = [f'label_replace(floor({mask} / {bits[r]}) % 2 == 1, "reason", "{r}", "", "")' for r in reasons]
    either = "(\n" + indent("\nor\n".join(parts)) + "\n)"
    return f"(\n{indent(either)}\n{indent(not_inferwatch(gpu))}\n)"


def throttling(gpu: Selector, reasons: list[str]) -> str:
    """GPUs slowing their clocks for one of `reasons`: inferwatch's per-reason gauge, or dcgm-exporter's bits."""
    reason = f'reason=~"{regex_alternation(reasons)}"'
    active = f'{gpu("inferwatch_gpu_clocks_event_active", reason)} == 1'
    bits = throttle_bits(gpu, reasons)
    return f"{active}\nor\n{bits}" if bits else active


def _in_cluster(spec: Spec) -> tuple[str, str]:
    """(matcher, printf argument) scoping an annotation's query to the alert's cluster; ("", "") in one."""
    if not spec.cluster.enabled:
        return "", ""
    return f"{spec.cluster.label}=%q", f" {label_arg(spec.cluster.label)}"


def groups(spec: Spec) -> list[Group]:
    l1 = spec.layers.L1
    gpu = spec.selectors.of("gpu")
    window = str(spec.prometheus.rate_window)
    used = identity.per_instance(gpu("DCGM_FI_DEV_FB_USED"))
    pods = identity.pods_holding(gpu, cluster=_in_cluster(spec))
    dbe_increase = f"increase({gpu('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')}[{window}])"
    recording = [
        # dcgm-exporter reports MiB used/free/reserved, not a total; reserved is absent on older drivers.
        # Per MIG instance (each has its own framebuffer), without the pod's labels.
        Recording(MEMORY_RATIO,
                  ratio(used, f"({used} + {identity.per_instance(gpu('DCGM_FI_DEV_FB_FREE'))}\n"
                              f" + ({identity.per_instance(gpu('DCGM_FI_DEV_FB_RESERVED'))} or {used} * 0))")),
        Recording(UTILIZATION, identity.utilization(gpu)),
    ]
    alerts = [
        Alert("GpuTemperatureCritical",
              f"{identity.device_wide(gpu('DCGM_FI_DEV_GPU_TEMP'))} > {num(l1.temperature_critical_celsius)}",
              l1.for_, "critical", f"{GPU} is at {{{{ $value }}}} °C (critical above "
                                   f"{num(l1.temperature_critical_celsius)} °C).{pods}")
    ]
    for name, severity, limit in (("GpuMemoryUsageHigh", "warning", l1.memory_used_warning_ratio),
                                  ("GpuMemoryUsageCritical", "critical", l1.memory_used_critical_ratio)):
        alerts.append(Alert(name, f"{MEMORY_RATIO} > {num(limit)}", l1.for_, severity,
                            f"{GPU}{MIG_INSTANCE} uses {{{{ $value | humanizePercentage }}}} of its framebuffer "
                            f"memory ({severity} above {limit:.0%}).{pods}"))
    alerts += [
        # The library lost (driver unloaded or reloaded, version mismatch) is one condition of the node, not
        # one per GPU: every known GPU reads `up` 0 meanwhile, and Alertmanager inhibits their GpuLost by node.
        # `devices > 0`: an exporter that never found a GPU (a CPU node, `--nvml auto`) has nothing to lose.
        Alert("GpuNvmlLost",
              f"{gpu('inferwatch_gpu_nvml_up')} == 0\nand on (job, instance)\n{gpu('inferwatch_gpu_devices')} > 0",
              l1.event_for, "critical",
              f"The NVML library on node {HOST} (exporter {{{{ $labels.instance }}}}) is lost: "
              "the driver was unloaded, reloaded or no longer matches the library, so none of the node's "
              "GPUs can be read and their workloads are likely failing."),
        # `up` 0 = NVML reports the device lost or unreadable; XID 79 = "GPU has fallen off the bus". Every
        # branch is reduced to LOST_BY: the same labels for the same GPU, so XID 79 then `up` 0 stays one alert.
        Alert("GpuLost",
              f"max by ({LOST_BY}) (\n"
              + indent(f"{gpu('inferwatch_gpu_up')} == 0\nor\n{xid_events(gpu, list(LOST_XIDS), window)}\nor\n"
                       f"{vanished(gpu, str(l1.vanished_gpu_lookback), str(l1.for_))}") + "\n)",
              l1.event_for, "critical",
              f"{GPU} is lost: its workloads fail "
              f"until the node is drained and the GPU reset or replaced."),
    ]
    # XIDs of a lost GPU are GpuLost's: one fault, one page.
    if set(l1.critical_xids) - set(LOST_XIDS):
        # The counters count every event; dcgm-exporter's gauge only holds the last XID and never goes back to
        # 0, so for it only a change to a critical code counts.
        alerts.append(Alert("GpuXidCritical",
                            f"max by ({GPU_BY}, xid, window_size_in_ms) (\n"
                            + indent(xid_events(gpu, l1.critical_xids, window, excluded=LOST_XIDS)) + "\n)",
                            l1.event_for, "critical",
                            f"{GPU} reported XID {{{{ with $labels.xid }}}}{{{{ . }}}}{{{{ else }}}}{{{{ $value }}}}"
                            f"{{{{ end }}}} in the last {window}.{pods}"))
    alerts += [
        Alert("GpuUncorrectableMemoryError",
              f"{identity.device_wide(gpu('DCGM_FI_DEV_ROW_REMAP_FAILURE'))} > 0\n"
              f"or\n{identity.device_wide(dbe_increase)} > 0",
              l1.event_for, "critical",
              f"{GPU} has an uncorrectable ECC error or a failed row remap: "
              f"its memory can no longer be trusted.{pods}"),
        Alert("GpuThrottling",
              f"max by ({GPU_BY}, reason) (\n{indent(throttling(gpu, l1.throttle_reasons))}\n)",
              l1.for_, "warning",
              f"{GPU} is slowing its clocks ({{{{ $labels.reason }}}}) for more than {l1.for_}.{pods}"),
        exporter_down("GpuExporterDown", gpu, for_=l1.exporter_down_for, severity="critical",
                      what="the GPU exporter", has_targets=bool(spec.targets.gpu_exporters), cluster=spec.cluster),
    ]
    return [Group("inferwatch-gpu.rules", recording), Group("inferwatch-gpu.alerts", alerts)]
