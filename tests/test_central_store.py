"""Two clusters writing to one central store (docs/several-clusters.md), end to end with real parts:

- clusters a and b, each with its own simulated GPU exporter, Triton collector and gateway (the one real
  Triton serves both), each spec naming its cluster (`cluster.name`) and the store (`central_store.url`);
- cluster a's edge is Prometheus from the generated edge-prometheus.yml with the rule files added: a full
  Prometheus of cluster a (the rules evaluate there, the single-Prometheus reference) that also writes every
  scraped sample to the store; cluster b's edge is vmagent from the generated edge-scrape.yml and command
  line, next to a plain Prometheus of cluster b (the reference for b: the same targets, the same rules);
- VictoriaMetrics holds both; vmalert evaluates the same generated rule files there and notifies the real
  Alertmanager (generated configuration), which posts to the notifier and on to the channel simulators.

A GPU of cluster b overheats: exactly one GpuTemperatureCritical, labelled cluster="b" and naming it in its
description, reaches the phone channel (PagerDuty); cluster a stays silent; before and after, every recording
rule's value per cluster in the store equals what the cluster's own Prometheus computes (within one
evaluation interval of time).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from inferwatch.deploy.alertmanager import PATH as AM_PATH
from inferwatch.deploy.alertmanager import outputs as am_outputs
from inferwatch.deploy.central import edge_prometheus_config, edge_scrape_config
from inferwatch.deploy.prometheus import scrape_jobs
from inferwatch.rules.generate import RULES_DIR
from inferwatch.rules.generate import outputs as rule_outputs
from inferwatch.rules.names import RECORDING_RULES
from inferwatch.spec import spec_from_dict
from inferwatch.testing.process import ManagedProcess, free_port, http_ok
from inferwatch.testing.prometheus import start_prometheus
from inferwatch.testing.victoriametrics import start_edge, start_victoria_metrics, start_vmalert
from inferwatch.traffic import TrafficLoop, infer_classifier, stream_toy_llm
from notifier_support import notifier_behind_alertmanager, wait_for

REPO = Path(__file__).resolve().parents[1]
EVAL = 2.0  # seconds: the demo spec's evaluation interval
TENANT = {"X-Tenant-ID": "acme", "X-Service-Name": "chat-web"}
pytestmark = pytest.mark.slow


def _exporter(tmp: Path, name: str, args: list[str], port: int) -> ManagedProcess:
    url = f"http://127.0.0.1:{port}/metrics"
    return ManagedProcess(name, [sys.executable, "-m", "inferwatch", "exporter", *args], tmp / f"{name}.log",
                          ready=lambda: http_ok(url)).start(timeout=60)


def _cluster_spec(base: dict, name: str, triton, ports: dict, vm_url: str, am_url: str, edge: str,
                  notifier: str) -> dict:
    raw = dict(base)
    raw["targets"] = {
        **raw.get("targets", {}), "alertmanager": am_url, "notifier": notifier,
        "triton": [{"name": "triton-0", "url": triton.url, "metrics_url": triton.metrics_url, "node": "node-t",
                    "metrics_interval_ms": 1000}],
        "gpu_exporters": [{"address": f"127.0.0.1:{ports['gpu']}", "node": f"gpu-{name}"}],
        "triton_collectors": [f"127.0.0.1:{ports['collector']}"],
        "gateways": [{"address": f"127.0.0.1:{ports['gateway_metrics']}", "node": f"gw-{name}"}],
        "notifiers": [],
    }
    raw["prometheus"] = {**raw["prometheus"], "scrape_interval": "1s", "evaluation_interval": f"{EVAL:g}s"}
    raw["cluster"] = {"name": name}
    raw["central_store"] = {"url": vm_url, "edge": edge}
    return raw


def _finite(result: list[dict]) -> dict[tuple, float]:
    return {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "cluster")): float(s["value"][1])
            for s in result if math.isfinite(float(s["value"][1]))}


def _range(prom_url: str, expr: str, start: float, end: float) -> dict[tuple, list[float]]:
    body = requests.get(f"{prom_url}/api/v1/query_range", params={
        "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1s"}, timeout=30).json()
    out: dict[tuple, list[float]] = {}
    for s in body["data"]["result"]:
        key = tuple(sorted((k, v) for k, v in s["metric"].items() if k != "cluster"))
        out[key] = [float(v) for _, v in s["values"] if math.isfinite(float(v))]
    return out


# MetricsQL's rate() divides an increase by the time its samples span (from the last sample before the
# window), Prometheus' extrapolates to the window's edges: over a window of 20 one-second scrapes of live
# traffic the two differ by up to a sample's share of it, and a ratio of two such rates of sub-millisecond
# Triton times by a few tenths of a millisecond (ABSOLUTE_SLACK). Over a window longer than the data (the
# SLO's minutes early in a run) they differ by design, so such windows are compared once the data covers them.
RATE_SLACK = 0.10
ABSOLUTE_SLACK = 2e-4
# vmalert writes its recordings back through remote write: one chained on another of its group reads it an
# evaluation or two late, and misses it at an evaluation now and then, so the store is read over a few
# evaluations before the instant compared.
STORE_LAG = 3 * EVAL


def compare_recordings(vm, prom_url: str, cluster: str, at: float, covered: float) -> tuple[int, list[str]]:
    """(series compared, mismatches): each recording rule's series of `cluster` in the store against the
    cluster's Prometheus, both from STORE_LAG before `at` to one evaluation interval after (their min..max there
    must overlap, with the slack above), for the series whose `slo_window` (if any) is within the `covered`
    seconds of data."""
    from inferwatch.spec import Duration

    compared, bad = 0, []
    for record in RECORDING_RULES:
        central = _range(vm.url, f'{record}{{cluster="{cluster}"}}', at - STORE_LAG, at + EVAL)
        central = {k: v for k, v in central.items() if v}
        single = _range(prom_url, record, at - STORE_LAG, at + EVAL)
        single = {k: v for k, v in single.items() if v}
        for key in set(central) | set(single):
            window = dict(key).get("slo_window")
            if window and Duration.parse(window).seconds > covered:
                central.pop(key, None)
                single.pop(key, None)
        if set(central) != set(single):
            bad.append(f"{record}: only in the store {sorted(set(central) - set(single))[:2]}, only in "
                       f"Prometheus {sorted(set(single) - set(central))[:2]}")
            continue
        for key, values in central.items():
            low, high = min(single[key]), max(single[key])
            slack = RATE_SLACK * max(abs(low), abs(high)) + ABSOLUTE_SLACK
            compared += 1
            if max(values) < low - slack or min(values) > high + slack:
                bad.append(f"{record}{dict(key)}: store {min(values):.6g}..{max(values):.6g}, "
                           f"Prometheus {low:.6g}..{high:.6g}")
    return compared, bad


def test_two_clusters_one_store_one_page_per_fault(triton, tmp_path):
    base = yaml.safe_load((REPO / "examples/demo/inferwatch.demo.yaml").read_text())
    grouping = {"L1": ["alertname", "node", "gpu"], "L2": ["alertname", "node"], "L3": ["alertname", "tenant"]}
    with contextlib.ExitStack() as stack, notifier_behind_alertmanager(tmp_path, grouping) as (sims, svc, data):
        vm = start_victoria_metrics(tmp_path / "vm")
        stack.callback(vm.stop)
        am_port = free_port()
        ports = {c: {k: free_port() for k in ("gpu", "collector", "gateway", "gateway_metrics")} for c in "ab"}
        raws = {c: _cluster_spec({**base, **{k: data[k] for k in ("channels", "routes")}}, c, triton, ports[c],
                                 vm.url, f"http://127.0.0.1:{am_port}", "prometheus-agent" if c == "a" else "vmagent",
                                 data["targets"]["notifier"])
                for c in "ab"}
        specs = {c: spec_from_dict(raw) for c, raw in raws.items()}
        # Alertmanager: the generated configuration (groups per cluster), posting to the notifier.
        am_data = {**raws["b"], "targets": {**raws["b"]["targets"], "notifier": data["targets"]["notifier"]},
                   "notifier": data["notifier"]}
        (tmp_path / "alertmanager.yml").write_text(am_outputs(spec_from_dict(am_data))[AM_PATH])
        from inferwatch.testing.alertmanager import start_alertmanager

        am = start_alertmanager(tmp_path / "am", tmp_path / "alertmanager.yml", port=am_port)
        stack.callback(am.stop)
        # One set of rule files: the two specs differ only in targets and the cluster's name.
        rules = tmp_path / "rules"
        rules.mkdir()
        generated = {c: {r: t for r, t in rule_outputs(s).items() if r.startswith(RULES_DIR)} for c, s in specs.items()}
        assert generated["a"] == generated["b"]
        for rel, text in generated["a"].items():
            (rules / Path(rel).name).write_text(text)
        for c in specs:
            spec_path = tmp_path / f"spec-{c}.yaml"
            spec_path.write_text(yaml.safe_dump(raws[c]))
            p = ports[c]
            for name, args, port in (
                    ("gpu", ["gpu", "--nvml", "sim", "--interval", "1s", "--hostname", f"gpu-{c}", "--port",
                             str(p["gpu"])],
                     p["gpu"]),
                    ("collector", ["triton", "--spec", str(spec_path), "--interval", "1s", "--port",
                                   str(p["collector"])],
                     p["collector"]),
                    ("gateway", ["gateway", "--upstream", triton.url, "--spec", str(spec_path), "--port",
                                 str(p["gateway"]), "--metrics-port", str(p["gateway_metrics"])],
                                 p["gateway_metrics"])):
                stack.callback(_exporter(tmp_path / c, f"{name}-{c}", args, port).stop)
        # Cluster a: the edge Prometheus config with the rule files: cluster a's own Prometheus, writing raw
        # samples to the store (its recorded series and ALERTS stay local: vmalert records the store's).
        config_a = edge_prometheus_config(specs["a"])
        config_a["global"]["evaluation_interval"] = f"{EVAL:g}s"
        config_a["rule_files"] = [str(rules / "*.yml")]
        config_a["remote_write"][0]["write_relabel_configs"] = [
            {"source_labels": ["__name__"], "regex": ".*:.*|ALERTS|ALERTS_FOR_STATE", "action": "drop"}]
        # Samples sent within a second, as vmagent's edge does here (Prometheus batches for up to 5 s).
        config_a["remote_write"][0]["queue_config"] = {"batch_send_deadline": "1s"}
        (tmp_path / "edge-a.yml").write_text(yaml.safe_dump(config_a))
        prom_a = start_prometheus(tmp_path / "prom-a", tmp_path / "edge-a.yml")
        stack.callback(prom_a.stop)
        # Cluster b: vmagent (the generated scrape config and command line) and a Prometheus of its own.
        (tmp_path / "edge-b.yml").write_text(yaml.safe_dump(edge_scrape_config(specs["b"])))
        edge_b = start_edge(tmp_path / "edge-b", specs["b"], tmp_path / "edge-b.yml")
        stack.callback(edge_b.stop)
        config_b = {"global": {"scrape_interval": "1s", "evaluation_interval": f"{EVAL:g}s"},
                    "rule_files": [str(rules / "*.yml")],
                    "scrape_configs": [job for _s, job in scrape_jobs(specs["b"])]}
        (tmp_path / "prom-b.yml").write_text(yaml.safe_dump(config_b))
        prom_b = start_prometheus(tmp_path / "prom-b", tmp_path / "prom-b.yml")
        stack.callback(prom_b.stop)
        vmalert = start_vmalert(tmp_path / "vmalert", specs["b"], str(rules / "*.yml"))
        stack.callback(vmalert.stop)

        started = time.time()
        for c in "ab":
            gateway = f"http://127.0.0.1:{ports[c]['gateway']}"
            loop = TrafficLoop(f"llm-{c}", lambda g=gateway: stream_toy_llm(g, max_tokens=6, headers=TENANT), 3.0,
                               workers=2).start()
            stack.callback(loop.stop)
        loop = TrafficLoop("classifier", lambda: (infer_classifier(triton.url, batch=2), 0), 4.0, workers=1).start()
        stack.callback(loop.stop)

        # Both clusters' samples and vmalert's recorded series reach the store, each labelled with its cluster.
        wait_for(lambda: {s["metric"].get("cluster") for s in vm.query("up")} == {"a", "b"}, timeout=90,
                 what="both clusters' samples in the store")
        wait_for(lambda: {s["metric"].get("cluster") for s in
                          vm.query("tenant_model_tier:gateway_requests:rate")} == {"a", "b"}, timeout=120,
                 what="recorded series of both clusters in the store")
        time.sleep(25)  # a full rate window (20s) of both clusters' samples
        # Each chained recording reaches the store an evaluation or more after the one it reads (through
        # remote write), and an edge's first samples may come seconds after the other's: wait until the store
        # holds the same recorded series of each cluster as the cluster's Prometheus before comparing values.
        for c, prom in (("a", prom_a), ("b", prom_b)):
            wait_for(lambda c=c, prom=prom: not [b for b in compare_recordings(
                vm, prom.url, c, time.time() - 6, time.time() - started)[1] if "only in" in b],
                timeout=120, what=f"the same recorded series of cluster {c} in the store as in its Prometheus")
        for c, prom in (("a", prom_a), ("b", prom_b)):
            compared, bad = compare_recordings(vm, prom.url, c, time.time() - 6, time.time() - started)
            assert compared >= 20 and not bad, f"cluster {c}: {compared} compared\n" + "\n".join(bad)
        assert not sims.pagerduty.received, [r.text for r in sims.pagerduty.received]

        # The fault: GPU 0 of cluster b overheats.
        requests.post(f"http://127.0.0.1:{ports['b']['gpu']}/sim/events", timeout=10, json=[
            {"gpu": 0, "ramp": {"temperature_c": 93, "power_w": 320}, "over": "4s"}]).raise_for_status()

        def pages() -> list[dict]:
            out = []
            for r in sims.pagerduty.received:
                if r.body.get("event_action") != "trigger":
                    continue
                for alert in r.body["payload"]["custom_details"].get("firing", []):
                    if alert["labels"].get("alertname") == "GpuTemperatureCritical":
                        out.append(alert)
            return out

        wait_for(lambda: pages(), timeout=120, what="GpuTemperatureCritical on the phone channel")
        time.sleep(10)  # any duplicate (another cluster, another evaluator) would arrive within this
        assert len(pages()) == 1, pages()
        page = pages()[0]
        assert page["labels"]["cluster"] == "b" and page["labels"]["node"] == "gpu-b", page["labels"]
        assert page["annotations"]["description"].startswith("Cluster b: GPU 0 "), page["annotations"]
        firing = [a["labels"] for a in am.alerts() if a["labels"].get("alertname") == "GpuTemperatureCritical"]
        assert [a["cluster"] for a in firing] == ["b"], firing
        assert not any("cluster a" in r.text.lower() or "Cluster a:" in r.text
                       for r in sims.pagerduty.received), [r.text for r in sims.pagerduty.received]
        # Cluster b's Prometheus, evaluating the same rules on the same targets, agrees it fires (for b only).
        assert prom_b.query('ALERTS{alertname="GpuTemperatureCritical", alertstate="firing"}')
        assert not prom_a.query('ALERTS{alertname="GpuTemperatureCritical"}')
        for c, prom in (("a", prom_a), ("b", prom_b)):
            compared, bad = compare_recordings(vm, prom.url, c, time.time() - 6, time.time() - started)
            assert compared >= 20 and not bad, f"cluster {c} after the fault:\n" + "\n".join(bad)
