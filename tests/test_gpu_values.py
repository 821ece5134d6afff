"""Readings as a GPU gives them, through the simulated NVML and real scrapes: blank sentinels and impossible
values are dropped and counted (never exported, never clamped, never the previous value), fan speed only
where there are fans, a lost GPU keeps its last XID, a lost library is one node-level signal."""

from __future__ import annotations

import contextlib

import pytest
import requests
import yaml

from gpu_support import SCENARIOS, FakeClock, by_gpu, samples, wait_until
from inferwatch.exporters.gpu.collector import GpuCollector
from inferwatch.exporters.gpu.scenario import parse_scenario
from inferwatch.exporters.gpu.server import MetricsServer
from inferwatch.exporters.gpu.sim import SimNvml
from inferwatch.exporters.gpu.xid import XidWatcher

STEP_S = 5  # seconds between collections; entry i of a row's values is in force at collection i


@contextlib.contextmanager
def _served(raw: dict):
    clock = FakeClock()
    sim = SimNvml(parse_scenario(raw), clock=clock)
    collector = GpuCollector(sim, "node-a", interval_s=STEP_S, wall=clock, monotonic=clock)
    server = MetricsServer.for_collector(collector, "127.0.0.1", 0, sim)
    server.start()
    try:
        yield sim, collector, clock, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def _scrape(base: str) -> str:
    answer = requests.get(f"{base}/metrics", timeout=10)
    assert answer.status_code == 200
    return answer.text


def _dropped(text: str) -> dict[tuple[str, str], float]:
    return {(s.labels["class"], s.labels["error"]): s.value for s in samples(text, "inferwatch_gpu_nvml_errors_total")
            if s.labels["class"] in ("blank", "out_of_range")}


