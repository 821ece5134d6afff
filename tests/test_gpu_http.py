"""The GPU exporter's HTTP side over real sockets: /metrics rendered once per collection and negotiated by
prometheus-client (OpenMetrics, text, gzip), and the simulator's test-only /sim/events bounded."""

from __future__ import annotations

import gzip
import threading

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from gpu_support import FakeClock, by_gpu, samples, wait_until
from inferwatch.exporters.gpu import simapi
from inferwatch.exporters.gpu.collector import GpuCollector
from inferwatch.exporters.gpu.exposition import Scrapes, YieldingView
from inferwatch.exporters.gpu.scenario import parse_scenario
from inferwatch.exporters.gpu.server import MetricsServer
from inferwatch.exporters.gpu.sim import SimNvml

# What Prometheus sends (scrape_protocols default of Prometheus 2.x/3.x, in its Accept form).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
                     "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


@pytest.fixture
def served():
    clock = FakeClock()
    sim = SimNvml(parse_scenario({"gpus": 2, "mig": {1: [{"profile": "1g.10gb", "gi_id": 9,
                                                           "memory_total_mib": 9728}]}}), clock=clock)
    collector = GpuCollector(sim, "node-a", wall=clock, monotonic=clock)
    collector.collect_once()
    server = MetricsServer.for_collector(collector, "127.0.0.1", 0, sim)
    server.start()
    yield sim, collector, server, f"http://127.0.0.1:{server.port}"
    server.stop()


def _registry_text(collector) -> bytes:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry)


def _collector_part(served: bytes) -> bytes:
    """The served text without the server's own connection families (which follow the collector's)."""
    head, sep, tail = served.partition(b"# HELP inferwatch_gpu_exporter_http_connections ")
    names = {line.split(b" ")[0].split(b"{")[0] for line in (sep + tail).splitlines() if not line.startswith(b"#")}
    prefix = b"inferwatch_gpu_exporter_http_connections"
    assert names == {prefix, prefix + b"_closed_total", prefix + b"_closed_created"}
    return head


def test_plain_scrape_is_prometheus_clients_own_text_format(served):
    _, collector, _, base = served
    answer = requests.get(f"{base}/metrics", headers={"Accept-Encoding": "identity"}, timeout=10)
    assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in answer.headers
    assert _collector_part(answer.content) == _registry_text(collector)


