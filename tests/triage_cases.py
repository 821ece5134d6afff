"""Per-alert and per-finding example values for the judging tests (tests/test_triage_findings.py).

Every alert of runbooks/ has a CONDITION row: the labels it carries, values for which its own condition holds
(`holds`) and overrides that make it not hold (`not_met`), judged with the thresholds of the repository's
inferwatch.yaml. Every finding has a FINDINGS row keyed (alert, cause): values on top of the alert's `holds`
for which the finding is made, and overrides for which its own condition is not met. A value left out is
missing (no data). The test table is generated from the runbooks: a finding without a row here fails.

`ABSENCE_IS_THE_FINDING` lists the findings that read their evidence only through nodata()/has(): for them
"evidence missing" is asserted with the value each expects to be missing or present.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Condition:
    labels: dict
    holds: dict
    not_met: dict


@dataclasses.dataclass(frozen=True)
class FindingCase:
    holds: dict
    not_met: dict


GPU = {"UUID": "GPU-0", "node": "node-a", "gpu": "0"}
MODEL = {"node": "node-a", "triton": "triton-a", "model": "llm", "version": "1"}
LLM = {"tenant": "acme", "model": "llm", "tier": "realtime"}
BUDGET = {"budget": "acme-all-month", "tenant": "acme", "period": "month", "currency": "USD"}
ENGINE = {**MODEL, "backend": "vllm"}

CONDITION = {
    # L1 ----------------------------------------------------------------------------------------------
    "GpuTemperatureCritical": Condition(GPU, {"temperature_celsius": 90}, {"temperature_celsius": 70}),
    "GpuMemoryUsageHigh": Condition(GPU, {"memory_used_ratio": 0.93}, {"memory_used_ratio": 0.5}),
    "GpuMemoryUsageCritical": Condition(GPU, {"memory_used_ratio": 0.97}, {"memory_used_ratio": 0.93}),
    "GpuNvmlLost": Condition({"node": "node-a"}, {"nvml_up": 0, "gpus_known": 2}, {"nvml_up": 1}),
    "GpuLost": Condition(GPU, {"gpu_up": 0, "xid79_recent": 0}, {"gpu_up": 1}),
    "GpuXidCritical": Condition(GPU, {"critical_xids_recent": 1}, {"critical_xids_recent": 0}),
    "GpuUncorrectableMemoryError": Condition(GPU, {"remap_failure": 0, "dbe_recent": 2},
                                                 {"remap_failure": 0, "dbe_recent": 0}),
    "GpuThrottling": Condition({**GPU, "reason": "hw_power_brake_slowdown"}, {"throttling_active": 1},
                               {"throttling_active": 0}),
    "GpuExporterDown": Condition({"node": "node-a", "instance": "node-a:9400"},
                                 {"exporter_up": 0, "targets_in_job": 3}, {"exporter_up": 1, "targets_in_job": 3}),
    # L2 ----------------------------------------------------------------------------------------------
    "TritonServerDown": Condition({"node": "node-a", "triton": "triton-a"},
                                  {"metrics_scrape_up": 0, "api_up": 1, "server_live": 1, "targets_in_job": 2},
                                  {"metrics_scrape_up": 1, "api_up": 1, "server_live": 1}),
    "TritonServerNotReady": Condition({"node": "node-a", "triton": "triton-a"}, {"server_ready": 0},
                                      {"server_ready": 1}),
    "TritonModelNotReady": Condition(MODEL, {"model_ready": 0}, {"model_ready": 1}),
    "TritonModelNotLoaded": Condition({"model": "llm"}, {"ready_versions": 0, "tritons_up": 2},
                                      {"ready_versions": 1}),
    "TritonModelErrorRatioHigh": Condition(MODEL, {"error_ratio": 0.3, "request_rate": 10},
                                           {"error_ratio": 0.001}),
    # model "classifier" has its own queue threshold (250 ms) in inferwatch.yaml: 300 ms is above it.
    "TritonDecoupledModelErrorRatioHigh": Condition(
        {"node": "node-a", "triton": "triton-a", "model": "llm", "source": "gateway"},
        {"gateway_error_ratio": 0.3, "gateway_request_rate": 10}, {"gateway_error_ratio": 0.001}),
    "TritonQueueTimeP95High": Condition({**MODEL, "model": "classifier"},
                                        {"queue_p95_seconds": 0.3, "request_rate": 20},
                                        {"queue_p95_seconds": 0.005}),
    "TritonRequestsRejected": Condition(MODEL, {"rejected_per_second": 2}, {"rejected_per_second": 0}),
    "TritonCancellationRatioHigh": Condition(MODEL, {"cancelled_ratio": 0.3, "request_rate": 10},
                                             {"cancelled_ratio": 0.05}),
    "TritonPendingRequestsHigh": Condition(MODEL, {"pending_requests": 150}, {"pending_requests": 20}),
    "TritonBatchingIneffective": Condition(
        MODEL, {"preferred_batch_size": 8, "batch_size_avg": 1.5, "queue_avg_seconds": 0.2, "request_rate": 20},
        {"batch_size_avg": 7}),
    "TritonCanaryRegression": Condition(
        MODEL, {"canary_error_ratio": 0.1, "others_error_ratio": 0.01, "canary_latency_seconds": 0.1,
                "others_latency_seconds": 0.1},
        {"canary_error_ratio": 0.01, "canary_latency_seconds": 0.1, "others_latency_seconds": 0.1}),
    "TritonCollectorDown": Condition({"instance": "collector:9401"}, {"collector_up": 0, "targets_in_job": 1},
                                     {"collector_up": 1, "targets_in_job": 1}),
    # L3 ----------------------------------------------------------------------------------------------
    # L2 engines (rules/engine.py) ----------------------------------------------------------------------------
    "EngineKvCacheFull": Condition(ENGINE, {"kv_cache_used_ratio": 0.95, "waiting_requests": 37},
                                   {"waiting_requests": 0}),
    "EnginePreemptionsHigh": Condition(ENGINE, {"preemption_rate": 0.5}, {"preemption_rate": 0.01}),
    "EngineWaitingRequestsGrowing": Condition(ENGINE, {"waiting_growth": 0.02, "waiting_requests": 30},
                                              {"waiting_growth": 0}),
    "EngineKvCacheFillPredicted": Condition(ENGINE, {"kv_cache_predicted_ratio": 1.2, "kv_cache_used_ratio": 0.6},
                                            {"kv_cache_predicted_ratio": 0.8}),
    "EngineGpuMemoryFillPredicted": Condition(GPU, {"memory_predicted_ratio": 1.2, "memory_used_ratio": 0.5},
                                              {"memory_predicted_ratio": 0.7}),
    "LlmTtftP95High": Condition(LLM, {"ttft_p95_seconds": 0.8, "request_rate": 10}, {"ttft_p95_seconds": 0.138}),
    "LlmTtftBurnRate": Condition({"tier": "realtime", "window": "fast-1h", "slo": "ttft"},
                                 {"slo_miss_long": 0.3, "slo_miss_short": 0.4, "short_window_request_rate": 5,
                                  "long_window_history_ratio": 1},
                                 {"slo_miss_long": 0.05}),
    "LlmAvailabilityBurnRate": Condition({"tier": "realtime", "window": "fast-1h", "slo": "availability"},
                                         {"error_ratio_long": 0.05, "error_ratio_short": 0.1,
                                          "short_window_request_rate": 5, "long_window_history_ratio": 1},
                                         {"error_ratio_short": 0.001}),
    "LlmOutputThroughputCollapse": Condition({"model": "llm", "tier": "realtime"},
                                             {"output_tokens_per_second": 100,
                                              "baseline_output_tokens_per_second": 400},
                                             {"output_tokens_per_second": 350}),
    "LlmCancellationRatioHigh": Condition(LLM, {"cancellation_ratio": 0.4, "request_rate": 5},
                                          {"cancellation_ratio": 0.05}),
    "LlmBudgetExceeded": Condition(BUDGET, {"spent_ratio": 1.2}, {"spent_ratio": 0.9}),
    "LlmBudgetForecastExceeded": Condition(BUDGET, {"spent_ratio": 0.8, "forecast_ratio": 1.5},
                                           {"spent_ratio": 0.8, "forecast_ratio": 0.9}),
    "GatewayExporterDown": Condition({"instance": "gw:9402"}, {"gateway_up": 0, "targets_in_job": 2},
                                     {"gateway_up": 1, "targets_in_job": 2}),
    # Notifier ----------------------------------------------------------------------------------------
    "NotifierDeliveryFailing": Condition({"node": "node-a", "channel": "oncall-slack"},
                                         {"failure_ratio": 0.8, "attempts_per_second": 1,
                                          "oldest_pending_seconds": 10},
                                         {"failure_ratio": 0.1}),
    "NotifierDeadLetters": Condition({"node": "node-a", "channel": "oncall-slack", "reason": "bad_key"},
                                     {"dead_letters_recent": 1}, {"dead_letters_recent": 0}),
    "NotifierDown": Condition({"instance": "127.0.0.1:9410"}, {"notifier_up": 0, "targets_in_job": 1},
                              {"notifier_up": 1, "targets_in_job": 1}),
    "NotifierUnroutedAlerts": Condition({"node": "node-a"}, {"unrouted_recent": 2}, {"unrouted_recent": 0}),
    "NotifierOutboxUnwritable": Condition({"job": "inferwatch-notifier", "instance": "n:9410", "node": "node-a"},
                                          {"outbox_writable": 0}, {"outbox_writable": 1}),
    "InferwatchHeartbeat": Condition({}, {"heartbeat": 1}, {"heartbeat": 0}),
    "NotifierOutboxDamaged": Condition({"job": "inferwatch-notifier", "instance": "n:9410", "node": "node-a"},
                                       {"damaged_age_seconds": 600, "lost_webhooks": 20},
                                       {"damaged_age_seconds": 90000}),
    "NotifierWebhooksRefused": Condition({"node": "node-a", "outcome": "unauthorized"}, {"refused_recent": 2},
                                         {"refused_recent": 0}),
    # The alerting path's replicas ---------------------------------------------------------------------
    "NotifierOutboxGrowing": Condition({"job": "inferwatch-notifier", "instance": "n:9410", "node": "node-a"},
                                       {"outbox_due": 500, "due_growth_per_second": 2}, {"outbox_due": 50}),
    "AlertmanagerClusterDegraded": Condition(
        {}, {"peers_configured": 3, "peers_answering": 2, "fewest_members_seen": 2},
        {"peers_answering": 3, "fewest_members_seen": 3}),
    "PrometheusRuleEvaluationFailing": Condition(
        {"instance": "prom:9090", "rule_group": "/etc/prometheus/rules/triton.yml;inferwatch-triton.rules"},
        {"failures_per_second": 0.02}, {"failures_per_second": 0}),
    "PrometheusReplicasDisagree": Condition({"disagreeing_alert": "GpuLost"}, {"disagreeing_alerts": 1},
                                            {"disagreeing_alerts": 0}),
    # The central store watching itself (rules/centralstore.py) --------------------------------------------
    "VictoriaMetricsDown": Condition({"job": "inferwatch-victoriametrics", "instance": "vm:8428"}, {"store_up": 0},
                                     {"store_up": 1}),
    "VictoriaMetricsNotIngesting": Condition({"job": "inferwatch-victoriametrics", "instance": "vm:8428"},
                                             {"read_only": 1, "rows_per_second": 0},
                                             {"read_only": 0, "rows_per_second": 120}),
    "VictoriaMetricsDiskSpaceLow": Condition({"job": "inferwatch-victoriametrics", "instance": "vm:8428"},
                                             {"free_ratio": 0.1}, {"free_ratio": 0.5}),
    "VmagentDown": Condition({"job": "inferwatch-vmagent", "instance": "vmagent:8429"}, {"vmagent_up": 0},
                             {"vmagent_up": 1}),
    "VmagentRemoteWriteFailing": Condition(
        {"job": "inferwatch-vmagent", "instance": "vmagent:8429", "signal": "errors"},
        {"errors_per_second": 0.05, "pending_bytes": 0, "queue_growth_per_second": 0, "dropped_recent": 0},
        {"errors_per_second": 0, "dropped_recent": 0}),
    "VmalertDown": Condition({"job": "inferwatch-vmalert", "instance": "vmalert:8880"}, {"vmalert_up": 0},
                             {"vmalert_up": 1}),
    "VmalertFailing": Condition(
        {"job": "inferwatch-vmalert", "instance": "vmalert:8880", "signal": "evaluation"},
        {"evaluation_errors_per_second": 0.6, "send_errors_per_second": 0, "write_errors_per_second": 0},
        {"evaluation_errors_per_second": 0, "send_errors_per_second": 0}),
}

F = FindingCase
FINDINGS = {
    ("GpuTemperatureCritical", "node-cooling"): F({"other_gpus_max_celsius": 84}, {"other_gpus_max_celsius": 60}),
    ("GpuTemperatureCritical", "gpu-cooling"): F({"other_gpus_max_celsius": 60, "gpu_util_percent": 20},
                                                 {"gpu_util_percent": 80}),
    ("GpuTemperatureCritical", "sustained-load"): F({"gpu_util_percent": 90, "power_watts": 650},
                                                    {"gpu_util_percent": 20}),
    **{(alert, cause): case for alert in ("GpuMemoryUsageHigh", "GpuMemoryUsageCritical") for cause, case in {
        "several-versions-loaded": F({"models_with_several_versions": 2}, {"models_with_several_versions": 0}),
        "memory-leak": F({"memory_growth_mib_1h": 4096, "request_rate_change": 1.0}, {"request_rate_change": 2.0}),
        "many-instances": F({"gpu_instances": 6}, {"gpu_instances": 2}),
    }.items()},
    ("GpuNvmlLost", "driver-unloaded"): F({"gpus_unreadable": 2, "seconds_since_last_reading": 120},
                                          {"gpus_unreadable": 1}),
    ("GpuNvmlLost", "library-errors"): F({"library_errors": 4}, {"library_errors": 0}),
    ("GpuLost", "node-wide-fault"): F({"lost_gpus_on_node": 4}, {"lost_gpus_on_node": 1}),
    ("GpuLost", "memory-error-then-loss"): F({"memory_xids_last_hour": 2}, {"memory_xids_last_hour": 0}),
    ("GpuLost", "overheated"): F({"max_temperature_1h": 95}, {"max_temperature_1h": 70}),
    ("GpuLost", "fell-off-bus"): F({"xid79_last_hour": 1, "gpu_up": 0}, {"xid79_last_hour": 0, "gpu_up": 1}),
    ("GpuXidCritical", "gpu-memory-failure"): F({"memory_xids": 1}, {"memory_xids": 0}),
    ("GpuXidCritical", "fell-off-bus"): F({"bus_xids": 1}, {"bus_xids": 0}),
    ("GpuXidCritical", "gsp-firmware"): F({"gsp_xids": 2}, {"gsp_xids": 0}),
    ("GpuXidCritical", "nvlink"): F({"nvlink_xids": 3, "gpus_with_xids_on_node": 2}, {"nvlink_xids": 0}),
    ("GpuUncorrectableMemoryError", "remap-failure-rma"): F({"remap_failure": 1}, {"remap_failure": 0}),
    ("GpuUncorrectableMemoryError", "remap-pending-reset"): F({"remap_pending": 1}, {"remap_pending": 0}),
    ("GpuUncorrectableMemoryError", "degrading-memory"): F({"dbe_last_day": 3, "uncorrectable_remapped_rows": 6},
                                                           {"dbe_last_day": 0, "uncorrectable_remapped_rows": 1}),
    ("GpuThrottling", "node-power"): F({"power_brake_active": 1, "gpus_braked_on_node": 4},
                                       {"gpus_braked_on_node": 1}),
    ("GpuThrottling", "power-brake"): F({"power_brake_active": 1}, {"power_brake_active": 0}),
    ("GpuThrottling", "thermal"): F({"thermal_active": 1, "temperature_celsius": 88}, {"thermal_active": 0}),
    ("GpuExporterDown", "no-targets"): F({"targets_in_job": None, "exporter_up": None}, {"targets_in_job": 3}),
    ("GpuExporterDown", "node-down"): F({"triton_up_same_node": 0}, {"triton_up_same_node": 1}),
    ("GpuExporterDown", "exporter-hang"): F({"scrape_duration_seconds": 9}, {"scrape_duration_seconds": 0.2}),
    ("GpuExporterDown", "exporter-down"): F({"triton_up_same_node": 1}, {"triton_up_same_node": 0}),

    ("TritonServerDown", "gpu-lost"): F({"gpus_lost_on_node": 1}, {"gpus_lost_on_node": 0}),
    ("TritonServerDown", "metrics-port-blocked"): F({"metrics_scrape_up": 0, "api_up": 1}, {"api_up": 0}),
    ("TritonServerDown", "node-down"): F({"api_up": 0, "gpu_exporter_up_same_node": 0},
                                         {"gpu_exporter_up_same_node": 1}),
    ("TritonServerDown", "crash-loop"): F({"restarts_1h": 3}, {"restarts_1h": 0}),
    ("TritonServerDown", "server-down"): F({"metrics_scrape_up": 0}, {"metrics_scrape_up": 1, "server_live": 0}),
    ("TritonServerNotReady", "model-load-out-of-memory"): F({"models_unavailable": 1, "gpu_memory_used_ratio": 0.97},
                                                            {"gpu_memory_used_ratio": 0.5}),
    ("TritonServerNotReady", "model-load-failure"): F({"models_unavailable": 2}, {"models_unavailable": 0}),
    ("TritonServerNotReady", "still-loading"): F({"models_loading": 1}, {"models_loading": 0}),
    ("TritonModelNotReady", "unloaded-on-purpose"): F({"unloaded_on_purpose": 1}, {"unloaded_on_purpose": 0}),
    ("TritonModelNotReady", "out-of-memory"): F({"unavailable": 1, "gpu_memory_used_ratio": 0.96,
                                                 "ready_versions_on_node": 5}, {"gpu_memory_used_ratio": 0.4}),
    ("TritonModelNotReady", "load-failure"): F({"unavailable": 1}, {"unavailable": 0}),
    ("TritonModelNotReady", "still-loading"): F({"loading": 1}, {"loading": 0}),
    # the user's case: unloaded while clients still send 3 req/s
    ("TritonModelNotLoaded", "unloaded-recently"): F({"listed_last_hour": 1, "client_request_rate": 3},
                                                     {"listed_last_hour": 0}),
    ("TritonModelNotLoaded", "never-loaded"): F({"listed_last_hour": 0}, {"listed_last_hour": 1}),
    ("TritonModelErrorRatioHigh", "capacity-rejections"): F({"rejected_per_second": 3, "failures_per_second": 3},
                                                            {"rejected_per_second": 0.5}),
    # the version became READY 4 min before the fault; within `for` (5m) + 2 rate windows (10m) of it
    ("TritonModelErrorRatioHigh", "new-version-errors"): F(
        {"backend_per_second": 3, "failures_per_second": 3, "version_ready_before_fault_seconds": 240},
        {"version_ready_before_fault_seconds": 7200}),
    ("TritonModelErrorRatioHigh", "backend-errors"): F({"backend_per_second": 3, "failures_per_second": 3},
                                                       {"backend_per_second": 0}),
    ("TritonModelErrorRatioHigh", "client-cancellations"): F({"canceled_per_second": 2, "failures_per_second": 3},
                                                             {"canceled_per_second": 0.1}),
    ("TritonDecoupledModelErrorRatioHigh", "step-failures"): F({"step_failures_per_second": 1},
                                                               {"step_failures_per_second": 0}),
    ("TritonDecoupledModelErrorRatioHigh", "upstream-unavailable"): F(
        {"upstream_errors_per_second": 2, "gateway_errors_per_second": 3}, {"upstream_errors_per_second": 0.5}),
    ("TritonDecoupledModelErrorRatioHigh", "mid-stream-errors"): F(
        {"mid_stream_errors_per_second": 2, "gateway_errors_per_second": 3, "triton_error_ratio": 0},
        {"mid_stream_errors_per_second": 0.5}),
    ("TritonQueueTimeP95High", "capacity"): F({"gpu_util_ratio": 0.95}, {"gpu_util_ratio": 0.5}),
    ("TritonQueueTimeP95High", "batching-configuration"): F(
        {"preferred_batch_size": 8, "batch_size_avg": 1, "max_queue_delay_seconds": 0.1}, {"batch_size_avg": 7}),
    ("TritonQueueTimeP95High", "oversized-inputs"): F({"compute_growth": 3, "compute_avg_seconds": 0.3},
                                                      {"compute_growth": 1}),
    ("TritonQueueTimeP95High", "too-few-instances"): F({"gpu_util_ratio": 0.3, "gpu_instances": 1},
                                                       {"gpu_instances": 2}),
    ("TritonRequestsRejected", "traffic-burst"): F({"request_rate_growth": 3}, {"request_rate_growth": 1}),
    ("TritonRequestsRejected", "capacity"): F({"gpu_util_ratio": 0.95, "pending_requests": 50},
                                              {"gpu_util_ratio": 0.5}),
    ("TritonRequestsRejected", "queue-policy-too-tight"): F({"gpu_util_ratio": 0.4}, {"gpu_util_ratio": 0.95}),
    ("TritonCancellationRatioHigh", "clients-time-out-waiting"): F({"queue_avg_seconds": 3},
                                                                   {"queue_avg_seconds": 0.1}),
    ("TritonCancellationRatioHigh", "client-behaviour"): F({"queue_avg_seconds": 0.1}, {"queue_avg_seconds": 3}),
    ("TritonPendingRequestsHigh", "stuck-model"): F({"executions_per_second": 0}, {"executions_per_second": 5}),
    ("TritonPendingRequestsHigh", "gpu-throttling"): F({"throttling": 1}, {"throttling": 0}),
    ("TritonPendingRequestsHigh", "capacity"): F({"gpu_util_ratio": 0.95}, {"gpu_util_ratio": 0.5}),
    ("TritonPendingRequestsHigh", "too-few-instances"): F({"gpu_util_ratio": 0.5}, {"gpu_util_ratio": 0.95}),
    ("TritonBatchingIneffective", "clients-already-batch"): F({"inferences_per_request": 6},
                                                              {"inferences_per_request": 1}),
    ("TritonBatchingIneffective", "preferred-size-never-filled"): F(
        {"requests_per_second": 20, "max_queue_delay_seconds": 0.1}, {"requests_per_second": 200}),
    ("TritonBatchingIneffective", "delay-too-short"): F({"max_queue_delay_seconds": 0.0005},
                                                        {"max_queue_delay_seconds": 0.01}),
    ("TritonCanaryRegression", "canary-errors"): F({"canary_error_ratio": 0.1, "others_error_ratio": 0.01},
                                                   {"canary_error_ratio": 0.0105}),
    ("TritonCanaryRegression", "canary-batching-config"): F(
        {"canary_latency_seconds": 0.3, "others_latency_seconds": 0.1, "canary_batch_size": 1,
         "others_batch_size": 8}, {"canary_batch_size": 7}),
    ("TritonCanaryRegression", "canary-slower"): F(
        {"canary_latency_seconds": 0.3, "others_latency_seconds": 0.1, "canary_queue_seconds": 0.05},
        {"canary_latency_seconds": 0.1}),
    ("TritonCollectorDown", "no-targets"): F({"targets_in_job": None, "collector_up": None}, {"targets_in_job": 1}),
    ("TritonCollectorDown", "slow-polls"): F({"poll_duration_seconds": 8, "scrape_duration_seconds": 1},
                                             {"poll_duration_seconds": 1, "scrape_duration_seconds": 1}),
    ("TritonCollectorDown", "collector-down"): F({"collector_up": 0, "triton_metrics_up": 1}, {"collector_up": 1,
                                                                                               "targets_in_job": 1}),

    ("LlmTtftP95High", "telemetry-gap"): F({}, {"triton_queue_p95_seconds": 0.01, "batch_size_avg": 4}),
    ("LlmTtftP95High", "upstream-not-on-triton"): F({"triton_models_reporting": 3},
                                                    {"triton_queue_p95_seconds": 0.01, "batch_size_avg": 4}),
    ("LlmTtftP95High", "capacity"): F({"triton_queue_p95_seconds": 0.5, "gpu_util_ratio": 0.97},
                                      {"gpu_util_ratio": 0.5}),
    ("LlmTtftP95High", "batching-configuration"): F({"batch_size_avg": 1, "max_batch_size": 8, "gpu_util_ratio": 0.3},
                                                    {"batch_size_avg": 6}),
    ("LlmTtftP95High", "oversized-inputs"): F({"triton_queue_p95_seconds": 0.5, "gpu_util_ratio": 0.5},
                                              {"triton_queue_p95_seconds": 0.05}),
    ("LlmTtftP95High", "model-slow-first-response"): F(
        {"triton_first_response_p95_seconds": 0.75, "triton_queue_p95_seconds": 0.01},
        {"triton_first_response_p95_seconds": 0.1}),
    ("LlmTtftP95High", "model-compute"): F({"triton_compute_seconds": 0.6, "triton_queue_p95_seconds": 0.01},
                                           {"triton_compute_seconds": 0.01}),
    ("LlmTtftP95High", "gateway-network"): F(
        {"triton_first_response_p95_seconds": 0.1, "triton_queue_p95_seconds": 0.01},
        {"triton_first_response_p95_seconds": 0.5}),
    ("LlmTtftP95High", "slow-after-scheduling"): F(
        {"triton_queue_p95_seconds": 0.005, "gpu_util_ratio": 0.2, "triton_compute_seconds": 0.001,
         "batch_size_avg": 1, "max_batch_size": 0}, {"gpu_util_ratio": 0.95}),
    ("LlmTtftBurnRate", "capacity"): F(
        {"triton_queue_p95_seconds": 0.5, "worst_model_ttft_p95_seconds": 1.0, "gpu_util_ratio": 0.95},
        {"gpu_util_ratio": 0.5}),
    ("LlmTtftBurnRate", "batching-configuration"): F({"batch_size_min": 1, "max_batch_size": 8, "gpu_util_ratio": 0.3},
                                                     {"batch_size_min": 6}),
    ("LlmTtftBurnRate", "one-slow-model"): F({"worst_model_ttft_p95_seconds": 3, "tier_ttft_p95_seconds": 0.4},
                                             {"tier_ttft_p95_seconds": 2.5}),
    ("LlmTtftBurnRate", "model-slow-first-response"): F(
        {"triton_first_response_p95_seconds": 0.8, "worst_model_ttft_p95_seconds": 1.0,
         "triton_queue_p95_seconds": 0.01}, {"triton_first_response_p95_seconds": 0.1}),
    ("LlmTtftBurnRate", "model-compute"): F(
        {"triton_compute_seconds": 0.7, "worst_model_ttft_p95_seconds": 1.0, "triton_queue_p95_seconds": 0.01},
        {"triton_compute_seconds": 0.05}),
    ("LlmTtftBurnRate", "gateway-network"): F(
        {"triton_first_response_p95_seconds": 0.1, "worst_model_ttft_p95_seconds": 1.0,
         "triton_queue_p95_seconds": 0.01, "tier_ttft_p95_seconds": 0.9},
        {"triton_first_response_p95_seconds": 0.6}),
    ("LlmTtftBurnRate", "slow-after-scheduling"): F(
        {"worst_model_ttft_p95_seconds": 1.0, "triton_queue_p95_seconds": 0.01, "gpu_util_ratio": 0.2,
         "triton_compute_seconds": 0.01, "batch_size_min": 1, "max_batch_size": 0}, {"gpu_util_ratio": 0.9}),
    ("LlmAvailabilityBurnRate", "upstream-down"): F(
        {"bad_gateway_ratio": 0.08, "error_ratio": 0.1, "tritons_down": 1, "models_not_ready": 0},
        {"tritons_down": 0}),
    ("LlmAvailabilityBurnRate", "capacity-timeouts"): F(
        {"timeout_ratio": 0.08, "error_ratio": 0.1, "triton_rejected_per_second": 0}, {"timeout_ratio": 0.01}),
    ("LlmAvailabilityBurnRate", "model-errors"): F({"triton_backend_errors_per_second": 2},
                                                   {"triton_backend_errors_per_second": 0}),
    ("LlmAvailabilityBurnRate", "gateway-or-network"): F(
        {"bad_gateway_ratio": 0.08, "error_ratio": 0.1, "tritons_down": 0, "models_not_ready": 0},
        {"tritons_down": 1}),
    ("LlmOutputThroughputCollapse", "failures"): F({"error_ratio": 0.2}, {"error_ratio": 0.01}),
    ("LlmOutputThroughputCollapse", "fewer-requests"): F({"requests_ratio_vs_baseline": 0.3},
                                                         {"requests_ratio_vs_baseline": 0.9}),
    ("LlmOutputThroughputCollapse", "gpu-throttling"): F({"gpu_throttling": 1, "itl_p95_ratio_vs_baseline": 1.8},
                                                         {"gpu_throttling": 0}),
    ("LlmOutputThroughputCollapse", "slower-generation"): F(
        {"itl_p95_ratio_vs_baseline": 1.8, "itl_p95_seconds": 0.09}, {"itl_p95_ratio_vs_baseline": 1.0}),
    ("LlmOutputThroughputCollapse", "shorter-outputs"): F({"output_length_ratio_vs_baseline": 0.3},
                                                          {"output_length_ratio_vs_baseline": 1.0}),
    ("LlmCancellationRatioHigh", "slow-first-token"): F({"ttft_p95_seconds": 1.5}, {"ttft_p95_seconds": 0.2}),
    ("LlmCancellationRatioHigh", "client-timeout"): F({"duration_p95_seconds": 60, "duration_p50_seconds": 10},
                                                      {"duration_p50_seconds": 40}),
    ("LlmCancellationRatioHigh", "buffered-streaming"): F({"ttft_p95_seconds": 0.2, "itl_p95_seconds": 0.05},
                                                          {"itl_p95_seconds": 0.5}),
    ("LlmBudgetExceeded", "spend-surge"): F({"cost_rate_vs_1d": 3}, {"cost_rate_vs_1d": 1.1}),
    ("LlmBudgetExceeded", "cache-misses"): F({"cached_input_share": 0.02}, {"cached_input_share": 0.6}),
    ("LlmBudgetExceeded", "reasoning-heavy"): F({"reasoning_share": 0.7}, {"reasoning_share": 0.2}),
    ("LlmBudgetForecastExceeded", "spend-surge"): F({"cost_rate_vs_1d": 3}, {"cost_rate_vs_1d": 1.1}),
    ("LlmBudgetForecastExceeded", "cache-misses"): F({"cached_input_share": 0.02}, {"cached_input_share": 0.6}),
    ("LlmBudgetForecastExceeded", "reasoning-heavy"): F({"reasoning_share": 0.7}, {"reasoning_share": 0.2}),
    ("GatewayExporterDown", "no-targets"): F({"targets_in_job": None, "gateway_up": None}, {"targets_in_job": 2}),
    ("GatewayExporterDown", "gateway-down-traffic-lost"): F({"triton_requests_ratio_vs_1h": 0.1},
                                                            {"triton_requests_ratio_vs_1h": 0.9}),
    ("GatewayExporterDown", "metrics-port-blocked"): F(
        {"triton_requests_ratio_vs_1h": 0.9, "triton_requests_per_second": 30, "gateways_up": 1},
        {"triton_requests_ratio_vs_1h": 0.1}),

    ("NotifierDeliveryFailing", "bad-credentials"): F({"credential_dead_letters": 2}, {"credential_dead_letters": 0}),
    ("NotifierDeliveryFailing", "provider-rate-limit"): F(
        {"rate_limited_dead_letters": 3},
        {"rate_limited_dead_letters": 0, "retried_per_second": 0, "delivered_per_second": 1, "outbox_depth": 0}),
    ("NotifierDeliveryFailing", "provider-or-network-down"): F(
        {"retried_per_second": 1, "delivered_per_second": 0, "oldest_pending_seconds": 600},
        {"delivered_per_second": 1}),
    ("NotifierDeadLetters", "bad-credentials"): F({"credential_dead_letters": 1}, {"credential_dead_letters": 0}),
    ("NotifierDeadLetters", "refused-payload"): F({"payload_dead_letters": 1}, {"payload_dead_letters": 0}),
    ("NotifierDeadLetters", "long-outage"): F({"max_age_dead_letters": 1}, {"max_age_dead_letters": 0}),
    ("NotifierDown", "no-targets"): F({"targets_in_job": None, "notifier_up": None}, {"targets_in_job": 1}),
    ("NotifierDown", "notifier-down"): F({"alertmanager_webhook_failures": 0.2}, {"alertmanager_webhook_failures": 0}),
    ("NotifierDown", "notifier-unreachable"): F({}, {"notifier_up": 1, "targets_in_job": 1}),
    ("NotifierUnroutedAlerts", "unrouted-dead-letters"): F({"unrouted_dead_letters_1h": 1},
                                                           {"unrouted_dead_letters_1h": 0}),
    ("NotifierUnroutedAlerts", "routing-gap"): F({}, {"unrouted_recent": 0}),
    ("NotifierOutboxUnwritable", "outbox-unwritable-refusing"): F({"intake_refused_503": 3}, {"intake_refused_503": 0}),
    ("NotifierOutboxUnwritable", "outbox-unwritable"): F({}, {"outbox_writable": 1}),
    ("InferwatchHeartbeat", "path-alive"): F({}, {"heartbeat": 0}),
    ("NotifierOutboxDamaged", "acknowledged-lost"): F({"lost_webhooks": 20}, {"lost_webhooks": 0}),
    ("NotifierOutboxDamaged", "outbox-moved-aside"): F({}, {"damaged_age_seconds": 90000}),
    ("NotifierWebhooksRefused", "token-mismatch"): F({"refused_unauthorized": 2, "alertmanager_webhook_failures": 2},
                                                     {"refused_unauthorized": 0}),
    ("NotifierWebhooksRefused", "body-too-large"): F({"refused_too_large": 1}, {"refused_too_large": 0}),
    ("NotifierWebhooksRefused", "foreign-sender"): F({"refused_other": 3, "alertmanager_webhook_failures": 0},
                                                     {"refused_other": 0}),
    ("NotifierOutboxGrowing", "channel-failing"): F({"send_failures_per_second": 0.5}, {"send_failures_per_second": 0}),
    ("NotifierOutboxGrowing", "rate-limited"): F({"rate_limited_per_second": 0.3}, {"rate_limited_per_second": 0}),
    ("NotifierOutboxGrowing", "storm"): F({"send_failures_per_second": 0, "webhooks_per_second": 20},
                                          {"webhooks_per_second": 0.5}),
    ("AlertmanagerClusterDegraded", "peer-down"): F({}, {"peers_answering": 3}),
    ("AlertmanagerClusterDegraded", "split-brain"): F({"peers_answering": 3}, {"peers_answering": 2}),
    ("PrometheusRuleEvaluationFailing", "group-overloaded"): F({"missed_evaluations": 0.01},
                                                               {"missed_evaluations": 0}),
    ("PrometheusRuleEvaluationFailing", "rule-error"): F({"missed_evaluations": 0}, {"missed_evaluations": 0.01}),
    ("VictoriaMetricsDown", "store-down"): F({"edge_write_errors": 0.05}, {"edge_write_errors": 0}),
    ("VictoriaMetricsDown", "watcher-cut-off"): F({"edge_write_errors": 0}, {"edge_write_errors": 0.05}),
    ("VictoriaMetricsNotIngesting", "read-only"): F({"free_disk_bytes": 5e6}, {"read_only": 0}),
    ("VictoriaMetricsNotIngesting", "nothing-arrives"): F({"read_only": 0}, {"rows_per_second": 50}),
    ("VictoriaMetricsDiskSpaceLow", "data-growing"): F({"data_growth_bytes_per_second": 2e5},
                                                       {"data_growth_bytes_per_second": 0}),
    ("VictoriaMetricsDiskSpaceLow", "space-taken-elsewhere"): F({"data_growth_bytes_per_second": 0},
                                                                {"data_growth_bytes_per_second": 2e5}),
    ("VmagentDown", "vmagent-down"): F({"store_up": 1}, {"store_up": 0}),
    ("VmagentDown", "watcher-isolated"): F({"store_up": 0}, {"store_up": 1}),
    ("VmagentRemoteWriteFailing", "store-down"): F({"store_up": 0}, {"store_up": 1}),
    ("VmagentRemoteWriteFailing", "store-unreachable"): F({"store_up": 1}, {"store_up": 0}),
    ("VmagentRemoteWriteFailing", "data-dropped"): F({"dropped_recent": 3}, {"dropped_recent": 0}),
    ("VmalertDown", "vmalert-down"): F({"store_up": 1}, {"store_up": 0}),
    ("VmalertDown", "watcher-isolated"): F({"store_up": 0}, {"store_up": 1}),
    ("VmalertFailing", "store-down"): F({"store_up": 0}, {"store_up": 1}),
    ("VmalertFailing", "query-refused"): F({"store_up": 1}, {"store_up": 0}),
    ("VmalertFailing", "alertmanager-unreachable"): F({"send_errors_per_second": 0.2}, {"send_errors_per_second": 0}),
    ("PrometheusReplicasDisagree", "configuration-differs"): F({"rules_difference": 3, "reload_failures": 0},
                                                               {"rules_difference": 0, "reload_failures": 0}),
    ("PrometheusReplicasDisagree", "targets-reached-differently"): F({"dial_failure_difference": 0.5},
                                                                     {"dial_failure_difference": 0}),
    # L2 engines, and the engine findings of the slow-first-token and queue-time pages.
    ("EngineKvCacheFull", "engine-saturated"): F({"max_running_requests": 64, "running_requests": 64},
                                                 {"running_requests": 10}),
    ("EngineKvCacheFull", "long-contexts"): F({"max_running_requests": 64, "running_requests": 4},
                                              {"running_requests": 40}),
    ("EngineKvCacheFull", "preemptions"): F({"preemption_rate": 0.5}, {"preemption_rate": 0}),
    ("EngineKvCacheFull", "prefix-cache-cold"): F({"prefix_cache_hit_ratio": 0.02}, {"prefix_cache_hit_ratio": 0.6}),
    ("EnginePreemptionsHigh", "kv-cache-full"): F(
        {"kv_cache_used_ratio": 0.97, "running_requests": 30, "waiting_requests": 4}, {"kv_cache_used_ratio": 0.5}),
    ("EnginePreemptionsHigh", "prefix-cache-cold"): F({"prefix_cache_hit_ratio": 0.02},
                                                      {"prefix_cache_hit_ratio": 0.6}),
    ("EngineWaitingRequestsGrowing", "kv-cache-full"): F({"kv_cache_used_ratio": 0.95}, {"kv_cache_used_ratio": 0.5}),
    ("EngineWaitingRequestsGrowing", "engine-saturated"): F({"max_running_requests": 64, "running_requests": 64},
                                                            {"running_requests": 10}),
    ("EngineWaitingRequestsGrowing", "capacity"): F(
        {"kv_cache_used_ratio": 0.5, "running_requests": 10, "max_running_requests": 64},
        {"kv_cache_used_ratio": 0.95}),
    ("EngineKvCacheFillPredicted", "traffic-growth"): F({"running_requests": 20}, {"running_requests": 0}),
    ("EngineGpuMemoryFillPredicted", "memory-growth"): F({}, {"memory_predicted_ratio": 0.7}),
    ("LlmTtftP95High", "kv-cache-full"): F(
        {"engine_reporting": 1, "engine_kv_cache_used_ratio": 0.97, "engine_waiting_requests": 37},
        {"engine_waiting_requests": 0}),
    ("LlmTtftP95High", "engine-saturated"): F(
        {"engine_reporting": 1, "engine_running_of_max": 1, "engine_running_requests": 64,
         "engine_max_running_requests": 64}, {"engine_running_of_max": 0.5}),
    ("TritonQueueTimeP95High", "kv-cache-full"): F(
        {"engine_reporting": 1, "engine_kv_cache_used_ratio": 0.97, "engine_waiting_requests": 37},
        {"engine_waiting_requests": 0}),
    ("TritonQueueTimeP95High", "engine-saturated"): F(
        {"engine_reporting": 1, "engine_running_of_max": 1, "engine_running_requests": 64,
         "engine_max_running_requests": 64}, {"engine_running_of_max": 0.5}),
    ("PrometheusReplicasDisagree", "replica-overloaded"): F({"missed_evaluations": 0.1}, {"missed_evaluations": 0}),
}

# Findings that are about absence itself: (alert, cause) -> the value whose absence they report (True: the
# finding holds when it is missing) or need present (False: without it the finding cannot be made).
ABSENCE_IS_THE_FINDING = {
    ("GpuExporterDown", "no-targets"): ("targets_in_job", True),
    ("TritonCollectorDown", "no-targets"): ("targets_in_job", True),
    ("GatewayExporterDown", "no-targets"): ("targets_in_job", True),
    ("NotifierDown", "no-targets"): ("targets_in_job", True),
    ("LlmTtftP95High", "telemetry-gap"): ("ttft_p95_seconds", False),
    ("LlmTtftP95High", "upstream-not-on-triton"): ("triton_models_reporting", False),
}
