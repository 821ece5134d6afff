"""L1 rules: GPUs, from dcgm-exporter compatible series (`DCGM_FI_DEV_*`) and the inferwatch GPU exporter's
extras (`inferwatch_gpu_up`, `inferwatch_gpu_xid_errors_total`, `inferwatch_gpu_clocks_event_active`).

Alerts keep every label of the series they watch (gpu, UUID, Hostname, modelName, node ...), so a page names
the exact device. Thresholds and `for`s come from `spec.layers.L1`.
"""

from __future__ import annotations

from inferwatch.rules.builders import exporter_down, num, ratio, regex_alternation
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.spec import Spec

JOB = "inferwatch-gpu"
MEMORY_RATIO = "gpu:DCGM_FI_DEV_FB_USED:ratio"
GPU = "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on node {{ $labels.node }}"


def groups(spec: Spec) -> list[Group]:
    l1 = spec.layers.L1
    window = str(spec.prometheus.rate_window)
    recording = [
        # dcgm-exporter reports MiB used/free/reserved, not a total; reserved is absent on older drivers.
        Recording(MEMORY_RATIO,
                  ratio("DCGM_FI_DEV_FB_USED",
                        "(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE\n"
                        " + (DCGM_FI_DEV_FB_RESERVED or DCGM_FI_DEV_FB_USED * 0))")),
    ]
    xids = regex_alternation(sorted(l1.critical_xids))
    alerts = [
        Alert("GpuTemperatureCritical", f"DCGM_FI_DEV_GPU_TEMP > {num(l1.temperature_critical_celsius)}", l1.for_,
              "critical", f"{GPU} is at {{{{ $value }}}} °C (critical above "
                          f"{num(l1.temperature_critical_celsius)} °C).")
    ]
    for name, severity, limit in (("GpuMemoryUsageHigh", "warning", l1.memory_used_warning_ratio),
                                  ("GpuMemoryUsageCritical", "critical", l1.memory_used_critical_ratio)):
        alerts.append(Alert(name, f"{MEMORY_RATIO} > {num(limit)}", l1.for_, severity,
                            f"{GPU} uses {{{{ $value | humanizePercentage }}}} of its framebuffer memory "
                            f"({severity} above {limit:.0%})."))
    alerts += [
        # The library lost (driver unloaded or reloaded, version mismatch) is one condition of the node, not
        # one per GPU: every known GPU reads `up` 0 meanwhile, and Alertmanager inhibits their GpuLost by node.
        # `devices > 0`: an exporter that never found a GPU (a CPU node, `--nvml auto`) has nothing to lose.
        Alert("GpuNvmlLost",
              "inferwatch_gpu_nvml_up == 0\nand on (job, instance)\ninferwatch_gpu_devices > 0",
              l1.event_for, "critical",
              "The NVML library on node {{ $labels.node }} (exporter {{ $labels.instance }}) is lost: "
              "the driver was unloaded, reloaded or no longer matches the library, so none of the node's "
              "GPUs can be read and their workloads are likely failing."),
        # XID 79 = "GPU has fallen off the bus"; `up` 0 = NVML reports the device lost or unreadable.
        Alert("GpuLost",
              f'inferwatch_gpu_up == 0\nor\nincrease(inferwatch_gpu_xid_errors_total{{xid="79"}}[{window}]) > 0',
              l1.event_for, "critical",
              f"{GPU} is lost{{{{ with $labels.xid }}}} (XID {{{{ . }}}}){{{{ end }}}}: its workloads fail "
              f"until the node is drained and the GPU reset or replaced."),
        # The inferwatch counter counts every event; dcgm-exporter's gauge only holds the last XID and never
        # goes back to 0, so for it only a change to a critical code counts.
        Alert("GpuXidCritical",
              f'increase(inferwatch_gpu_xid_errors_total{{xid=~"{xids}"}}[{window}]) > 0\n'
              f'or\n(DCGM_FI_DEV_XID_ERRORS == {" or DCGM_FI_DEV_XID_ERRORS == ".join(str(x) for x in sorted(l1.critical_xids))})'
              f'\nand\nchanges(DCGM_FI_DEV_XID_ERRORS[{window}]) > 0',
              l1.event_for, "critical",
              f"{GPU} reported XID {{{{ with $labels.xid }}}}{{{{ . }}}}{{{{ else }}}}{{{{ $value }}}}{{{{ end }}}} "
              f"in the last {window}."),
        Alert("GpuUncorrectableMemoryError",
              f"DCGM_FI_DEV_ROW_REMAP_FAILURE > 0\nor\nincrease(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[{window}]) > 0",
              l1.event_for, "critical",
              f"{GPU} has an uncorrectable ECC error or a failed row remap: "
              f"its memory can no longer be trusted."),
        Alert("GpuThrottling",
              f'inferwatch_gpu_clocks_event_active{{reason=~"{regex_alternation(l1.throttle_reasons)}"}} == 1',
              l1.for_, "warning",
              f"{GPU} is slowing its clocks ({{{{ $labels.reason }}}}) for more than {l1.for_}."),
        exporter_down("GpuExporterDown", JOB, for_=l1.exporter_down_for, severity="critical",
                      what="the GPU exporter", has_targets=bool(spec.targets.gpu_exporters)),
    ]
    return [Group("inferwatch-gpu.rules", recording), Group("inferwatch-gpu.alerts", alerts)]
