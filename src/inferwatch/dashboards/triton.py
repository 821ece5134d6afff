"""L2 Triton models: traffic and failures by reason, where the time goes (queue / compute input / infer /
output), P95 queue, pending requests, batching achieved vs preferred, model states, canary versions side by
side, ensembles and streaming models as clients see them, and models idle for 7 days.

Ensemble (and BLS) steps are not traffic: request panels show entry points, and steps appear as executions
per request of their parent. Decoupled (streaming) models have no stage times (Triton's figures are the
execute call); their latency and errors come from the gateway.

Triton's latency metrics are cumulative microsecond counters, not histograms: averages are
rate(sum) / rate(count) (Triton docs "Metrics", Latencies); P95 comes from the `*_summary_us` quantiles that
`--metrics-config summary_latencies=true` turns on, through the recording rule the alerts use.
"""

from __future__ import annotations

import dataclasses

from grafana_foundation_sdk.builders import dashboard as db

from inferwatch.dashboards.builders import (
    dashboard,
    query,
    runbook_links,
    stat_panel,
    table_panel,
    table_query,
    timeseries_panel,
    variable,
)
from inferwatch.dashboards.engine import with_engine_row
from inferwatch.rules.identity import TritonLabels
from inferwatch.rules.triton import Sources
from inferwatch.spec import Spec

NODE, TRITON = 'node=~"$node"', 'triton=~"$triton"'
SEL = f'{NODE}, {TRITON}, model=~"$model"'
BY = "node, triton, model, version"
LEGEND = "{{model}} v{{version}} ({{triton}})"
MAIN_PANEL = "Requests by model version"
RATE = "[$__rate_interval]"
MODEL = 'model=~"$model"'
TRITON_MODEL = f"{TRITON}, {MODEL}"
COLLECTOR_SEL = SEL  # the collector's own labels, whatever the spec's identity


@dataclasses.dataclass(frozen=True)
class Names:
    """The matchers, `by` lists and legends of this dashboard with the spec's identity labels (spec
    `identity.triton`): Triton's own and recorded series carry the spec's names, the collector's its own
    (`node`, `triton`). The dashboard's variables keep their names (`$node`, `$triton`) whatever the labels."""

    node: str = 'node=~"$node"'
    triton: str = 'triton=~"$triton"'
    server: str = "triton"
    node_label: str = "node"
    by: str = BY
    legend: str = LEGEND

    @classmethod
    def of(cls, ids: TritonLabels) -> "Names":
        return cls(f'{ids.node}=~"$node"', f'{ids.server}=~"$triton"', ids.server, ids.node,
                   f"{ids.node}, {ids.server}, model, version",
                   f"{{{{model}}}} v{{{{version}}}} ({{{{{ids.server}}}}})")

    @property
    def sel(self) -> str:
        return f"{self.node}, {self.triton}, {MODEL}"


def _rate(src: Sources, metric: str, by: str = "", n: Names = Names()) -> str:
    return f"sum by ({by or n.by}) (rate({src.triton(metric, n.sel)}{RATE}))"


def _avg_seconds(src: Sources, metric: str, n: Names = Names()) -> str:
    """Average stage time per successful request, s: rate(µs counter) / rate(success) / 1e6; decoupled models
    left out (their stage times are the execute call, not the stream)."""
    return (f"{_rate(src, metric, n=n)} / 1e6\n/ on ({n.by})\n{_rate(src, 'nv_inference_request_success', n=n)}\n"
            f"unless on ({src.server_model})\n{src.decoupled}")


def _entry_points(src: Sources, expr: str) -> str:
    return f"{expr}\nunless on ({src.server_model})\n{src.steps}"


