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

from inferwatch.rules.identity import GPU as GPU_IDENTITY
from inferwatch.rules.identity import GPU_INSTANCE

LAYERS = ("L1", "L2", "L3")


# ------------------------------------------------------------------------------------------ recording rules
# name -> (labels kept, meaning). Rates and ratios are over spec.prometheus.rate_window unless said otherwise.
RECORDING_RULES: dict[str, tuple[tuple[str, ...], str]] = {
    # L1 ------------------------------------------------------------------------------------------------
    "gpu:DCGM_FI_DEV_FB_USED:ratio": (
        GPU_INSTANCE, "framebuffer used / (used + free + reserved), 0-1, per MIG instance (per GPU without MIG)"),
    "gpu:DCGM_FI_DEV_GPU_UTIL:ratio": (
        GPU_INSTANCE, "utilization 0-1 per MIG instance (per GPU without MIG): DCGM_FI_DEV_GPU_UTIL / 100, else "
                      "DCGM_FI_PROF_GR_ENGINE_ACTIVE (MIG instances have no DCGM_FI_DEV_GPU_UTIL)"),
    # L2 (Triton's own metrics; labels node, triton, pod (the replica, where present), model, version) --------
    "model_version:nv_inference_request_success:rate": (
        ("node", "triton", "model", "version"), "successful requests/s"),
    "model_version_reason:nv_inference_request_failure:rate": (
        ("node", "triton", "model", "version", "reason"),
        "failed requests/s by reason (REJECTED|CANCELED|BACKEND|OTHER)"),
    "model_version:nv_inference_requests:rate": (
        ("node", "triton", "model", "version"), "all requests/s (success + failure)"),
    "model_version:nv_inference_request_error:ratio": (
        ("node", "triton", "model", "version"), "server errors (reason BACKEND|OTHER, or none) / all requests, 0-1"),
    "model_version:nv_inference_request_cancelled:ratio": (
        ("node", "triton", "model", "version"), "requests cancelled by their client (reason CANCELED) / all, 0-1"),
    "model_version:nv_inference_version:number": (
        ("node", "triton", "model", "version"), "the version label as a number (versions with requests, <= 8 digits)"),
    "model_version:nv_inference_version:newest_rank": (
        ("node", "triton", "model", "version", "rank"),
        "the newest busy versions of a model on a replica, rank 1 the newest; value the version number"),
    "model_version:nv_inference_request_duration:avg_seconds": (
        ("node", "triton", "model", "version"),
        "average request time, s (rate(µs sum) / rate(success); the summary's _sum / _count without counters)"),
    "model_version:nv_inference_queue_duration:avg_seconds": (
        ("node", "triton", "model", "version"), "average queue time, s (counters, else the summary's _sum / _count)"),
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
        ("node", "triton", "pod", "model", "source"),
        "failed / all requests per entry point; source=gateway for a decoupled model the gateway meters (errors "
        "mid-stream included), source=triton (Triton's failure counter) otherwise"),
    "parent_model:nv_inference_step_requests:per_parent_request": (
        ("node", "triton", "parent", "model"),
        "a step's executions per request to its parent (e.g. ~ output tokens for a per-token postprocessing step)"),
    "model:gateway_requests:rate": (("model",), "requests/s through the gateway, every tenant and tier"),
    "model:gateway_requests_errors:ratio": (
        ("model",), "error|timeout outcomes / all requests at the gateway (client 4xx except 429 excluded)"),
    "model:gateway_requests_cancelled:ratio": (("model",), "cancelled / all requests at the gateway"),
    # L2 engines (TensorRT-LLM and vLLM backends, rules/engine.py; labels node, triton, model, version,
    # backend = tensorrt_llm|vllm) ----------------------------------------------------------------------------
    "model_version:engine_kv_cache_used:ratio": (
        ("node", "triton", "model", "version", "backend"),
        "KV cache used, 0-1: used / max blocks (TensorRT-LLM), vllm:kv_cache_usage_perc (or gpu_cache_usage_perc)"),
    "model_version:engine_kv_cache_used:predicted_ratio": (
        ("node", "triton", "model", "version", "backend"),
        "KV cache used fraction predicted layers.L2.engine.fill_horizon ahead (predict_linear over fill_lookback)"),
    "model_version:engine_requests_waiting:count": (
        ("node", "triton", "model", "version", "backend"), "requests waiting for the engine now"),
    "model_version:engine_requests_running:count": (
        ("node", "triton", "model", "version", "backend"),
        "requests the engine runs now (TensorRT-LLM active, vLLM running)"),
    "model_version:engine_requests_max:count": (
        ("node", "triton", "model", "version", "backend"), "most requests the engine runs at once (TensorRT-LLM)"),
    "model_version:engine_requests_running:ratio_of_max": (
        ("node", "triton", "model", "version", "backend"), "running / maximum requests, 0-1 (TensorRT-LLM)"),
    "model_version:engine_preemptions:rate": (
        ("node", "triton", "model", "version", "backend"), "preemptions/s (vLLM)"),
    "model_version:engine_prefix_cache_hits:ratio": (
        ("node", "triton", "model", "version", "backend"), "prefix-cache hit tokens / queried tokens, 0-1 (vLLM)"),
    "gpu:DCGM_FI_DEV_FB_USED:predicted_ratio": (
        ("every GPU series label",),
        "framebuffer used fraction predicted layers.L2.engine.fill_horizon ahead, GPUs of engine nodes only"),
    # L3 (gateway; labels tenant, model, tier) ------------------------------------------------------------
    "tenant_model_tier_type:gateway_tokens:rate": (
        ("tenant", "model", "tier", "type"), "tokens/s metered, type=input|output (output = output tokens/s)"),
    "tenant_model_tier:gateway_requests:rate": (("tenant", "model", "tier"), "requests/s, every outcome"),
    "tenant_model_tier:gateway_requests_errors:rate": (
        ("tenant", "model", "tier"),
        "error|timeout requests/s (client 4xx except 429 excluded); no series where none failed (the ratio is 0)"),
    "tenant_model_tier:gateway_requests_cancelled:rate": (
        ("tenant", "model", "tier"), "cancelled requests/s; no series where none was cancelled (the ratio is 0)"),
    "tenant_model_tier:gateway_requests_errors:ratio": (
        ("tenant", "model", "tier"), "error|timeout outcomes / all requests (client 4xx except 429 excluded)"),
    "tenant_model_tier:gateway_requests_cancelled:ratio": (
        ("tenant", "model", "tier"), "cancelled / all requests"),
    # SLO windows (label slo_window = each long and short window of layers.L3.burn_rate_windows) ---------------
    "tier_slo_window:gateway_requests:rate": (("tier", "slo_window"), "requests/s over slo_window"),
    "tier_slo_window:gateway_requests_errors:rate": (
        ("tier", "slo_window"), "error|timeout requests/s over the shortest SLO window (longer ones average it)"),
    "tier_slo_window:gateway_time_to_first_token_seconds_within_slo:rate": (
        ("tier", "slo_window"), "streamed requests/s whose TTFT met the tier's ttft_slo_seconds, shortest SLO window"),
    "tier_slo_window:gateway_time_to_first_token_seconds_count:rate": (
        ("tier", "slo_window"), "streamed requests/s (TTFT observations), shortest SLO window"),
    "tier_slo_window:gateway_requests_errors:ratio": (
        ("tier", "slo_window"), "availability SLI misses: error|timeout / all requests over slo_window"),
    "tier_slo_window:gateway_time_to_first_token_seconds:ratio_over_slo": (
        ("tier", "slo_window"), "TTFT SLI misses: streamed requests slower than the tier's ttft_slo_seconds / "
                                "all streamed requests over slo_window"),
    # Budgets (rules/budget.py; only with billing.budgets; labels currency, period = month|day) ------------------
    "tenant_model:gateway_cost:increase": (
        ("tenant", "model", "currency"), "cost added over the budget group's 5m step (increase)"),
    "tenant_model_period:gateway_cost:increase": (
        ("tenant", "model", "currency", "period", "period_index"),
        "the step's cost where period_index (month 1-12, day of month 1-31) is the current one, absent otherwise"),
    "tenant_model_period:gateway_cost:spent": (
        ("tenant", "model", "currency", "period"), "cost since the period (UTC month or day) began"),
    "tenant_period:gateway_cost:spent": (("tenant", "currency", "period"), "the same, every model together"),
    "tenant_model:gateway_cost:forecast_rate": (
        ("tenant", "model", "currency"), "cost per second over billing.forecast_window (the burn rate)"),
    "tenant_model_period:gateway_cost:forecast": (
        ("tenant", "model", "currency", "period"), "spent + forecast_rate x seconds left in the period"),
    "tenant_period:gateway_cost:forecast": (("tenant", "currency", "period"), "the same, every model together"),
    "budget:gateway_cost:spent_ratio": (
        ("budget", "tenant", "currency", "period", "model"), "spent / the budget's amount (1 = all of it)"),
    "budget:gateway_cost:forecast_ratio": (
        ("budget", "tenant", "currency", "period", "model"), "forecast / the budget's amount"),
    "slo_window:gateway_scrapes:history_ratio": (
        ("slo_window",), "share of each long SLO window Prometheus has scraped the gateway for, 0-1 (the burn-rate "
                         "alerts count a long window's misses against the requests of the whole window)"),
}


