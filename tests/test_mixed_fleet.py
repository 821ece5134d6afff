"""A mixed fleet end to end, on the real Triton, Prometheus and Alertmanager, following docs/own-stack.md's
steps exactly: the spec snippet and the command lines are read from that page (between its `own-stack:`
markers), with only addresses, ports and file names replaced by the test's. The OpenAI SSE server of
gateway_support stands in for vLLM (which needs a GPU); Triton's series come from "the user's own monitor"
(`kubernetes.triton.monitor: false`: the selector is its Service's namespace and service labels, which the
scrape job writes); the GPU exporter runs on simulated NVML.

The page's table, row by row:
- clean (the vLLM model serves every request, Triton serves its models): no fleet alert at all, not even
  pending, over longer than L2's `for` after every target is up and every source has reported;
- L1 fault, XID 48 on GPU 0: GpuXidCritical (L1, critical) for that GPU;
- L2 fault, `classifier` unloaded from Triton: TritonModelNotLoaded (L2, critical) for it;
- L3 fault, the vLLM server cuts every stream: LlmAvailabilityBurnRate (L3, critical) for the tier;
and no Triton alert ever names the vLLM model.

The alerting path's own alerts (Notifier*, Alertmanager*, Prometheus*: no notifier runs here) and its
heartbeat are left out; scrapes every 2 s, evaluations every 1 s, L2's `for` 6 s and the burn-rate windows
1m/20s keep the test near two minutes."""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from gateway_support import DONE, OpenAIUpstream, chat_chunk, usage_chunk
from inferwatch.deploy.prometheus import scrape_jobs
from inferwatch.spec import spec_from_dict
from inferwatch.testing.process import ManagedProcess, free_port, http_ok

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "own-stack.md"
TENANT = {"X-Tenant-ID": "acme", "X-Service-Name": "chat-web"}
# The alerting path's own alerts, and its heartbeat (always firing, by design).
ALERTING_PATH = ("Notifier", "Alertmanager", "Prometheus", "InferwatchHeartbeat")
pytestmark = pytest.mark.slow


def doc_block(marker: str) -> str:
    """The fenced block between `<!-- own-stack:<marker> -->` and `<!-- /own-stack:<marker> -->` of the page."""
    found = re.search(rf"<!-- own-stack:{marker} -->\s*```\w*\n(.*?)```\s*<!-- /own-stack:{marker} -->",
                      DOC.read_text(), re.S)
    assert found, f"docs/own-stack.md has no own-stack:{marker} block"
    return found.group(1)


def _argv(line: str, replace: dict[str, str]) -> list[str]:
    """A command line of the page as this test runs it: `inferwatch` as this interpreter's module, the page's
    placeholders (file name, ports) replaced."""
    words = [replace.get(w, w) for w in shlex.split(line)]
    assert words[0] == "inferwatch", line
    return [sys.executable, "-m", "inferwatch", *words[1:]]


def _fleet_alerts(am_url: str) -> list[dict]:
    alerts = requests.get(f"{am_url}/api/v2/alerts", timeout=10).json()
    return [a for a in alerts if not a["labels"]["alertname"].startswith(ALERTING_PATH)]


