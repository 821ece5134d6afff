"""Every recording rule and alert the generator emits: the registry dashboards, runbooks and triage import.

Names never depend on the spec (windows and thresholds do), so a dashboard built on these names works with
the production spec and with a demo spec that shortens every window. Recording rules are named
`level:metric:operation` (Prometheus "Defining recording rules"); the level lists the labels kept besides the
topology labels. Per-model rules (`model_version*`) keep `node` and `triton`; gateway rules keep no node (they
aggregate across gateways).

A test checks that the generated rules and this registry list the same names.
"""

from __future__ import annotations

import dataclasses

LAYERS = ("L1", "L2", "L3")


# ------------------------------------------------------------------------------------------ recording rules
# name -> (labels kept, meaning). Rates and ratios are over spec.prometheus.rate_window unless said otherwise.
RECORDING_RULES: dict[str, tuple[tuple[str, ...], str]] = {
    # L1 ------------------------------------------------------------------------------------------------
    "gpu:DCGM_FI_DEV_FB_USED:ratio": (
        ("every GPU series label",), "framebuffer used / (used + free + reserved), 0-1"),
    # L2 (Triton's own metrics; labels node, triton, model, version) ----------------------------------------
    "model_version:nv_inference_request_success:rate": (
        ("node", "triton", "model", "version"), "successful requests/s"),
    "model_version_reason:nv_inference_request_failure:rate": (
        ("node", "triton", "model", "version", "reason"), "failed requests/s by reason (REJECTED|CANCELED|BACKEND|OTHER)"),
    "model_version:nv_inference_requests:rate": (
        ("node", "triton", "model", "version"), "all requests/s (success + failure)"),
    "model_version:nv_inference_request_error:ratio": (
        ("node", "triton", "model", "version"), "failed / all requests, 0-1"),
    "model_version:nv_inference_request_duration:avg_seconds": (
        ("node", "triton", "model", "version"), "average request time, s (rate(µs sum) / rate(success))"),
    "model_version:nv_inference_queue_duration:avg_seconds": (
        ("node", "triton", "model", "version"), "average queue time, s"),
    "model_version:nv_inference_compute_duration:avg_seconds": (
        ("node", "triton", "model", "version"), "average compute time (input + infer + output), s"),
    "model_version:nv_inference_queue_duration:p95_seconds": (
        ("node", "triton", "model", "version"),
        "P95 queue time, s, from nv_inference_queue_summary_us (max over processes); the average where "
        "summaries are absent"),
    "model_version:nv_inference_batch_size:avg": (
        ("node", "triton", "model", "version"), "achieved batch size: rate(inference_count) / rate(exec_count)"),
    # L2 as clients see it: entry points, steps of ensembles and BLS models, decoupled models --------------
    "model:nv_inference_entry_point_requests:rate": (
        ("node", "triton", "model"), "requests/s to models clients call (steps of an ensemble or BLS model left out)"),
    "model:nv_inference_entry_point_error:ratio": (
        ("node", "triton", "model", "source"),
        "failed / all requests per entry point; source=gateway for a decoupled model the gateway meters (errors "
        "mid-stream included), source=triton (Triton's failure counter) otherwise"),
    "parent_model:nv_inference_step_requests:per_parent_request": (
        ("node", "triton", "parent", "model"),
        "a step's executions per request to its parent (e.g. ~ output tokens for a per-token postprocessing step)"),
    "model:gateway_requests:rate": (("model",), "requests/s through the gateway, every tenant and tier"),
    "model:gateway_requests_errors:ratio": (
        ("model",), "error|timeout outcomes / all requests at the gateway (client 4xx except 429 excluded)"),
    "model:gateway_requests_cancelled:ratio": (("model",), "cancelled / all requests at the gateway"),
    # L3 (gateway; labels tenant, model, tier) ------------------------------------------------------------
    "tenant_model_tier_le:gateway_time_to_first_token_seconds_bucket:rate": (
        ("tenant", "model", "tier", "le"), "TTFT bucket rates (for histogram_quantile at other quantiles)"),
    "tenant_model_tier_le:gateway_inter_token_latency_seconds_bucket:rate": (
        ("tenant", "model", "tier", "le"), "ITL bucket rates"),
    "tenant_model_tier:gateway_time_to_first_token_seconds:p50": (("tenant", "model", "tier"), "TTFT P50, s"),
    "tenant_model_tier:gateway_time_to_first_token_seconds:p95": (("tenant", "model", "tier"), "TTFT P95, s"),
    "tenant_model_tier:gateway_time_to_first_token_seconds:p99": (("tenant", "model", "tier"), "TTFT P99, s"),
    "tenant_model_tier:gateway_inter_token_latency_seconds:p50": (("tenant", "model", "tier"), "ITL P50, s"),
    "tenant_model_tier:gateway_inter_token_latency_seconds:p95": (("tenant", "model", "tier"), "ITL P95, s"),
    "tenant_model_tier:gateway_inter_token_latency_seconds:p99": (("tenant", "model", "tier"), "ITL P99, s"),
    "tenant_model_tier_type:gateway_tokens:rate": (
        ("tenant", "model", "tier", "type"), "tokens/s metered, type=input|output (output = output tokens/s)"),
    "tenant_model_tier:gateway_output_tokens:avg": (
        ("tenant", "model", "tier"), "average output length per successful request, tokens"),
    "tenant_model_tier:gateway_requests:rate": (("tenant", "model", "tier"), "requests/s, every outcome"),
    "tenant_model_tier:gateway_requests_errors:ratio": (
        ("tenant", "model", "tier"), "error|timeout outcomes / all requests (client 4xx except 429 excluded)"),
    "tenant_model_tier:gateway_requests_cancelled:ratio": (
        ("tenant", "model", "tier"), "cancelled / all requests"),
    # SLO windows (label slo_window = each long and short window of layers.L3.burn_rate_windows) ---------------
    "tier_slo_window:gateway_requests:rate": (("tier", "slo_window"), "requests/s over slo_window"),
    "tier_slo_window:gateway_requests_errors:ratio": (
        ("tier", "slo_window"), "availability SLI misses: error|timeout / all requests over slo_window"),
    "tier_slo_window:gateway_time_to_first_token_seconds:ratio_over_slo": (
        ("tier", "slo_window"), "TTFT SLI misses: streamed requests slower than the tier's ttft_slo_seconds / "
                                "all streamed requests over slo_window"),
}


