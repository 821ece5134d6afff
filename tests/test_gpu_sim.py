"""The NVML simulator: scenario timeline, and the same pynvml exception classes the real library raises."""

from __future__ import annotations

import pynvml
import pytest

from gpu_support import SCENARIOS, FakeClock
from inferwatch.exporters.gpu.scenario import Scenario, load_scenario, parse_scenario
from inferwatch.exporters.gpu.sim import SimNvml
from inferwatch.specload import SpecError


def _sim(raw: dict | None = None) -> tuple[SimNvml, FakeClock]:
    clock = FakeClock()
    sim = SimNvml(parse_scenario(raw) if raw is not None else Scenario(), clock=clock)
    return sim, clock


def test_calls_before_init_raise_uninitialized():
    sim, _ = _sim()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.device_count()
    sim.init()
    assert sim.device_count() == 1


def test_example_scenarios_load():
    for path in sorted(SCENARIOS.glob("*.yaml")):
        scenario = load_scenario(path)
        assert scenario.gpus >= 1, path
    assert load_scenario(SCENARIOS / "faults.yaml").mig[3][1].profile == "1g.10gb"


def test_overheat_ramp_crosses_85c_between_60_and_90_seconds():
    clock = FakeClock()
    sim = SimNvml(load_scenario(SCENARIOS / "overheat.yaml"), clock=clock)
    sim.init()
    gpu0, gpu1 = sim.device_handle(0), sim.device_handle(1)
    temps = {}
    for t in (0, 60, 75, 90, 120):
        clock.t = 1000.0 + t
        temps[t] = (sim.temperature(gpu0), sim.temperature(gpu1))
    assert temps[0] == (44, 44) and temps[60] == (44, 44)
    assert temps[75] == (68, 44)                     # halfway through the ramp
    assert temps[90] == (92, 44) and temps[120] == (92, 44)
    assert sim.clocks_event_reasons(gpu0) == 0x20    # sw_thermal_slowdown from t=80 s


def test_unsupported_and_not_permitted_fields_raise_the_real_classes():
    sim, _ = _sim({"gpus": 2, "timeline": [{"gpu": 1, "not_supported": ["memory_temperature"],
                                            "no_permission": "total_ecc_errors"}]})
    sim.init()
    h0, h1 = sim.device_handle(0), sim.device_handle(1)
    assert sim.memory_temperature(h0) == 48
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.memory_temperature(h1)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        sim.total_ecc_errors(h1, uncorrected=True, aggregate=False)