def build(spec: Spec) -> db.Dashboard:
    l2 = spec.layers.L2
    src = Sources.of(spec)
    n = Names.of(src.ids)
    # Triton's own and recorded series: the spec's labels; the collector's: its own (module constants).
    sel, by, legend, server, node = n.sel, n.by, n.legend, n.server, n.node_label
    success = "nv_inference_request_success"
    decoupled_models = f"max by (model) ({src.collector('inferwatch_triton_model_decoupled', TRITON_MODEL)}) == 1"
    board = (dashboard("triton", "L2 runtime: every model version on every Triton. Alerts of this layer go to "
                                 "the on-call Slack channel.")
             .with_variable(variable("node", "Node", f"label_values({src.triton(success)}, {node})"))
             .with_variable(variable("triton", "Triton", f'label_values({src.triton(success, n.node)}, {server})'))
             .with_variable(variable("model", "Model",
                                     f'label_values({src.triton(success, n.node, n.triton)}, model)')))
    board = board.with_row(db.Row("Servers and models"))
    board = board.with_panel(stat_panel(
        "Triton servers ready", "Tritons answering their metrics scrape and ready (strict readiness) / all "
        "Tritons. Below 100 % see TritonServerDown / TritonServerNotReady.", "percentunit",
        [query(f"avg(min by ({server}) ({src.triton('up', n.triton)}) * on ({server}) group_left () "
               f"max by ({server}) ({src.collected('inferwatch_triton_server_ready', TRITON)}))", "ready")],
        links=runbook_links(spec, ["TritonServerDown", "TritonServerNotReady", "TritonCollectorDown"]),
        thresholds=[(0, "red"), (1, "green")]))
    board = board.with_panel(stat_panel(
        "Model versions not READY", "Model versions the repository index lists as not READY "
        "(inferwatch_triton_model_ready 0); a deliberately unloaded version shows as UNAVAILABLE with "
        "reason `unloaded`.", "none",
        [query(f"count({src.collector('inferwatch_triton_model_ready', COLLECTOR_SEL)} == 0) or vector(0)",
               "not ready")],
        links=runbook_links(spec, ["TritonModelNotReady"]), thresholds=[(1, "red")]))
    board = board.with_panel(table_panel(
        "Model states", "State of every model version in the repository index (READY, UNAVAILABLE, LOADING, "
        "UNLOADING) from the inferwatch Triton collector.", "none",
        [table_query(f"{src.collector('inferwatch_triton_model_state', COLLECTOR_SEL)} == 1")],
        links=runbook_links(spec, ["TritonModelNotReady"])))
    board = board.with_row(db.Row("Traffic and errors"))
    board = board.with_panel(timeseries_panel(
        MAIN_PANEL, "Successful and failed inference requests per second per model version "
        "(nv_inference_request_success + nv_inference_request_failure), for the models clients call: steps of "
        "ensembles and BLS models are their parent's work (see \"Steps per parent request\").", "reqps",
        [query(_entry_points(src, _rate(src, "nv_inference_request_success", n=n)), legend + " ok"),
         query(_entry_points(src, _rate(src, "nv_inference_request_failure", n=n)), legend + " failed")], min_val=0))
    board = board.with_panel(timeseries_panel(
        "Failures by reason", "Failed requests/s by Triton's `reason`: REJECTED (queue full or timed out in "
        "the queue), CANCELED, BACKEND (the model raised), OTHER.", "reqps",
        [query(_rate(src, "nv_inference_request_failure", by + ", reason", n) + " > 0", legend + " {{reason}}")],
        links=runbook_links(spec, ["TritonRequestsRejected", "TritonModelErrorRatioHigh"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "Error ratio", "Failed / all requests per entry point (model clients call) over the rules' rate window "
        "(model:nv_inference_entry_point_error:ratio). Source `triton`: Triton's failure counter; source "
        "`gateway`: a decoupled (streaming) model the gateway meters, whose errors mid-stream Triton counts as "
        f"successes. Dashed line: {l2.error_ratio:.1%} (TritonModelErrorRatioHigh, "
        f"TritonDecoupledModelErrorRatioHigh; judged only above {l2.min_request_rate:g} req/s).", "percentunit",
        [query(f"model:nv_inference_entry_point_error:ratio{{{sel}}}",
               f"{{{{model}}}} ({{{{{server}}}}}, {{{{source}}}})")],
        links=runbook_links(spec, ["TritonModelErrorRatioHigh", "TritonDecoupledModelErrorRatioHigh"]),
        thresholds=[(l2.error_ratio, "red")], min_val=0))
    board = board.with_panel(timeseries_panel(
        "Pending requests", "Requests received and not yet executing (nv_inference_pending_request_count). "
        f"Dashed line: {l2.pending_requests:g} (TritonPendingRequestsHigh).", "short",
        [query(f"sum by ({by}) ({src.triton('nv_inference_pending_request_count', sel)})", legend)],
        links=runbook_links(spec, ["TritonPendingRequestsHigh"]), thresholds=[(l2.pending_requests, "orange")],
        min_val=0))
    board = board.with_row(db.Row("Latency"))
    board = board.with_panel(timeseries_panel(
        "Where the time goes", "Average time per successful request in each stage: queue, compute input, "
        "compute infer, compute output (rate of Triton's µs counters / rate of successes). Stacked, so the top "
        "is about the average request time. Decoupled (streaming) models are left out: their figures time the "
        "execute call, not the stream (see \"Streaming models: time to first token\").", "s",
        [query(_avg_seconds(src, "nv_inference_queue_duration_us", n), legend + " queue"),
         query(_avg_seconds(src, "nv_inference_compute_input_duration_us", n), legend + " compute input"),
         query(_avg_seconds(src, "nv_inference_compute_infer_duration_us", n), legend + " compute infer"),
         query(_avg_seconds(src, "nv_inference_compute_output_duration_us", n), legend + " compute output")],
        stacked=True, min_val=0))
    board = board.with_panel(timeseries_panel(
        "P95 queue time", "95th percentile time in the queue (model_version:nv_inference_queue_duration:"
        "p95_seconds: Triton's summary quantile, the average where summary_latencies is off). Dashed line: "
        f"{l2.queue_p95_seconds:g} s (TritonQueueTimeP95High; per-model overrides in the spec).", "s",
        [query(f"model_version:nv_inference_queue_duration:p95_seconds{{{sel}}}", legend)],
        links=runbook_links(spec, ["TritonQueueTimeP95High"]), thresholds=[(l2.queue_p95_seconds, "orange")],
        min_val=0))
    board = board.with_row(db.Row("Batching"))
    board = board.with_panel(timeseries_panel(
        "Achieved vs preferred batch size", "Achieved batch size (inferences / executions) against the "
        "largest preferred_batch_size of the model's dynamic batcher. Below "
        f"{l2.batching_efficiency_ratio:.0%} of preferred while requests queue fires TritonBatchingIneffective.",
        "short",
        [query(f"{_rate(src, 'nv_inference_count', n=n)}\n/ on ({by})\n{_rate(src, 'nv_inference_exec_count', n=n)}",
               legend + " achieved"),
         query("max by (triton, model) "
               f"({src.collector('inferwatch_triton_model_preferred_batch_size_max', TRITON_MODEL)})",
               "{{model}} preferred ({{triton}})")],
        links=runbook_links(spec, ["TritonBatchingIneffective"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "Executions by batch size", "Model executions per second by the batch size Triton formed "
        "(inferwatch_triton_model_batch_executions_total, from the statistics API).", "ops",
        [query("sum by (model, batch_size) (rate("
               f"{src.collector('inferwatch_triton_model_batch_executions_total', TRITON_MODEL)}{RATE})) > 0",
               "{{model}} batch {{batch_size}}")],
        stacked=True, min_val=0))
    board = board.with_row(db.Row("Ensembles, BLS and streaming models"))
    board = board.with_panel(table_panel(
        "Ensemble and BLS steps", "Models that run as steps of another model (parent), read from the parent's "
        "ensemble_scheduling (kind ensemble) or given to the collector with --bls-step (kind bls); `step` is the "
        "position. Clients call the parent; a step's requests are its parent's work.", "none",
        [table_query(src.collector("inferwatch_triton_model_step_info", TRITON))],
        links=runbook_links(spec, ["TritonModelNotReady"])))
    board = board.with_panel(timeseries_panel(
        "Steps per parent request", "Executions of each step per request to its parent "
        "(parent_model:nv_inference_step_requests:per_parent_request): 1 for a step that runs once, about the "
        "output length for a postprocessing step that runs once per streamed token. A step whose counters stay 0 "
        "(some decoupled LLM backends report none) shows nothing.", "short",
        [query(f'parent_model:nv_inference_step_requests:per_parent_request{{{n.triton}, parent=~"$model"}}',
               f"{{{{parent}}}} step {{{{model}}}} ({{{{{server}}}}})")], min_val=0))
    board = board.with_panel(timeseries_panel(
        "Streaming models: errors and cancellations at the gateway", "Error and cancellation ratios of decoupled "
        "(streaming) models as the gateway sees them (model:gateway_requests_errors:ratio, "
        "model:gateway_requests_cancelled:ratio). Triton counts both as successes for a decoupled model.",
        "percentunit",
        [query(f"model:gateway_requests_errors:ratio\nand on (model)\n{decoupled_models}", "{{model}} errors"),
         query(f"model:gateway_requests_cancelled:ratio\nand on (model)\n{decoupled_models}",
               "{{model}} cancelled")],
        links=runbook_links(spec, ["TritonDecoupledModelErrorRatioHigh"]), thresholds=[(l2.error_ratio, "red")],
        min_val=0))
    board = board.with_panel(timeseries_panel(
        "Streaming models: time to first token", "P95 time to first token of decoupled (streaming) models, "
        "measured at the gateway (arrival to first token event, every tenant and tier): what a client waits for, "
        "which Triton's request duration of a decoupled model (the execute call) is not.", "s",
        [query(f"histogram_quantile(0.95, sum by (model, le) (rate("
               f"{src.gateway('gateway_time_to_first_token_seconds_bucket', MODEL)}{RATE})))\n"
               f"and on (model)\n{decoupled_models}", "{{model}} P95")],
        min_val=0))
    board = board.with_row(db.Row("Versions and lifecycle"))
    board = board.with_panel(timeseries_panel(
        "Canary: request time by version", "Average request time per version of each model, side by side "
        "(model_version:nv_inference_request_duration:avg_seconds). A newer version more than "
        f"{l2.canary_regression_ratio:.0%} slower than the majority version fires TritonCanaryRegression.", "s",
        [query(f"model_version:nv_inference_request_duration:avg_seconds{{{sel}}}", legend)],
        links=runbook_links(spec, ["TritonCanaryRegression"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "Canary: traffic share by version", "Share of each model's requests served by each version "
        "(model_version:nv_inference_requests:rate / the model's total).", "percentunit",
        [query(f"model_version:nv_inference_requests:rate{{{sel}}}\n/ on ({node}, {server}, model) group_left ()\n"
               f"sum by ({node}, {server}, model) (model_version:nv_inference_requests:rate{{{sel}}})", legend)],
        links=runbook_links(spec, ["TritonCanaryRegression"]), min_val=0, max_val=1))
    board = board.with_panel(timeseries_panel(
        "Canary: error ratio by version", "Error ratio of each version of each model, side by side.",
        "percentunit", [query(f"model_version:nv_inference_request_error:ratio{{{sel}}}", legend)],
        links=runbook_links(spec, ["TritonCanaryRegression"]), min_val=0))
    board = board.with_panel(table_panel(
        "Models with no traffic for 7 days", "Loaded models that served no successful request in the last "
        "7 days: candidates to retire (they still hold memory and instances). Needs 7 days of retention.",
        "short",
        [table_query(f"sum by ({node}, {server}, model) (increase({src.triton('nv_inference_request_success', sel)}"
                     "[7d])) == 0")]))
    return with_engine_row(spec, board)
