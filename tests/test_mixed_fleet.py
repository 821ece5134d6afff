"""A mixed fleet end to end, on the real Triton, Prometheus and Alertmanager: the spec lists Triton's models,
a model of an OpenAI-compatible upstream (the OpenAI SSE server of gateway_support standing in for vLLM,
which needs a GPU) and a Triton model no Triton has loaded; one gateway fronts both upstreams; Triton's series
come from "the user's own monitor" (`kubernetes.triton.monitor: false`: the selector is its Service's
namespace and service labels, which the scrape job writes); the GPU exporter runs on simulated NVML.

1. Clean (the vLLM model serves every request): the one page of the fleet is L2's TritonModelNotLoaded for
   the missing Triton model; the vLLM model (which used to page as "not loaded" and escalate to the phone)
   never has an alert.
2. L1 fault, an XID 48 on GPU 0: GpuXidCritical (L1, critical) for that GPU.
3. L3 fault, the vLLM server cuts every stream: LlmAvailabilityBurnRate (L3, critical) for the tier, and
   still no alert names the vLLM model (its failures are not Triton's).

The alerting path's own alerts (Notifier*, Alertmanager*, Prometheus*: no notifier runs here) are left out;
the burn-rate windows are shortened (1m and 30s) so the L3 page comes within the test."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from gateway_support import DONE, OpenAIUpstream, chat_chunk, usage_chunk
from inferwatch.rules.generate import RULES_DIR
from inferwatch.rules.generate import outputs as rule_outputs
from inferwatch.rules.promconfig import scrape_jobs
from inferwatch.spec import spec_from_dict
from inferwatch.testing.alertmanager import start_alertmanager
from inferwatch.testing.process import ManagedProcess, free_port, http_ok
from inferwatch.testing.prometheus import start_prometheus

REPO = Path(__file__).resolve().parents[1]
TENANT = {"X-Tenant-ID": "acme", "X-Service-Name": "chat-web"}
pytestmark = pytest.mark.slow


def _exporter(tmp: Path, name: str, args: list[str], port: int) -> ManagedProcess:
    url = f"http://127.0.0.1:{port}/metrics"
    return ManagedProcess(name, [sys.executable, "-m", "inferwatch", "exporter", *args], tmp / f"{name}.log",
                          ready=lambda: http_ok(url)).start(timeout=60)


ALERTING_PATH = ("Notifier", "Alertmanager", "Prometheus")


def _fleet_alerts(am) -> list[dict]:
    return [a for a in am.alerts() if not a["labels"]["alertname"].startswith(ALERTING_PATH)]


def _chat(gateway: str) -> bool:
    try:
        resp = requests.post(gateway + "/v1/chat/completions", headers=TENANT, timeout=30,
                             json={"model": "llama3", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        return resp.status_code == 200 and b"[DONE]" in resp.content
    except requests.RequestException:
        return False  # a cut stream


def _until(gateway: str, am, found, what: str, seen: list[dict], timeout: float = 150.0) -> list[dict]:
    """Send a chat request a second (the fleet's traffic) until `found(alerts)` holds; every fleet alert seen
    on the way is added to `seen`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _chat(gateway)
        alerts = _fleet_alerts(am)
        seen += alerts
        if found(alerts):
            return alerts
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}; alerts seen: "
                         f"{sorted({(a['labels']['alertname'], a['labels'].get('model', '')) for a in seen})}")


def _named(alerts: list[dict], name: str) -> list[dict]:
    return [a for a in alerts if a["labels"]["alertname"] == name]


