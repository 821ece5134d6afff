"""The Triton collector against two real Triton processes standing for two pods of one Service: behind a
name that resolves to both (a headless Service) each is polled as its own server; behind one round-robin
address (a ClusterIP Service) the collector says it answers as several servers and exports no blended
counters (exporters/triton/replicas.py)."""

from __future__ import annotations

import logging

import pytest

from inferwatch.exporters.triton.collector import TritonCollector
from inferwatch.exporters.triton.reader import TargetConfig
from inferwatch.exporters.triton.replicas import went_back
from inferwatch.exporters.triton.stats import parse_stats
from inferwatch.testing.tcpproxy import RoundRobinProxy
from inferwatch.testing.triton import EXAMPLE_MODEL_REPOSITORY, start_triton
from inferwatch.traffic import infer_classifier
from test_triton_collector import samples

# Requests each pod served before the collector starts: different, so a blend of the two is visible.
SENT = {"127.0.0.1": 8, "127.0.0.2": 3}
NAME = "triton-headless"


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    """Two Tritons on 127.0.0.1 and 127.0.0.2 sharing HTTP and metrics ports, as pods behind one Service do;
    each served SENT[host] single-row classifier requests."""
    first = start_triton(tmp_path_factory.mktemp("pod-a"), EXAMPLE_MODEL_REPOSITORY, ready_path="/v2/health/ready")
    servers = [first]
    try:
        servers.append(start_triton(tmp_path_factory.mktemp("pod-b"), EXAMPLE_MODEL_REPOSITORY, host="127.0.0.2",
                                    http_port=first.http_port, metrics_port=first.metrics_port,
                                    ready_path="/v2/health/ready"))
        for server in servers:
            for _ in range(SENT[server.host]):
                assert infer_classifier(server.url, batch=1)
        yield servers
    finally:
        for server in servers:
            server.stop()


class Dns:
    """A name's A records as a headless Service's DNS gives them (every ready pod), changed by the test."""

    def __init__(self, records: dict[str, list[str]]):
        self.records = records

    async def __call__(self, host: str, port: int) -> list[str]:
        if host not in self.records:
            raise OSError(f"{host} does not resolve")
        return list(self.records[host])


def _successes(s: dict) -> dict[tuple[str, str | None], float]:
    """(triton, address) -> classifier v2 successful requests, as a scrape serves them now."""
    return {(dict(k[1])["triton"], dict(k[1]).get("address")): v for k, v in s.items()
            if k[0] == "inferwatch_triton_model_inference_stat_count_total" and dict(k[1])["model"] == "classifier"
            and dict(k[1])["version"] == "2" and dict(k[1])["stat"] == "success"}


def _of(s: dict, name: str) -> dict[tuple[str, str | None], float]:
    return {(dict(k[1])["triton"], dict(k[1]).get("address")): v for k, v in s.items() if k[0] == name}


def test_a_name_behind_which_two_pods_answer_gives_per_pod_series(pods, caplog):
    port = pods[0].http_port
    dns = Dns({NAME: ["127.0.0.1", "127.0.0.2"]})
    target = TargetConfig("svc", f"http://{NAME}:{port}", f"http://{NAME}:{pods[0].metrics_port}/metrics")
    collector = TritonCollector([target], resolver=dns)
    try:
        with caplog.at_level(logging.INFO):
            polls = []
            for _ in range(4):   # idle: every counter must read the same on every poll (rate 0)
                collector.poll_once()
                polls.append(samples(collector))
        a, b = (("svc", f"{ip}:{port}") for ip in SENT)
        for s in polls:
            assert _successes(s) == {a: SENT["127.0.0.1"], b: SENT["127.0.0.2"]}
            assert _of(s, "inferwatch_triton_up") == {a: 1, b: 1}
            assert _of(s, "inferwatch_triton_server_ready") == {a: 1, b: 1}
            assert _of(s, "inferwatch_triton_summaries_enabled") == {a: 1, b: 1}   # each pod's own /metrics
            assert _of(s, "inferwatch_triton_target_addresses") == {("svc", None): 2}
            assert _of(s, "inferwatch_triton_target_load_balanced") == {a: 0, b: 0}
        for name in ("inferwatch_triton_model_executions_total", "inferwatch_triton_model_inferences_total"):
            first, last = _of(polls[0], name), _of(polls[-1], name)
            assert first == last and set(first) == {a, b}, name
        resolved = [r.getMessage() for r in caplog.records if "resolves to 2 addresses" in r.getMessage()]
        assert len(resolved) == 1   # said once, not per poll

        dns.records[NAME] = ["127.0.0.2"]   # one pod gone: its series go, the other is polled at its address
        collector.poll_once()
        s = samples(collector)
        assert _successes(s) == {("svc", None): SENT["127.0.0.2"]}
        assert _of(s, "inferwatch_triton_target_addresses") == {("svc", None): 1}

        del dns.records[NAME]   # the name no longer resolves: the target is down, not silently gone
        collector.poll_once()
        s = samples(collector)
        assert _of(s, "inferwatch_triton_up") == {("svc", None): 0}
        assert _of(s, "inferwatch_triton_target_addresses") == {("svc", None): 0}
    finally:
        collector.close()


