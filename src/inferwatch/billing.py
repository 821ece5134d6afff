"""Prices and budgets: the spec's `billing` section, and the cost of one request (docs/cost-and-budgets.md).

Token types and what each is a part of (the servers' own definitions, docs/sources.md#token-types):
- input: every prompt token. OpenAI `prompt_tokens` / Responses `input_tokens` include their cached tokens;
  Anthropic's `input_tokens` excludes them, so the gateway adds `cache_read_input_tokens` and
  `cache_creation_input_tokens` to it (protocol_messages.py): input is always the whole prompt.
- cached input (part of input): OpenAI `prompt_tokens_details.cached_tokens`, Responses
  `input_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`.
- cache-creation input (part of input): Anthropic `cache_creation_input_tokens` (OpenAI has no such field).
- output: every generated token; reasoning (part of output): `completion_tokens_details.reasoning_tokens`,
  Responses `output_tokens_details.reasoning_tokens` (both count inside the output total).

Cost of one request, in the spec's currency (prices are per million tokens, as providers publish them):

    ((input - cached - cache_creation) * price.input + cached * price.cached_input
     + cache_creation * price.cache_creation_input
     + (output - reasoning) * price.output + reasoning * price.reasoning) / 1e6

A part the server did not report is priced as the whole it belongs to (an unreported cached count is priced
as input: what the gateway cannot tell apart it bills at the full price, never below it). The cost is unknown
(None, no sample) when the input or output count is unknown, or when the model has no price; a `free` model
costs exactly 0.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from inferwatch.specload import Duration, SpecError, field

if TYPE_CHECKING:
    from inferwatch.spec import Spec

__all__ = ["Price", "Budget", "Billing", "request_cost", "validate_billing", "PERIODS"]

PER = 1_000_000  # prices are per million tokens
# Budget periods: calendar month and day in UTC, the window Prometheus' month()/day_of_month() read.
PERIODS = ("month", "day")
_CURRENCY = re.compile(r"[A-Z]{3}")  # ISO 4217 alphabetic code


@dataclasses.dataclass
class Price:
    """One model's prices per million tokens, in `billing.currency`; `free: true` instead for a model that
    costs nothing (an internal model). `cached_input` and `cache_creation_input` default to `input`,
    `reasoning` to `output` (OpenAI bills reasoning tokens as output tokens)."""

    free: bool = field(False, doc="the model costs nothing (then give no prices)")
    input: float | None = field(None, doc="currency units per 1,000,000 uncached input (prompt) tokens")
    cached_input: float | None = field(None, doc="currency units per 1,000,000 input tokens read from the prompt "
                                                 "cache; unset: the input price")
    cache_creation_input: float | None = field(None, doc="currency units per 1,000,000 input tokens written to "
                                                         "the prompt cache (Anthropic); unset: the input price")
    output: float | None = field(None, doc="currency units per 1,000,000 output tokens that are not reasoning")
    reasoning: float | None = field(None, doc="currency units per 1,000,000 reasoning tokens; unset: the output "
                                              "price")

    def _validate(self, path: str) -> None:
        given = [n for n in ("input", "cached_input", "cache_creation_input", "output", "reasoning")
                 if getattr(self, n) is not None]
        if self.free:
            if given:
                raise SpecError(f"{path}.{given[0]}", "a free model has no prices (drop free: true or the prices)")
            return
        for name in ("input", "output"):
            if getattr(self, name) is None:
                raise SpecError(f"{path}.{name}", "expected a price per million tokens (or free: true)")
        for name in given:
            value = getattr(self, name)
            if not value >= 0 or value == float("inf"):
                raise SpecError(f"{path}.{name}", f"expected a price >= 0 per million tokens, got {value}")

    def rates(self) -> tuple[float, float, float, float, float]:
        """(input, cached_input, cache_creation_input, output, reasoning) per token; zeros when free."""
        if self.free:
            return (0.0,) * 5
        inp = float(self.input or 0.0)
        out = float(self.output or 0.0)
        return (inp / PER,
                (inp if self.cached_input is None else self.cached_input) / PER,
                (inp if self.cache_creation_input is None else self.cache_creation_input) / PER,
                out / PER,
                (out if self.reasoning is None else self.reasoning) / PER)


@dataclasses.dataclass
class Budget:
    """A tenant's spending limit per period (optionally for one model), in `billing.currency`."""

    tenant: str = field(doc="a declared tenant (`tenants`)")
    amount: float = field(doc="currency units the tenant may spend per period; > 0")
    period: str = field("month", doc="month or day, calendar periods in UTC")
    model: str = field("", doc="a declared model the budget is for; empty: all the tenant's models together")

    def _validate(self, path: str) -> None:
        if self.period not in PERIODS:
            raise SpecError(f"{path}.period", f"expected one of {', '.join(PERIODS)}, got {self.period!r}")
        if not self.amount > 0 or self.amount == float("inf"):
            raise SpecError(f"{path}.amount", f"expected an amount > 0, got {self.amount}")


