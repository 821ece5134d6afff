"""The "LLM engines" row of the Triton dashboard: the KV cache, waiting vs running vs maximum requests,
preemptions and prefix-cache hits of the TensorRT-LLM and vLLM backends, one series per engine (model
version on a Triton, with its `backend`).

Panels read the recording rules of rules/engine.py (both vLLM spellings of a renamed family already merged
there), except the KV cache's free blocks, which only TensorRT-LLM reports. On a Triton without an engine
backend the row is there and its panels are empty: unknown is absent, never drawn as 0.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from inferwatch.dashboards.builders import query, runbook_links, timeseries_panel
from inferwatch.rules import engine
from inferwatch.rules.builders import by
from inferwatch.rules.identity import TritonLabels
from inferwatch.spec import Spec

SEL = 'node=~"$node", triton=~"$triton", model=~"$model"'
BY = engine.EV
# A vLLM server of its own has no `triton` or `version`: its scraped address names it.
LEGEND = "{{model}} v{{version}} ({{triton}} {{instance}} {{engine}}, {{backend}})"
ROW = "LLM engines (TensorRT-LLM, vLLM)"


def _recorded(name: str, sel: str = SEL) -> str:
    return f"{name}{{{sel}}}"


def names(spec: Spec) -> tuple[str, str, str]:
    """(SEL, BY, LEGEND) with the spec's Triton identity labels (spec `identity.triton`)."""
    ids = TritonLabels.of(spec)
    sel = f'{ids.node}=~"$node", {ids.server}=~"$triton", model=~"$model"'
    legend = LEGEND.replace("{{triton}}", f"{{{{{ids.server}}}}}")
    return sel, by(engine.identity_of(spec)), legend


def with_engine_row(spec: Spec, board: db.Dashboard) -> db.Dashboard:
    """`board` with the engine row and its panels appended (the engines' series through the `engine`
    selector)."""
    e = spec.layers.L2.engine
    sel, by_, legend = names(spec)
    server = TritonLabels.of(spec).server
    triton = spec.selectors.of("engine")
    kv_alerts = ["EngineKvCacheFull", "EngineKvCacheFillPredicted"]
    board = board.with_row(db.Row(ROW))
    board = board.with_panel(timeseries_panel(
        "KV cache used", "Used fraction of each engine's KV cache (TensorRT-LLM used / max blocks, vLLM "
        "kv_cache_usage_perc or gpu_cache_usage_perc) and its forecast at the fill horizon. Dashed lines: "
        f"{e.kv_cache_warning_ratio:.0%} and {e.kv_cache_critical_ratio:.0%}: EngineKvCacheFull fires only while "
        "requests also wait (a full cache alone is a busy engine); a forecast reaching 100 % fires "
        "EngineKvCacheFillPredicted.", "percentunit",
        [query(_recorded(engine.KV_USED, sel), legend),
         query(_recorded(engine.KV_PREDICTED, sel), legend + " forecast")],
        links=runbook_links(spec, kv_alerts),
        thresholds=[(e.kv_cache_warning_ratio, "orange"), (e.kv_cache_critical_ratio, "red")], min_val=0))
    board = board.with_panel(timeseries_panel(
        "KV cache blocks: used and free", "Used and free KV cache blocks of TensorRT-LLM engines "
        "(nv_trt_llm_kv_cache_block_metrics; vLLM exports only the used fraction).", "short",
        [query(f"max by ({by_}) ({triton(engine.TRT_KV, sel, f'kv_cache_block_type={chr(34)}{kind}{chr(34)}')})",
               f"{{{{model}}}} v{{{{version}}}} ({{{{{server}}}}} {{{{instance}}}}) " + kind)
         for kind in ("used", "free")],
        links=runbook_links(spec, ["EngineKvCacheFull"]), stacked=True, min_val=0))
    board = board.with_panel(timeseries_panel(
        "Waiting vs running vs maximum requests", "Requests waiting for the engine, running in its in-flight "
        "batch, and the most it runs at once (TensorRT-LLM; vLLM does not export its max_num_seqs). Waiting "
        f"that keeps growing for {e.waiting_growth_for} fires EngineWaitingRequestsGrowing.", "short",
        [query(_recorded(engine.WAITING, sel), legend + " waiting"),
         query(_recorded(engine.RUNNING, sel), legend + " running"),
         query(_recorded(engine.RUNNING_MAX, sel), legend + " maximum")],
        links=runbook_links(spec, ["EngineWaitingRequestsGrowing", "EngineKvCacheFull"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "Preemptions", "Running requests the engine preempted per second (vLLM's num_preemptions_total; "
        f"TensorRT-LLM exports none): their work is recomputed. Dashed line: {e.preemption_rate:g}/s "
        "(EnginePreemptionsHigh).", "ops",
        [query(_recorded(engine.PREEMPTIONS, sel), legend)],
        links=runbook_links(spec, ["EnginePreemptionsHigh"]), thresholds=[(e.preemption_rate, "orange")],
        min_val=0))
    board = board.with_panel(timeseries_panel(
        "Prefix-cache hits", "Prompt tokens served from the prefix cache / prompt tokens looked up (vLLM "
        "prefix_cache_hits / prefix_cache_queries, or the older gpu_prefix_cache_* names), over the rules' "
        "rate window. Low while clients share a system prompt: prefix caching is off or the prompts differ.",
        "percentunit", [query(_recorded(engine.PREFIX_HITS, sel), legend)], min_val=0, max_val=1))
    return board