def test_one_address_balancing_over_two_pods_is_said_and_its_blended_counters_withheld(pods, caplog):
    with RoundRobinProxy([(p.host, p.http_port) for p in pods]) as proxy:
        target = TargetConfig("lb", f"http://127.0.0.1:{proxy.port}", pods[0].metrics_url)
        collector = TritonCollector([target])
        try:
            with caplog.at_level(logging.WARNING):
                collector.poll_once()
                collector.poll_once()
                s = samples(collector)
        finally:
            collector.close()
    assert _of(s, "inferwatch_triton_target_load_balanced") == {("lb", None): 1}
    assert _of(s, "inferwatch_triton_up") == {("lb", None): 1}
    assert _successes(s) == {}   # no blend of 8 and 3 that rate() would read as traffic
    assert not [k for k in s if k[0] == "inferwatch_triton_model_executions_total"]
    assert [k for k in s if k[0] == "inferwatch_triton_model_ready"]   # what every pod shares is still there
    said = [r.getMessage() for r in caplog.records if "answers as several servers" in r.getMessage()]
    assert len(said) == 1 and "headless Service" in said[0]
    assert proxy.connections[0] > 0 and proxy.connections[1] > 0


def test_one_server_through_the_same_proxy_is_one_server(pods):
    with RoundRobinProxy([(pods[0].host, pods[0].http_port)]) as proxy:
        collector = TritonCollector([TargetConfig("one", f"http://127.0.0.1:{proxy.port}", pods[0].metrics_url)])
        try:
            collector.poll_once()
            s = samples(collector)
        finally:
            collector.close()
    assert _of(s, "inferwatch_triton_target_load_balanced") == {("one", None): 0}
    assert _successes(s) == {("one", None): SENT["127.0.0.1"]}


def _stats(counts: dict[str, int]) -> dict:
    """A /v2/models/stats answer for classifier v2 with these counts (others 0)."""
    def duration(n: int) -> dict:
        return {"count": n, "ns": n * 1000}
    return parse_stats({"model_stats": [{
        "name": "classifier", "version": "2", "inference_count": counts.get("inference", 0),
        "execution_count": counts.get("execution", 0),
        "inference_stats": {k: duration(counts.get(k, 0)) for k in (
            "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
            "cache_miss")},
        "batch_stats": []}]})[0]


@pytest.mark.parametrize("reads, several", [
    ([{"execution": 400}, {"execution": 8}, {"execution": 400}, {"execution": 8}], True),   # the reads
    ([{"success": 5}, {"success": 5}, {"success": 6}], False),      # one server, traffic in between
    ([{"inference": 10}, {"inference": 9}], True),
    ([{"fail": 2}, {"fail": 1}], True),
    ([{}, {}, {}], False),                                           # idle twins cannot be told apart
], ids=["400-8-400-8", "growing", "inferences-back", "failures-back", "idle"])
def test_counts_that_go_back_between_reads_mean_several_servers(reads, several):
    assert went_back([_stats(r) for r in reads]) is several


