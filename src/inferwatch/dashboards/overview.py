"""Overview: per layer, what is firing now and the one number an on-call looks at first (hottest GPU, worst
model error ratio, worst TTFT P95 by tier), each linking to its layer dashboard.

Firing alerts come from Prometheus' own `ALERTS` series (labels of the rule plus alertstate), so this page
needs no Alertmanager access; silenced alerts still show here.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from inferwatch.dashboards.builders import (
    dashboard,
    dashboard_link,
    query,
    runbook_data_link,
    runbook_links,
    stat_panel,
    table_panel,
    table_query,
    timeseries_panel,
)
from inferwatch.rules.names import alerts_of_layer
from inferwatch.spec import Spec

MAIN_PANEL = "Hottest GPU"
LAYERS = (("L1", "gpu", "GPUs"), ("L2", "triton", "Triton runtime"), ("L3", "llm", "LLM experience"))


def build(spec: Spec) -> db.Dashboard:
    l1, l2 = spec.layers.L1, spec.layers.L2
    board = dashboard("overview", "Start here: what is firing per layer and the first number to look at; each "
                                  "panel links to its layer dashboard.")
    board = board.with_row(db.Row("Firing now"))
    for layer, key, what in LAYERS:
        board = board.with_panel(stat_panel(
            f"{layer} {what}: alerts firing", f"Alerts of layer {layer} firing now (Prometheus ALERTS, "
            "silenced ones included). Critical ones page.", "none",
            [query(f'count(ALERTS{{alertstate="firing", layer="{layer}"}}) or vector(0)', "firing")],
            links=[dashboard_link(key)], thresholds=[(1, "red")], w=8, h=4))
    # Where an alert is, by the spec's identity labels (spec `identity`): Triton's node and server, the GPUs'
    # node where it is another label.
    ids = spec.identity
    where = ", ".join(dict.fromkeys((ids.triton.node, ids.gpu.node, ids.triton.server)))
    board = board.with_panel(table_panel(
        "Firing alerts", "Every alert firing now with its layer, severity and where (node, model, tier); "
        "click an alert name for its runbook.", "none",
        [table_query(f'sum by (alertname, layer, severity, {where}, model, tier) '
                     '(ALERTS{alertstate="firing"})')], w=24, h=6).data_links([runbook_data_link(spec)]))
    board = board.with_row(db.Row("First numbers"))
    board = board.with_panel(stat_panel(
        MAIN_PANEL, "Highest GPU temperature across the fleet now (DCGM_FI_DEV_GPU_TEMP); red from the "
        f"critical threshold {l1.temperature_critical_celsius:g} °C.", "celsius",
        [query(f"max({spec.selectors.of('gpu')('DCGM_FI_DEV_GPU_TEMP')})", "hottest")],
        links=[dashboard_link("gpu")] + runbook_links(spec, ["GpuTemperatureCritical"]),
        thresholds=[(l1.temperature_critical_celsius - 10, "orange"), (l1.temperature_critical_celsius, "red")],
        w=8, h=5))
    board = board.with_panel(stat_panel(
        "Worst model error ratio", "Highest failed / all requests ratio of any model version "
        f"(model_version:nv_inference_request_error:ratio); red from {l2.error_ratio:.1%}.", "percentunit",
        [query("max(model_version:nv_inference_request_error:ratio)", "worst")],
        links=[dashboard_link("triton")] + runbook_links(spec, ["TritonModelErrorRatioHigh"]),
        thresholds=[(l2.error_ratio, "red")], w=8, h=5))
    ttft = spec.selectors.of("gateway")("gateway_time_to_first_token_seconds_bucket")
    board = board.with_panel(stat_panel(
        "TTFT P95 by tier", "Time-to-first-token P95 per tier, every tenant and model together, from the gateway's "
        "histogram (gateway_time_to_first_token_seconds). Targets: "
        f"{', '.join(f'{n} {t.ttft_p95_seconds:g} s' for n, t in spec.tiers.items())}.", "s",
        [query(f"histogram_quantile(0.95, sum by (tier, le) (rate({ttft}[$__rate_interval])))", "{{tier}}")],
        links=[dashboard_link("llm")] + runbook_links(spec, ["LlmTtftP95High"]),
        thresholds=[(min(t.ttft_p95_seconds for t in spec.tiers.values()), "orange")] if spec.tiers else (),
        w=8, h=5))
    board = board.with_row(db.Row("Trend"))
    for layer, key, _what in LAYERS:
        board = board.with_panel(timeseries_panel(
            f"{layer} alerts over time",
            f"Firing {layer} alerts by name, over time ({len(alerts_of_layer(layer))} alert rules in this layer; "
            "their runbooks are linked from the layer dashboard).",
            "none",
            [query(f'count by (alertname) (ALERTS{{alertstate="firing", layer="{layer}"}})', "{{alertname}}")],
            links=[dashboard_link(key)], w=8, h=7, min_val=0))
    return board