# ---------------------------------------------------------------------------------------------------- alerts
# Label sets alerts carry (besides alertname, layer, severity), from the series they watch: the scrape labels
# every target gets in the generated prometheus.yml, dcgm-exporter's device labels, the recorded topology.
# GPU series come from the inferwatch exporter or dcgm-exporter (spec `selectors.gpu`): both write the
# device labels; the host label is `Hostname` (inferwatch, dcgm-exporter up to 4.8.2) or `hostname`
# (dcgm-exporter from 4.8.3); namespace/pod/container name the pod holding the GPU, when one does.
SCRAPE = ("job", "instance", "node")
GPU_ID = ("gpu", "UUID")
DEVICE = GPU_ID + ("pci_bus_id", "device", "modelName")
POD = ("namespace", "pod", "container")
DCGM = DEVICE + ("Hostname", "hostname", "DCGM_FI_DRIVER_VERSION") + POD
MIG = ("GPU_I_PROFILE", "GPU_I_ID")  # only on a MIG instance's framebuffer series
XID = ("xid", "window_size_in_ms")  # the XID counters' (dcgm-exporter's count is over a window)
MODEL_VERSION = ("node", "triton", "pod", "model", "version")
# One LLM engine (rules/engine.py IDENTITY): a Triton replica's model version, or a vLLM server (`instance`)
# and its engine core (`engine`, vLLM's label).
ENGINE = MODEL_VERSION + ("instance", "engine")
# What every engine alert carries, whichever shape: a vLLM server of its own has no node, triton or version.
ENGINE_SCOPE = ("instance", "model")
# An engine on Triton's port (a model version on a Triton replica), a vLLM server's engine core.
ENGINE_SHAPES = (("node", "triton", "instance", "model", "version", "backend"),
                 ("instance", "model", "engine", "backend"))