def test_mixed_fleet_pages_once_per_layer_fault_and_never_for_the_vllm_model(triton, tmp_path):
    vllm = OpenAIUpstream()
    vllm.script = [chat_chunk("Hi", role="assistant"), chat_chunk("!", finish="stop"), usage_chunk(3, 2), DONE]
    ports = {k: free_port() for k in ("gpu", "collector", "gateway", "gateway_metrics")}
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    raw["models"] = ["toy_llm", "classifier", "ghost"]  # ghost: a Triton model no Triton has
    raw["upstreams"] = {"triton": {"kind": "triton", "url": triton.url, "default": True},
                        "vllm": {"kind": "openai", "url": vllm.url, "models": ["llama3"]}}
    raw["kubernetes"] = {**raw.get("kubernetes", {}),
                         "triton": {"namespace": "serving", "service": "triton", "monitor": False}}
    raw["targets"] = {
        **raw["targets"],
        "triton": [{"name": "triton", "url": triton.url, "metrics_url": triton.metrics_url, "node": "node-t",
                    "metrics_interval_ms": 1000}],
        "gpu_exporters": [{"address": f"127.0.0.1:{ports['gpu']}", "node": "gpu-a"}],
        "triton_collectors": [f"127.0.0.1:{ports['collector']}"],
        "gateways": [{"address": f"127.0.0.1:{ports['gateway_metrics']}", "node": "gw-a"}]}
    raw["prometheus"] = {**raw["prometheus"], "scrape_interval": "2s", "evaluation_interval": "2s",
                         "rate_window": "30s"}
    raw["layers"]["L2"]["for"] = "10s"
    raw["layers"]["L3"]["burn_rate_windows"] = [{"name": "page-fast", "long": "1m", "short": "30s",
                                                 "factor": 14.4, "severity": "critical", "for": "0s"}]
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    spec = spec_from_dict(raw)
    assert spec.selectors.triton == 'namespace="serving", service="triton"'
    rules = tmp_path / "rules"
    rules.mkdir()
    for rel, text in rule_outputs(spec).items():
        if rel.startswith(RULES_DIR):
            (rules / Path(rel).name).write_text(text)
    jobs = [job for source, job in scrape_jobs(spec) if source in ("gpu", "triton", "triton_collector", "gateway")]
    triton_job = next(j for j in jobs if j["static_configs"][0]["labels"].get("service") == "triton")
    assert triton_job["static_configs"][0]["labels"]["namespace"] == "serving"
    with contextlib.ExitStack() as stack:
        stack.callback(vllm.stop)
        (tmp_path / "am.yml").write_text(yaml.safe_dump({"route": {"receiver": "null"},
                                                         "receivers": [{"name": "null"}]}))
        am = start_alertmanager(tmp_path / "am", tmp_path / "am.yml")
        stack.callback(am.stop)
        for name, args, port in (
                ("gpu", ["gpu", "--nvml", "sim", "--interval", "1s", "--hostname", "gpu-a", "--port",
                         str(ports["gpu"])], ports["gpu"]),
                ("collector", ["triton", "--spec", str(spec_path), "--interval", "1s", "--port",
                               str(ports["collector"])], ports["collector"]),
                # No --upstream: the spec's upstreams, one chosen per request.
                ("gateway", ["gateway", "--spec", str(spec_path), "--port", str(ports["gateway"]),
                             "--metrics-port", str(ports["gateway_metrics"])], ports["gateway_metrics"])):
            stack.callback(_exporter(tmp_path, name, args, port).stop)
        config = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                  "rule_files": [str(rules / "*.yml")], "scrape_configs": jobs,
                  "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.url.split("://")[1]]}]}]}}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = start_prometheus(tmp_path / "prom", tmp_path / "prometheus.yml")
        stack.callback(prom.stop)
        gateway = f"http://127.0.0.1:{ports['gateway']}"
        assert _chat(gateway), "the vLLM model answers through the gateway"
        seen: list[dict] = []

        # 1. Clean: L2's page for the missing Triton model only.
        alerts = _until(gateway, am, lambda a: _named(a, "TritonModelNotLoaded"), "TritonModelNotLoaded", seen)
        assert [a["labels"]["model"] for a in _named(alerts, "TritonModelNotLoaded")] == ["ghost"]
        assert {a["labels"]["alertname"] for a in seen} == {"TritonModelNotLoaded"}, seen

        # 2. L1: an XID on GPU 0.
        resp = requests.post(f"http://127.0.0.1:{ports['gpu']}/sim/events", json=[{"gpu": 0, "xid": 48}], timeout=10)
        assert resp.status_code == 200, resp.text
        alerts = _until(gateway, am, lambda a: _named(a, "GpuXidCritical"), "GpuXidCritical", seen)
        xid = _named(alerts, "GpuXidCritical")
        assert [(a["labels"]["gpu"], a["labels"]["layer"], a["labels"]["severity"]) for a in xid] == \
            [("0", "L1", "critical")]

        # 3. L3: the vLLM server cuts every stream.
        vllm.script = [chat_chunk("Hi", role="assistant"), ("cut",)]
        alerts = _until(gateway, am, lambda a: _named(a, "LlmAvailabilityBurnRate"), "LlmAvailabilityBurnRate",
                        seen)
        burn = _named(alerts, "LlmAvailabilityBurnRate")
        assert {(a["labels"]["tier"], a["labels"]["layer"], a["labels"]["severity"]) for a in burn} == \
            {("realtime", "L3", "critical")}
        assert not [a for a in seen if a["labels"].get("model") == "llama3"
                    and a["labels"]["alertname"].startswith("Triton")], "a Triton alert for the vLLM model"
        # One page per fault: nothing else fired on the way.
        assert {a["labels"]["alertname"] for a in seen} == {"TritonModelNotLoaded", "GpuXidCritical",
                                                           "LlmAvailabilityBurnRate"}, \
            sorted({a["labels"]["alertname"] for a in seen})
        series = prom.query('ALERTS{alertname="TritonModelNotLoaded"}')
        assert {s["metric"].get("model") for s in series} == {"ghost"}, series
