"""A mixed fleet end to end, on the real Triton, Prometheus and Alertmanager: the spec lists Triton's models,
a model of an OpenAI-compatible upstream (the OpenAI SSE server of gateway_support standing in for vLLM,
which needs a GPU) and a Triton model no Triton has loaded; one gateway fronts both upstreams; Triton's series
come from "the user's own monitor" (`kubernetes.triton.monitor: false`: the selector is its Service's
namespace and service labels, which the scrape job writes).

While the vLLM model serves every request, the one page is TritonModelNotLoaded for the missing Triton
model; the vLLM model (which used to page as "not loaded" and escalate to the phone) never has an alert."""

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


def test_mixed_fleet_pages_only_for_the_missing_triton_model(triton, tmp_path):
    vllm = OpenAIUpstream()
    vllm.script = [chat_chunk("Hi", role="assistant"), chat_chunk("!", finish="stop"), usage_chunk(3, 2), DONE]
    ports = {k: free_port() for k in ("collector", "gateway", "gateway_metrics")}
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
        "triton_collectors": [f"127.0.0.1:{ports['collector']}"],
        "gateways": [{"address": f"127.0.0.1:{ports['gateway_metrics']}", "node": "gw-a"}]}
    raw["prometheus"] = {**raw["prometheus"], "scrape_interval": "2s", "evaluation_interval": "2s"}
    raw["layers"]["L2"]["for"] = "10s"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    spec = spec_from_dict(raw)
    assert spec.selectors.triton == 'namespace="serving", service="triton"'
    rules = tmp_path / "rules"
    rules.mkdir()
    for rel, text in rule_outputs(spec).items():
        if rel.startswith(RULES_DIR):
            (rules / Path(rel).name).write_text(text)
    jobs = [job for source, job in scrape_jobs(spec) if source in ("triton", "triton_collector", "gateway")]
    triton_job = next(j for j in jobs if j["static_configs"][0]["labels"].get("service") == "triton")
    assert triton_job["static_configs"][0]["labels"]["namespace"] == "serving"
    with contextlib.ExitStack() as stack:
        stack.callback(vllm.stop)
        (tmp_path / "am.yml").write_text(yaml.safe_dump({"route": {"receiver": "null"},
                                                         "receivers": [{"name": "null"}]}))
        am = start_alertmanager(tmp_path / "am", tmp_path / "am.yml")
        stack.callback(am.stop)
        stack.callback(_exporter(tmp_path, "collector", ["triton", "--spec", str(spec_path), "--interval", "1s",
                                                         "--port", str(ports["collector"])], ports["collector"]).stop)
        stack.callback(_exporter(tmp_path, "gateway", ["gateway", "--spec", str(spec_path), "--port",
                                                       str(ports["gateway"]), "--metrics-port",
                                                       str(ports["gateway_metrics"])], ports["gateway_metrics"]).stop)
        config = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                  "rule_files": [str(rules / "*.yml")], "scrape_configs": jobs,
                  "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.url.split("://")[1]]}]}]}}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = start_prometheus(tmp_path / "prom", tmp_path / "prometheus.yml")
        stack.callback(prom.stop)
        gateway = f"http://127.0.0.1:{ports['gateway']}"
        deadline = time.monotonic() + 120
        not_loaded: set[str] = set()
        llama_alerts: list[dict] = []
        while time.monotonic() < deadline and not not_loaded:
            resp = requests.post(gateway + "/v1/chat/completions", headers=TENANT, timeout=30,
                                 json={"model": "llama3", "stream": True, "messages": [{"role": "user",
                                                                                        "content": "hi"}]})
            assert resp.status_code == 200 and b"Hi" in resp.content
            alerts = am.alerts()
            not_loaded = {a["labels"].get("model", "") for a in alerts
                          if a["labels"]["alertname"] == "TritonModelNotLoaded"}
            llama_alerts += [a for a in alerts if a["labels"].get("model") == "llama3"]
            time.sleep(1.0)
        assert not_loaded == {"ghost"}, "TritonModelNotLoaded for the missing Triton model only"
        assert llama_alerts == [], llama_alerts
        # Its rule judged Triton's models only (the vLLM model is in no Triton's repository).
        series = prom.query('ALERTS{alertname="TritonModelNotLoaded"}')
        assert all(s["metric"].get("model") == "ghost" for s in series), series
        assert len(vllm.bodies) >= 1
