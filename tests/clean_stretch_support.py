"""The demo's clean stretch as series: what Prometheus would scrape from the demo's sources over N minutes of
traffic with no fault, for `promtool test rules` over every generated rule (tests/test_clean_stretch.py).

The traffic has the demo's shape (inferwatch/demo/workload.py: its tenants, services, tiers, rates and token
counts, the classifier at 6 req/s in batches of 2 straight to Triton); only the first-token times are set by
each row, as a share of requests at given TTFTs per tier. The gateway's series come from the gateway's own
metric families (exporters/gateway/metrics.py) fed one request at a time, the GPUs' from the GPU exporter over
the simulated NVML with the demo's healthy scenario, so names, labels and buckets are the exporters'; Triton's,
the collector's, the notifier's and the alerting path's own series are written here with the labels the
generated scrape configuration adds.
"""

from __future__ import annotations

import dataclasses
import math

from prometheus_client.registry import CollectorRegistry

from inferwatch.demo.workload import CLASSIFIER_BATCH, CLASSIFIER_RATE_PER_S, FLOWS
from inferwatch.exporters.gateway.metrics import GatewayMetrics

MODEL = "toy_llm"          # what every demo flow streams (inferwatch/demo/workload.py)
NODE = "node-a"            # the shipped spec's node of every target
INPUT_TOKENS = 16          # prompt tokens per demo request (a short chat prompt)


@dataclasses.dataclass(frozen=True)
class Ttft:
    """First-token times of one tier: `pattern`, repeated request after request, lists the TTFT (seconds) of
    each request of one cycle (e.g. 19 at the target and 1 at the SLO threshold: exactly 95 % within target
    over whole cycles)."""

    pattern: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Stretch:
    """One replay: `minutes` of data at `step_s` spacing; `ttft` per tier; `failed_every`: one request in
    that many fails with a 500 (0: none); `failed_first`: so do the first requests of every flow (a start-up
burst); `per_step`: requests per flow and step instead of the demo's rates
    (for a row that needs whole cycles in every step); `start_counts_s`: seconds of traffic the gateway and
    Triton had already counted before Prometheus's first scrape (a Prometheus started after them)."""

    ttft: dict[str, Ttft]
    minutes: int = 10
    step_s: int = 15
    failed_every: int = 0
    failed_first: int = 0
    per_step: int | None = None
    start_counts_s: float = 0.0


