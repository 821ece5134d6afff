"""Prepared Prometheus data for triage tests: cross-layer situations an on-call meets, as the raw series
the gateway, Triton, the Triton collector and the GPU exporter would have produced over the last 30 min.

Each situation uses its own model and node, so one Prometheus holds all of them and a triage scoped by
`model` sees only its own situation.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from inferwatch.testing.backfill import Series, counter, gauge, serve_series
from inferwatch.testing.prometheus import PrometheusServer

# TTFT distribution every situation shares at the gateway: cumulative fraction of requests per bucket
# edge. P95 interpolates to 0.3 + (0.95 - 0.8) / 0.2 * 0.7 = 0.825 s, far above the 300 ms realtime target.
SLOW_TTFT = {"0.1": 0.5, "0.3": 0.8, "1.0": 1.0, "+Inf": 1.0}
TTFT_P95_SECONDS = 0.825
# Triton's own time to first response (nv_inference_first_response_histogram_ms, Triton 24.11+, bucket
# edges in ms as a per-model metric_control may set them). FAST: P95 = 0.95 / 0.97 * 100 ms ≈ 98 ms, so
# the gateway's TTFT is lost outside Triton. SLOW mirrors the gateway: P95 825 ms, the model itself is slow.
FAST_FIRST_RESPONSE = {"100": 0.97, "300": 1.0, "1000": 1.0, "+Inf": 1.0}
SLOW_FIRST_RESPONSE = {"100": 0.5, "300": 0.8, "1000": 1.0, "+Inf": 1.0}
# A healthy realtime model: P95 interpolates to 0.1 + (0.95 - 57/62) / (1 - 57/62) * 0.1 = 0.138 s, well
# under the 300 ms target (the gateway exporter's real bucket edges 0.1 and 0.2).
FAST_TTFT = {"0.1": 57 / 62, "0.2": 1.0, "0.3": 1.0, "1.0": 1.0, "+Inf": 1.0}
FAST_TTFT_P95_SECONDS = 0.138


@dataclasses.dataclass(frozen=True)
class Situation:
    model: str
    node: str
    expected_cause: str
    queue_p95_seconds: float | None = None     # None: Triton not scraped at all
    batch_size: float = 1.0
    max_batch_size: int = 8
    gpu_util_percent: float = 50.0
    pending: float = 0.0
    request_rate: float = 20.0
    first_response: dict[str, float] | None = None   # Triton-side TTFT CDF (ms edges); None: Triton < 24.11
    compute_seconds: float = 0.002                   # Triton compute time per request
    ttft: dict[str, float] = dataclasses.field(default_factory=lambda: dict(SLOW_TTFT))  # gateway TTFT CDF
    max_queue_delay_seconds: float | None = None     # dynamic batcher max_queue_delay; None: not exported


SITUATIONS = [
    # Queue long and GPU saturated at full batches: out of capacity.
    Situation("llm-capacity", "node-a", "capacity", queue_p95_seconds=0.6, batch_size=8, gpu_util_percent=97,
              pending=40),
    # Queue short, every request alone although max_batch_size is 8, GPU mostly idle: batching configuration.
    Situation("llm-batching", "node-b", "batching-configuration", queue_p95_seconds=0.01, batch_size=1.0,
              gpu_util_percent=30, pending=1),
    # Triton's own first response is fast (24.11+ histogram) and everything else normal: the time is lost
    # between gateway and Triton.
    Situation("llm-gateway", "node-c", "gateway-network", queue_p95_seconds=0.005, batch_size=6,
              gpu_util_percent=40, first_response=FAST_FIRST_RESPONSE),
    # Triton's own first response is as slow as the gateway's TTFT, queue short: the model (prefill) is slow.
    Situation("llm-slow-model", "node-f", "model-slow-first-response", queue_p95_seconds=0.005, max_batch_size=0,
              gpu_util_percent=40, first_response=SLOW_FIRST_RESPONSE),
    # No first-response histogram, but Triton computes 700 ms per request: model compute.
    Situation("llm-compute", "node-g", "model-compute", queue_p95_seconds=0.005, max_batch_size=0,
              gpu_util_percent=60, compute_seconds=0.7),
    # The demo's fault on Triton 2.51: a decoupled Python model waits before its first token. Queue short,
    # GPU idle, compute tiny (the work happens outside execute), no first-response histogram: triage must
    # not blame the network, only say the time goes after scheduling.
    Situation("llm-prefill", "node-h", "slow-after-scheduling", queue_p95_seconds=0.005, max_batch_size=0,
              gpu_util_percent=20, compute_seconds=0.001),
    # Gateway sees slow TTFT but Triton, which reports other models, has no series for this one: the model is
    # served by another upstream (or named differently on Triton).
    Situation("llm-dark", "node-d", "upstream-not-on-triton"),
]

# Nothing wrong by the alert's own measure: the evidence the old triage read as "slow after scheduling"
# (short queue, idle GPU, tiny compute, no first-response histogram) with a TTFT P95 of 138 ms against the
# realtime tier's 300 ms target.
HEALTHY_LLM = Situation("llm-fast", "node-j", "", queue_p95_seconds=0.005, max_batch_size=0, gpu_util_percent=20,
                        compute_seconds=0.001, ttft=FAST_TTFT)
# Model `classifier` (its own 250 ms queue threshold in inferwatch.yaml) queues 5 ms at P95 while batching
# one by one against a preferred size of 8 with a 100 ms max_queue_delay: the batching evidence is there,
# the queue fault is not.
SHORT_QUEUE_CLASSIFIER = Situation("classifier", "node-k", "", queue_p95_seconds=0.005, batch_size=1.0,
                                   max_batch_size=8, gpu_util_percent=30, max_queue_delay_seconds=0.1)


def situation_series(s: Situation, start: float, end: float) -> list[Series]:
    """Raw series for one situation between `start` and `end` (unix seconds)."""
    out: list[Series] = []
    gw = {"job": "inferwatch-gateway", "instance": "gw:9402", "node": "gw-node", "model": s.model,
          "tier": "realtime", "tenant": "acme"}
    for le, frac in s.ttft.items():
        out.append(counter("gateway_time_to_first_token_seconds_bucket", {**gw, "le": le}, s.request_rate * frac,
                           start, end))
    out.append(counter("gateway_time_to_first_token_seconds_count", gw, s.request_rate, start, end))
    out.append(counter("gateway_requests_total", {**gw, "outcome": "success", "code": "200"}, s.request_rate,
                       start, end))
    out.append(gauge("gateway_requests_in_flight", gw, s.request_rate * 2, start, end))
    if s.queue_p95_seconds is None:
        return out
    tri = {"job": "triton", "instance": f"{s.node}:8002", "node": s.node, "triton": f"triton-{s.node}",
           "model": s.model, "version": "1"}
    out += [
        counter("nv_inference_request_success", tri, s.request_rate, start, end),
        counter("nv_inference_count", tri, s.request_rate, start, end),
        counter("nv_inference_exec_count", tri, s.request_rate / s.batch_size, start, end),
        counter("nv_inference_queue_duration_us", tri, s.request_rate * s.queue_p95_seconds * 0.6e6, start, end),
        gauge("nv_inference_queue_summary_us", {**tri, "quantile": "0.95"}, s.queue_p95_seconds * 1e6, start, end),
        gauge("nv_inference_pending_request_count", tri, s.pending, start, end),
        counter("nv_inference_compute_infer_duration_us", tri, s.request_rate * s.compute_seconds * 1e6, start, end),
    ]
    for le, frac in (s.first_response or {}).items():
        out.append(counter("nv_inference_first_response_histogram_ms_bucket", {**tri, "le": le},
                           s.request_rate * frac, start, end))
    if s.first_response:
        out.append(counter("nv_inference_first_response_histogram_ms_count", tri, s.request_rate, start, end))
    col = {"job": "inferwatch-triton", "instance": "collector:9401", "node": s.node, "triton": f"triton-{s.node}",
           "model": s.model}
    out += [
        gauge("inferwatch_triton_model_max_batch_size", col, s.max_batch_size, start, end),
        gauge("inferwatch_triton_model_preferred_batch_size_max", col, s.max_batch_size, start, end),
        gauge("inferwatch_triton_model_dynamic_batching_enabled", col, 1, start, end),
    ]
    if s.max_queue_delay_seconds is not None:
        out.append(gauge("inferwatch_triton_model_max_queue_delay_seconds", col, s.max_queue_delay_seconds, start, end))
    gpu = {"job": "inferwatch-gpu", "instance": f"{s.node}:9400", "node": s.node, "gpu": "0",
           "UUID": f"GPU-{s.node}", "Hostname": s.node, "modelName": "NVIDIA H100 80GB HBM3"}
    out.append(gauge("DCGM_FI_DEV_GPU_UTIL", gpu, s.gpu_util_percent, start, end))
    out.append(gauge("inferwatch_gpu_up", {k: gpu[k] for k in ("job", "instance", "node", "gpu", "UUID", "Hostname")},
                     1, start, end))
    return out


SCRAPING_ON_S = 20 * 60


def metrics_port_blocked_series(start: float, end: float) -> list[Series]:
    """Triton on node-e answers its HTTP API (the collector reaches it) but its :8002/metrics cannot be
    scraped; the node's GPU exporter is fine. TritonServerDown should say: metrics port blocked."""
    node, triton = "node-e", "triton-node-e"
    # Prometheus keeps scraping while the module's tests run (minutes on a busy machine): its `up` samples go on
    # past `end`, so triage finds the GPU exporter fresh by its own scrape interval whenever a test asks.
    scraping = end + SCRAPING_ON_S
    return [
        gauge("up", {"job": "triton", "instance": f"{node}:8002", "node": node, "triton": triton}, 0, start, scraping),
        gauge("up", {"job": "inferwatch-gpu", "instance": f"{node}:9400", "node": node}, 1, start, scraping),
        gauge("inferwatch_triton_up", {"job": "inferwatch-triton", "instance": "collector:9401", "node": node,
                                       "triton": triton}, 1, start, end),
        gauge("inferwatch_gpu_up", {"job": "inferwatch-gpu", "instance": f"{node}:9400", "node": node, "gpu": "0",
                                    "UUID": f"GPU-{node}", "Hostname": node}, 1, start, end),
    ]


