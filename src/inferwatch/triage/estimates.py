"""Quantiles are estimates: a value from `histogram_quantile` is an interpolation inside one histogram bucket,
so triage shows it with the bucket it lies in ("≈ 990 ms, a histogram estimate between 750 ms and 1.00 s"),
never as a measurement.

Prometheus's histogram_quantile finds the bucket holding the quantile's rank and interpolates linearly inside
it (prometheus/promql/quantile.go `bucketQuantile`): every request of a TTFT at ≥ 0.903 s in the 0.75–1.0 s
bucket reads as "P95 0.99 s". The bucket is read back from the same query: the histogram's own `le` edges of
the query's second argument, scaled as the query scales the quantile (`/ 1000` from milliseconds, `/ 1e6`).
"""

from __future__ import annotations

import math
import re

__all__ = ["split_quantile", "bucket_of", "estimate_text"]

_SCALE = re.compile(r"^\s*/\s*([0-9.eE+]+)\s*$")


def split_quantile(expr: str) -> tuple[str, float] | None:
    """(bucket expression, divisor) when `expr` is `histogram_quantile(q, <buckets>)` optionally divided by a
    number; None for any other expression (an `or` fallback, a summary's quantile label)."""
    text = expr.strip()
    if not text.startswith("histogram_quantile("):
        return None
    depth, comma, end = 0, None, None
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
        elif ch == "," and depth == 1 and comma is None:
            comma = i
    if comma is None or end is None:
        return None
    rest = text[end + 1:]
    divisor = 1.0
    if rest.strip():
        m = _SCALE.match(rest)
        if not m:
            return None
        divisor = float(m.group(1))
    return text[comma + 1:end].strip(), divisor


def bucket_of(value: float, edges: list[float]) -> tuple[float, float]:
    """(lower, upper) edges of the bucket `value` lies in; lower 0 below the first edge, upper inf above the
    last finite one. `edges`: the histogram's `le` values, any order, +Inf included or not."""
    finite = sorted(e for e in edges if not math.isinf(e))
    lower = 0.0
    for e in finite:
        if value <= e + 1e-12:
            return lower, e
        lower = e
    return lower, math.inf


def estimate_text(shown: str, lower: str, upper: str | None) -> str:
    """`≈ 990 ms, a histogram estimate between 750 ms and 1.00 s` (upper None: above the last edge)."""
    if upper is None:
        return f"≈ {shown}, a histogram estimate above the last bucket edge {lower}"
    return f"≈ {shown}, a histogram estimate between {lower} and {upper}"
