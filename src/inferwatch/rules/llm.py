"""L3 rules: the LLM user experience as the gateway exporter measures it (`gateway_*`, labels tenant, model,
tier; histograms in seconds).

SLO alerts follow the multi-window multi-burn-rate scheme (Google SRE Workbook ch. 5; docs/sources.md#slo-alerting):
one rule per tier and window pair, labelled `window` (fast-1h, slow-6h, fast-1d, slow-3d) so
Alertmanager can inhibit the slower pairs while a faster one fires, each with a low-traffic guard.
"""

from __future__ import annotations

from inferwatch.rules.builders import by, exporter_down, indent, le_matcher, num, or_zero, ratio, ratio_or_zero
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.selectors import Selector
from inferwatch.spec import Duration, Spec

TMT = ("tenant", "model", "tier")
TMT_BY = by(TMT)
# Availability SLI: error and timeout outcomes count against the budget; client mistakes (4xx) do not, except
# 429, which is the platform refusing work. A stream that fails after its 200 has code 200, outcome error.
ERRORS = 'outcome=~"error|timeout", code!~"4(0[0-9]|1[0-9]|2[0-8]|[3-9][0-9])"'
REQUESTS = "tenant_model_tier:gateway_requests:rate"
TOKENS = "tenant_model_tier_type:gateway_tokens:rate"
CANCELLED = "tenant_model_tier:gateway_requests_cancelled:ratio"
ERROR_RATIO = "tenant_model_tier:gateway_requests_errors:ratio"
# Rates, recorded once, that the ratios above, the SLO's per-tier errors and the per-model gateway ratios
# (rules/triton.py) sum, so no rule multiplies a ratio back into a rate over every tenant's series.
ERROR_RATE = "tenant_model_tier:gateway_requests_errors:rate"
CANCELLED_RATE = "tenant_model_tier:gateway_requests_cancelled:rate"
MT_BY = by(("model", "tier"))
SLO_REQUESTS = "tier_slo_window:gateway_requests:rate"
SLO_ERRORS = "tier_slo_window:gateway_requests_errors:ratio"
SLO_TTFT = "tier_slo_window:gateway_time_to_first_token_seconds:ratio_over_slo"
SLO_ERROR_RATE = "tier_slo_window:gateway_requests_errors:rate"
SLO_TTFT_FAST = "tier_slo_window:gateway_time_to_first_token_seconds_within_slo:rate"
SLO_TTFT_COUNT = "tier_slo_window:gateway_time_to_first_token_seconds_count:rate"
SLO_HISTORY = "slo_window:gateway_scrapes:history_ratio"
CANCELLED_OUTCOME = 'outcome="cancelled"'
WHO = "tenant {{ $labels.tenant }}, model {{ $labels.model }}, tier {{ $labels.tier }}"


def ttft_p95_over_target(spec: Spec, tier_name: str, keep: str, window: str) -> str:
    """The TTFT P95 of `tier_name` above its target, per `keep` labels, without computing a quantile: with the
    target T a bucket edge, histogram_quantile(0.95) > T exactly when fewer than 95 % of the observations
    are <= T, i.e. rate(bucket{le=T}) / rate(bucket{le="+Inf"}) < 0.95. That reads two of the ~30 bucket
    series per tenant, model and tier instead of all of them at every evaluation (benchmarks/rules_eval.py:
    rating every bucket was the costliest rule). The expression's value is that share (< 0.95)."""
    gateway = spec.selectors.of("gateway")
    tier = spec.tiers[tier_name]
    sel = f'tier="{tier_name}"'
    within = gateway("gateway_time_to_first_token_seconds_bucket", sel, le_matcher(tier.ttft_p95_seconds))
    every = gateway("gateway_time_to_first_token_seconds_bucket", sel, 'le="+Inf"')
    fraction = ratio(f"sum by ({keep}) (rate({within}[{window}]))", f"sum by ({keep}) (rate({every}[{window}]))",
                     tuple(k.strip() for k in keep.split(",")))
    return f"(\n{indent(fraction)}\n) < 0.95"


def recording_rules(gateway: Selector, window: str) -> list[Recording]:
    """Requests/s per tenant, model and tier (with outcome_recording_rules, the rules that rate the gateway's
    request counters; the SLO rates them too only when its shortest window is not the rate window). The
    per-tenant output-length mean is not recorded: nothing reads it, and the dashboard draws output length
    from the histogram over its own range."""
    return [Recording(REQUESTS, f"sum by ({TMT_BY}) (rate({gateway('gateway_requests_total')}[{window}]))")]