# GPU temperature situations: node -> [(UUID, temperature °C, utilisation %)]. node-solo has one GPU, so
# there is no neighbour to compare with; node-rack has a cool neighbour; node-hot's GPUs are all hot.
GPU_HEAT = {
    "node-solo": [("GPU-solo-0", 90.0, 20.0)],
    "node-rack": [("GPU-rack-0", 90.0, 20.0), ("GPU-rack-1", 60.0, 25.0)],
    "node-hot": [("GPU-hot-0", 90.0, 20.0), ("GPU-hot-1", 84.0, 25.0)],
}


def gpu_heat_series(start: float, end: float) -> list[Series]:
    out: list[Series] = []
    for node, gpus in GPU_HEAT.items():
        for i, (uuid, temperature, util) in enumerate(gpus):
            labels = {"job": "inferwatch-gpu", "instance": f"{node}:9400", "node": node, "gpu": str(i), "UUID": uuid,
                      "Hostname": node}
            out += [gauge("DCGM_FI_DEV_GPU_TEMP", labels, temperature, start, end),
                    gauge("DCGM_FI_DEV_GPU_UTIL", labels, util, start, end),
                    gauge("inferwatch_gpu_up", labels, 1, start, end)]
    return out


@dataclasses.dataclass(frozen=True)
class VersionRun:
    """A model failing with BACKEND errors on `failing_version`, which became READY `loaded_before_s` before
    the end of the data while `watched_s` of collector data exist; earlier versions READY all along."""

    model: str
    node: str
    watched_s: float
    loaded_before_s: float
    failing_version: str = "2"
    earlier_versions: tuple[str, ...] = ("1",)


