"""The exact share as the headline: where a condition compares a histogram quantile with a target that is one
of the histogram's bucket edges, the share of observations within the target is known exactly (the bucket's
cumulative count over the total), so triage leads with it ("91.2 % of observations within 0.3 s, the P95
target needs 95 %") and shows the quantile only as the estimate it is (inferwatch.triage.estimates).

It is also what the alert rule measures: LlmTtftP95High fires on the share of first tokens within the tier's
target (`rate(..._bucket{le="<target>"}) / rate(..._bucket{le="+Inf"}) < 0.95`, rules/llm.py), never on
an interpolated P95. The share is read from the quantile query's own bucket expression (`sum by (le)
(rate(X_bucket{...}[w]))`), at the bucket whose `le` equals the target (scaled as the query scales the
quantile: `/ 1000` from milliseconds). A target between two edges has no exact share (None): only the
estimate is shown then. A histogram with no observation in the window has none either (unknown, not 0 %).
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = ["ExactShare", "quantile_of", "compared_with", "exact_share", "share_text"]

_QUANTILE = re.compile(r"^\s*histogram_quantile\(\s*([0-9.eE+-]+)\s*,")
_REL_TOL = 1e-9   # an `le` edge equals the target when they agree to this relative tolerance


@dataclasses.dataclass(frozen=True)
class ExactShare:
    """`share` (0-1) of the observations of query `query` at or below `threshold` (the spec value named
    `threshold_name`, in the query's unit), against the `quantile` (0-1) the condition compares with it."""

    query: str
    threshold_name: str
    threshold: float
    quantile: float
    share: float


def quantile_of(expr: str) -> float | None:
    """q of `histogram_quantile(q, ...)`, None for any other expression or q outside [0, 1]."""
    m = _QUANTILE.match(expr)
    if not m:
        return None
    try:
        q = float(m.group(1))
    except ValueError:
        return None
    return q if 0 <= q <= 1 else None


def compared_with(when: str, query: str, thresholds: list[str]) -> str | None:
    """The threshold name `query` is compared with in the condition text `when` (`query > name`, `query >= name`,
    `name < query`, `name <= query`: over the target), or None."""
    for name in thresholds:
        q, t = re.escape(query), re.escape(name)
        if re.search(rf"\b{q}\s*>=?\s*{t}\b", when) or re.search(rf"\b{t}\s*<=?\s*{q}\b", when):
            return name
    return None


def exact_share(buckets: list[tuple[dict, float]], threshold: float, divisor: float = 1.0) -> float | None:
    """The share of observations at or below `threshold` from one histogram's cumulative bucket rates
    (`buckets`: (labels with `le`, value) per bucket, as `sum by (le) (rate(X_bucket[w]))` returns them).
    `divisor`: what the quantile query divides by (1000 for a histogram in milliseconds read in seconds), so
    the edge sought is threshold x divisor. None when no `le` equals it, or no +Inf bucket, or the total is
    0 or not a number (no observation: unknown)."""
    edge = threshold * divisor
    at_edge, total = None, None
    for labels, value in buckets:
        le = labels.get("le")
        try:
            bound = float(le) if le is not None else None
        except ValueError:
            continue
        if bound is None:
            continue
        if math.isinf(bound):
            total = value
        elif math.isclose(bound, edge, rel_tol=_REL_TOL, abs_tol=1e-12):
            at_edge = value
    if at_edge is None or total is None or math.isnan(total) or total <= 0 or math.isnan(at_edge):
        return None
    return min(1.0, max(0.0, at_edge / total))


def share_text(share: float, threshold_shown: str, quantile: float) -> str:
    """`91.2 % of observations within 300 ms (exact, from the histogram's bucket at 300 ms); the P95 target
    needs 95 %` — one decimal, never rounded up to the quantile it misses (94.96 % reads 94.9 %)."""
    pct = math.floor(share * 1000 + 1e-9) / 10
    needs = f"{quantile * 100:g}"
    return (f"{pct:.1f} % of observations within {threshold_shown} (exact, from the histogram's bucket at "
            f"{threshold_shown}); the P{needs} target needs {needs} %")
