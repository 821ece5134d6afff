"""The GPU collector over the simulated NVML: failure behaviour per error class, XIDs, serving over HTTP."""

from __future__ import annotations

import math

import requests

from gpu_support import SCENARIOS, FakeClock, by_gpu, render, samples, wait_until
from inferwatch.exporters.gpu.collector import GpuCollector
from inferwatch.exporters.gpu.scenario import load_scenario, parse_scenario
from inferwatch.exporters.gpu.server import MetricsServer
from inferwatch.exporters.gpu.sim import SimNvml
from inferwatch.exporters.gpu.xid import XidWatcher


def _setup(raw_or_file, **kwargs):
    clock = FakeClock()
    scenario = load_scenario(SCENARIOS / raw_or_file) if isinstance(raw_or_file, str) else parse_scenario(raw_or_file)
    sim = SimNvml(scenario, clock=clock)
    collector = GpuCollector(sim, "node-a", interval_s=5, wall=clock, monotonic=clock, **kwargs)
    return sim, collector, clock


def test_faults_scenario_every_name_present_unsupported_absent_no_sentinel():
    sim, collector, _ = _setup("faults.yaml")
    collector.collect_once()
    text = render(collector)
    assert set(by_gpu(text, "DCGM_FI_DEV_GPU_TEMP")) == {"0", "1", "2", "3"}
    assert set(by_gpu(text, "DCGM_FI_DEV_MEMORY_TEMP")) == {"0", "2", "3"}        # NotSupported on gpu 1
    assert set(by_gpu(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")) == {"0", "2", "3"}  # NoPermission on gpu 1
    assert set(by_gpu(text, "DCGM_FI_DEV_GPU_UTIL")) == {"0", "1", "2"}           # MIG on gpu 3
    mig = {s.labels["GPU_I_ID"]: s.labels["GPU_I_PROFILE"] for s in samples(text, "DCGM_FI_DEV_FB_USED")
           if "GPU_I_ID" in s.labels}
    assert mig == {"1": "3g.40gb", "9": "1g.10gb"}
    for s in samples(text):
        assert math.isfinite(s.value) and 0 <= s.value < 2**53, (s.name, s.labels, s.value)
    errors = {(s.labels["class"], s.labels["error"]) for s in samples(text, "inferwatch_gpu_nvml_errors_total")}
    assert {("absent", "NotSupported"), ("absent", "NoPermission")} <= errors


def test_lost_gpu_goes_up_0_and_the_others_keep_reporting():
    sim, collector, clock = _setup("faults.yaml")
    collector.collect_once()
    clock.advance(40)                       # gpu 2 falls off the bus at 40 s
    collector.collect_once()
    text = render(collector)
    assert by_gpu(text, "inferwatch_gpu_up") == {"0": 1, "1": 1, "2": 0, "3": 1}
    assert set(by_gpu(text, "DCGM_FI_DEV_GPU_TEMP")) == {"0", "1", "3"}
    up2 = [s for s in samples(text, "inferwatch_gpu_up") if s.labels["gpu"] == "2"][0]
    assert up2.labels["UUID"].startswith("GPU-")      # still named after it became unreadable
    assert samples(text, "inferwatch_gpu_nvml_up")[0].value == 1


def test_gpu_lost_before_start_is_reported_down_then_picked_up():
    sim, collector, clock = _setup({"gpus": 2, "timeline": [{"gpu": 1, "lost": True, "for": "10s"}]})
    collector.collect_once()
    assert by_gpu(render(collector), "inferwatch_gpu_up") == {"0": 1, "1": 0}
    clock.advance(10)
    collector.collect_once()
    text = render(collector)
    assert by_gpu(text, "inferwatch_gpu_up") == {"0": 1, "1": 1}
    assert by_gpu(text, "DCGM_FI_DEV_GPU_TEMP") == {"0": 42, "1": 42}


def test_library_lost_and_back_recovers_without_restart():
    sim, collector, clock = _setup({"gpus": 2, "timeline": [{"at": "10s", "library_lost": True, "for": "20s"},
                                                            {"at": "10s", "set": {"temperature_c": 50}}]})
    collector.collect_once()
    first_success = samples(render(collector), "inferwatch_gpu_last_collection_success_timestamp_seconds")[0].value
    clock.advance(10)
    collector.collect_once()                # the library is gone: shut down, backoff scheduled
    text = render(collector)
    assert samples(text, "inferwatch_gpu_nvml_up")[0].value == 0
    assert by_gpu(text, "inferwatch_gpu_up") == {"0": 0, "1": 0}
    assert samples(text, "inferwatch_gpu_devices")[0].value == 2
    assert samples(text, "inferwatch_gpu_last_collection_success_timestamp_seconds")[0].value == first_success
    for _ in range(7):                      # 17.5 s of collections while the library is still gone
        clock.advance(2.5)
        collector.collect_once()
        assert samples(render(collector), "inferwatch_gpu_nvml_up")[0].value == 0
    clock.advance(60)                        # past the loss and past any backoff
    collector.collect_once()
    text = render(collector)
    assert samples(text, "inferwatch_gpu_nvml_up")[0].value == 1
    assert by_gpu(text, "inferwatch_gpu_up") == {"0": 1, "1": 1}
    assert by_gpu(text, "DCGM_FI_DEV_GPU_TEMP") == {"0": 50, "1": 50}
    errors = {s.labels["error"]: s.value for s in samples(text, "inferwatch_gpu_nvml_errors_total")
              if s.labels["class"] == "library_lost"}
    assert errors.get("DriverNotLoaded", 0) >= 2


def test_backoff_spaces_reinit_attempts():
    sim, collector, clock = _setup({"timeline": [{"library_lost": True}]}, backoff_base_s=1, backoff_max_s=8)
    attempts = []
    for step in range(40):                   # 20 s in 0.5 s steps, library never comes back
        before = sim.calls
        collector.collect_once()
        if sim.calls > before:
            attempts.append(step * 0.5)
        clock.advance(0.5)
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert gaps[:4] == [1, 2, 4, 8] and all(g == 8 for g in gaps[4:])


def test_scrapes_serve_the_last_collection_without_calling_nvml():
    sim, collector, _ = _setup("healthy.yaml")
    collector.collect_once()
    calls = sim.calls
    for _ in range(5):
        render(collector)
    assert sim.calls == calls


def test_xid_events_are_counted_per_code_by_the_event_thread():
    clock = FakeClock()
    sim = SimNvml(load_scenario(SCENARIOS / "healthy.yaml"), clock=clock)
    collector = GpuCollector(sim, "node-a", wall=clock, monotonic=clock)
    collector.collect_once()
    watcher = XidWatcher(sim, collector, timeout_ms=50, idle_s=0.01)
    watcher.start()
    try:
        # The fake clock stands still, so the watcher's event set is never younger than these events.
        sim.add_events([{"gpu": 0, "xid": 48}, {"gpu": 0, "xid": 48}, {"gpu": 1, "xid": 79}])

        def counts():
            return {(s.labels["gpu"], s.labels["xid"]): s.value
                    for s in samples(render(collector), "inferwatch_gpu_xid_errors_total")}
        wait_until(lambda: counts().get(("1", "79")) == 1 and counts().get(("0", "48")) == 2, "XID counts")
        text = render(collector)
        assert by_gpu(text, "DCGM_FI_DEV_XID_ERRORS") == {"0": 48, "1": 79}
        assert counts()[("0", "79")] == 0    # preset code, no event
    finally:
        watcher.stop()


# XIDs that are no code, if they arrive anyway: (value, where from, the class and error they are counted under)
IMPOSSIBLE_XIDS = [
    (2**64 - 1, "sim", ("blank", "NvmlValueNotAvailable")),       # what NVML writes for "not available"
    (99999999999999999999, "direct", ("out_of_range", "AbovePhysicalRange")),  # wider than unsigned long long
    (0, "direct", ("out_of_range", "BelowPhysicalRange")),
    (-1, "direct", ("blank", "NvmlValueNotAvailable")),
]


def test_impossible_xids_are_dropped_and_counted_never_exported():
    clock = FakeClock()
    sim = SimNvml(load_scenario(SCENARIOS / "healthy.yaml"), clock=clock)
    collector = GpuCollector(sim, "node-a", wall=clock, monotonic=clock)
    collector.collect_once()
    identity = collector.devices_for_events()[1][0].identity
    watcher = XidWatcher(sim, collector, timeout_ms=50, idle_s=0.01)
    watcher.start()
    try:
        for xid, source, _ in IMPOSSIBLE_XIDS:
            if source == "sim":
                sim.add_events([{"gpu": 0, "xid": xid}])  # the simulator takes what the C type holds
            else:
                collector.record_xid(identity, xid)        # what no NVML could deliver: the sanity layer's case
        sim.add_events([{"gpu": 0, "xid": 48}])           # delivered after the sim's impossible one
        wait_until(lambda: by_gpu(render(collector), "DCGM_FI_DEV_XID_ERRORS").get("0") == 48, "XID 48")
    finally:
        watcher.stop()
    collector.collect_once()
    text = render(collector)
    xids = {s.labels["xid"] for s in samples(text, "inferwatch_gpu_xid_errors_total") if s.value}
    assert xids == {"48"}
    errors = {(s.labels["class"], s.labels["error"]): s.value
              for s in samples(text, "inferwatch_gpu_nvml_errors_total")}
    expected: dict = {}
    for _, _, key in IMPOSSIBLE_XIDS:
        expected[key] = expected.get(key, 0) + 1
    for key, n in expected.items():
        assert errors.get(key) == n, (key, errors)
    for s in samples(text):
        assert s.value < 2**53, (s.name, s.labels, s.value)


def test_xid_thread_reregisters_after_library_recovery():
    clock = FakeClock()
    sim = SimNvml(parse_scenario({"timeline": [{"at": "10s", "library_lost": True, "for": "5s"}]}), clock=clock)
    collector = GpuCollector(sim, "node-a", wall=clock, monotonic=clock, backoff_base_s=0)
    collector.collect_once()
    watcher = XidWatcher(sim, collector, timeout_ms=50, idle_s=0.01)
    watcher.start()
    try:
        clock.advance(10)
        collector.collect_once()                   # library lost: generation moves on
        clock.advance(5)
        collector.collect_once()                   # re-initialised
        generation = collector.generation
        assert collector.devices_for_events()[1]
        sim.add_events([{"gpu": 0, "xid": 94}])
        wait_until(lambda: any(s.labels["xid"] == "94" and s.value == 1
                                for s in samples(render(collector), "inferwatch_gpu_xid_errors_total")),
                    "XID 94 after recovery")
        assert collector.generation == generation
    finally:
        watcher.stop()


def test_http_scrape_is_200_with_a_lost_gpu_and_sim_events_endpoint():
    sim, collector, clock = _setup("faults.yaml")
    server = MetricsServer.for_collector(collector, "127.0.0.1", 0, sim)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        clock.advance(40)
        collector.collect_once()
        answer = requests.get(f"{base}/metrics", timeout=10)
        assert answer.status_code == 200
        assert by_gpu(answer.text, "inferwatch_gpu_up") == {"0": 1, "1": 1, "2": 0, "3": 1}
        bad = requests.post(f"{base}/sim/events", data='[{"gpu": 0, "set": {"nope": 1}}]', timeout=10)
        assert bad.status_code == 400 and "events[0].set.nope" in bad.json()["error"]
        good = requests.post(f"{base}/sim/events", json=[{"gpu": 0, "set": {"temperature_c": 91}}], timeout=10)
        assert good.status_code == 200 and good.json() == {"added": 1}
        collector.collect_once()
        assert by_gpu(requests.get(f"{base}/metrics", timeout=10).text, "DCGM_FI_DEV_GPU_TEMP")["0"] == 91
    finally:
        server.stop()