TENANT_MODEL_TIER = ("tenant", "model", "tier")


@dataclasses.dataclass(frozen=True)
class AlertInfo:
    """One alert name. `labels`: every label its alerts may carry besides alertname, layer and severity;
    `scope`: those every alert of that name carries, whatever branch of its expression fired (inhibition
    keys on them). tests/test_rules_labels.py checks both against the generated rule files."""

    layer: str
    severities: tuple[str, ...]
    summary: str  # static sentence, ends with a period (mixtool lint rules)
    extra_labels: tuple[str, ...] = ()  # labels besides layer/severity the rule itself sets
    labels: tuple[str, ...] = ()
    scope: tuple[str, ...] = ()
    # Where the scope alone names no one object: the labels that name it in each shape the alert takes, all
    # present on that shape (an engine on Triton's port, a vLLM server's engine core). Inhibition keys on them.
    shapes: tuple[tuple[str, ...], ...] = ()


def _info(layer: str, severities: tuple[str, ...], summary: str, labels: tuple[str, ...],
          scope: tuple[str, ...] | None = None, extra: tuple[str, ...] = ()) -> AlertInfo:
    # The scope defaults to the labels without `pod`: the replica label is absent outside Kubernetes.
    default_scope = tuple(label for label in labels if label != "pod")
    return AlertInfo(layer, severities, summary, extra, tuple(dict.fromkeys(labels + extra)),
                     tuple(dict.fromkeys((default_scope if scope is None else scope) + extra)))