def outcome_recording_rules(gateway: Selector, window: str) -> list[Recording]:
    """The error and cancellation rates per tenant, model and tier, absent where no such series exists (the
    ratios are 0 there). A group of its own, so a slow evaluation of the request rates delays neither."""
    return [
        Recording(ERROR_RATE, f"sum by ({TMT_BY}) (rate({gateway('gateway_requests_total', ERRORS)}[{window}]))"),
        Recording(CANCELLED_RATE,
                  f"sum by ({TMT_BY}) (rate({gateway('gateway_requests_total', CANCELLED_OUTCOME)}[{window}]))"),
    ]


def ratio_recording_rules() -> list[Recording]:
    """Error and cancellation ratios per tenant, model and tier from the recorded rates (inferwatch-llm.rules
    and inferwatch-llm-outcomes.rules, read as of their last evaluation)."""
    return [Recording(ERROR_RATIO, ratio_or_zero(ERROR_RATE, REQUESTS, TMT)),
            Recording(CANCELLED, ratio_or_zero(CANCELLED_RATE, REQUESTS, TMT))]


def token_recording_rules(gateway: Selector, window: str) -> list[Recording]:
    """Tokens/s per tenant, model, tier and type (its own group: it shares no series with the request rules)."""
    return [Recording(TOKENS, f"sum by ({TMT_BY}, type) (rate({gateway('gateway_tokens_total')}[{window}]))")]


def slo_windows(spec: Spec) -> list[Duration]:
    """Every distinct long and short window of the burn-rate pairs, shortest first."""
    return sorted({w for pair in spec.layers.L3.burn_rate_windows for w in (pair.long, pair.short)})


def slo_recording_rules(spec: Spec) -> list[Recording]:
    """Per tier and SLO window: requests/s, the availability SLI's misses (error ratio) and the TTFT SLI's.

    Only the shortest window reads the gateway's series (rates per tier: requests, errors, streamed requests
    and those faster than the tier's TTFT target); every longer window averages those recorded per-tier rates
    over itself (`avg_over_time`, as SLO tooling such as Sloth records its long windows), so the 3-day window
    reads three days of a few recorded series, not three days of every tenant's and model's raw series. The
    average covers the window plus one short window at its start; ratios are ratios of the averaged rates."""
    gateway = spec.selectors.of("gateway")
    windows = slo_windows(spec)
    base = windows[0]
    at_base = {"slo_window": str(base)}
    if base == spec.prometheus.rate_window:
        # The per tenant, model and tier rates over the same window are recorded already (inferwatch-llm.rules
        # and inferwatch-llm-outcomes.rules, read as of their last evaluation): summing those reads 1/3 of the
        # series the counters would.
        requests = f"sum by (tier) ({REQUESTS})"
        errors = f"sum by (tier) ({ERROR_RATE})"
    else:
        requests = f"sum by (tier) (rate({gateway('gateway_requests_total')}[{base}]))"
        errors = f"sum by (tier) (rate({gateway('gateway_requests_total', ERRORS)}[{base}]))"
    # A tier with requests and no error series yet (the gateway creates one at the first error, a restart
    # drops it) has 0 errors/s, recorded: the long windows average this series over time, and a missing sample
    # would leave the error-free stretch out of the average, so the long window would read as high as the short.
    base_requests = f'{SLO_REQUESTS}{{slo_window="{base}"}}'
    errors = or_zero(errors, f"sum by (tier) ({base_requests})", ("tier",))
    rules = [Recording(SLO_REQUESTS, requests, at_base), Recording(SLO_ERROR_RATE, errors, at_base)]
    for tier_name, tier in spec.tiers.items():
        sel = f'tier="{tier_name}"'
        bucket = gateway("gateway_time_to_first_token_seconds_bucket", sel, le_matcher(tier.ttft_slo_seconds))
        count = gateway("gateway_time_to_first_token_seconds_count", sel)
        per_tier = {**at_base, "tier": tier_name}
        rules.append(Recording(SLO_TTFT_FAST, f"sum by (tier) (rate({bucket}[{base}]))", per_tier))
        rules.append(Recording(SLO_TTFT_COUNT, f"sum by (tier) (rate({count}[{base}]))", per_tier))

    def over(name: str, w: Duration) -> str:
        selected = f'{name}{{slo_window="{base}"}}'
        return selected if w == base else f"avg_over_time({selected}[{w}])"

    for w in windows:
        label = {"slo_window": str(w)}
        if w != base:
            rules.append(Recording(SLO_REQUESTS, f"sum by (tier) ({over(SLO_REQUESTS, w)})", label))
        total = f'sum by (tier) ({SLO_REQUESTS}{{slo_window="{w}"}})'
        rules.append(Recording(SLO_ERRORS, ratio_or_zero(f"sum by (tier) ({over(SLO_ERROR_RATE, w)})", total,
                                                          ("tier",)), label))
        fast = ratio(f"sum by (tier) ({over(SLO_TTFT_FAST, w)})", f"sum by (tier) ({over(SLO_TTFT_COUNT, w)})",
                     ("tier",))
        rules.append(Recording(SLO_TTFT, f"1 - (\n{indent(fast)}\n)", label))
    long_windows = sorted({pair.long for pair in spec.layers.L3.burn_rate_windows})
    scrape_s = spec.prometheus.scrape_interval.seconds
    # How much of each long window Prometheus has watched the gateway for, past the first shortest window:
    # the shortest window's rates over less than their own span are extrapolated from the first scrapes, so
    # the history starts counting once one whole shortest window is held (0 until then, 1 once the long
    # window is full).
    for w in (w for w in long_windows if w != base):
        scrapes = f"max by () (count_over_time({gateway('up')}[{w}]))"
        span = f"({scrapes} * {num(scrape_s)} - {num(base.seconds)}) / {num(w.seconds - base.seconds)}"
        rules.append(Recording(SLO_HISTORY, f"clamp_min(clamp_max({span}, 1), 0)", {"slo_window": str(w)}))
    return rules


