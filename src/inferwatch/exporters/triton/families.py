"""Pure function: Triton snapshots (+ cumulative poll-error counts) → Prometheus metric families.

Names and labels: prefix `inferwatch_triton_`, labels `triton` (the
target name), `model`, `version` where they apply. Model-config figures are per model (all versions of a
model share one configuration), so they carry no `version`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from inferwatch.exporters.triton.snapshot import CAUSES, ENDPOINTS, STATES, TritonSnapshot
from inferwatch.exporters.triton.stats import INFERENCE_STATS

P = "inferwatch_triton_"
# Load-failure reasons are Python tracebacks or long C++ messages: cap them so one label value cannot
# bloat every scrape (the full text stays in Triton's log). The marker shows the cut.
REASON_MAX_CHARS = 200
TRUNCATION_MARK = "…[truncated]"


def cap_reason(reason: str, limit: int = REASON_MAX_CHARS) -> str:
    """`reason` cut to at most `limit` characters (marker included), newlines folded to spaces."""
    text = " ".join(reason.split())
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATION_MARK)] + TRUNCATION_MARK


def _b(flag: bool) -> float:
    return 1.0 if flag else 0.0


def steps_of(snap: TritonSnapshot, bls_steps: Mapping[str, tuple[str, ...]]) -> list[tuple[str, str, str, int]]:
    """(parent, kind, step model, position) for every step of a loaded parent: the ensemble_scheduling steps
    of each ensemble whose configuration is known, and the `bls_steps` of BLS parents the index lists READY."""
    out = [(parent, "ensemble", step, i)
           for parent, cfg in sorted(snap.configs.items()) for i, step in enumerate(cfg.ensemble_steps)]
    ready = {m.name for m in snap.models or [] if m.state == "READY"}
    out += [(parent, "bls", step, i)
            for parent in sorted(set(bls_steps) & ready) for i, step in enumerate(bls_steps[parent])]
    return out


def build_families(snapshots: Iterable[TritonSnapshot],
                   poll_errors: Mapping[tuple[str, str, str], int],
                   bls_steps: Mapping[str, tuple[str, ...]] | None = None,
                   config_fetches: Mapping[str, int] | None = None) -> list[Metric]:
    """Metric families for the latest snapshot of each target.

    `poll_errors` maps (triton, endpoint, cause) → cumulative count since start; every target gets the full
    endpoint × cause set (zeros included) so rates work from the first error on. `bls_steps`: parent model →
    models it calls (see steps_of). `config_fetches`: triton → configurations requested since start.
    Returns families in a stable order; a family may have no samples.
    """
    bls_steps = bls_steps or {}
    config_fetches = config_fetches or {}
    snaps = sorted(snapshots, key=lambda s: s.triton)
    up = GaugeMetricFamily(P + "up", "1 when the collector got an answer from Triton's /v2/health/live",
                           labels=["triton"])
    live = GaugeMetricFamily(P + "server_live", "1 when /v2/health/live answers 200 (absent while up is 0)",
                             labels=["triton"])
    ready = GaugeMetricFamily(P + "server_ready",
                              "1 when /v2/health/ready answers 200; strict readiness: every model loaded "
                              "(absent while up is 0)", labels=["triton"])
    summaries = GaugeMetricFamily(P + "summaries_enabled",
                                  "1 when Triton's /metrics exposes nv_inference_*_summary_us (P95 available); "
                                  "0 means rules must fall back to averages", labels=["triton"])
    state = GaugeMetricFamily(P + "model_state",
                              "state set of a model version: 1 for the current state "
                              "(READY, UNAVAILABLE, LOADING, UNLOADING)",
                              labels=["triton", "model", "version", "state"])
    model_ready = GaugeMetricFamily(P + "model_ready", "1 when the model version is READY",
                                    labels=["triton", "model", "version"])
    reason = InfoMetricFamily(P + "model_state_reason",
                              f"Triton's reason for a model version's state (load failure), capped at "
                              f"{REASON_MAX_CHARS} characters", labels=["triton", "model", "version"])
    max_batch = GaugeMetricFamily(P + "model_max_batch_size", "max_batch_size from the model config "
                                  "(0: the model does not batch)", labels=["triton", "model"])
    dyn = GaugeMetricFamily(P + "model_dynamic_batching_enabled",
                            "1 when the model config enables dynamic batching", labels=["triton", "model"])
    preferred = GaugeMetricFamily(P + "model_preferred_batch_size_max",
                                  "largest preferred_batch_size (max_batch_size when none is set); "
                                  "only for dynamically batched models", labels=["triton", "model"])
    delay = GaugeMetricFamily(P + "model_max_queue_delay_seconds",
                              "dynamic batcher max_queue_delay_microseconds, in seconds", labels=["triton", "model"])
    instances = GaugeMetricFamily(P + "model_instances", "model instances per instance-group kind",
                                  labels=["triton", "model", "kind"])
    decoupled = GaugeMetricFamily(P + "model_decoupled", "1 when the model config sets model_transaction_policy "
                                  "decoupled (any number of responses per request, e.g. streamed tokens): Triton's "
                                  "request duration then measures the execute call, not what a client waits for",
                                  labels=["triton", "model"])
    entry = GaugeMetricFamily(P + "model_entry_point", "1 when clients call the model (no loaded ensemble or BLS "
                              "parent lists it as a step); 0 for a step, whose requests are its parent's work",
                              labels=["triton", "model"])
    step_info = InfoMetricFamily(P + "model_step", "a model that runs as a step of `parent` (kind ensemble: read "
                                 "from the parent's ensemble_scheduling; bls: from --bls-step); `step` is its "
                                 "position", labels=["triton", "model", "parent", "kind", "step"])
    inferences = CounterMetricFamily(P + "model_inferences", "inference_count from /v2/models/stats: inferences "
                                     "performed, each item of a batch counted (no cache hits)",
                                     labels=["triton", "model", "version"])
    executions = CounterMetricFamily(P + "model_executions", "execution_count from /v2/models/stats: model "
                                     "executions (one per executed batch; no cache hits)",
                                     labels=["triton", "model", "version"])
    stat_count = CounterMetricFamily(P + "model_inference_stat_count", "count of each /v2/models/stats "
                                     "inference_stats field (stat success and fail: requests; queue, compute_*: "
                                     "requests through that stage; cache_hit, cache_miss)",
                                     labels=["triton", "model", "version", "stat"])
    stat_seconds = CounterMetricFamily(P + "model_inference_stat_duration_seconds", "cumulative duration of each "
                                       "inference_stats field, from Triton's exact nanoseconds",
                                       labels=["triton", "model", "version", "stat"])
    stat_mean = GaugeMetricFamily(P + "model_inference_stat_mean_seconds", "mean duration per count of each "
                                  "inference_stats field since the version loaded, computed from the exact integers "
                                  "(absent while the count is 0)", labels=["triton", "model", "version", "stat"])
    batches = CounterMetricFamily(P + "model_batch_executions",
                                  "executions per executed batch size (/v2/models/stats batch_stats "
                                  "compute_infer.count); resets when Triton restarts",
                                  labels=["triton", "model", "version", "batch_size"])
    batch_infer = CounterMetricFamily(P + "model_batch_compute_infer_duration_seconds",
                                      "cumulative compute_infer time per executed batch size (batch_stats)",
                                      labels=["triton", "model", "version", "batch_size"])
    fetches = CounterMetricFamily(P + "config_fetches", "model configurations requested from Triton (a model's "
                                  "configuration is read again only when its versions or states change, or when "
                                  "it is older than --config-max-age)", labels=["triton"])
    duration = GaugeMetricFamily(P + "poll_duration_seconds", "wall time of the last poll of this Triton",
                                 labels=["triton"])
    last = GaugeMetricFamily(P + "last_poll_timestamp_seconds", "Unix time the last poll of this Triton ended",
                             labels=["triton"])
    errors = CounterMetricFamily(P + "poll_errors", "failed Triton API calls by endpoint and cause",
                                 labels=["triton", "endpoint", "cause"])

    for snap in snaps:
        t = snap.triton
        up.add_metric([t], _b(snap.up))
        duration.add_metric([t], snap.duration_seconds)
        last.add_metric([t], snap.timestamp)
        fetches.add_metric([t], float(config_fetches.get(t, 0)))
        for endpoint in ENDPOINTS:
            for cause in CAUSES:
                errors.add_metric([t, endpoint, cause], float(poll_errors.get((t, endpoint, cause), 0)))
        if not snap.up:
            continue
        if snap.live is not None:
            live.add_metric([t], _b(snap.live))
        if snap.ready is not None:
            ready.add_metric([t], _b(snap.ready))
        if snap.summaries_enabled is not None:
            summaries.add_metric([t], _b(snap.summaries_enabled))
        for mv in sorted(snap.models or [], key=lambda m: (m.name, m.version)):
            for s in STATES:
                state.add_metric([t, mv.name, mv.version, s], _b(mv.state == s))
            model_ready.add_metric([t, mv.name, mv.version], _b(mv.state == "READY"))
            if mv.reason:
                reason.add_metric([t, mv.name, mv.version], {"reason": cap_reason(mv.reason)})
        for name in sorted(snap.configs):
            cfg = snap.configs[name]
            max_batch.add_metric([t, name], float(cfg.max_batch_size))
            dyn.add_metric([t, name], _b(cfg.dynamic_batching))
            if cfg.preferred_batch_size_max is not None:
                preferred.add_metric([t, name], float(cfg.preferred_batch_size_max))
            if cfg.max_queue_delay_seconds is not None:
                delay.add_metric([t, name], cfg.max_queue_delay_seconds)
            for kind in sorted(cfg.instances):
                instances.add_metric([t, name, kind], float(cfg.instances[kind]))
            decoupled.add_metric([t, name], _b(cfg.decoupled))
        steps = steps_of(snap, bls_steps)
        step_models = {model for _, _, model, _ in steps}
        for name in sorted(snap.configs):
            entry.add_metric([t, name], _b(name not in step_models))
        for parent, kind, model, position in steps:
            step_info.add_metric([t, model, parent, kind, str(position)], {})
        for (name, version), st in sorted((snap.stats or {}).items()):
            labels = [t, name, version]
            inferences.add_metric(labels, float(st.inference_count))
            executions.add_metric(labels, float(st.execution_count))
            for stat in INFERENCE_STATS:
                d = st.inference[stat]
                stat_count.add_metric(labels + [stat], float(d.count))
                stat_seconds.add_metric(labels + [stat], d.seconds)
                mean = d.mean_seconds()
                if mean is not None:
                    stat_mean.add_metric(labels + [stat], mean)
            for size in sorted(st.batches):
                infer = st.batches[size]["compute_infer"]
                batches.add_metric(labels + [str(size)], float(infer.count))
                batch_infer.add_metric(labels + [str(size)], infer.seconds)

    return [up, live, ready, summaries, state, model_ready, reason, max_batch, dyn, preferred, delay,
            instances, decoupled, entry, step_info, inferences, executions, stat_count, stat_seconds, stat_mean,
            batches, batch_infer, fetches, duration, last, errors]