_C, _W = ("critical",), ("warning",)
ALERTS: dict[str, AlertInfo] = {
    # L1 ---------------------------------------------------------------------------------------------------
    # GPU alerts carry their subject's identity (rules/identity.py), never the pod's labels.
    "GpuTemperatureCritical": _info("L1", _C, "GPU temperature is above its critical threshold.", GPU_IDENTITY,
                                    SCRAPE + DEVICE),
    "GpuMemoryUsageHigh": _info("L1", _W, "GPU framebuffer memory is nearly full.", GPU_INSTANCE,
                                SCRAPE + DEVICE),
    "GpuMemoryUsageCritical": _info("L1", _C, "GPU framebuffer memory is full.", GPU_INSTANCE,
                                    SCRAPE + DEVICE),
    "GpuNvmlLost": _info("L1", _C, "The NVML library of a node is lost, none of its GPUs can be read.", SCRAPE),
    # One alert per GPU whichever branch fires (NVML `up` 0, XID 79, vanished series): reduced to these labels.
    "GpuLost": _info("L1", _C, "A GPU has fallen off the bus or cannot be read.",
                     SCRAPE + GPU_ID + ("Hostname", "hostname"), SCRAPE + GPU_ID),
    "GpuXidCritical": _info("L1", _C, "A GPU reported a critical XID error.", GPU_IDENTITY + XID,
                            SCRAPE + GPU_ID),
    "GpuUncorrectableMemoryError": _info(
        "L1", _C, "A GPU reported an uncorrectable memory error or a failed row remap.", GPU_IDENTITY,
        SCRAPE + DEVICE),
    "GpuThrottling": _info("L1", _W, "A GPU is slowing its clocks for thermal or power-brake reasons.",
                           GPU_IDENTITY + ("reason",), SCRAPE + GPU_ID + ("reason",)),
    # `absent(up{job})` (the job has no target at all) carries only `job`.
    "GpuExporterDown": _info("L1", _C, "The GPU exporter cannot be scraped, GPU alerts are blind.", SCRAPE, ("job",)),
    # L2 ---------------------------------------------------------------------------------------------------
    # `pod`: the replica behind a Service, from Triton's own scrape (rules/identity.py, rules/replicas.py).
    # One alert per replica whichever source sees it (Triton's scrape, the collector): reduced to these labels.
    # `address`: a replica the collector polls through a headless Service (rules/replicas.py); on
    # TritonServerDown only where Triton's own scrape has no target at that IP.
    "TritonServerDown": _info("L2", _C, "A Triton server does not answer.",
                              ("node", "triton", "pod", "job", "address"), ()),
    "TritonServerNotReady": _info("L2", _C, "A Triton server is live but not ready.",
                                  SCRAPE + ("triton", "pod", "address"), SCRAPE + ("triton",)),
    "TritonModelNotReady": _info("L2", _C, "A model version is not READY on a Triton server.",
                                 SCRAPE + MODEL_VERSION + ("address",), SCRAPE + ("triton", "model", "version")),
    # A model the spec lists (spec `models`) that no Triton of the cluster lists while one answers: unloaded.
    "TritonModelNotLoaded": _info("L2", _C, "A model the spec lists as served is loaded on no Triton server.",
                                  ("model",)),
    "TritonModelErrorRatioHigh": _info("L2", _C, "A model fails too many inference requests.", MODEL_VERSION),
    "TritonDecoupledModelErrorRatioHigh": _info(
        "L2", _C, "A streaming model fails too many requests as clients see them.",
        ("node", "triton", "pod", "model", "source")),
    "TritonQueueTimeP95High": _info("L2", _W, "Requests wait too long in a model's queue.", MODEL_VERSION),
    "TritonRequestsRejected": _info("L2", _W, "Triton rejects requests for a model.", MODEL_VERSION + ("reason",)),
    "TritonCancellationRatioHigh": _info("L2", _W, "Clients cancel many requests to a model.", MODEL_VERSION),
    "TritonPendingRequestsHigh": _info("L2", _W, "Too many requests are pending for a model.", MODEL_VERSION),
    "TritonBatchingIneffective": _info(
        "L2", _W, "Dynamic batching forms batches far smaller than configured while requests queue.", MODEL_VERSION),
    "TritonCanaryRegression": _info(
        "L2", _W, "A newer model version is worse than the older versions still serving.", MODEL_VERSION,
        extra=("signal",)),
    "TritonCollectorDown": _info("L2", _W, "The inferwatch Triton collector cannot be scraped.", SCRAPE, ("job",)),
    # L2 engines (rules/engine.py): per engine and backend; the GPU forecast per GPU of an engine node.
    "EngineKvCacheFull": dataclasses.replace(
        _info("L2", ("critical", "warning"), "An LLM engine's KV cache is full and requests wait.", ENGINE,
              ENGINE_SCOPE, extra=("backend",)), shapes=ENGINE_SHAPES),
    "EnginePreemptionsHigh": dataclasses.replace(
        _info("L2", _W, "An LLM engine preempts running requests.", ENGINE, ENGINE_SCOPE, extra=("backend",)),
        shapes=ENGINE_SHAPES),
    "EngineWaitingRequestsGrowing": dataclasses.replace(
        _info("L2", _W, "An LLM engine's queue of waiting requests keeps growing.", ENGINE, ENGINE_SCOPE,
              extra=("backend",)), shapes=ENGINE_SHAPES),
    "EngineKvCacheFillPredicted": dataclasses.replace(
        _info("L2", _W, "An LLM engine's KV cache is predicted to fill soon.", ENGINE, ENGINE_SCOPE,
              extra=("backend",)), shapes=ENGINE_SHAPES),
    "EngineGpuMemoryFillPredicted": _info("L2", _W, "The GPU memory of an LLM engine node is predicted to fill soon.",
                                          GPU_INSTANCE, SCRAPE + DEVICE),
    # L3 ---------------------------------------------------------------------------------------------------
    # per tenant for tiers with per_tenant_quantiles, else per model and tier (no tenant label)
    "LlmTtftP95High": _info("L3", _W, "Time to first token P95 is above the tier's target.", TENANT_MODEL_TIER,
                            ("model", "tier"), extra=("tier",)),
    "LlmAvailabilityBurnRate": _info(
        "L3", ("critical", "warning"), "The availability error budget is burning too fast.", (),
        extra=("window", "slo", "tier")),
    "LlmTtftBurnRate": _info(
        "L3", ("critical", "warning"), "The time-to-first-token error budget is burning too fast.", (),
        extra=("window", "slo", "tier")),
    "LlmOutputThroughputCollapse": _info(
        "L3", _W, "Output token throughput collapsed compared with the baseline.", ("model", "tier")),
    "LlmCancellationRatioHigh": _info("L3", _W, "Many LLM requests are cancelled by clients.", TENANT_MODEL_TIER),
    # One per budget of billing.budgets: `model` only on a per-model budget.
    "LlmBudgetForecastExceeded": _info("L3", _W, "A tenant's cost forecast exceeds its budget for the period.",
                                       ("budget", "tenant", "period", "currency", "model"),
                                       ("budget", "tenant", "period", "currency")),
    "LlmBudgetExceeded": _info("L3", _W, "A tenant has spent its budget for the period.",
                               ("budget", "tenant", "period", "currency", "model"),
                               ("budget", "tenant", "period", "currency")),
    "GatewayExporterDown": _info("L3", _W, "The gateway exporter cannot be scraped, LLM alerts are blind.",
                                 SCRAPE, ("job",)),
    # Notifier self-alerts (layer L1 so they page; Alertmanager routes component=notifier around the notifier)
    "NotifierDeliveryFailing": _info(
        "L1", _C, "The notifier fails to deliver notifications.", SCRAPE + ("channel",), ("node",),
        extra=("component", "signal")),
    "NotifierDeadLetters": _info(
        "L1", _C, "The notifier gave up on notifications.", ("node", "channel", "reason"), extra=("component",)),
    "NotifierUnroutedAlerts": _info(
        "L1", _W, "The notifier received alerts that no route matched.", ("node",), extra=("component",)),
    "NotifierOutboxUnwritable": _info(
        "L1", _C, "The notifier cannot write its outbox.", SCRAPE, extra=("component",)),
    "NotifierOutboxDamaged": _info(
        "L1", _C, "The notifier moved a damaged outbox aside.", SCRAPE, extra=("component",)),
    "InferwatchHeartbeat": _info(
        "L1", ("info",), "The alerting path is alive.", (), extra=("component",)),
    "NotifierWebhooksRefused": _info(
        "L1", _W, "The notifier refused webhooks.", ("node", "outcome"), extra=("component",)),
    "NotifierDown": _info("L1", _C, "The notifier cannot be scraped.", SCRAPE, ("job",), extra=("component",)),
    # The alerting path's replicas (rules/ha.py): warnings, one more failure is not yet an outage.
    "NotifierOutboxGrowing": _info(
        "L1", _W, "A notifier replica's backlog of unsent notifications grows.", SCRAPE, extra=("component",)),
    "AlertmanagerClusterDegraded": _info(
        "L1", _W, "The Alertmanager cluster has fewer members than configured.", SCRAPE, (), extra=("component",)),
    # A generated rule group failing to evaluate (rules/rulehealth.py): one alert per Prometheus and group.
    "PrometheusRuleEvaluationFailing": _info(
        "L1", _C, "A generated rule group fails to evaluate, its alerts cannot fire.", ("instance", "rule_group"),
        extra=("component",)),
    "PrometheusReplicasDisagree": _info(
        "L1", _W, "The Prometheus replicas disagree about which alerts fire.", ("disagreeing_alert",),
        extra=("component",)),
    # The central store watching itself (rules/centralstore.py), evaluated by the store's watcher: one alert per
    # program instance (job, instance; the edge's also carries the cluster label of its target).
    "VictoriaMetricsDown": _info(
        "L1", _C, "The central store (VictoriaMetrics) cannot be scraped.", ("job", "instance"), extra=("component",)),
    "VictoriaMetricsNotIngesting": _info(
        "L1", _C, "The central store stores no new samples.", ("job", "instance"), extra=("component",)),
    "VictoriaMetricsDiskSpaceLow": _info(
        "L1", _W, "The central store is running out of disk space.", ("job", "instance"), extra=("component",)),
    "VmagentDown": _info(
        "L1", _C, "An edge vmagent cannot be scraped.", ("job", "instance"), extra=("component",)),
    "VmagentRemoteWriteFailing": _info(
        "L1", _C, "An edge vmagent fails to deliver samples to the central store.", ("job", "instance"),
        extra=("component", "signal")),
    "VmalertDown": _info(
        "L1", _C, "The rule evaluator vmalert cannot be scraped.", ("job", "instance"), extra=("component",)),
    "VmalertFailing": _info(
        "L1", _C, "The rule evaluator vmalert fails to evaluate rules, send alerts or write recordings.",
        ("job", "instance"), extra=("component", "signal")),
}

# Values of the labels alerts take from a fixed set (route matchers on them are checked by `inferwatch check`);
# `tier`, `tenant` and `model` values come from the spec.
FIXED_LABEL_VALUES: dict[str, tuple[str, ...]] = {
    "alertname": tuple(ALERTS),
    "layer": LAYERS,
    "severity": tuple(dict.fromkeys(s for info in ALERTS.values() for s in info.severities)),
    "component": ("notifier", "alerting"),
    "slo": ("availability", "ttft"),
    "signal": ("error_ratio", "latency", "failure_ratio", "stuck", "errors", "queue_growing", "dropping",
               "evaluation", "notification", "remote_write"),
}


def alert_label_names() -> set[str]:
    """Every label an alert of the registry may carry (alertname, layer and severity included)."""
    return {"alertname", "layer", "severity"} | {label for info in ALERTS.values() for label in info.labels}


def alerts_of_layer(layer: str) -> list[str]:
    """Alert names of one layer (L1|L2|L3), in registry order."""
    return [name for name, info in ALERTS.items() if info.layer == layer]
