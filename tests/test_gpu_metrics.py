"""Pure families builder of the GPU exporter, with literal readings: names, labels, units, no sentinels."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from golden import assert_matches_golden, promtool_check_metrics
from inferwatch.exporters.gpu.metrics import CollectionStats, XidCounts, build_families
from inferwatch.exporters.gpu.nvml import MemoryInfo, RemappedRows
from inferwatch.exporters.gpu.pods import PodMap, PodRef
from inferwatch.exporters.gpu.reading import (
    GpuIdentity,
    GpuReading,
    MigReading,
    Snapshot,
)

GOLDEN = Path(__file__).parent / "golden" / "gpu_exporter.metrics"
MIB = 1024 * 1024
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
# Every name the GPU exporter's first version listed (ECC volatile/aggregate totals, remapped rows, remap failure
# included).
REQUIRED_DCGM = [
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
]


def _gpu(index: int, **overrides) -> GpuReading:
    values = dict(
        identity=GpuIdentity(index, f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd", f"00000000:1{index}:00.0",
                             "NVIDIA H100 80GB HBM3"),
        up=True, temperature_c=61, memory_temperature_c=70, power_mw=250_500, energy_mj=123_456_789,
        utilization_gpu_pct=87, utilization_memory_pct=40, fan_speed_pct=55,
        memory=MemoryInfo(total=81559 * MIB, free=1000 * MIB, used=80028 * MIB, reserved=531 * MIB),
        sm_clock_mhz=1980, mem_clock_mhz=2619, clocks_event_reasons=0x20 | 0x4, pcie_replay=3,
        ecc_sbe_volatile=5, ecc_dbe_volatile=1, ecc_sbe_aggregate=50, ecc_dbe_aggregate=2,
        remapped_rows=RemappedRows(correctable=4, uncorrectable=1, pending=True, failure=False),
    )
    values.update(overrides)
    return GpuReading(**values)


def _fleet() -> Snapshot:
    mig = (MigReading(gi_id=1, profile="3g.40gb", memory=MemoryInfo(40192 * MIB, 30000 * MIB, 10192 * MIB, 0),
                      uuid="MIG-11111111-aaaa-bbbb-cccc-dddddddddddd"),
           MigReading(gi_id=9, profile="1g.10gb", memory=MemoryInfo(9728 * MIB, 9216 * MIB, 512 * MIB, 0),
                      uuid="MIG-99999999-aaaa-bbbb-cccc-dddddddddddd"))
    return Snapshot(nvml_up=True, devices=3, driver_version="550.54.15", gpus=(
        _gpu(0),
        _gpu(1, memory_temperature_c=None, ecc_sbe_volatile=None, ecc_dbe_volatile=None, utilization_gpu_pct=None,
             utilization_memory_pct=None, fan_speed_pct=None, mig=mig),
        GpuReading(identity=GpuIdentity(2, "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd", "00000000:12:00.0",
                                        "NVIDIA H100 80GB HBM3"), up=False),
    ))


# Pods holding GPU 0 (by UUID) and MIG instance 9 of GPU 1 (by MIG UUID); GPU 2 (lost) by device name.
PODS = PodMap({"GPU-00000000-aaaa-bbbb-cccc-dddddddddddd": PodRef("llm", "triton-0", "triton"),
               "MIG-99999999-aaaa-bbbb-cccc-dddddddddddd": PodRef("vision", "classifier-7", "server"),
               "nvidia2": PodRef("llm", "triton-1", "triton")})


def _render(snapshot: Snapshot, pods: PodMap | None = None) -> str:
    xids = XidCounts(counts={(0, "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"): {48: 2, 13: 1},
                             (2, "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd"): {79: 1}},
                     last={(0, "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"): 48,
                           (2, "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd"): 79})
    stats = CollectionStats(duration_seconds=0.0125, last_success_unix=1_790_000_000.0,
                            errors={("absent", "NotSupported"): 4, ("device_lost", "GpuIsLost"): 2,
                                    ("blank", "DcgmInt64NotSupported"): 3, ("out_of_range", "AbovePhysicalRange"): 1})

    class _Static:
        def collect(self):
            return iter(build_families(snapshot, "node-a", xids, stats, preset_xids=(48, 79), pods=pods))

    registry = CollectorRegistry()
    registry.register(_Static())
    return generate_latest(registry).decode()


def _samples(text: str) -> list:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def _by_name(text: str, name: str) -> list:
    return [s for s in _samples(text) if s.name == name]


def test_every_listed_name_carries_the_dcgm_label_set():
    text = _render(_fleet())
    for name in REQUIRED_DCGM:
        samples = _by_name(text, name)
        assert samples, f"{name} missing"
        assert set(samples[0].labels) == DCGM_LABELS, (name, samples[0].labels)
    s = _by_name(text, "DCGM_FI_DEV_GPU_TEMP")[0]
    assert s.labels == {"gpu": "0", "UUID": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
                        "pci_bus_id": "00000000:10:00.0", "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
                        "Hostname": "node-a", "DCGM_FI_DRIVER_VERSION": "550.54.15"}


def test_units_follow_dcgm_exporter():
    text = _render(_fleet())

    def value(name, gpu="0"):
        return next(s.value for s in _by_name(text, name) if s.labels["gpu"] == gpu and "GPU_I_ID" not in s.labels)

    assert value("DCGM_FI_DEV_POWER_USAGE") == 250.5          # mW -> W
    assert value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 123_456_789  # mJ kept
    assert value("DCGM_FI_DEV_FB_USED") == 80028              # bytes -> MiB
    assert value("DCGM_FI_DEV_FB_FREE") == 1000
    assert value("DCGM_FI_DEV_FB_RESERVED") == 531
    assert value("DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == 0x24
    assert value("DCGM_FI_DEV_ROW_REMAP_PENDING") == 1
    assert value("DCGM_FI_DEV_XID_ERRORS") == 48 and value("DCGM_FI_DEV_XID_ERRORS", "1") == 0
    assert value("DCGM_FI_DEV_FAN_SPEED") == 55


def test_missing_fields_give_no_series_and_no_sentinel():
    text = _render(_fleet())
    gpu1 = {s.name for s in _samples(text) if s.labels.get("gpu") == "1"}
    for absent in ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_GPU_UTIL",
                   "DCGM_FI_DEV_FAN_SPEED"):
        assert absent not in gpu1
    assert "DCGM_FI_DEV_GPU_TEMP" in gpu1
    for s in _samples(text):
        assert math.isfinite(s.value) and 0 <= s.value < 2**53, (s.name, s.labels, s.value)


def test_lost_gpu_is_up_0_with_no_values_and_others_still_reported():
    text = _render(_fleet())
    up = {s.labels["gpu"]: s.value for s in _by_name(text, "inferwatch_gpu_up")}
    assert up == {"0": 1, "1": 1, "2": 0}
    assert set(_by_name(text, "inferwatch_gpu_up")[0].labels) == {"gpu", "UUID", "Hostname"}
    lost = {s.name: s.value for s in _samples(text) if s.labels.get("gpu") == "2" and s.name.startswith("DCGM_")}
    assert lost == {"DCGM_FI_DEV_XID_ERRORS": 79}    # its readings go, its last XID (the reason) stays
    assert {s.labels["xid"]: s.value for s in _by_name(text, "inferwatch_gpu_xid_errors_total")
            if s.labels["gpu"] == "2"} == {"48": 0, "79": 1}
    assert {s.labels["gpu"] for s in _by_name(text, "DCGM_FI_DEV_GPU_TEMP")} == {"0", "1"}


def test_mig_instances_add_gpu_instance_labels_with_their_own_memory():
    text = _render(_fleet())
    used = _by_name(text, "DCGM_FI_DEV_FB_USED")
    mig = {s.labels["GPU_I_ID"]: (s.labels["GPU_I_PROFILE"], s.value) for s in used if "GPU_I_ID" in s.labels}
    assert mig == {"1": ("3g.40gb", 10192), "9": ("1g.10gb", 512)}
    for s in used:
        if "GPU_I_ID" in s.labels:
            assert set(s.labels) == DCGM_LABELS | {"GPU_I_PROFILE", "GPU_I_ID"} and s.labels["gpu"] == "1"
    assert [s.value for s in used if s.labels["gpu"] == "1" and "GPU_I_ID" not in s.labels] == [80028]


def test_clocks_event_reasons_split_per_reason():
    text = _render(_fleet())
    active = {s.labels["reason"]: s.value for s in _by_name(text, "inferwatch_gpu_clocks_event_active")
              if s.labels["gpu"] == "0"}
    assert active["sw_thermal_slowdown"] == 1 and active["sw_power_cap"] == 1
    assert sum(active.values()) == 2 and len(active) == 9
    assert {"gpu_idle", "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sync_boost",
            "applications_clocks_setting", "display_clock_setting"} <= set(active)


def test_xid_counters_by_code_with_preset_zeros():
    text = _render(_fleet())
    xid = {(s.labels["gpu"], s.labels["xid"]): s.value for s in _by_name(text, "inferwatch_gpu_xid_errors_total")}
    assert xid[("0", "48")] == 2 and xid[("0", "13")] == 1 and xid[("0", "79")] == 0
    assert xid[("2", "48")] == 0 and ("1", "13") not in xid   # presets on every GPU, seen codes where seen


def test_self_metrics():
    text = _render(_fleet())
    assert _by_name(text, "inferwatch_gpu_devices")[0].value == 3
    (nvml_up,) = _by_name(text, "inferwatch_gpu_nvml_up")
    assert (nvml_up.labels, nvml_up.value) == ({"Hostname": "node-a"}, 1)   # one node-level series
    assert _by_name(text, "inferwatch_gpu_collection_duration_seconds")[0].value == 0.0125
    assert _by_name(text, "inferwatch_gpu_last_collection_success_timestamp_seconds")[0].value == 1_790_000_000
    errs = {(s.labels["class"], s.labels["error"]): s.value for s in _by_name(text, "inferwatch_gpu_nvml_errors_total")}
    assert errs == {("absent", "NotSupported"): 4, ("device_lost", "GpuIsLost"): 2,
                    ("blank", "DcgmInt64NotSupported"): 3, ("out_of_range", "AbovePhysicalRange"): 1}


def test_no_nvml_exports_zero_devices():
    text = _render(Snapshot(nvml_up=False))
    assert _by_name(text, "inferwatch_gpu_devices")[0].value == 0
    assert _by_name(text, "inferwatch_gpu_nvml_up")[0].value == 0
    assert not _by_name(text, "inferwatch_gpu_up")


def test_pod_labels_on_the_gpu_and_the_mig_instance_a_pod_holds():
    text = _render(_fleet(), PODS)
    pod_of = {(s.name, s.labels["gpu"], s.labels.get("GPU_I_ID", "")): s.labels.get("pod")
              for s in _samples(text) if "gpu" in s.labels}
    assert pod_of[("DCGM_FI_DEV_GPU_TEMP", "0", "")] == "triton-0"
    assert pod_of[("inferwatch_gpu_up", "0", "")] == "triton-0"
    assert pod_of[("DCGM_FI_DEV_FB_USED", "1", "9")] == "classifier-7"
    assert pod_of[("DCGM_FI_DEV_FB_USED", "1", "1")] is None      # the other instance: no pod holds it
    assert pod_of[("DCGM_FI_DEV_FB_USED", "1", "")] is None       # the parent of a MIG instance: not the pod's
    assert pod_of[("DCGM_FI_DEV_XID_ERRORS", "2", "")] == "triton-1"  # lost GPU, named by device name
    assert pod_of[("inferwatch_gpu_xid_errors_total", "0", "")] is None  # counters keep their series
    held = next(s for s in _by_name(text, "DCGM_FI_DEV_FB_USED") if s.labels.get("GPU_I_ID") == "9")
    assert set(held.labels) == DCGM_LABELS | {"GPU_I_PROFILE", "GPU_I_ID", "namespace", "pod", "container"}
    assert (held.labels["namespace"], held.labels["container"]) == ("vision", "server")


def test_golden_metrics_text():
    assert_matches_golden(_render(_fleet(), PODS), GOLDEN)


def test_golden_passes_promtool_check_metrics():
    proc = promtool_check_metrics(GOLDEN)
    # dcgm-exporter compatibility fixes some names promtool's linter dislikes (camelCase labels such as
    # modelName/UUID/Hostname; "COUNTER" inside DCGM_FI_DEV_PCIE_REPLAY_COUNTER). Those lints, and only
    # those, are accepted: a parse error or any other lint fails.
    accepted = ("label names should be written in 'snake_case' not 'camelCase'",
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'")
    problems = [line for line in (proc.stdout + proc.stderr).splitlines()
                if line.strip() and not (line.startswith("DCGM_") and line.endswith(accepted))]
    assert problems == [], problems
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr  # 3 = lint findings only