def _chat(gateway: str) -> bool:
    try:
        resp = requests.post(gateway + "/v1/chat/completions", headers=TENANT, timeout=30,
                             json={"model": "llama3", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        return resp.status_code == 200 and b"[DONE]" in resp.content
    except requests.RequestException:
        return False  # a cut stream


def _named(alerts: list[dict], name: str) -> list[dict]:
    return [a for a in alerts if a["labels"]["alertname"] == name]


def test_mixed_fleet_follows_the_page_and_pages_once_per_layer_fault(triton_factory, prometheus_factory,
                                                                   alertmanager_factory, tmp_path):
    # Explicit model control, so the L2 fault can unload a model; every model loaded at start.
    triton = triton_factory(extra_args=["--model-control-mode=explicit", "--load-model=*"],
                            ready_path="/v2/health/ready")
    vllm = OpenAIUpstream()
    vllm.script = [chat_chunk("Hi", role="assistant"), chat_chunk("!", finish="stop"), usage_chunk(3, 2), DONE]
    ports = {k: free_port() for k in ("gpu", "collector", "gateway", "gateway_metrics")}

    # Step 1: the page's spec snippet on top of the repository's spec, its server addresses made real.
    snippet = yaml.safe_load(doc_block("spec")
                             .replace("http://triton:8000", triton.url).replace("http://vllm:8000", vllm.url))
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    for key, value in snippet.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) and key == "kubernetes" else value
    # The test's stack: its targets, and intervals short enough for a test.
    raw["targets"] = {
        **raw["targets"],
        "triton": [{"name": "triton", "url": triton.url, "metrics_url": triton.metrics_url, "node": "node-t",
                    "metrics_interval_ms": 1000}],
        "gpu_exporters": [{"address": f"127.0.0.1:{ports['gpu']}", "node": "gpu-a"}],
        "triton_collectors": [f"127.0.0.1:{ports['collector']}"],
        "gateways": [{"address": f"127.0.0.1:{ports['gateway_metrics']}", "node": "gw-a"}]}
    # Scraping no faster than Triton refreshes (the check refuses it); evaluating every second.
    raw["prometheus"] = {**raw["prometheus"], "scrape_interval": "2s", "evaluation_interval": "1s",
                         "rate_window": "20s"}
    raw["layers"]["L2"]["for"] = "6s"
    raw["layers"]["L3"]["burn_rate_windows"] = [{"name": "page-fast", "long": "1m", "short": "20s",
                                                 "factor": 14.4, "severity": "critical", "for": "0s"}]
    spec_path = tmp_path / "my.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    spec = spec_from_dict(raw)
    assert spec.selectors.triton == 'namespace="serving", service="triton"'

    # Step 2: the page's command lines, in its order.
    out = tmp_path / "deploy-mine"
    replace = {"my.yaml": str(spec_path), "deploy-mine": str(out), "8080": str(ports["gateway"]),
               "9402": str(ports["gateway_metrics"])}
    commands = [line for line in doc_block("commands").splitlines() if line.strip()]
    assert [shlex.split(c)[1] for c in commands] == ["check", "generate", "exporter"], commands
    for line in commands[:2]:
        done = subprocess.run(_argv(line, replace), capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
    rules = sorted((out / "rules" / "generated").glob("*.yml"))
    assert rules, "generate wrote no rule files"
    # The user's Prometheus: the fleet's scrape jobs (Triton's as their own monitor labels it) and the rules.
    jobs = [job for source, job in scrape_jobs(spec) if source in ("gpu", "triton", "triton_collector", "gateway")]
    triton_job = next(j for j in jobs if j["static_configs"][0]["labels"].get("service") == "triton")
    assert triton_job["static_configs"][0]["labels"]["namespace"] == "serving"

    with contextlib.ExitStack() as stack:
        stack.callback(vllm.stop)
        (tmp_path / "am.yml").write_text(yaml.safe_dump({"route": {"receiver": "null"},
                                                         "receivers": [{"name": "null"}]}))
        am = alertmanager_factory(tmp_path / "am.yml")
        processes = [
            ("gpu", [sys.executable, "-m", "inferwatch", "exporter", "gpu", "--nvml", "sim", "--interval", "1s",
                     "--hostname", "gpu-a", "--port", str(ports["gpu"])], ports["gpu"]),
            ("collector", [sys.executable, "-m", "inferwatch", "exporter", "triton", "--spec", str(spec_path),
                           "--interval", "1s", "--port", str(ports["collector"])], ports["collector"]),
            ("gateway", _argv(commands[2], replace), ports["gateway_metrics"])]
        for name, argv, port in processes:
            url = f"http://127.0.0.1:{port}/metrics"
            process = ManagedProcess(name, argv, tmp_path / f"{name}.log", ready=lambda url=url: http_ok(url))
            stack.callback(process.start(timeout=60).stop)
        config = {"global": {"scrape_interval": "2s", "evaluation_interval": "1s"},
                  "rule_files": [str(r) for r in rules], "scrape_configs": jobs,
                  "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.url.split("://")[1]]}]}]}}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = prometheus_factory(tmp_path / "prometheus.yml")
        gateway = f"http://127.0.0.1:{ports['gateway']}"
        assert _chat(gateway), "the vLLM model answers through the gateway"
        seen: set[tuple[str, str]] = set()  # (alert, model) of the alerts Alertmanager received: the pages
        pended: set[tuple[str, str]] = set()  # and of every alert pending or firing in Prometheus

        def pending_or_firing() -> list[dict]:
            return [s["metric"] for s in prom.query("ALERTS")
                    if not s["metric"]["alertname"].startswith(ALERTING_PATH)]

        def until(found, what: str, timeout: float = 120.0) -> list[dict]:
            """Send a chat request a second (the fleet's traffic) until `found(alerts)` holds in Alertmanager;
            every fleet alert seen on the way is added to `seen` (Alertmanager) and `pended` (Prometheus)."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                _chat(gateway)
                alerts = _fleet_alerts(am.url)
                seen.update((a["labels"]["alertname"], a["labels"].get("model", "")) for a in alerts)
                pended.update((m["alertname"], m.get("model", "")) for m in pending_or_firing())
                if found(alerts):
                    return alerts
                time.sleep(1.0)
            raise AssertionError(f"timed out waiting for {what}; alerts seen: {sorted(seen | pended)}")

        # Clean: first every source reports (targets up, Triton's models, the vLLM model's requests) ...
        def reporting(_alerts) -> bool:
            return (len(prom.query("up")) >= len(jobs) and not prom.query("up == 0")
                    and bool(prom.query('inferwatch_triton_model_ready{model="classifier"} == 1'))
                    and bool(prom.query('gateway_requests_total{model="llama3"} > 0')))

        until(lambda a: reporting(a) and not a and not pending_or_firing(), "every source reporting, the "
              "start-up's pending exporter-down alerts gone")
        seen.clear()  # what pended before the first scrapes (exporters not yet seen) is no page
        pended.clear()
        # ... then nothing pends or fires over L2's `for` plus the rate window (the longest rule input here).
        clean_until = time.monotonic() + 6 + 20 + 4
        until(lambda _a: time.monotonic() > clean_until, "the clean window")
        assert seen | pended == set(), f"alerts on the clean stack: {sorted(seen | pended)}"

        # L1: an XID on GPU 0.
        resp = requests.post(f"http://127.0.0.1:{ports['gpu']}/sim/events", json=[{"gpu": 0, "xid": 48}], timeout=10)
        assert resp.status_code == 200, resp.text
        xid = _named(until(lambda a: _named(a, "GpuXidCritical"), "GpuXidCritical"), "GpuXidCritical")
        assert [(a["labels"]["gpu"], a["labels"]["layer"], a["labels"]["severity"]) for a in xid] == \
            [("0", "L1", "critical")]

        # L2: a Triton model unloaded.
        requests.post(triton.url + "/v2/repository/models/classifier/unload", timeout=60).raise_for_status()
        gone = _named(until(lambda a: _named(a, "TritonModelNotLoaded"), "TritonModelNotLoaded"),
                      "TritonModelNotLoaded")
        assert [(a["labels"]["model"], a["labels"]["layer"], a["labels"]["severity"]) for a in gone] == \
            [("classifier", "L2", "critical")]

        # L3: the vLLM server cuts every stream.
        vllm.script = [chat_chunk("Hi", role="assistant"), ("cut",)]
        burn = _named(until(lambda a: _named(a, "LlmAvailabilityBurnRate"), "LlmAvailabilityBurnRate"),
                      "LlmAvailabilityBurnRate")
        assert {(a["labels"]["tier"], a["labels"]["layer"], a["labels"]["severity"]) for a in burn} == \
            {("realtime", "L3", "critical")}

        assert not [s for s in seen | pended if s[1] == "llama3" and s[0].startswith("Triton")], \
            f"a Triton alert for the vLLM model: {sorted(seen | pended)}"
        # One page per fault: nothing else reached Alertmanager on the way.
        assert {name for name, _model in seen} == {"GpuXidCritical", "TritonModelNotLoaded",
                                                   "LlmAvailabilityBurnRate"}, (sorted(seen), sorted(pended))