VERSION_RUNS = [
    # A four-minute run (the demo's length): everything, the failing version included, READY from the
    # collector's first poll. Its load time is unknown; "loaded in the last hour" must not mean "new".
    VersionRun("llm-fresh", "node-i", watched_s=240, loaded_before_s=240, failing_version="1", earlier_versions=()),
    # Version 2 became READY 3 min before the fault, version 1 served before: new-version-errors.
    VersionRun("llm-newver", "node-l", watched_s=1800, loaded_before_s=180),
    # Version 2 became READY 25 min before the fault and served cleanly since: not the new version.
    VersionRun("llm-oldver", "node-m", watched_s=1800, loaded_before_s=1500),
]


def version_run_series(run: VersionRun, end: float) -> list[Series]:
    start, loaded = end - run.watched_s, end - run.loaded_before_s
    triton = f"triton-{run.node}"
    col = {"job": "inferwatch-triton", "instance": "collector:9401", "node": run.node, "triton": triton}
    tri = {"job": "triton", "instance": f"{run.node}:8002", "node": run.node, "triton": triton, "model": run.model}
    out = [gauge("inferwatch_triton_up", col, 1, start, end)]
    for version in run.earlier_versions:
        out.append(gauge("inferwatch_triton_model_ready", {**col, "model": run.model, "version": version}, 1, start,
                         end))
        out.append(counter("nv_inference_request_success", {**tri, "version": version}, 10.0, start, end))
    v = {**tri, "version": run.failing_version}
    out.append(gauge("inferwatch_triton_model_ready", {**col, "model": run.model, "version": run.failing_version}, 1,
                     loaded, end))
    # Clean traffic on the failing version until 2 min before the end, then 30 % backend errors.
    fault = end - 120
    out.append(counter("nv_inference_request_success", v, 10.0, loaded, end))
    out.append(gauge("nv_inference_request_failure", {**v, "reason": "BACKEND"},  # a counter from 0 at `fault`
                     lambda t: max(0.0, 3.0 * (t - fault)), loaded, end))
    return out


def all_series(now: float | None = None, minutes: int = 30) -> list[Series]:
    """Every situation's series for the `minutes` before `now` (default: the current time)."""
    end = (now or time.time()) - 5
    start = end - minutes * 60
    series: list[Series] = []
    for s in [*SITUATIONS, HEALTHY_LLM, SHORT_QUEUE_CLASSIFIER]:
        series += situation_series(s, start, end)
    for run in VERSION_RUNS:
        series += version_run_series(run, end)
    return series + metrics_port_blocked_series(start, end) + gpu_heat_series(start, end)


def start_prepared_prometheus(workdir: Path, now: float | None = None) -> PrometheusServer:
    """A real Prometheus (no scrape targets) whose TSDB holds the 30 minutes before `now` (unix seconds,
    default the present) of every situation, backfilled with `promtool tsdb create-blocks-from openmetrics`."""
    return serve_series(all_series(now), workdir, name="scenarios")