def _threshold(factor: float, objective: float) -> str:
    return num(float(f"{factor * (1 - objective):.10g}"))


def burn_rate_alerts(spec: Spec) -> list[Alert]:
    l3 = spec.layers.L3
    base = slo_windows(spec)[0]
    alerts = []
    slos = (("LlmAvailabilityBurnRate", "availability", SLO_ERRORS, "availability_objective",
             "of requests failed"),
            ("LlmTtftBurnRate", "ttft", SLO_TTFT, "ttft_objective", "of streamed requests missed the TTFT target"))
    for alert, slo, series, objective_field, what in slos:
        for tier_name, tier in spec.tiers.items():
            objective = getattr(tier, objective_field)
            for pair in l3.burn_rate_windows:
                threshold = _threshold(pair.factor, objective)

                def sel(name: str, w: Duration, tier_name: str = tier_name) -> str:
                    return f'max without (slo_window) ({name}{{tier="{tier_name}", slo_window="{w}"}})'

                # The long window's misses counted against the requests of the whole window: a Prometheus
                # holding 5 minutes of a 1h window otherwise judges the hour by those 5 minutes, and a start-up
                # burst pages as if the budget of an hour had burnt. No gateway `up` (a store without it): the
                # history is unknown, the window judged as it is.
                # (Not `or on () vector(1)` for the unknown case: with several clusters in one store that
                # fallback has no cluster label, so it matches no cluster's series.)
                history = f'{SLO_HISTORY}{{slo_window="{pair.long}"}}'
                long = sel(series, pair.long)
                long_full = (f"(\n  {long} * on () group_left () {history} > {threshold}\n  or\n"
                             f"  {long} unless on () {history}\n)\nand on (tier)\n") if pair.long != base else ""
                expr = (f"{sel(series, pair.long)} > {threshold}\nand on (tier)\n{long_full}"
                        f"{sel(series, pair.short)} > {threshold}\nand on (tier)\n"
                        f"{sel(SLO_REQUESTS, pair.short)} > {num(l3.min_request_rate)}")
                target = (f", TTFT target {num(tier.ttft_slo_seconds)} s" if slo == "ttft" else "")
                description = (f"Tier {{{{ $labels.tier }}}}: {{{{ $value | humanizePercentage }}}} {what} over "
                               f"the last {pair.long} and more than {float(threshold) * 100:.4g}% over the last "
                               f"{pair.short}: {num(pair.factor)}x the error budget of the {objective * 100:.4g}% "
                               f"objective{target} ({pair.name}).")
                alerts.append(Alert(alert, expr, pair.for_, pair.severity, description,
                                    labels={"window": pair.name, "slo": slo, "tier": tier_name}))
    return alerts