@pytest.mark.slow
def test_prometheus_reads_rate_zero_per_pod_and_no_blend(pods, tmp_path, prometheus_factory):
    """The collector served over HTTP and scraped every second by the real Prometheus: idle pods behind a
    name give two series whose rate() is 0; the same pods behind one round-robin address give no executions
    series at all (where a blend read 8, 3, 8, 3 … and rate() showed traffic) and load_balanced 1."""
    from prometheus_client import CollectorRegistry

    from inferwatch.exporters.triton.server import metrics_server
    from inferwatch.testing.prometheus import write_config

    port = pods[0].http_port
    dns = Dns({NAME: ["127.0.0.1", "127.0.0.2"]})
    with RoundRobinProxy([(p.host, p.http_port) for p in pods]) as proxy:
        collector = TritonCollector([
            TargetConfig("svc", f"http://{NAME}:{port}", f"http://{NAME}:{pods[0].metrics_port}/metrics"),
            TargetConfig("lb", f"http://127.0.0.1:{proxy.port}", pods[0].metrics_url)],
            resolver=dns, interval=0.5)
        registry = CollectorRegistry(support_collectors_without_names=True)
        registry.register(collector)
        server = metrics_server(registry, "127.0.0.1", 0)
        server.start()
        collector.start()
        try:
            prom = prometheus_factory(write_config(tmp_path / "prometheus.yml", [
                {"job_name": "inferwatch-triton", "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}]}]))
            executions = 'inferwatch_triton_model_executions_total{model="classifier", version="2"}'
            prom.wait_for(f"count_over_time({executions}[10s])", timeout=60,
                          predicate=lambda r: len(r) == 2 and all(float(x["value"][1]) >= 8 for x in r))
            rates = prom.query(f"rate({executions}[10s])")
            assert {x["metric"]["address"]: float(x["value"][1]) for x in rates} == {
                f"127.0.0.1:{port}": 0.0, f"127.0.0.2:{port}": 0.0}
            assert {x["metric"]["triton"] for x in rates} == {"svc"}   # nothing from the balanced address
            balanced = prom.query("inferwatch_triton_target_load_balanced")
            assert {(x["metric"]["triton"], x["metric"].get("address")): float(x["value"][1]) for x in balanced} == {
                ("svc", f"127.0.0.1:{port}"): 0, ("svc", f"127.0.0.2:{port}"): 0, ("lb", None): 1}
        finally:
            collector.close()
            server.stop()


@pytest.mark.slow
def test_prometheus_names_each_polled_address_by_the_pod_of_tritons_own_scrape(pods, tmp_path, prometheus_factory):
    """The rules' per-replica view (rules/replicas.py) in the real Prometheus: the collector polls a name that
    resolves to both pods and a third address where nothing answers (a hung pod), Triton's own scrape names
    the three `pod-a`, `pod-b`, `pod-c` on their metrics ports. Each address's series get the pod and node of
    the target at its IP, and the hung pod, down in both sources, is one TritonServerDown series naming it."""
    from prometheus_client import CollectorRegistry

    from inferwatch.exporters.triton.server import metrics_server
    from inferwatch.rules.triton import Sources, server_down
    from inferwatch.spec import Spec
    from inferwatch.testing.prometheus import write_config

    port, metrics_port = pods[0].http_port, pods[0].metrics_port
    hosts = {"127.0.0.1": ("pod-a", "node-a"), "127.0.0.2": ("pod-b", "node-b"), "127.0.0.3": ("pod-c", "node-c")}
    dns = Dns({NAME: list(hosts)})
    collector = TritonCollector([TargetConfig("svc", f"http://{NAME}:{port}", f"http://{NAME}:{metrics_port}/metrics")],
                                resolver=dns, interval=0.5)
    registry = CollectorRegistry(support_collectors_without_names=True)
    registry.register(collector)
    server = metrics_server(registry, "127.0.0.1", 0)
    server.start()
    collector.start()
    try:
        prom = prometheus_factory(write_config(tmp_path / "prometheus.yml", [
            {"job_name": "inferwatch-triton", "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}]},
            {"job_name": "triton", "static_configs": [
                {"targets": [f"{ip}:{metrics_port}"], "labels": {"triton": "svc", "pod": pod, "node": node}}
                for ip, (pod, node) in hosts.items()]}]))
        src = Sources.of(Spec())
        ready = src.per_replica(src.collected("inferwatch_triton_server_ready"))
        # Until Triton's own scrape has reported each target the collector's series stand unmatched.
        found = prom.wait_for(ready, timeout=60,
                              predicate=lambda r: len(r) == 2 and all("pod" in x["metric"] for x in r))
        assert {x["metric"]["address"]: (x["metric"].get("pod"), x["metric"].get("node")) for x in found} == {
            f"{ip}:{port}": hosts[ip][:2] for ip in ("127.0.0.1", "127.0.0.2")}
        prom.wait_for(f'inferwatch_triton_up{{address="127.0.0.3:{port}"}} == 0 and on () up{{pod="pod-c"}} == 0',
                      timeout=60)
        down = prom.query(server_down(src))
        assert [x["metric"] for x in down] == [{"node": "node-c", "triton": "svc", "pod": "pod-c"}]
    finally:
        collector.close()
        server.stop()
