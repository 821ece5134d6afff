"""A GPU that leaves NVML's device list (driver unbind after XID 79, hot removal) or can no longer be opened is
lost, by UUID, until it comes back (exporters/gpu/devicelist.py), and `GpuLost` stays firing meanwhile."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_support import FakeClock, render, samples
from inferwatch.exporters.gpu.collector import GpuCollector
from inferwatch.exporters.gpu.scenario import parse_scenario
from inferwatch.exporters.gpu.sim import SimNvml

REPO = Path(__file__).resolve().parents[1]
STEP_S = 30


def _setup(raw: dict):
    clock = FakeClock()
    sim = SimNvml(parse_scenario(raw), clock=clock)
    return sim, GpuCollector(sim, "node-a", interval_s=STEP_S, wall=clock, monotonic=clock), clock


def _uuids(sim: SimNvml) -> list[str]:
    """The scenario's GPUs' UUIDs, in scenario order, read while every GPU is listed."""
    return _uuids_listed(sim)


def _up(text: str) -> dict[str, tuple[str, float]]:
    """UUID -> (gpu label, inferwatch_gpu_up)."""
    return {s.labels["UUID"]: (s.labels["gpu"], s.value) for s in samples(text, "inferwatch_gpu_up")}


def _temps(text: str) -> dict[str, tuple[str, float]]:
    return {s.labels["UUID"]: (s.labels["gpu"], s.value) for s in samples(text, "DCGM_FI_DEV_GPU_TEMP")}


# (timeline, scenario GPUs gone at 10 s, NVML's device count then)
GONE = [
    pytest.param([{"at": "10s", "gpu": 0, "removed": True}], {0}, 2, id="first-of-three-removed-indexes-shift"),
    pytest.param([{"at": "10s", "gpu": 2, "removed": True}], {2}, 2, id="last-removed"),
    pytest.param([{"at": "10s", "gpu": [0, 1], "removed": True}], {0, 1}, 1, id="two-removed"),
    pytest.param([{"at": "10s", "gpu": 1, "lost": True}], {1}, 3, id="listed-but-cannot-be-opened"),
    pytest.param([{"at": "10s", "gpu": 1, "removed": True}, {"at": "10s", "gpu": 2, "lost": True}], {1, 2}, 2,
                 id="one-removed-one-unopenable"),
]


@pytest.mark.parametrize("timeline, gone, count", GONE)
def test_a_gpu_seen_by_uuid_that_leaves_or_cannot_be_opened_is_lost_until_it_returns(timeline, gone, count, caplog):
    raw = {"gpus": 3, "timeline": [{**entry, "for": "30m"} for entry in timeline]}
    sim, collector, clock = _setup(raw)
    uuids = _uuids(sim)
    collector.collect_once()
    before = render(collector)
    assert _up(before) == {u: (str(i), 1) for i, u in enumerate(uuids)}
    with caplog.at_level(logging.WARNING):
        for _ in range(6):  # 30 minutes, every 5 minutes: far past any `for` or lookback
            clock.advance(300)
            collector.collect_once()
            text = render(collector)
            # Each GPU keeps the labels it was first seen with, whatever index NVML gives it now.
            assert _up(text) == {u: (str(i), 0 if i in gone else 1) for i, u in enumerate(uuids)}
            assert _temps(text) == {u: (str(i), 42) for i, u in enumerate(uuids) if i not in gone}
            assert samples(text, "inferwatch_gpu_devices")[0].value == count
            assert samples(text, "inferwatch_gpu_nvml_up")[0].value == 1
    lost_lines = [r.getMessage() for r in caplog.records if "lost (inferwatch_gpu_up 0)" in r.getMessage()]
    assert len(lost_lines) == len(gone)  # once per GPU, not once per collection
    # Back in the list (the entries end 30 m after 10 s): read again under the same labels.
    clock.advance(STEP_S)
    collector.collect_once()
    text = render(collector)
    assert _up(text) == {u: (str(i), 1) for i, u in enumerate(uuids)}
    assert _temps(text) == {u: (str(i), 42) for i, u in enumerate(uuids)}


def test_a_gpu_removed_while_the_library_is_down_is_lost_after_reinit():
    raw = {"gpus": 2, "timeline": [{"at": "10s", "library_lost": True, "for": "20s"},
                                   {"at": "15s", "gpu": 0, "removed": True}]}
    sim, collector, clock = _setup(raw)
    uuids = _uuids(sim)
    collector.collect_once()
    clock.advance(10)
    collector.collect_once()
    assert _up(render(collector)) == {uuids[0]: ("0", 0), uuids[1]: ("1", 0)}   # library down: every GPU 0
    clock.advance(120)
    collector.collect_once()
    text = render(collector)
    assert samples(text, "inferwatch_gpu_nvml_up")[0].value == 1
    assert _up(text) == {uuids[0]: ("0", 0), uuids[1]: ("1", 1)}
    assert _temps(text) == {uuids[1]: ("1", 42)}


def test_a_new_gpu_at_a_lost_gpus_index_is_a_gpu_of_its_own():
    """The scenario's GPU 2 is out of the list at start, GPU 1 leaves at 10 s and GPU 2 comes in at 20 s: NVML
    lists it at index 1, the lost GPU's; both are exported apart (by UUID), the lost one with its last XID."""
    raw = {"gpus": 3, "timeline": [{"gpu": 2, "removed": True, "for": "20s"},
                                   {"at": "10s", "gpu": 1, "removed": True}]}
    sim, collector, clock = _setup(raw)
    clock.advance(30)
    u0, u2 = _uuids_listed(sim)
    clock.advance(-30)
    u1 = _uuids_listed(sim)[1]
    collector.collect_once()                      # t=0: scenario GPUs 0 and 1 listed
    gpu1 = next(d.identity for d in collector._devices if d.identity.uuid == u1)
    collector.record_xid(gpu1, 79)
    clock.advance(30)
    collector.collect_once()                      # t=30: GPU 1 gone, GPU 2 listed at index 1
    text = render(collector)
    assert {(s.labels["gpu"], s.labels["UUID"]): s.value for s in samples(text, "inferwatch_gpu_up")} == {
        ("0", u0): 1, ("1", u1): 0, ("1", u2): 1}
    assert {(s.labels["gpu"], s.labels["UUID"]): s.value for s in samples(text, "DCGM_FI_DEV_XID_ERRORS")} == {
        ("0", u0): 0, ("1", u1): 79, ("1", u2): 0}
    assert samples(text, "inferwatch_gpu_devices")[0].value == 2