def test_gzip_when_accepted(served):
    _, collector, _, base = served
    raw = requests.get(f"{base}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=10, stream=True).raw
    assert raw.headers["Content-Encoding"] == "gzip"
    assert _collector_part(gzip.decompress(raw.read(decode_content=False))) == _registry_text(collector)


def test_prometheus_accept_header_gets_openmetrics(served):
    _, _, _, base = served
    answer = requests.get(f"{base}/metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=10)
    assert answer.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert answer.text.endswith("# EOF\n")
    families = {f.name: f for f in parse_openmetrics(answer.text)}
    assert families["inferwatch_gpu_xid_errors"].type == "counter"
    assert {s.labels["gpu"] for s in families["DCGM_FI_DEV_GPU_TEMP"].samples} == {"0", "1"}


def test_rendered_once_per_collection_and_format(served):
    _, collector, server, base = served
    cache = server.cache
    before = cache.renders
    bodies = {requests.get(f"{base}/metrics", timeout=10).content for _ in range(5)}
    assert len(bodies) == 1 and cache.renders == before + 1       # first scrape of this variant renders
    requests.get(f"{base}/metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=10)
    assert cache.renders == before + 2                              # a second variant: one more render
    collector.collect_once()                                        # both variants re-rendered after it
    assert cache.renders == before + 4
    for _ in range(5):
        requests.get(f"{base}/metrics", timeout=10)
        requests.get(f"{base}/metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=10)
    assert cache.renders == before + 4                              # scrapes only hand out bytes


def test_a_new_collection_is_served_not_the_old_bytes(served):
    sim, collector, _, base = served
    sim.add_events([{"gpu": 0, "set": {"temperature_c": 77}}])
    assert by_gpu(requests.get(f"{base}/metrics", timeout=10).text, "DCGM_FI_DEV_GPU_TEMP")["0"] == 42
    collector.collect_once()
    assert by_gpu(requests.get(f"{base}/metrics", timeout=10).text, "DCGM_FI_DEV_GPU_TEMP")["0"] == 77


def test_name_filter_head_and_methods(served):
    _, _, _, base = served
    only = requests.get(f"{base}/metrics", params={"name[]": "inferwatch_gpu_up"}, timeout=10).text
    assert {s.name for s in samples(only)} == {"inferwatch_gpu_up"}
    head = requests.head(f"{base}/metrics", timeout=10)
    assert head.status_code == 200 and head.content == b"" and int(head.headers["Content-Length"]) > 0
    assert requests.post(f"{base}/metrics", timeout=10).status_code == 405


def _alias_bomb() -> bytes:
    """301 bytes of YAML whose one entry expands to 9**9 scalars if aliases are followed."""
    parts = ["&a [x,x,x,x,x,x,x,x,x]"] + [f"&{cur} [" + ",".join([f"*{prev}"] * 9) + "]"
                                          for prev, cur in zip("abcdefgh", "bcdefghi", strict=True)]
    text = "- [" + ", ".join(parts) + "]\n"
    return (text + "#" * (300 - len(text)) + "\n").encode()


def test_alias_bomb_gets_a_short_400_and_adds_nothing(served):
    sim, _, _, base = served
    bomb = _alias_bomb()
    assert len(bomb) == 301
    before = list(sim.scenario.timeline)
    answer = requests.post(f"{base}/sim/events", data=bomb, timeout=10)
    print(f"alias bomb: {len(bomb)} bytes posted -> {answer.status_code}, {len(answer.content)} bytes answered")
    assert answer.status_code == 400
    assert len(answer.content) < 512 and "aliases" in answer.json()["error"]
    assert sim.scenario.timeline == before


@pytest.mark.parametrize("body, status, says", [
    (b"[" * 5000 + b"]" * 5000, 400, "nested too deeply"),
    (b"\xff\xfe", 400, "UTF-8"),
    (b"[{gpu: 0, gpu: 1, lost: true}]", 400, "gpu"),                     # a key given twice
    (b"[" + b"{gpu: 0, set: {nope: 1}}," * 2000 + b"]", 400, "events[0].set.nope"),
    (b"x" * (64 * 1024 + 1), 413, "65536"),
])
def test_bad_bodies_get_short_4xx(served, body, status, says):
    sim, _, _, base = served
    before = list(sim.scenario.timeline)
    answer = requests.post(f"{base}/sim/events", data=body, timeout=10)
    assert answer.status_code == status and says in answer.json()["error"]
    assert len(answer.content) < 512
    assert sim.scenario.timeline == before


@pytest.mark.parametrize("body, field", [
    (b'[{"gpu":0,"xid":99999999999999999999}]', "events[0].xid"),    # the input
    (b'[{"gpu":0,"set":{"temperature_c":4294967296}}]', "events[0].set.temperature_c"),
    (b'[{"gpu":0,"set":{"ecc_dbe_volatile":18446744073709551616}}]', "events[0].set.ecc_dbe_volatile"),
    (b'[{"gpu":0,"lost":true,"at":1e999}]', "events[0].at"),
])
def test_values_no_nvml_could_return_get_a_400_naming_the_field(served, body, field):
    sim, collector, _, base = served
    before = list(sim.scenario.timeline)
    answer = requests.post(f"{base}/sim/events", data=body, timeout=10)
    assert answer.status_code == 400 and field in answer.json()["error"]
    assert sim.scenario.timeline == before
    collector.collect_once()
    text = requests.get(f"{base}/metrics", timeout=10).text
    assert "99999999999999999999" not in text and "e+20" not in text


@pytest.mark.parametrize("remote, allowed", [("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
                                             ("10.1.2.3", False), ("172.17.0.1", False), ("::ffff:10.0.0.1", False),
                                             ("", False)])
def test_sim_events_are_loopback_only_unless_told(remote, allowed):
    refused = simapi.forbidden(remote, any_host=False)
    assert (refused is None) == allowed
    if not allowed:
        assert "--sim-events-from-any-host" in refused["error"]
    assert simapi.forbidden(remote, any_host=True) is None


def test_sim_events_over_http_and_absent_without_a_simulator(served):
    sim, collector, _, base = served
    answer = requests.post(f"{base}/sim/events", json=[{"gpu": 0, "xid": 13}], timeout=10)
    assert answer.status_code == 200 and answer.json() == {"added": 1}   # from 127.0.0.1
    assert requests.get(f"{base}/sim/events", timeout=10).status_code == 405
    plain = MetricsServer.for_collector(collector, "127.0.0.1", 0).start()   # a real-NVML exporter
    try:
        assert requests.post(f"http://127.0.0.1:{plain.port}/sim/events", json=[], timeout=10).status_code == 404
    finally:
        plain.stop()


def test_background_render_waits_for_a_scrape_in_flight_and_gives_the_same_bytes(served):
    _, collector, server, _ = served
    scrapes = Scrapes(max_wait_s=30, budget_s=60)
    events: list[str] = []
    scrapes.begin()                                   # a scrape is being served
    pauser = threading.Thread(target=lambda: (scrapes.pause(), events.append("render resumed")))
    pauser.start()
    # The render must be waiting at its pause before the scrape ends, or the order below proves nothing (a
    # fixed 50 ms did not guarantee it on a loaded machine): the condition's waiter is the render. Fault
    # check: with pause() returning at once, this fails ("the render waiting at its pause").
    wait_until(lambda: len(scrapes._cond._waiters) == 1, "the render waiting at its pause")
    events.append("scrape done")
    scrapes.end()
    pauser.join(timeout=30)
    assert events == ["scrape done", "render resumed"]
    registry = CollectorRegistry()
    registry.register(collector)
    assert generate_latest(YieldingView(registry, Scrapes())) == generate_latest(registry)


def test_stepping_aside_is_bounded_by_a_budget():
    scrapes = Scrapes(max_wait_s=0.01, budget_s=0.05)
    scrapes.begin()                                   # a scrape that never ends
    for _ in range(100):                              # would wait 1 s without the budget
        scrapes.pause()
    assert scrapes.budget_left_s <= 0
    scrapes.reset()
    assert scrapes.budget_left_s == 0.05