def _key(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _fmt(v: float) -> str:
    return repr(float(v)) if not math.isinf(v) else "+Inf"


def gateway_series(stretch: Stretch) -> dict[str, list[str]]:
    """The gateway exporter's families at every step, with the scrape's job, instance and node."""
    steps = stretch.minutes * 60 // stretch.step_s + 1
    metrics = GatewayMetrics(CollectorRegistry())
    owed = {f: 0.0 for f in FLOWS}
    sent = {f: 0 for f in FLOWS}
    out: dict[str, list[str]] = {}
    scrape = {"job": "inferwatch-gateway", "instance": "127.0.0.1:9402", "node": NODE}

    def requests(flow, seconds: float) -> None:
        series = metrics.series(flow.tenant, MODEL, flow.tier)
        if stretch.per_step is not None:
            n = int(round(stretch.per_step * seconds / stretch.step_s))
        else:
            owed[flow] += flow.rate_per_s * seconds
            n = int(owed[flow])
            owed[flow] -= n
        pattern = stretch.ttft[flow.tier].pattern
        for _ in range(n):
            i = sent[flow]
            sent[flow] += 1
            series.add_tokens("input", INPUT_TOKENS)
            if i < stretch.failed_first or (stretch.failed_every and (i + 1) % stretch.failed_every == 0):
                series.count_request(500, "error")
                continue
            ttft = pattern[i % len(pattern)]
            series.ttft.observe(ttft)
            series.duration.observe(ttft + 0.01 * flow.max_tokens)
            series.output_tokens.observe(flow.max_tokens)
            series.add_tokens("output", flow.max_tokens)
            series.count_request(200, "ok")

    for flow in FLOWS:
        requests(flow, stretch.start_counts_s)
    for step in range(steps):
        if step:
            for flow in FLOWS:
                requests(flow, stretch.step_s)
        for family in metrics.registry.collect():
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                key = _key(s.name, {**s.labels, **scrape})
                out.setdefault(key, ["_"] * steps)[step] = _fmt(s.value)
    return out


def _steady(steps: int, value: float) -> list[str]:
    return [_fmt(value)] * steps


def _growing(steps: int, start: float, per_step: float) -> list[str]:
    return [_fmt(start + per_step * i) for i in range(steps)]


def fleet_series(stretch: Stretch) -> dict[str, list[str]]:
    """Every other source of the shipped spec's fleet, healthy: Triton serving the classifier (6 req/s in
    batches of 2, 3 ms queue, 5 ms compute) and toy_llm, the collector seeing every spec model READY, the
    notifier idle with a writable outbox, Alertmanager and Prometheus up."""
    steps = stretch.minutes * 60 // stretch.step_s + 1
    s = stretch.step_s
    before = stretch.start_counts_s
    out: dict[str, list[str]] = {}
    triton = {"job": "triton", "instance": "127.0.0.1:8002", "node": NODE, "triton": "triton-0"}
    collector = {"job": "inferwatch-triton", "instance": "127.0.0.1:9401", "node": NODE, "triton": "triton-0"}
    out[_key("up", triton)] = _steady(steps, 1)
    out[_key("up", {"job": "inferwatch-triton", "instance": "127.0.0.1:9401", "node": NODE})] = _steady(steps, 1)
    out[_key("inferwatch_triton_up", collector)] = _steady(steps, 1)
    out[_key("inferwatch_triton_server_live", collector)] = _steady(steps, 1)
    out[_key("inferwatch_triton_server_ready", collector)] = _steady(steps, 1)
    llm_rate = sum(f.rate_per_s for f in FLOWS)
    per_model = {"classifier": (CLASSIFIER_RATE_PER_S, CLASSIFIER_BATCH), MODEL: (llm_rate, 1)}
    for model in ("toy_llm", "classifier", "chat_ens"):
        out[_key("inferwatch_triton_model_ready", {**collector, "model": model, "version": "1"})] = _steady(steps, 1)
    out[_key("inferwatch_triton_model_preferred_batch_size_max", {**collector, "model": "classifier"})] = \
        _steady(steps, CLASSIFIER_BATCH)
    for model, (rate, batch) in per_model.items():
        labels = {**triton, "model": model, "version": "1"}
        req = rate * s
        out[_key("nv_inference_request_success", labels)] = _growing(steps, rate * before, req)
        out[_key("nv_inference_request_failure", {**labels, "reason": "REJECTED"})] = _steady(steps, 0)
        out[_key("nv_inference_request_failure", {**labels, "reason": "BACKEND"})] = _steady(steps, 0)
        out[_key("nv_inference_count", labels)] = _growing(steps, rate * batch * before, req * batch)
        out[_key("nv_inference_exec_count", labels)] = _growing(steps, rate * before, req)
        out[_key("nv_inference_pending_request_count", labels)] = _steady(steps, 0)
        for name, us in (("queue", 3000), ("compute_input", 100), ("compute_infer", 5000),
                         ("compute_output", 100), ("request", 8300)):
            out[_key(f"nv_inference_{name}_duration_us", labels)] = _growing(steps, rate * us * before, req * us)
    notifier = {"job": "inferwatch-notifier", "instance": "127.0.0.1:9410", "node": NODE}
    out[_key("up", notifier)] = _steady(steps, 1)
    out[_key("inferwatch_notifier_outbox_writable", notifier)] = _steady(steps, 1)
    out[_key("inferwatch_notifier_outbox_due", notifier)] = _steady(steps, 0)
    out[_key("inferwatch_notifier_oldest_pending_age_seconds", notifier)] = _steady(steps, 0)
    for job, port in (("inferwatch-alertmanager", 9093), ("inferwatch-prometheus", 9090)):
        out[_key("up", {"job": job, "instance": f"127.0.0.1:{port}", "node": NODE})] = _steady(steps, 1)
    out[_key("alertmanager_cluster_members", {"job": "inferwatch-alertmanager", "instance": "127.0.0.1:9093",
                                              "node": NODE})] = _steady(steps, 1)
    out[_key("up", {"job": "inferwatch-gateway", "instance": "127.0.0.1:9402", "node": NODE})] = _steady(steps, 1)
    return out


def gpu_series(stretch: Stretch) -> dict[str, list[str]]:
    """The GPU exporter over the simulated NVML with the demo's scenario (two steady, healthy GPUs), collected
    once per step, with the scrape's job, instance and node; `up` of the scrape too."""
    from gpu_support import FakeClock, render, samples
    from inferwatch.demo.services import GPU_SIM_SCENARIO
    from inferwatch.exporters.gpu.collector import GpuCollector
    from inferwatch.exporters.gpu.scenario import load_scenario
    from inferwatch.exporters.gpu.sim import SimNvml

    steps = stretch.minutes * 60 // stretch.step_s + 1
    clock = FakeClock()
    sim = SimNvml(load_scenario(GPU_SIM_SCENARIO), clock=clock)
    collector = GpuCollector(sim, NODE, interval_s=stretch.step_s, wall=clock, monotonic=clock)
    scrape = {"job": "inferwatch-gpu", "instance": "127.0.0.1:9400", "node": NODE}
    out: dict[str, list[str]] = {_key("up", scrape): _steady(steps, 1)}
    for step in range(steps):
        collector.collect_once()
        for s in samples(render(collector)):
            if s.name.endswith("_created"):
                continue
            out.setdefault(_key(s.name, {**s.labels, **scrape}), ["_"] * steps)[step] = _fmt(s.value)
        clock.advance(stretch.step_s)
    return out


def all_series(stretch: Stretch) -> dict[str, list[str]]:
    """Every source's series of one replay: {series text: one value or '_' per step}."""
    return {**gateway_series(stretch), **fleet_series(stretch), **gpu_series(stretch)}