def _uuids_listed(sim: SimNvml) -> list[str]:
    if not sim._initialized:
        sim.init()
    return [sim.uuid(sim.device_handle(i)) for i in range(sim.device_count())]


# ------------------------------------------------------------------------------------ GpuLost over time
def _promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found; install it with: apt-get install -y prometheus", pytrace=False)
    return path


def _rule(name: str) -> dict:
    for group in yaml.safe_load((REPO / "rules" / "generated" / "gpu.yml").read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                return rule
    raise AssertionError(f"{name} is not in rules/generated/gpu.yml")


def _series_over_time(raw: dict, minutes: int, xid_at_s: float | None = None) -> dict[str, list[str]]:
    """The exporter's own exposition every STEP_S seconds, as promtool input series (with the labels a scrape
    by job inferwatch-gpu adds); '_' where a series has no sample."""
    sim, collector, clock = _setup(raw)
    steps = minutes * 60 // STEP_S + 1
    series: dict[str, list[str]] = {}
    for step in range(steps):
        if xid_at_s is not None and step * STEP_S == xid_at_s:
            for device in collector._devices:
                if device.identity.index == 0:
                    collector.record_xid(device.identity, 79)
        collector.collect_once()
        for s in samples(render(collector)):
            labels = {**s.labels, "job": "inferwatch-gpu", "instance": "node-a:9400", "node": "node-a"}
            key = s.name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            series.setdefault(key, ["_"] * steps)[step] = repr(float(s.value))
        clock.advance(STEP_S)
    return series


def test_gpu_lost_stays_firing_while_the_gpu_is_out_of_the_device_list(tmp_path):
    """XID 79 at 60 s, then GPU 0 leaves the device list for 30 minutes: the generated GpuLost fires once for
    the GPU (its identity labels) and keeps firing past the XID window until the GPU is back."""
    raw = {"gpus": 2, "timeline": [{"at": "60s", "gpu": 0, "removed": True, "for": "30m"}]}
    series = _series_over_time(raw, 45, xid_at_s=60)
    rule = {k: v for k, v in _rule("GpuLost").items() if k != "annotations"}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "lost", "rules": [rule]}]}))
    uuid0 = next(k for k in series if k.startswith("inferwatch_gpu_up") and 'gpu="0"' in k).split('UUID="')[1]
    uuid0 = uuid0.split('"')[0]
    firing = [{"exp_labels": {"layer": "L1", "severity": "critical", "job": "inferwatch-gpu",
                              "instance": "node-a:9400", "node": "node-a", "gpu": "0", "UUID": uuid0,
                              "Hostname": "node-a"}}]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": f"{STEP_S}s", "tests": [{
        "interval": f"{STEP_S}s",
        "input_series": [{"series": k, "values": " ".join(v)} for k, v in sorted(series.items())],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "GpuLost", "exp_alerts": firing},
            {"eval_time": "20m", "alertname": "GpuLost", "exp_alerts": firing},   # XID window long past
            {"eval_time": "30m", "alertname": "GpuLost", "exp_alerts": firing},
            {"eval_time": "40m", "alertname": "GpuLost", "exp_alerts": []},       # back since 31 m
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, width=10**9))
    out = subprocess.run([_promtool(), "test", "rules", "test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


@pytest.mark.parametrize("entry, field", [
    ({"gpu": 0, "removed": "yes"}, "events[0].removed"),
    ({"gpu": 0, "removed": 1}, "events[0].removed"),
    ({"gpu": 0, "removed": False}, "events[0]"),   # changes nothing
])
def test_removed_entries_that_are_no_boolean_are_refused(entry, field):
    from inferwatch.specload import SpecError

    sim, _, _ = _setup({"gpus": 1})
    with pytest.raises(SpecError) as raised:
        sim.add_events([entry])
    assert raised.value.path == field


def test_a_removal_added_at_run_time_lasts_its_for():
    """Entries added at run time (what `/sim/events` does): the GPU is out of the list for its `for`, then back."""
    sim, collector, clock = _setup({"gpus": 2})
    collector.collect_once()
    sim.add_events([{"gpu": 1, "removed": True, "for": "1m"}])
    clock.advance(STEP_S)
    collector.collect_once()
    assert sim.device_count() == 1
    assert sorted(v for _, v in _up(render(collector)).values()) == [0, 1]
    clock.advance(60)
    collector.collect_once()
    assert sorted(v for _, v in _up(render(collector)).values()) == [1, 1]
