"""L3 LLM experience, as the gateway exporter measures it: TTFT, inter-token latency and time per output token
quantiles (and heatmaps) by tier and tenant, tokens/s, output length, outcomes and cancellations, SLO burn
rates, and token metering per tenant.

Quantiles come from the gateway histograms (`histogram_quantile` over `sum by (..., le)`), so a
tier-wide P95 is computed from merged buckets, never by averaging per-tenant quantiles.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from inferwatch.billing import active_budgets
from inferwatch.dashboards.builders import (
    dashboard,
    heatmap_panel,
    query,
    runbook_links,
    table_panel,
    table_query,
    timeseries_panel,
    variable,
)
from inferwatch.rules.budget import FORECAST, FORECAST_RATIO, SPENT, SPENT_RATIO
from inferwatch.rules.llm import CANCELLED, SLO_ERRORS, SLO_TTFT
from inferwatch.selectors import Selector
from inferwatch.spec import Spec

TIER, TENANT = 'tier=~"$tier"', 'tenant=~"$tenant"'
SEL = f'{TENANT}, {TIER}, model=~"$model"'
RATE = "[$__rate_interval]"
MAIN_PANEL = "Time to first token by tier"


def _quantiles(gateway: Selector, metric: str, by: str, legend: str) -> list:
    return [query(f"histogram_quantile({q}, sum by ({by}, le) (rate({gateway(metric + '_bucket', SEL)}{RATE})))",
                  f"{legend} p{int(q * 100)}") for q in (0.5, 0.95, 0.99)]


def _rate(gateway: Selector, metric: str, by: str, extra: str = "") -> str:
    return f"sum by ({by}) (rate({gateway(metric, SEL, extra)}{RATE}))"


def build(spec: Spec) -> db.Dashboard:
    l3 = spec.layers.L3
    gw = spec.selectors.of("gateway")
    requests = "gateway_requests_total"
    board = (dashboard("llm", "L3 user experience: what LLM users see through the gateway, per tier and tenant. "
                              "Alerts of this layer go to the model owners' WeCom group.")
             .with_variable(variable("tier", "Tier", f"label_values({gw(requests)}, tier)"))
             .with_variable(variable("tenant", "Tenant", f"label_values({gw(requests, TIER)}, tenant)"))
             .with_variable(variable("model", "Model", f"label_values({gw(requests, TIER, TENANT)}, model)")))
    ttft_lines = [(t.ttft_p95_seconds, "orange") for t in spec.tiers.values()]
    board = board.with_row(db.Row("Latency users feel"))
    board = board.with_panel(timeseries_panel(
        MAIN_PANEL, "Arrival at the gateway to the first token, streamed requests only: P50/P95/P99 per SLA tier "
        "(gateway_time_to_first_token_seconds). Dashed lines: each tier's ttft_p95_seconds "
        f"({', '.join(f'{n} {t.ttft_p95_seconds:g} s' for n, t in spec.tiers.items())}; LlmTtftP95High).", "s",
        _quantiles(gw, "gateway_time_to_first_token_seconds", "tier", "{{tier}}"),
        links=runbook_links(spec, ["LlmTtftP95High", "LlmTtftBurnRate"]), thresholds=ttft_lines, min_val=0))
    board = board.with_panel(heatmap_panel(
        "Time to first token distribution", "Streamed requests per TTFT bucket over time (all selected tiers "
        "and tenants). A second band appearing is a second population: cold caches, a slow tenant, a queue.",
        "s", f"sum by (le) (rate({gw('gateway_time_to_first_token_seconds_bucket', SEL)}{RATE}))"))
    board = board.with_panel(timeseries_panel(
        "TTFT P95 by tenant", "Time to first token P95 per tenant and tier: which tenant's users wait.", "s",
        [query("histogram_quantile(0.95, sum by (tenant, tier, le) (rate("
               f"{gw('gateway_time_to_first_token_seconds_bucket', SEL)}{RATE})))", "{{tenant}} {{tier}}")],
        links=runbook_links(spec, ["LlmTtftP95High"]), thresholds=ttft_lines, min_val=0))
    board = board.with_panel(timeseries_panel(
        "Inter-token latency by tier", "Gap between tokens as the client receives them, per token, where a "
        "chunk's token count is known: P50/P95/P99 per tier (gateway_inter_token_latency_seconds). High ITL "
        "with normal TTFT points to decode, not queueing.", "s",
        _quantiles(gw, "gateway_inter_token_latency_seconds", "tier", "{{tier}}"), min_val=0))
    board = board.with_panel(heatmap_panel(
        "Inter-token latency distribution", "Tokens per inter-token-latency bucket over time.", "s",
        f"sum by (le) (rate({gw('gateway_inter_token_latency_seconds_bucket', SEL)}{RATE}))"))
    board = board.with_panel(timeseries_panel(
        "Time per output chunk by tier", "Gap between output chunks of one sequence as the client receives "
        "them: P50/P95/P99 per tier (gateway_time_per_output_chunk_seconds). Every streamed request has it; "
        "inter-token latency only streams whose chunks say their token count (docs/gateway-apis.md).", "s",
        _quantiles(gw, "gateway_time_per_output_chunk_seconds", "tier", "{{tier}}"), min_val=0))
    board = board.with_panel(timeseries_panel(
        "Time per output token by tier", "Per successful streamed request, (last token - first token) / "
        "(output tokens - 1): P50/P95/P99 per tier (gateway_time_per_output_token_seconds).", "s",
        _quantiles(gw, "gateway_time_per_output_token_seconds", "tier", "{{tier}}"), min_val=0))
    board = board.with_row(db.Row("Throughput and output"))
    board = board.with_panel(timeseries_panel(
        "Output tokens per second", "Output tokens the gateway delivered per second, per tier "
        "(gateway_tokens_total{type=\"output\"}). A drop to below "
        f"{l3.throughput_collapse_ratio:.0%} of the same time {l3.throughput_baseline_offset} earlier fires "
        "LlmOutputThroughputCollapse.", "suffix: tokens/s",
        [query(_rate(gw, "gateway_tokens_total", "tier", 'type="output"'), "{{tier}}")],
        links=runbook_links(spec, ["LlmOutputThroughputCollapse"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "Per-request decode speed", "Output tokens / request duration per successful request: P50 and P5 "
        "(the slow tail) per tier (gateway_output_tokens_per_second).", "suffix: tokens/s",
        [query("histogram_quantile(0.5, sum by (tier, le) (rate("
               f"{gw('gateway_output_tokens_per_second_bucket', SEL)}{RATE})))", "{{tier}} p50"),
         query("histogram_quantile(0.05, sum by (tier, le) (rate("
               f"{gw('gateway_output_tokens_per_second_bucket', SEL)}{RATE})))", "{{tier}} p5")], min_val=0))
    board = board.with_panel(timeseries_panel(
        "Output length", "Output tokens per successful request: average and P95 per tier "
        "(gateway_output_tokens). A sudden change explains TTFT-stable latency changes.", "short",
        [query(f"{_rate(gw, 'gateway_output_tokens_sum', 'tier')}\n/\n"
               f"{_rate(gw, 'gateway_output_tokens_count', 'tier')}",
               "{{tier}} avg"),
         query("histogram_quantile(0.95, sum by (tier, le) (rate("
               f"{gw('gateway_output_tokens_bucket', SEL)}{RATE})))", "{{tier}} p95")], min_val=0))
    board = board.with_panel(timeseries_panel(
        "Requests by outcome", "Requests per second per outcome (ok, error, cancelled, timeout) and tier "
        "(gateway_requests_total).", "reqps",
        [query(_rate(gw, "gateway_requests_total", "tier, outcome"), "{{tier}} {{outcome}}")],
        stacked=True, min_val=0))
    board = board.with_row(db.Row("Errors, cancellations and SLOs"))
    board = board.with_panel(timeseries_panel(
        "Cancellation ratio", f"Cancelled / all requests per tenant, model and tier ({CANCELLED}): clients "
        f"giving up. Dashed line: {l3.cancellation_ratio:.0%} (LlmCancellationRatioHigh).", "percentunit",
        [query(f"{CANCELLED}{{{SEL}}}", "{{tenant}} {{model}} {{tier}}")],
        links=runbook_links(spec, ["LlmCancellationRatioHigh"]), thresholds=[(l3.cancellation_ratio, "orange")],
        min_val=0))
    board = board.with_panel(timeseries_panel(
        "Availability burn rate", "Error-budget burn rate per tier and SLO window: availability SLI misses "
        f"({SLO_ERRORS}) / (1 - availability_objective). 1 spends the 30-day budget exactly; the multi-window "
        "alerts page from 14.4 (LlmAvailabilityBurnRate).", "short",
        [query(f'{SLO_ERRORS}{{tier="{name}"}} / {1 - tier.availability_objective:.6g}',
               "{{tier}} {{slo_window}}") for name, tier in spec.tiers.items()],
        links=runbook_links(spec, ["LlmAvailabilityBurnRate"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "TTFT burn rate", f"TTFT SLO burn rate per tier and window: share of streamed requests slower than "
        f"ttft_slo_seconds ({SLO_TTFT}) / (1 - ttft_objective) (LlmTtftBurnRate).", "short",
        [query(f'{SLO_TTFT}{{tier="{name}"}} / {1 - tier.ttft_objective:.6g}', "{{tier}} {{slo_window}}")
         for name, tier in spec.tiers.items()],
        links=runbook_links(spec, ["LlmTtftBurnRate"]), min_val=0))
    board = board.with_panel(timeseries_panel(
        "Gateway exporters up", f"Prometheus `up` of each gateway exporter ({gw.describe()}); 0 blinds "
        "every L3 alert (GatewayExporterDown).", "bool",
        [query(gw("up"), "{{instance}}")],
        links=runbook_links(spec, ["GatewayExporterDown"]), min_val=0, max_val=1))
    board = board.with_row(db.Row("Token metering"))
    board = board.with_panel(timeseries_panel(
        "Tokens per tenant", "Tokens metered per second per tenant and type (input, output), every outcome "
        "included: the billing counter gateway_tokens_total.", "suffix: tokens/s",
        [query(_rate(gw, "gateway_tokens_total", "tenant, type"), "{{tenant}} {{type}}")], stacked=True,
        min_val=0))
    board = board.with_panel(table_panel(
        "Tokens metered in the time range", "Tokens per tenant, model and type over the dashboard's time "
        "range (increase of gateway_tokens_total over $__range): the figure to bill from.", "short",
        [table_query(f"sum by (tenant, model, type) (increase({gw('gateway_tokens_total', SEL)}[$__range]))")]))
    if spec.billing.enabled:
        board = _cost_row(spec, board)
    return board


def _cost_row(spec: Spec, board: db.Dashboard) -> db.Dashboard:
    """Cost per tenant from gateway_cost_total (billing.prices) and, with budgets, the spend this period, its
    forecast and each budget's share (rules/budget.py; docs/cost-and-budgets.md)."""
    gw = spec.selectors.of("gateway")
    currency = spec.billing.currency
    board = board.with_row(db.Row("Cost and budgets"))
    board = board.with_panel(timeseries_panel(
        "Cost per tenant", f"Cost per hour per tenant and model ({currency}), from the tokens metered and the "
        "spec's billing.prices (gateway_cost_total).", f"suffix: {currency}/h",
        [query(f"3600 * {_rate(gw, 'gateway_cost_total', 'tenant, model')}", "{{tenant}} {{model}}")],
        stacked=True, min_val=0))
    if not active_budgets(spec):
        return board
    who = f'{{{TENANT}}}'
    board = board.with_panel(timeseries_panel(
        "Cost this period and forecast", f"Spend per tenant since the start of the calendar month or day (UTC, "
        f"{currency}) and its forecast to the period's end at the cost rate of the last "
        f"{spec.billing.forecast_window} (rules/budget.py).", f"suffix: {currency}",
        [query(f"{SPENT}{who}", "{{tenant}} {{period}} spent"),
         query(f"{FORECAST}{who}", "{{tenant}} {{period}} forecast")],
        links=runbook_links(spec, ["LlmBudgetForecastExceeded", "LlmBudgetExceeded"]), min_val=0))
    board = board.with_panel(table_panel(
        "Budgets", "Each budget of billing.budgets: the spend this period and its forecast as shares of the "
        "budget (1 = all of it; LlmBudgetExceeded at 1, LlmBudgetForecastExceeded above "
        f"{spec.billing.forecast_warning_ratio:g}).", "percentunit",
        [table_query(f"{SPENT_RATIO}{who}"), table_query(f"{FORECAST_RATIO}{who}")],
        links=runbook_links(spec, ["LlmBudgetForecastExceeded", "LlmBudgetExceeded"])))
    return board
