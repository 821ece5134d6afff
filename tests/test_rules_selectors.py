"""The rules with selectors as the Prometheus Operator writes them, in promtool (Prometheus' own rule engine):

- every exporter-down alert stays silent while its source's targets are scraped and fires when they vanish
  (or one stops answering), naming the source by its selector's labels;
- dcgm-exporter as the GPU Operator ships it is a first-class GPU source: series with its label set
  (`hostname` from 4.8.3, `Hostname` before; `namespace`/`pod`/`container` of the pod holding a GPU; its
  last-XID gauge labelled by the code) and no `inferwatch_gpu_*` series at all fire the L1 alerts with exact
  labels and annotations, and stay silent when healthy.

The promtool test files are written here, next to rules generated from the repository's spec with the
operator selectors (tests/test_selectors.py OPERATOR)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.rules.generate import RULES_DIR, outputs
from inferwatch.rules.names import ALERTS, alerts_of_layer
from selector_support import OPERATOR, spec_with
from test_rules import promtool

RUNBOOKS = "https://github.com/inferwatch/inferwatch/blob/main/runbooks/"
DCGM_JOB = "gpu-operator/nvidia-dcgm-exporter"
# What each operator-scraped target carries: the selector's labels, instance, the node (a relabeling).
TARGETS = {
    "gpu": {"job": DCGM_JOB, "instance": "10.0.0.1:9400", "node": "gpu-a"},
    "triton": {"job": "triton-metrics", "namespace": "triton", "service": "triton-metrics",
               "instance": "10.0.1.1:8002", "node": "gpu-a", "triton": "triton-metrics"},
    "triton_collector": {"job": "inferwatch-triton-collector", "namespace": "monitoring",
                         "service": "inferwatch-triton-collector", "instance": "10.0.2.1:9401", "node": "cpu-a"},
    "gateway": {"job": "inferwatch-gateway", "namespace": "monitoring", "service": "inferwatch-gateway",
                "instance": "10.0.2.2:9402", "node": "cpu-a"},
    "notifier": {"job": "inferwatch-notifier", "namespace": "monitoring", "service": "inferwatch-notifier",
                 "instance": "10.0.2.3:9410", "node": "cpu-b"},
}
DOWN = {"gpu": ("GpuExporterDown", "L1", "critical"), "triton": ("TritonServerDown", "L2", "critical"),
        "triton_collector": ("TritonCollectorDown", "L2", "warning"),
        "gateway": ("GatewayExporterDown", "L3", "warning"), "notifier": ("NotifierDown", "L1", "critical")}


def series(name: str, labels: dict) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory) -> Path:
    """The rule files generated with the operator selectors."""
    root = tmp_path_factory.mktemp("operator-rules")
    for rel, text in outputs(spec_with(OPERATOR)).items():
        if rel.startswith(RULES_DIR):
            (root / Path(rel).name).write_text(text)
    return root


def run_promtool(rules_dir: Path, name: str, tests: list[dict], files=("gpu", "triton", "llm", "notifier")):
    path = rules_dir / f"{name}.test.yml"
    groups = [g["name"] for f in files for g in yaml.safe_load((rules_dir / f"{f}.yml").read_text())["groups"]]
    order = [g for g in groups if g.endswith(".rules")] + [g for g in groups if not g.endswith(".rules")]
    path.write_text(yaml.safe_dump({"rule_files": [f"{f}.yml" for f in files], "evaluation_interval": "1m",
                                    "group_eval_order": order, "tests": tests}, sort_keys=False, width=10**6))
    out = subprocess.run([promtool(), "test", "rules", path.name], cwd=rules_dir, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "SUCCESS" in out.stdout


def expected(alert: str, labels: dict, description: str) -> dict:
    info = ALERTS[alert]
    return {"exp_labels": labels, "exp_annotations": {"summary": info.summary, "description": description,
                                                      "runbook_url": f"{RUNBOOKS}{alert}.md"}}


# --------------------------------------------------------------------------------------- exporter down
def test_exporter_down_alerts_follow_the_operator_selectors(rules_dir):
    """Silent while every source's targets answer (no series of the default jobs exists at all, which is what
    made GpuExporterDown fire for ever before), then each fires once its targets vanish; a second GPU exporter
    pod that stops answering fires with its own labels after `for`."""
    inputs = [{"series": series("up", TARGETS[s]), "values": "1x10"} for s in TARGETS]
    broken = {**TARGETS["gpu"], "instance": "10.0.0.2:9400", "node": "gpu-b"}
    inputs.append({"series": series("up", broken), "values": "1x5 0x5"})
    quiet = [{"eval_time": "9m", "alertname": DOWN[s][0]} for s in TARGETS]
    quiet += [{"eval_time": "12m", "alertname": DOWN[s][0]} for s in TARGETS if s != "gpu"]
    describe = {
        "gpu": "Prometheus cannot scrape the GPU exporter (job gpu-operator/nvidia-dcgm-exporter): its alerts "
               "cannot fire while it is down.",
        "triton": "Triton (every target of namespace triton, service triton-metrics) does not answer (metrics "
                  "endpoint down or liveness failing): every model it serves is unavailable.",
        "triton_collector": "Prometheus cannot scrape the inferwatch Triton collector (namespace monitoring, service "
                            "inferwatch-triton-collector): its alerts cannot fire while it is down.",
        "gateway": "Prometheus cannot scrape the gateway exporter (namespace monitoring, service "
                   "inferwatch-gateway): its alerts cannot fire while it is down.",
        "notifier": "Prometheus cannot scrape the notifier (namespace monitoring, service inferwatch-notifier): "
                    "its alerts cannot fire while it is down.",
    }
    gone = []
    for source, (alert, layer, severity) in DOWN.items():
        labels = {k: v for k, v in TARGETS[source].items() if k in ("job", "namespace", "service")}
        if source != "gpu":
            labels.pop("job")  # absent() keeps the selector's `=` labels only
        labels.update(layer=layer, severity=severity, **({"component": "notifier"} if source == "notifier" else {}))
        gone.append({"eval_time": "30m", "alertname": alert, "exp_alerts": [expected(alert, labels, describe[source])]})
    gone.append({"eval_time": "12m", "alertname": "GpuExporterDown", "exp_alerts": [
        expected("GpuExporterDown", {**broken, "layer": "L1", "severity": "critical"},
                 "Prometheus cannot scrape the GPU exporter at 10.0.0.2:9400 (job gpu-operator/nvidia-dcgm-exporter, "
                 "node gpu-b): its alerts cannot fire while it is down.")]})
    run_promtool(rules_dir, "exporter-down", [{
        "name": "operator selectors: silent while scraped, firing once the targets vanish",
        "interval": "1m", "input_series": inputs, "alert_rule_test": quiet + gone}])


# ----------------------------------------------------------------------------------------- dcgm-exporter
def dcgm(metric: str, gpu: int, *, host: str = "Hostname", node: str | None = "gpu-a",
         instance: str = "10.0.0.1:9400", pod: tuple[str, str, str] | None = None, **extra) -> str:
    """A dcgm-exporter series in its label order (render template: gpu, UUID, pci_bus_id, device, modelName,
    host, the driver version label row, then attributes such as the pod holding the GPU), plus the target
    labels the ServiceMonitor gives it (job, instance, the node from a relabeling)."""
    labels = {"gpu": str(gpu), "UUID": f"GPU-{gpu:04d}-aaaa", "pci_bus_id": f"00000000:{gpu + 0x18:02X}:00.0",
              "device": f"nvidia{gpu}", "modelName": "NVIDIA H100 80GB HBM3", host: "gpu-host-a",
              "DCGM_FI_DRIVER_VERSION": "570.124.06"}
    if pod:
        labels.update(zip(("namespace", "pod", "container"), pod, strict=False))
    labels.update(extra)
    labels.update(job=DCGM_JOB, instance=instance)
    if node:
        labels["node"] = node
    return series(metric, labels)


def labels_of(text: str) -> dict:
    """The labels of a series written by `series` (no comma or quote inside values)."""
    inner = text.split("{", 1)[1].rstrip("}")
    return {k: v.strip('"') for k, v in (part.split("=", 1) for part in inner.split(","))}


L1 = [a for a in alerts_of_layer("L1") if not a.startswith("Notifier")]
CRITICAL = {"layer": "L1", "severity": "critical"}
POD = ("inference", "llm-0", "triton")
HEALTHY = {  # dcgm-exporter's default fields (etc/default-counters.csv) for one GPU, as a calm H100 reads
    "DCGM_FI_DEV_GPU_TEMP": "44", "DCGM_FI_DEV_MEMORY_TEMP": "52", "DCGM_FI_DEV_POWER_USAGE": "118.5",
    "DCGM_FI_DEV_GPU_UTIL": "12", "DCGM_FI_DEV_MEM_COPY_UTIL": "3", "DCGM_FI_DEV_FB_USED": "20480",
    "DCGM_FI_DEV_FB_FREE": "60520", "DCGM_FI_DEV_FB_RESERVED": "559", "DCGM_FI_DEV_ROW_REMAP_FAILURE": "0",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "0", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "0",
}


def test_dcgm_exporter_as_it_ships_drives_the_gpu_alerts(rules_dir):
    gpu_a = "GPU 0 (GPU-0000-aaaa) on node gpu-a"
    tests = []
    # Healthy: every default field of two GPUs (one held by a pod), the old and the new host label, no
    # inferwatch_gpu_* series at all: no L1 alert, no GpuExporterDown.
    healthy = [{"series": dcgm(m, g, host=h, pod=POD if g == 0 else None), "values": f"{v}x15"}
               for m, v in HEALTHY.items() for g, h in ((0, "hostname"), (1, "Hostname"))]
    healthy += [{"series": dcgm("DCGM_FI_DEV_XID_ERRORS", g, err_code="0", err_msg="No Error"), "values": "0x15"}
                for g in (0, 1)]
    healthy.append({"series": series("up", TARGETS["gpu"]), "values": "1x15"})
    tests.append({"name": "dcgm-exporter healthy: no GPU alert", "interval": "1m", "input_series": healthy,
                  "alert_rule_test": [{"eval_time": t, "alertname": a} for a in L1 for t in ("5m", "15m")]})

    # Hot GPU held by a pod; the page names the exporter's host label (hostname from 4.8.3) and node, and the
    # pod in its description, never in its labels (a rescheduled pod is the same incident: rules/identity.py);
    # a GPU whose target has no `node` is named by its host label instead.
    hot = dcgm("DCGM_FI_DEV_GPU_TEMP", 0, host="hostname", pod=POD)
    hot_b = dcgm("DCGM_FI_DEV_GPU_TEMP", 3, host="hostname", node=None, instance="10.0.0.9:9400")
    hot_b_alert = expected("GpuTemperatureCritical", {**labels_of(hot_b), **CRITICAL},
                           "GPU 3 (GPU-0003-aaaa) on node gpu-host-a is at 91 °C (critical above 85 °C).")
    held = dcgm("DCGM_FI_DEV_FB_USED", 0, host="hostname", pod=POD)
    hot_labels = {k: v for k, v in labels_of(hot).items() if k not in ("namespace", "pod", "container")}
    tests.append({"name": "dcgm-exporter: GpuTemperatureCritical names the pod, without its labels", "interval": "1m",
                  "input_series": [{"series": hot, "values": "70 70 90x10"}, {"series": hot_b, "values": "91x10"},
                                   {"series": held, "values": "20480x12"},
                                   {"series": series("up", TARGETS["gpu"]), "values": "1x12"}],
                  "alert_rule_test": [
                      {"eval_time": "3m", "alertname": "GpuTemperatureCritical", "exp_alerts": [hot_b_alert]},
                      {"eval_time": "5m", "alertname": "GpuTemperatureCritical", "exp_alerts": [
                          expected("GpuTemperatureCritical", {**hot_labels, **CRITICAL},
                                   f"{gpu_a} is at 90 °C (critical above 85 °C). Pods on it: inference/llm-0."),
                          hot_b_alert]}]})

    # XID 79 in dcgm-exporter's last-XID gauge: it labels the value (err_code, err_msg), so the code changing
    # starts a new series. GpuLost and GpuXidCritical fire at once, then resolve once the change leaves the
    # window; an application XID (13) on GPU 1 never pages.
    before = dcgm("DCGM_FI_DEV_XID_ERRORS", 0, err_code="0", err_msg="No Error")
    after = dcgm("DCGM_FI_DEV_XID_ERRORS", 0, err_code="79", err_msg="GPU has fallen off the bus")
    app_before = dcgm("DCGM_FI_DEV_XID_ERRORS", 1, err_code="0", err_msg="No Error")
    app = dcgm("DCGM_FI_DEV_XID_ERRORS", 1, err_code="13", err_msg="Graphics Engine Exception")
    xid_labels = {"job": DCGM_JOB, "instance": "10.0.0.1:9400", "node": "gpu-a", "gpu": "0",
                  "UUID": "GPU-0000-aaaa", "Hostname": "gpu-host-a", "modelName": "NVIDIA H100 80GB HBM3"}
    lost_labels = {k: v for k, v in xid_labels.items() if k != "modelName"}
    tests.append({"name": "dcgm-exporter: XID 79 from the last-XID gauge", "interval": "1m", "input_series": [
        {"series": before, "values": "0 0 0 stale"}, {"series": after, "values": "_x3 79x12"},
        {"series": app_before, "values": "0 0 0 stale"}, {"series": app, "values": "_x3 13x12"},
        {"series": series("up", TARGETS["gpu"]), "values": "1x15"}],
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "GpuXidCritical"},
            # XID 79 is GpuLost's alone (one fault, one page); 13 is an application fault
            {"eval_time": "5m", "alertname": "GpuXidCritical"},
            {"eval_time": "5m", "alertname": "GpuLost", "exp_alerts": [
                # reduced to the labels every GpuLost branch shares: no modelName, no err_code
                expected("GpuLost", {**lost_labels, "layer": "L1", "severity": "critical"},
                         f"{gpu_a} is lost: its workloads fail until the node is drained and the GPU reset or "
                         "replaced.")]},
            {"eval_time": "12m", "alertname": "GpuXidCritical"},  # the gauge still reads 79: nothing new
            {"eval_time": "12m", "alertname": "GpuLost"}]})

    # dcgm-exporter's windowed XID count (DCGM_EXP_XID_ERRORS_COUNT, when enabled in its field list) carries
    # the code as `xid`; the gauge branch then stands aside, so the XID pages once.
    count = dcgm("DCGM_EXP_XID_ERRORS_COUNT", 2, window_size_in_ms="300000", xid="48")
    quiet = dcgm("DCGM_EXP_XID_ERRORS_COUNT", 1, window_size_in_ms="300000")
    gauge = dcgm("DCGM_FI_DEV_XID_ERRORS", 2, err_code="48", err_msg="Double Bit ECC Error")
    tests.append({"name": "dcgm-exporter: XID 48 from its windowed count", "interval": "1m", "input_series": [
        {"series": count, "values": "0 0 1x5 0x5"}, {"series": quiet, "values": "0x12"},
        {"series": dcgm("DCGM_FI_DEV_XID_ERRORS", 2, err_code="0", err_msg="No Error"), "values": "0 0 stale"},
        {"series": gauge, "values": "_ _ 48x10"}, {"series": series("up", TARGETS["gpu"]), "values": "1x12"}],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "GpuXidCritical"},
            {"eval_time": "3m", "alertname": "GpuXidCritical", "exp_alerts": [
                expected("GpuXidCritical", {**labels_of(count), "layer": "L1", "severity": "critical"},
                         "GPU 2 (GPU-0002-aaaa) on node gpu-a reported XID 48 in the last 5m.")]},
            {"eval_time": "10m", "alertname": "GpuXidCritical"}]})

    # A GPU that stops reporting while its exporter answers is lost (dcgm-exporter has no per-GPU up); an
    # exporter restart (new pod, new instance) or a node leaving loses no GPU.
    gone = dcgm("DCGM_FI_DEV_GPU_TEMP", 1, host="hostname")
    stays = dcgm("DCGM_FI_DEV_GPU_TEMP", 0, host="hostname")
    old = dcgm("DCGM_FI_DEV_GPU_TEMP", 5, node="gpu-c", instance="10.0.0.5:9400")
    new = dcgm("DCGM_FI_DEV_GPU_TEMP", 5, node="gpu-c", instance="10.0.0.6:9400")
    vanished = {"job": DCGM_JOB, "instance": "10.0.0.1:9400", "node": "gpu-a", "gpu": "1", "UUID": "GPU-0001-aaaa",
                "hostname": "gpu-host-a", **CRITICAL}
    lost = expected("GpuLost", vanished, "GPU 1 (GPU-0001-aaaa) on node gpu-a is lost: its workloads fail until the "
                                         "node is drained and the GPU reset or replaced.")
    tests.append({"name": "dcgm-exporter: a GPU whose series vanished while the exporter answers", "interval": "1m",
                  "input_series": [
                      {"series": gone, "values": "50 50 50 stale"}, {"series": stays, "values": "50x20"},
                      {"series": series("up", TARGETS["gpu"]), "values": "1x20"},
                      {"series": old, "values": "50 50 50 stale"}, {"series": new, "values": "_ _ _ 50x17"},
                      {"series": series("up", {**TARGETS["gpu"], "instance": "10.0.0.5:9400", "node": "gpu-c"}),
                       "values": "1 1 1 stale"},
                      {"series": series("up", {**TARGETS["gpu"], "instance": "10.0.0.6:9400", "node": "gpu-c"}),
                       "values": "_ _ _ 1x17"}],
                  "alert_rule_test": [
                      {"eval_time": "3m", "alertname": "GpuLost"},
                      {"eval_time": "6m", "alertname": "GpuLost", "exp_alerts": [lost]},
                      {"eval_time": "20m", "alertname": "GpuLost", "exp_alerts": [lost]},
                      {"eval_time": "20m", "alertname": "GpuExporterDown"}]})

    # Clocks-event reasons from dcgm-exporter's bitmask field (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, added to its
    # field list): 0x41 = idle + hardware thermal slowdown pages after `for`; 0x4 (power cap) never does.
    hot_clocks = dcgm("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0)
    capped = dcgm("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1)
    tests.append({"name": "dcgm-exporter: GpuThrottling from the clocks-event bitmask", "interval": "1m",
                  "input_series": [{"series": hot_clocks, "values": "1 65x10"}, {"series": capped, "values": "4x10"},
                                   {"series": series("up", TARGETS["gpu"]), "values": "1x10"}],
                  "alert_rule_test": [
                      {"eval_time": "2m", "alertname": "GpuThrottling"},
                      {"eval_time": "4m", "alertname": "GpuThrottling", "exp_alerts": [
                          expected("GpuThrottling",
                                   {**labels_of(hot_clocks), "reason": "hw_thermal_slowdown", "layer": "L1",
                                    "severity": "warning"},
                                   f"{gpu_a} is slowing its clocks (hw_thermal_slowdown) for more than 2m.")]}]})
    run_promtool(rules_dir, "dcgm-exporter", tests, files=("gpu",))