# (id, {scenario value: raw value at each collection}, {metric: exported value at each collection, None =
# no series}, {(class, error): count after the last collection}). Raw values are what NVML (or DCGM, whose
# blank families start at DCGM_INT32_BLANK 2147483632, DCGM_INT64_BLANK 9223372036854775792 and
# DCGM_FP64_BLANK 2**47) hands back; 4294967295 is NVML_VALUE_NOT_AVAILABLE in an unsigned int.
ROWS = [
    ("issue-example",
     {"memory_temperature_c": [9223372036854775794] * 3, "sm_clock_mhz": [2147483632, 1410, 1410],
      "utilization_gpu_pct": [52, 4294967295, 55]},
     {"DCGM_FI_DEV_MEMORY_TEMP": [None, None, None], "DCGM_FI_DEV_SM_CLOCK": [None, 1410, 1410],
      "DCGM_FI_DEV_GPU_UTIL": [52, None, 55]},
     {("blank", "DcgmInt64NotSupported"): 3, ("blank", "DcgmInt32Blank"): 1, ("blank", "NvmlValueNotAvailable"): 1}),
    ("int64-blank-family", {"memory_temperature_c": [9223372036854775792, 9223372036854775793, 9223372036854775795]},
     {"DCGM_FI_DEV_MEMORY_TEMP": [None, None, None]},
     {("blank", "DcgmInt64Blank"): 1, ("blank", "DcgmInt64NotFound"): 1, ("blank", "DcgmInt64NotPermissioned"): 1}),
    ("fp64-blank-family", {"memory_temperature_c": [140737488355328.0, 140737488355330.0, 61.5]},
     {"DCGM_FI_DEV_MEMORY_TEMP": [None, None, 61.5]},
     {("blank", "DcgmFp64Blank"): 1, ("blank", "DcgmFp64NotSupported"): 1}),
    ("int32-blank-top", {"temperature_c": [2147483647, 44, 44]}, {"DCGM_FI_DEV_GPU_TEMP": [None, 44, 44]},
     {("blank", "DcgmInt32Blank"): 1}),
    ("temperature-above-150", {"temperature_c": [150, 151, 300]}, {"DCGM_FI_DEV_GPU_TEMP": [150, None, None]},
     {("out_of_range", "AbovePhysicalRange"): 2}),
    ("utilization-above-100", {"utilization_memory_pct": [100, 101, 40]},
     {"DCGM_FI_DEV_MEM_COPY_UTIL": [100, None, 40]}, {("out_of_range", "AbovePhysicalRange"): 1}),
    ("mem-clock-not-available", {"mem_clock_mhz": [4294967295, 2619, 4294967295]},
     {"DCGM_FI_DEV_MEM_CLOCK": [None, 2619, None]}, {("blank", "NvmlValueNotAvailable"): 2}),
    ("power-not-available", {"power_w": [4294967.295, 250.0, 250.0]},   # 4294967295 mW from nvmlDeviceGetPowerUsage
     {"DCGM_FI_DEV_POWER_USAGE": [None, 250.0, 250.0]}, {("blank", "NvmlValueNotAvailable"): 1}),
    ("pcie-replay-int32-blank", {"pcie_replay": [2147483635, 3, 3]},
     {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": [None, 3, 3]}, {("blank", "DcgmInt32NotPermissioned"): 1}),
    ("ecc-64bit-not-available", {"ecc_dbe_volatile": [18446744073709551615, 2, 2]},
     {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": [None, 2, 2]}, {("blank", "NvmlValueNotAvailable"): 1}),
    # A 64-bit counter passes through the int32 blank range like any number: it is a real count there.
    ("ecc-64bit-int32-range-is-a-count", {"ecc_sbe_aggregate": [2147483632, 2147483640, 2147483650]},
     {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": [2147483632, 2147483640, 2147483650]}, {}),
    ("fan-not-available", {"fan_speed_pct": [4294967295, 120, 45]}, {"DCGM_FI_DEV_FAN_SPEED": [None, 120, 45]},
     {("blank", "NvmlValueNotAvailable"): 1}),   # NVML: fan speed "may exceed 100%", so 120 is a reading
]


@pytest.mark.parametrize("values, expected, counts", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_blank_and_impossible_values_are_dropped_and_counted(values, expected, counts):
    timeline = [{"at": f"{STEP_S * i}s", "set": {name: raw}}
                for name, series in values.items() for i, raw in enumerate(series)]
    with _served({"gpus": 1, "fans": True, "timeline": timeline}) as (_, collector, clock, base):
        for step in range(3):
            collector.collect_once()
            text = _scrape(base)
            for metric, series in expected.items():
                assert by_gpu(text, metric).get("0") == series[step], (metric, step)
            clock.advance(STEP_S)
        assert _dropped(text) == counts
        for s in samples(text):
            assert s.value < 2**53, (s.name, s.labels, s.value)   # nothing sentinel-sized reached the scrape


def test_shipped_blanks_scenario_scrapes_as_documented():
    with _served(yaml.safe_load((SCENARIOS / "blanks.yaml").read_text())) as (_, collector, clock, base):
        seen = []
        for _ in range(4):
            collector.collect_once()
            text = _scrape(base)
            seen.append(tuple(by_gpu(text, m).get("0") for m in
                              ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL",
                               "DCGM_FI_DEV_FAN_SPEED")))
            clock.advance(STEP_S)
    assert seen == [(None, None, 52, 45), (None, 1410, None, 45), (None, 1410, 55, 45), (None, 1410, 55, None)]


def test_fan_speed_only_where_the_gpu_has_fans():
    with _served({"gpus": 1}) as (_, collector, _clock, base):          # passively cooled: NotSupported
        collector.collect_once()
        text = _scrape(base)
        assert by_gpu(text, "DCGM_FI_DEV_FAN_SPEED") == {}
        assert ("absent", "NotSupported") in {(s.labels["class"], s.labels["error"])
                                              for s in samples(text, "inferwatch_gpu_nvml_errors_total")}
    with _served({"gpus": 2, "fans": True, "values": {"fan_speed_pct": 38}}) as (_, collector, _clock, base):
        collector.collect_once()
        assert by_gpu(_scrape(base), "DCGM_FI_DEV_FAN_SPEED") == {"0": 38, "1": 38}


def test_lost_gpu_keeps_its_last_xid_and_counter_while_its_readings_go():
    with _served({"gpus": 2}) as (sim, collector, _clock, base):
        collector.collect_once()
        uuid = {s.labels["gpu"]: s.labels["UUID"] for s in samples(_scrape(base), "inferwatch_gpu_up")}
        watcher = XidWatcher(sim, collector, timeout_ms=50, idle_s=0.01)
        watcher.start()
        try:
            posted = requests.post(f"{base}/sim/events", json=[{"gpu": 1, "xid": 79}, {"gpu": 1, "lost": True}],
                                   timeout=10)
            assert posted.json() == {"added": 2}

            def xid79() -> float:
                return next((s.value for s in samples(_scrape(base), "inferwatch_gpu_xid_errors_total")
                             if s.labels["gpu"] == "1" and s.labels["xid"] == "79"), 0)
            wait_until(lambda: xid79() == 1, "XID 79 counted")
            collector.collect_once()
        finally:
            watcher.stop()
        text = _scrape(base)
        assert by_gpu(text, "inferwatch_gpu_up") == {"0": 1, "1": 0}
        gpu1 = {s.name: s for s in samples(text) if s.labels.get("gpu") == "1" and s.name.startswith("DCGM_")}
        assert set(gpu1) == {"DCGM_FI_DEV_XID_ERRORS"} and gpu1["DCGM_FI_DEV_XID_ERRORS"].value == 79
        assert gpu1["DCGM_FI_DEV_XID_ERRORS"].labels["UUID"] == uuid["1"]      # remembered, not blank
        counter = [s for s in samples(text, "inferwatch_gpu_xid_errors_total") if s.labels["gpu"] == "1"]
        assert {s.labels["xid"]: s.value for s in counter}["79"] == 1
        assert {s.labels["UUID"] for s in counter} == {uuid["1"]}


def test_lost_library_is_one_node_level_signal_and_xids_stay():
    raw = {"gpus": 2, "timeline": [{"at": "10s", "library_lost": "driver_not_loaded", "for": "30s"}]}
    with _served(raw) as (_, collector, clock, base):
        collector.collect_once()
        collector.record_xid(collector.snapshot.gpus[0].identity, 48)
        clock.advance(10)
        collector.collect_once()
        text = _scrape(base)
        assert [(s.labels, s.value) for s in samples(text, "inferwatch_gpu_nvml_up")] == [({"Hostname": "node-a"}, 0)]
        assert by_gpu(text, "inferwatch_gpu_up") == {"0": 0, "1": 0}
        assert by_gpu(text, "DCGM_FI_DEV_XID_ERRORS") == {"0": 48}   # no readings, the last XID stays
        assert by_gpu(text, "DCGM_FI_DEV_GPU_TEMP") == {}
