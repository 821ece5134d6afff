"""L1 GPU fleet: temperature, memory, utilization, power, XID events, throttling and `up`, per node and GPU.

Reads dcgm-exporter names (DCGM_FI_DEV_*) through the spec's GPU selector (`selectors.gpu`), so it works with
dcgm-exporter or the inferwatch GPU exporter; the clocks-event reasons and per-GPU `up` panels need the
inferwatch exporter, the XID panel reads either exporter's XIDs. `namespace` and `pod` select the GPUs a pod
holds (both exporters label a GPU with the pod holding it; GPUs no pod holds show under All). Threshold lines
are the spec's L1 alert thresholds (`layers.L1`).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from inferwatch.dashboards.builders import (
    dashboard,
    query,
    runbook_data_link,
    runbook_links,
    stat_panel,
    table_panel,
    table_query,
    timeseries_panel,
    variable,
)
from inferwatch.rules import identity
from inferwatch.rules.builders import regex_alternation
from inferwatch.rules.gpu import MEMORY_RATIO, changed
from inferwatch.spec import Spec

NODE, GPU, NAMESPACE = 'node=~"$node"', 'gpu=~"$gpu"', 'namespace=~"$namespace"'
SEL = f'{NODE}, {GPU}, {NAMESPACE}, pod=~"$pod"'
TEMP = "DCGM_FI_DEV_GPU_TEMP"
LEGEND = "{{node}} GPU {{gpu}}"
MAIN_PANEL = "GPU temperature"


def build(spec: Spec) -> db.Dashboard:
    l1 = spec.layers.L1
    gpu = spec.selectors.of("gpu")
    # The node label of the GPU source (spec `identity.gpu.node`: dcgm-exporter under the GPU Operator writes
    # `Hostname`); the variable keeps its name `$node`.
    n = spec.identity.gpu.node
    node_m = f'{n}=~"$node"'
    sel, legend = f'{node_m}, {GPU}, {NAMESPACE}, pod=~"$pod"', LEGEND.replace("{{node}}", f"{{{{{n}}}}}")
    up = gpu("up", node_m)
    throttle = regex_alternation(l1.throttle_reasons)
    reason = f'reason=~"{throttle}"'
    xid_gauge = f"max by ({n}, gpu) ({gpu('DCGM_FI_DEV_XID_ERRORS', sel)})"
    board = (dashboard("gpu", "L1 infrastructure: every GPU's health, per node. Alerts of this layer page.")
             .with_variable(variable("node", "Node", f"label_values({gpu(TEMP)}, {n})"))
             .with_variable(variable("gpu", "GPU", f"label_values({gpu(TEMP, node_m)}, gpu)"))
             .with_variable(variable("namespace", "Namespace", f"label_values({gpu(TEMP, node_m, GPU)}, namespace)"))
             .with_variable(variable("pod", "Pod", f"label_values({gpu(TEMP, node_m, GPU, NAMESPACE)}, pod)")))
    board = board.with_row(db.Row("Health"))
    board = board.with_panel(stat_panel(
        "GPUs lost or unreadable", "GPUs whose NVML reads fail or that fell off the bus (inferwatch_gpu_up 0). "
        "Any value above 0 pages (GpuLost).", "none",
        [query(f'count({gpu("inferwatch_gpu_up", sel)} == 0) or vector(0)', "lost")],
        links=runbook_links(spec, ["GpuLost"]), thresholds=[(1, "red")]))
    board = board.with_panel(stat_panel(
        "GPU exporters up", f"Scraped GPU exporter targets answering / all targets ({gpu.describe()}). "
        "Below 100 % the L1 alerts are blind for that node (GpuExporterDown).", "percentunit",
        [query(f"avg({up})", "up")],
        links=runbook_links(spec, ["GpuExporterDown"]), thresholds=[(0, "red"), (1, "green")]))
    board = board.with_panel(stat_panel(
        "Hottest GPU", "Highest current GPU temperature in the selection; red from the critical threshold "
        f"({l1.temperature_critical_celsius:g} °C, GpuTemperatureCritical).", "celsius",
        [query(f'max({gpu("DCGM_FI_DEV_GPU_TEMP", sel)})', "max")],
        links=runbook_links(spec, ["GpuTemperatureCritical"]),
        thresholds=[(l1.temperature_critical_celsius - 10, "orange"), (l1.temperature_critical_celsius, "red")]))
    board = board.with_panel(table_panel(
        "Firing L1 alerts", "GPU (L1) alerts firing now, one row per alert and device; click an alert name "
        "for its runbook.", "none",
        [table_query(f'sum by (alertname, severity, {n}, gpu) (ALERTS{{alertstate="firing", layer="L1", '
                     f'{node_m}}})')], w=6, h=5).data_links([runbook_data_link(spec)]))
    board = board.with_row(db.Row("Thermals and power"))
    board = board.with_panel(timeseries_panel(
        MAIN_PANEL, "GPU core temperature (DCGM_FI_DEV_GPU_TEMP). The dashed line is the critical threshold "
        "of GpuTemperatureCritical; most datacenter GPUs slow their clocks from about 87 °C.", "celsius",
        [query(gpu("DCGM_FI_DEV_GPU_TEMP", sel), legend)],
        links=runbook_links(spec, ["GpuTemperatureCritical"]),
        thresholds=[(l1.temperature_critical_celsius, "red")]))
    board = board.with_panel(timeseries_panel(
        "Power draw", "Board power draw (DCGM_FI_DEV_POWER_USAGE), watts.", "watt",
        [query(gpu("DCGM_FI_DEV_POWER_USAGE", sel), legend)], min_val=0))
    board = board.with_panel(timeseries_panel(
        "Clocks slowed (throttling)", "Active clocks-event reasons per GPU (inferwatch_gpu_clocks_event_active"
        f" 1). Thermal and power-brake reasons ({', '.join(l1.throttle_reasons)}) fire GpuThrottling; "
        "gpu_idle and sw_power_cap are normal.", "none",
        [query(f'{gpu("inferwatch_gpu_clocks_event_active", sel)} == 1', legend + " {{reason}}")],
        links=runbook_links(spec, ["GpuThrottling"]), min_val=0, max_val=1))
    board = board.with_panel(timeseries_panel(
        "Throttling for alerting reasons", "GPUs slowed by the reasons GpuThrottling watches "
        f"({throttle}), count per node.", "none",
        [query(f"count by ({n}) ({gpu('inferwatch_gpu_clocks_event_active', sel, reason)} == 1)",
               f"{{{{{n}}}}}")],
        links=runbook_links(spec, ["GpuThrottling"]), min_val=0))
    board = board.with_row(db.Row("Memory and load"))
    board = board.with_panel(timeseries_panel(
        "Framebuffer memory used", f"Used / (used + free + reserved) framebuffer ({MEMORY_RATIO}). Dashed "
        f"lines: warning {l1.memory_used_warning_ratio:.0%} (GpuMemoryUsageHigh) and critical "
        f"{l1.memory_used_critical_ratio:.0%} (GpuMemoryUsageCritical).", "percentunit",
        # The ratio is per MIG instance without pod labels (rules/identity.py): the pod filter selects the
        # instances whose framebuffer series that pod holds.
        [query(f"{MEMORY_RATIO}{{{NODE}, {GPU}}}\nand on (UUID, GPU_I_ID)\n{gpu('DCGM_FI_DEV_FB_USED', sel)}",
               legend + "{{GPU_I_ID}}")],
        links=runbook_links(spec, ["GpuMemoryUsageHigh", "GpuMemoryUsageCritical"]),
        thresholds=[(l1.memory_used_warning_ratio, "orange"), (l1.memory_used_critical_ratio, "red")],
        min_val=0, max_val=1))
    board = board.with_panel(timeseries_panel(
        "Framebuffer memory used (MiB)", "Framebuffer used (DCGM_FI_DEV_FB_USED), MiB as dcgm-exporter "
        "reports it.", "mbytes", [query(gpu("DCGM_FI_DEV_FB_USED", sel), legend)], min_val=0))
    board = board.with_panel(timeseries_panel(
        "GPU utilization", "Share of time a kernel ran, per GPU or MIG instance: DCGM_FI_DEV_GPU_UTIL, else "
        "(MIG instances have none) the profiling field DCGM_FI_PROF_GR_ENGINE_ACTIVE. High utilization with low "
        "throughput upstream points to the model, not the GPU.", "percentunit",
        [query(identity.utilization(gpu, sel, keep=identity.GPU_INSTANCE + ("namespace", "pod")),
               legend + "{{GPU_I_ID}}")], min_val=0, max_val=1))
    board = board.with_panel(timeseries_panel(
        "Memory copy utilization", "Percent of time the memory controller was busy "
        "(DCGM_FI_DEV_MEM_COPY_UTIL).", "percent",
        [query(gpu("DCGM_FI_DEV_MEM_COPY_UTIL", sel), legend)], min_val=0, max_val=100))
    board = board.with_row(db.Row("Errors"))
    board = board.with_panel(timeseries_panel(
        "XID events", "XID errors per code (inferwatch_gpu_xid_errors_total increase; with dcgm-exporter its "
        "DCGM_EXP_XID_ERRORS_COUNT where enabled, else the code its last-XID gauge DCGM_FI_DEV_XID_ERRORS "
        "changed to). Codes in the spec's "
        f"critical list ({', '.join(map(str, sorted(l1.critical_xids)))}) page (GpuXidCritical, XID 79 "
        "GpuLost); 13, 31, 43 are application faults.", "short",
        [query(f"sum by ({n}, gpu, xid) (increase({gpu('inferwatch_gpu_xid_errors_total', sel)}"
               "[$__rate_interval])) > 0", legend + " XID {{xid}}"),
         query(f"sum by ({n}, gpu, xid) ({gpu('DCGM_EXP_XID_ERRORS_COUNT', sel)}) > 0", legend + " XID {{xid}}"),
         query(f"{xid_gauge} > 0\nand\n{changed(xid_gauge, '$__rate_interval')}", legend + " last XID changed")],
        links=runbook_links(spec, ["GpuXidCritical", "GpuLost"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "Uncorrectable memory errors", "Double-bit ECC errors (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL increase) and "
        "failed row remaps (DCGM_FI_DEV_ROW_REMAP_FAILURE). Any of them pages (GpuUncorrectableMemoryError).",
        "short",
        [query(f"increase({gpu('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL', sel)}[$__rate_interval])", legend + " ECC DBE"),
         query(gpu("DCGM_FI_DEV_ROW_REMAP_FAILURE", sel), legend + " row remap failed")],
        links=runbook_links(spec, ["GpuUncorrectableMemoryError"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "GPU up", "1 while NVML reads the GPU (inferwatch_gpu_up); 0 means lost or unreadable (GpuLost).",
        "bool", [query(gpu("inferwatch_gpu_up", sel), legend)],
        links=runbook_links(spec, ["GpuLost"]), min_val=0, max_val=1))
    board = board.with_panel(timeseries_panel(
        "Exporter scrape up", f"Prometheus `up` of each GPU exporter target ({gpu.describe()}).", "bool",
        [query(up, f"{{{{{n}}}}} {{{{instance}}}}")],
        links=runbook_links(spec, ["GpuExporterDown"]), min_val=0, max_val=1))
    return board