# ---------------------------------------------------------------------------------------------------- alerts
@dataclasses.dataclass(frozen=True)
class AlertInfo:
    layer: str
    severities: tuple[str, ...]
    summary: str  # static sentence, ends with a period (mixtool lint rules)
    extra_labels: tuple[str, ...] = ()  # labels besides layer/severity the rule itself sets


ALERTS: dict[str, AlertInfo] = {
    # L1 ---------------------------------------------------------------------------------------------------
    "GpuTemperatureCritical": AlertInfo("L1", ("critical",), "GPU temperature is above its critical threshold."),
    "GpuMemoryUsageHigh": AlertInfo("L1", ("warning",), "GPU framebuffer memory is nearly full."),
    "GpuMemoryUsageCritical": AlertInfo("L1", ("critical",), "GPU framebuffer memory is full."),
    "GpuLost": AlertInfo("L1", ("critical",), "A GPU has fallen off the bus or cannot be read."),
    "GpuXidCritical": AlertInfo("L1", ("critical",), "A GPU reported a critical XID error."),
    "GpuUncorrectableMemoryError": AlertInfo(
        "L1", ("critical",), "A GPU reported an uncorrectable memory error or a failed row remap."),
    "GpuThrottling": AlertInfo("L1", ("warning",), "A GPU is slowing its clocks for thermal or power-brake reasons."),
    "GpuExporterDown": AlertInfo("L1", ("critical",), "The GPU exporter cannot be scraped, GPU alerts are blind."),
    # L2 ---------------------------------------------------------------------------------------------------
    "TritonServerDown": AlertInfo("L2", ("critical",), "A Triton server does not answer."),
    "TritonServerNotReady": AlertInfo("L2", ("critical",), "A Triton server is live but not ready."),
    "TritonModelNotReady": AlertInfo("L2", ("critical",), "A model version is not READY on a Triton server."),
    "TritonModelErrorRatioHigh": AlertInfo("L2", ("critical",), "A model fails too many inference requests."),
    "TritonDecoupledModelErrorRatioHigh": AlertInfo(
        "L2", ("critical",), "A streaming model fails too many requests as clients see them."),
    "TritonQueueTimeP95High": AlertInfo("L2", ("warning",), "Requests wait too long in a model's queue."),
    "TritonRequestsRejected": AlertInfo("L2", ("warning",), "Triton rejects requests for a model."),
    "TritonPendingRequestsHigh": AlertInfo("L2", ("warning",), "Too many requests are pending for a model."),
    "TritonBatchingIneffective": AlertInfo(
        "L2", ("warning",), "Dynamic batching forms batches far smaller than configured while requests queue."),
    "TritonCanaryRegression": AlertInfo(
        "L2", ("warning",), "A canary model version is worse than the version serving most traffic.",
        ("signal",)),
    "TritonCollectorDown": AlertInfo("L2", ("warning",), "The inferwatch Triton collector cannot be scraped."),
    # L3 ---------------------------------------------------------------------------------------------------
    "LlmTtftP95High": AlertInfo("L3", ("warning",), "Time to first token P95 is above the tier's target.", ("tier",)),
    "LlmAvailabilityBurnRate": AlertInfo(
        "L3", ("critical", "warning"), "The availability error budget is burning too fast.", ("window", "slo", "tier")),
    "LlmTtftBurnRate": AlertInfo(
        "L3", ("critical", "warning"), "The time-to-first-token error budget is burning too fast.",
        ("window", "slo", "tier")),
    "LlmOutputThroughputCollapse": AlertInfo(
        "L3", ("warning",), "Output token throughput collapsed compared with the baseline."),
    "LlmCancellationRatioHigh": AlertInfo("L3", ("warning",), "Many LLM requests are cancelled by clients."),
    "GatewayExporterDown": AlertInfo("L3", ("warning",), "The gateway exporter cannot be scraped, LLM alerts are blind."),
    # Notifier self-alerts (layer L1 so they page; Alertmanager routes component=notifier around the notifier)
    "NotifierDeliveryFailing": AlertInfo(
        "L1", ("critical",), "The notifier fails to deliver notifications.", ("component", "signal")),
    "NotifierDeadLetters": AlertInfo(
        "L1", ("critical",), "The notifier gave up on notifications.", ("component",)),
    "NotifierDown": AlertInfo("L1", ("critical",), "The notifier cannot be scraped.", ("component",)),
}


def alerts_of_layer(layer: str) -> list[str]:
    """Alert names of one layer (L1|L2|L3), in registry order."""
    return [name for name, info in ALERTS.items() if info.layer == layer]
