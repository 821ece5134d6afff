"""L3 budget rules: what each tenant spent this period (from `gateway_cost_total`, priced by the spec's
`billing.prices`), the forecast to the period's end, and an alert per budget of `billing.budgets` when the
forecast exceeds it (LlmBudgetForecastExceeded) and when the spend has (LlmBudgetExceeded).

Spend since the start of a calendar period (UTC month or day) cannot be one `increase()`: a range is fixed, the
period's start moves. So the cost's increase over each evaluation step (STEP, the group's interval) is recorded
once per period index (month 1-12, day of month 1-31), each copy present only while its index is the current
one (`month()` / `day_of_month()`); the spend is the sum of the current index's samples over the longest
period (31 days, 1 day), which holds exactly this period's steps (the same index a year or a month earlier
is older than that span). When the period ends its copy stops, and the next index starts from 0: the
boundary needs no reset. The first step of a period holds up to STEP of the previous one's spend (the
increase over the step that crosses midnight); `increase` extrapolates each step over its edges, exact for
a steady spend, within a scrape interval's spend per step otherwise.

Forecast: the spend so far plus the cost rate over `billing.forecast_window` (a burn rate: currency per
second) times the seconds left in the period (`days_in_month()`, `day_of_month()`, `hour()`, `minute()`).
LlmBudgetForecastExceeded waits `layers.L3.for`, at least two steps (one sample never warns).
The alerts' value is a share of the budget (1 = all of it), recorded per budget with its amount written in (so
no join with a constant series is needed: it would lack the `cluster` label of a central store) and labelled
`budget` (`<tenant>-<model or all>-<period>`). Identity: `budget` (with `tenant`, `period`, `currency`, and
`model` for a per-model budget).
"""

from __future__ import annotations

from inferwatch.billing import active_budgets
from inferwatch.rules.builders import num
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.spec import Duration, Spec

STEP = Duration(5 * 60 * 1000)  # the budget group's interval: one increase per step
INCREASE = "tenant_model:gateway_cost:increase"
PERIOD_INCREASE = "tenant_model_period:gateway_cost:increase"
SPENT_MODEL = "tenant_model_period:gateway_cost:spent"
SPENT = "tenant_period:gateway_cost:spent"
RATE = "tenant_model:gateway_cost:forecast_rate"
FORECAST_MODEL = "tenant_model_period:gateway_cost:forecast"
FORECAST = "tenant_period:gateway_cost:forecast"
SPENT_RATIO = "budget:gateway_cost:spent_ratio"
FORECAST_RATIO = "budget:gateway_cost:forecast_ratio"
# Per period: the function naming its index, the indexes, the span holding one whole period, and the
# seconds left in it (scalars: no label matching, so a central store's cluster label never gets in the way).
PERIODS = {
    "month": ("month", range(1, 13), "31d",
              "(scalar(days_in_month()) - scalar(day_of_month()) + 1) * 86400 - scalar(hour()) * 3600"
              " - scalar(minute()) * 60"),
    "day": ("day_of_month", range(1, 32), "1d", "86400 - scalar(hour()) * 3600 - scalar(minute()) * 60"),
}
KEEP = "tenant, model, currency"


def recording_rules(spec: Spec) -> list[Recording]:
    gateway = spec.selectors.of("gateway")
    cost = gateway("gateway_cost_total")
    periods = sorted({b.period for b in active_budgets(spec)}, key=list(PERIODS).index)
    rules = [Recording(INCREASE, f"sum by ({KEEP}) (increase({cost}[{STEP}]))"),
             Recording(RATE, f"sum by ({KEEP}) (rate({cost}[{spec.billing.forecast_window}]))")]
    for period in periods:
        fn, indexes, _, _ = PERIODS[period]
        for i in indexes:
            # INCREASE where the period's index is i now, absent otherwise.
            rules.append(Recording(PERIOD_INCREASE, f"{INCREASE}\nand\n(0 * {INCREASE} + scalar({fn}())) == {i}",
                                   {"period": period, "period_index": str(i)}))
    for period in periods:
        _, _, span, left = PERIODS[period]
        current = f'{PERIOD_INCREASE}{{period="{period}"}}'
        rules.append(Recording(SPENT_MODEL, f"sum without (period_index) (\n  sum_over_time({current}[{span}])\n"
                                            f"  and\n  {current}\n)", {"period": period}))
        rules.append(Recording(FORECAST_MODEL, f'{SPENT_MODEL}{{period="{period}"}}\n+ ignoring (period)\n'
                                               f"{RATE} * ({left})", {"period": period}))
    if periods:
        rules.append(Recording(SPENT, f"sum without (model) ({SPENT_MODEL})"))
        rules.append(Recording(FORECAST, f"sum without (model) ({FORECAST_MODEL})"))
    return rules


def budget_id(budget) -> str:
    """The `budget` label of one budget's series and alerts: `<tenant>-<model or all>-<period>`."""
    return f"{budget.tenant}-{budget.model or 'all'}-{budget.period}"


def budget_rules(spec: Spec) -> list[Recording]:
    """Per budget, the spend and the forecast as shares of its amount (1 = all of it), labelled `budget`."""
    out = []
    for budget in active_budgets(spec):
        selector = f'tenant="{budget.tenant}", period="{budget.period}"'
        if budget.model:
            selector += f', model="{budget.model}"'
        spent = f"{SPENT_MODEL if budget.model else SPENT}{{{selector}}}"
        forecast = f"{FORECAST_MODEL if budget.model else FORECAST}{{{selector}}}"
        labels = {"budget": budget_id(budget)}
        out.append(Recording(SPENT_RATIO, f"{spent} / {num(budget.amount)}", labels))
        out.append(Recording(FORECAST_RATIO, f"{forecast} / {num(budget.amount)}", labels))
    return out


def alerts(spec: Spec) -> list[Alert]:
    billing = spec.billing
    what = "tenant {{ $labels.tenant }}{{ with $labels.model }} on model {{ . }}{{ end }}"
    return [
        Alert("LlmBudgetExceeded", f"{SPENT_RATIO} >= 1", Duration(0), "warning",
              f"The {what} has spent {{{{ $value | humanizePercentage }}}} of its {{{{ $labels.period }}}} budget "
              f"{{{{ $labels.budget }}}} ({{{{ $labels.currency }}}}, calendar {{{{ $labels.period }}}} in UTC)."),
        Alert("LlmBudgetForecastExceeded",
              f"{FORECAST_RATIO} > {num(billing.forecast_warning_ratio)}\nand\n{SPENT_RATIO} < 1",
              max(spec.layers.L3.for_, Duration(2 * STEP.ms)), "warning",
              f"At the cost rate of the last {billing.forecast_window}, {what} will spend "
              f"{{{{ $value | humanizePercentage }}}} of its {{{{ $labels.period }}}} budget {{{{ $labels.budget }}}} "
              f"({{{{ $labels.currency }}}}) by the end of the {{{{ $labels.period }}}} (UTC)."),
    ]


def groups(spec: Spec) -> list[Group]:
    if not active_budgets(spec):
        return []
    records: list[Recording | Alert] = [*recording_rules(spec), *budget_rules(spec)]
    return [Group("inferwatch-llm-budget.rules", records, interval=STEP),
            Group("inferwatch-llm-budget.alerts", list[Recording | Alert](alerts(spec)), interval=STEP)]