def test_lost_gpu_raises_gpu_is_lost_everywhere_including_handle_lookup():
    sim, clock = _sim({"gpus": 2, "timeline": [{"at": "10s", "gpu": 0, "lost": True}]})
    sim.init()
    h0 = sim.device_handle(0)
    clock.advance(10)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.temperature(h0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.device_handle(0)
    assert sim.temperature(sim.device_handle(1)) == 42


def test_library_lost_then_back_needs_reinit():
    sim, clock = _sim({"timeline": [{"at": "5s", "library_lost": "lib_rm_version_mismatch", "for": "10s"}]})
    sim.init()
    handle = sim.device_handle(0)
    clock.advance(5)
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        sim.temperature(handle)
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        sim.init()
    clock.advance(10)
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # back, but this process's state is stale
        sim.temperature(handle)
    sim.shutdown()
    sim.init()
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # handles from before the re-init are stale too
        sim.temperature(handle)
    assert sim.temperature(sim.device_handle(0)) == 42


def test_mig_gpu_has_no_utilization_but_instances_have_memory():
    sim, _ = _sim({"gpus": 1, "mig": {0: [{"profile": "1g.10gb", "gi_id": 9, "memory_total_mib": 9728,
                                           "memory_used_mib": 512}]}})
    sim.init()
    h = sim.device_handle(0)
    assert sim.mig_enabled(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.utilization(h)
    (mig,) = sim.mig_handles(h)
    assert (sim.gpu_instance_id(mig), sim.mig_profile(mig)) == (9, "1g.10gb")
    assert sim.memory_info(mig).used == 512 * 1024 * 1024


def test_xid_events_only_for_registered_gpus_and_never_replayed():
    sim, clock = _sim({"gpus": 2, "timeline": [{"at": "1s", "gpu": 0, "xid": 48}, {"at": "2s", "gpu": 1, "xid": 13}]})
    sim.init()
    es = sim.event_set_create()
    sim.register_xid_events(sim.device_handle(0), es)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.wait_xid_event(es, 0)
    clock.advance(2)
    event = sim.wait_xid_event(es, 0)
    assert (event.device_key, event.xid) == (0, 48)
    with pytest.raises(pynvml.NVMLError_Timeout):   # XID 13 is on GPU 1, which is not registered
        sim.wait_xid_event(es, 0)
    clock.advance(1)
    later = sim.event_set_create()
    sim.register_xid_events(sim.device_handle(1), later)
    with pytest.raises(pynvml.NVMLError_Timeout):   # happened before this set existed: no history
        sim.wait_xid_event(later, 0)
    sim.add_events([{"gpu": 1, "xid": 79}])
    assert sim.wait_xid_event(later, 0).xid == 79


def test_energy_only_grows():
    sim, clock = _sim()
    sim.init()
    h = sim.device_handle(0)
    first = sim.total_energy(h)
    clock.advance(10)
    assert sim.total_energy(h) == first + 180 * 10 * 1000   # 180 W for 10 s, in mJ


@pytest.mark.parametrize("raw, where", [
    ({"gpus": "two"}, "gpus"),
    ({"colour": 1}, "colour"),
    ({"timeline": [{"at": "10s", "set": {"temprature_c": 90}}]}, "timeline[0].set.temprature_c"),
    ({"gpus": 2, "timeline": [{"gpu": 5, "lost": True}]}, "timeline[0].gpu"),
    ({"timeline": [{"at": "soon", "lost": True}]}, "timeline[0].at"),
    ({"timeline": [{"not_supported": ["power_limit"]}]}, "timeline[0].not_supported"),
    ({"fans": "yes"}, "fans"),
    ({"timeline": [{"library_lost": "gone"}]}, "timeline[0].library_lost"),
    ({"timeline": [{"at": "1s"}]}, "timeline[0]"),
    ({"timeline": [{"set": {"clocks_event_reasons": ["too_hot"]}}]}, "timeline[0].set.clocks_event_reasons"),
])
def test_bad_scenarios_name_the_entry(raw, where):
    with pytest.raises(SpecError) as err:
        parse_scenario(raw)
    assert err.value.path == where


def test_bad_scenario_file_names_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("timeline: [{at: 1s, xid: -3}]\n")
    with pytest.raises(SpecError, match=r"s\.yaml: timeline\[0\]\.xid"):
        load_scenario(path)


def test_runtime_events_are_validated_before_anything_is_added():
    sim, _ = _sim()
    before = list(sim.scenario.timeline)
    with pytest.raises(SpecError):
        sim.add_events([{"gpu": 0, "xid": 48}, {"gpu": 0, "set": {"nope": 1}}])
    assert sim.scenario.timeline == before


# Every field /sim/events (and a scenario file) takes, with values the real library could never return: each is
# refused naming the field, and nothing is added. (entry, the path the error names)
OUT_OF_C_TYPE = [
    ({"gpu": 0, "xid": 99999999999999999999}, "events[0].xid"),          # the input: wider than uint64
    ({"gpu": 0, "xid": 2**64}, "events[0].xid"),
    ({"gpu": 0, "xid": 0}, "events[0].xid"),
    ({"gpu": 0, "xid": 79.0}, "events[0].xid"),
    ({"gpu": 0, "set": {"temperature_c": 2**32}}, "events[0].set.temperature_c"),       # unsigned int
    ({"gpu": 0, "set": {"temperature_c": float("nan")}}, "events[0].set.temperature_c"),
    ({"gpu": 0, "set": {"power_w": 4294968}}, "events[0].set.power_w"),                 # milliwatts: uint
    ({"gpu": 0, "set": {"utilization_gpu_pct": 2**32}}, "events[0].set.utilization_gpu_pct"),
    ({"gpu": 0, "set": {"fan_speed_pct": float("inf")}}, "events[0].set.fan_speed_pct"),
    ({"gpu": 0, "set": {"memory_used_mib": 2**44}}, "events[0].set.memory_used_mib"),   # bytes: 2**64
    ({"gpu": 0, "set": {"sm_clock_mhz": 10**20}}, "events[0].set.sm_clock_mhz"),
    ({"gpu": 0, "set": {"pcie_replay": 2**32}}, "events[0].set.pcie_replay"),
    ({"gpu": 0, "set": {"ecc_dbe_volatile": 2**64}}, "events[0].set.ecc_dbe_volatile"),  # unsigned long long
    ({"gpu": 0, "set": {"remapped_rows_uncorrectable": 2**32}}, "events[0].set.remapped_rows_uncorrectable"),
    ({"gpu": 0, "set": {"memory_temperature_c": 2**64}}, "events[0].set.memory_temperature_c"),
    ({"gpu": 0, "ramp": {"temperature_c": 10**20}, "over": "10s"}, "events[0].ramp.temperature_c"),
    ({"gpu": 0, "set": {"temperature_c": -1}}, "events[0].set.temperature_c"),
    ({"gpu": 0, "set": {"temperature_c": "90"}}, "events[0].set.temperature_c"),
    ({"gpu": 0, "lost": "yes"}, "events[0].lost"),
    ({"gpu": 0, "lost": True, "at": float("inf")}, "events[0].at"),
    ({"gpu": 0, "lost": True, "at": 1e300}, "events[0].at"),
    ({"gpu": 0, "lost": True, "at": -5}, "events[0].at"),
    ({"gpu": 0, "lost": True, "for": "99999999999999999999d"}, "events[0].for"),
    ({"gpu": 0, "ramp": {"temperature_c": 90}, "over": float("nan")}, "events[0].over"),
    ({"gpu": 2**64, "lost": True}, "events[0].gpu"),
]


@pytest.mark.parametrize("entry, where", OUT_OF_C_TYPE, ids=[w + "=" + repr(e)[:40] for e, w in OUT_OF_C_TYPE])
def test_values_the_c_type_cannot_hold_are_refused_naming_the_field(entry, where):
    sim, _ = _sim({"gpus": 2})
    before = list(sim.scenario.timeline)
    with pytest.raises(SpecError) as err:
        sim.add_events([{"gpu": 1, "xid": 48}, entry])
    assert err.value.path == where.replace("events[0]", "events[1]")
    assert len(str(err.value)) < 300  # a huge value is not echoed in full
    assert sim.scenario.timeline == before


# What the real library can return, blanks and physically impossible readings included, is still accepted: the
# exporter's sanity layer is what drops those (test_gpu_values.py).
WITHIN_C_TYPE = [
    {"gpu": 0, "xid": 2**64 - 1},                                  # NVML_VALUE_NOT_AVAILABLE as event data
    {"gpu": 0, "set": {"utilization_gpu_pct": 4294967295}},        # all-ones unsigned int
    {"gpu": 0, "set": {"memory_temperature_c": 9223372036854775794}},
    {"gpu": 0, "set": {"memory_temperature_c": float("nan")}},     # the field may be a double
    {"gpu": 0, "set": {"power_w": 4294967.295}},
    {"gpu": 0, "set": {"memory_total_mib": 2**44 - 1}},
    {"gpu": 0, "set": {"temperature_c": 500}},                     # impossible physically, not for the type
]


@pytest.mark.parametrize("entry", WITHIN_C_TYPE, ids=[repr(e)[:50] for e in WITHIN_C_TYPE])
def test_values_the_c_type_holds_are_accepted(entry):
    sim, _ = _sim({"gpus": 1})
    assert len(sim.add_events([entry])) == 1


@pytest.mark.parametrize("instance, where", [
    ({"profile": "1g.10gb", "gi_id": -1, "memory_total_mib": 9728}, "mig.0[0].gi_id"),
    ({"profile": "1g.10gb", "gi_id": 2**32, "memory_total_mib": 9728}, "mig.0[0].gi_id"),
    ({"profile": "1g.10gb", "gi_id": "9", "memory_total_mib": 9728}, "mig.0[0].gi_id"),
    ({"profile": "1g.10gb", "gi_id": 9, "memory_total_mib": 2**44}, "mig.0[0].memory_total_mib"),
    ({"profile": "1g.10gb", "gi_id": 9, "memory_total_mib": 9728, "memory_used_mib": float("nan")},
     "mig.0[0].memory_used_mib"),
])
def test_mig_instances_outside_their_c_types_are_refused(instance, where):
    with pytest.raises(SpecError) as err:
        parse_scenario({"gpus": 1, "mig": {0: [instance]}})
    assert err.value.path == where