@dataclasses.dataclass
class Billing:
    """Prices per model (the gateway's cost counters and usage log) and budgets per tenant (L3 alerts)."""

    currency: str = field("USD", doc="ISO 4217 code of every price and budget (the currency label of "
                                     "gateway_cost_total)")
    prices: dict[str, Price] = field({}, doc="model -> prices per million tokens, or free: true; when any is "
                                             "given, every declared model should be priced or free (check warns; "
                                             "an unpriced model's cost is unknown; key `other` prices the "
                                             "undeclared models)")
    budgets: list[Budget] = field([], doc="per-tenant (optionally per-model) budgets per month or day; one "
                                         "naming an undeclared tenant or model is left out (check warns)")
    forecast_warning_ratio: float = field(1.0, doc="LlmBudgetForecastExceeded fires when the spend so far plus "
                                                   "forecast_window's cost rate until the period ends exceeds "
                                                   "this fraction of the budget")
    forecast_window: Duration = field(Duration(6 * 3600 * 1000), doc="the cost rate the forecast extrapolates "
                                                                     "(a burn rate, currency per second)")

    def _validate(self, path: str) -> None:
        if not _CURRENCY.fullmatch(self.currency):
            raise SpecError(f"{path}.currency", f"expected an ISO 4217 code such as USD, got {self.currency!r}")
        if not 5 * 60 * 1000 <= self.forecast_window.ms <= 7 * 86400 * 1000:
            raise SpecError(f"{path}.forecast_window", f"expected 5m to 7d, got {self.forecast_window}")
        if not 0 < self.forecast_warning_ratio <= 10:
            raise SpecError(f"{path}.forecast_warning_ratio",
                            f"expected a ratio above 0 and at most 10, got {self.forecast_warning_ratio}")

    @property
    def enabled(self) -> bool:
        return bool(self.prices)


def _budget_applies(spec: "Spec", budget: Budget) -> bool:
    return budget.tenant in spec.tenants and (not budget.model or budget.model in spec.models)


def active_budgets(spec: "Spec") -> list[Budget]:
    """The budgets the rules judge: those naming a declared tenant (and model). One naming anything else is
    left out and warned by `inferwatch check` (findings), so a spec derived from another by dropping a tenant
    or model stays valid."""
    return [b for b in spec.billing.budgets if _budget_applies(spec, b)]


def findings(spec: "Spec") -> list[str]:
    """Warning lines (no prefix) for `inferwatch check`: prices of undeclared models (never used: undeclared
    models are metered as `other`), declared models without a price (their cost is unknown, counted in
    gateway_cost_unknown_requests_total{reason="no_price"}), budgets left out (active_budgets)."""
    from inferwatch.spec import OTHER

    billing, out = spec.billing, []
    if billing.prices:
        for model in billing.prices:
            if model not in spec.models and model != OTHER:
                out.append(f"billing.prices.{model}: not a declared model (declared: "
                           f"{', '.join(spec.models) or 'none'}); its prices are never used")
        for model in spec.models:
            if model not in billing.prices:
                out.append(f"billing.prices: model {model!r} has no price: its cost is unknown; give its prices "
                           f"or free: true")
    for i, budget in enumerate(billing.budgets):
        if budget.tenant not in spec.tenants:
            out.append(f"billing.budgets[{i}].tenant: {budget.tenant!r} is not a declared tenant (declared: "
                       f"{', '.join(spec.tenants) or 'none'}); the budget is left out")
        elif budget.model and budget.model not in spec.models:
            out.append(f"billing.budgets[{i}].model: {budget.model!r} is not a declared model (declared: "
                       f"{', '.join(spec.models) or 'none'}); the budget is left out")
    return out


def validate_billing(spec: "Spec") -> None:
    """Cross-section checks: budgets need prices, one budget per (tenant, model, period). Raises SpecError.
    Names that do not match the spec's tenants and models are warnings (findings), not errors."""
    billing = spec.billing
    if billing.budgets and not billing.prices:
        raise SpecError("billing.budgets", "budgets need billing.prices (a cost to compare them with)")
    seen = set()
    for i, budget in enumerate(billing.budgets):
        key = (budget.tenant, budget.model, budget.period)
        if key in seen:
            which = f" model {budget.model!r}" if budget.model else ""
            raise SpecError(f"billing.budgets[{i}]",
                            f"a second {budget.period} budget for tenant {budget.tenant!r}{which}")
        seen.add(key)


def request_cost(rates: tuple[float, float, float, float, float], inputs: int | None, outputs: int | None,
                 details) -> float | None:
    """The cost of one request (module docstring) from Price.rates(), its input and output counts and its token
    types `details` ([cached, cache_creation, reasoning] or None when none was reported). None when a count is
    unknown. Parts larger than their whole are refused before they get here (protocols check them)."""
    if inputs is None or outputs is None:
        return None
    r_in, r_cached, r_write, r_out, r_reason = rates
    if details is None:
        return inputs * r_in + outputs * r_out
    cached = details[0] or 0
    write = details[1] or 0
    reasoning = details[2] or 0
    return ((inputs - cached - write) * r_in + cached * r_cached + write * r_write
            + (outputs - reasoning) * r_out + reasoning * r_reason)