def groups(spec: Spec) -> list[Group]:
    l3 = spec.layers.L3
    gateway = spec.selectors.of("gateway")
    window = str(spec.prometheus.rate_window)
    guard = f"and on ({TMT_BY})\n{REQUESTS} > {num(l3.min_request_rate)}"
    ttft_alerts = []
    for tier_name, tier in spec.tiers.items():
        # Each tier's guard reads that tier's request rates only.
        tier_requests = f'{REQUESTS}{{tier="{tier_name}"}}'
        if tier.per_tenant_quantiles:
            who = WHO
            judged = (f"{ttft_p95_over_target(spec, tier_name, TMT_BY, window)}\nand on ({TMT_BY})\n"
                      f"{tier_requests} > {num(l3.min_request_rate)}")
        else:
            who = "model {{ $labels.model }}, tier {{ $labels.tier }} (every tenant)"
            judged = (f"{ttft_p95_over_target(spec, tier_name, MT_BY, window)}\nand on ({MT_BY})\n"
                      f"sum by ({MT_BY}) ({tier_requests}) > {num(l3.min_request_rate)}")
        target = num(tier.ttft_p95_seconds)
        # The value is the exact share of first tokens within the target (no quantile estimate, and no query
        # in the description: annotations are expanded at every evaluation of every active alert, which in an
        # alert storm cost more than the rules themselves; benchmarks/rules_eval.py).
        ttft_alerts.append(Alert(
            "LlmTtftP95High", judged, l3.for_, "warning",
            f"Time to first token P95 for {who} is above the tier's target of {target} s: "
            f"{{{{ $value | humanizePercentage }}}} of first tokens came within {target} s over {window}, "
            f"95% must.", labels={"tier": tier_name}))
    base = f'{TOKENS}{{type="output"}}'
    offset = str(l3.throughput_baseline_offset)
    baseline = f"sum by (model, tier) ({base} offset {offset})"
    alerts = [
        # A model and tier whose series vanished (gateway restarted, no request since) produces 0 tokens/s,
        # the worst collapse: without `or 0 * baseline` the comparison would return nothing and never fire.
        Alert("LlmOutputThroughputCollapse",
              f"{or_zero(f'sum by (model, tier) ({base})', baseline, ('model', 'tier'))}\n"
              f"< {num(l3.throughput_collapse_ratio)} * {baseline}\nand on (model, tier)\n"
              f"{baseline} > {num(l3.throughput_min_tokens_per_second)}",
              l3.for_, "warning",
              f"Model {{{{ $labels.model }}}}, tier {{{{ $labels.tier }}}} produces {{{{ $value | printf \"%.3g\" }}}} "
              f"output tokens/s, under {l3.throughput_collapse_ratio:.0%} of what it produced {offset} earlier."),
        Alert("LlmCancellationRatioHigh", f"{CANCELLED} > {num(l3.cancellation_ratio)}\n{guard}", l3.for_,
              "warning",
              f"Clients cancel {{{{ $value | humanizePercentage }}}} of the requests of {WHO} over {window} "
              f"(threshold {l3.cancellation_ratio:.0%}): they give up waiting."),
        exporter_down("GatewayExporterDown", gateway, for_=l3.exporter_down_for, severity="warning",
                      what="the gateway exporter", has_targets=bool(spec.targets.gateways), cluster=spec.cluster),
    ]
    # Separate groups evaluate concurrently, so no group waits on another's heavy query. No quantile is recorded:
    # LlmTtftP95High judges its target from two buckets (ttft_p95_over_target), no
    # alert or runbook reads another quantile, and the dashboards draw TTFT and inter-token latency from the
    # histograms over their own range. Rating every bucket of every tenant, model and tier at each evaluation
    # was the costliest part of the rules (benchmarks/rules_eval.py).
    return [Group("inferwatch-llm.rules", recording_rules(gateway, window)),
            Group("inferwatch-llm-outcomes.rules", outcome_recording_rules(gateway, window)),
            Group("inferwatch-llm-ratios.rules", ratio_recording_rules()),
            Group("inferwatch-llm-tokens.rules", token_recording_rules(gateway, window)),
            Group("inferwatch-llm-slo.rules", slo_recording_rules(spec)),
            Group("inferwatch-llm-ttft.alerts", ttft_alerts),
            Group("inferwatch-llm.alerts", alerts),
            Group("inferwatch-llm-slo.alerts", burn_rate_alerts(spec))]
