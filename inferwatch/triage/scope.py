"""Scope a runbook query to one alert: replace `{{ $labels.x }}` with the alert's label value.

Values go into a PromQL regex matcher (`=~"..."`), so they are escaped twice: first as an RE2 literal,
then as a PromQL double-quoted string. A label the alert does not carry becomes `.*` (all series), so a
query written for a model still answers for an alert that names only a node.
"""

from __future__ import annotations

import re
from typing import Mapping

from inferwatch.triage.evidence import PLACEHOLDER

__all__ = ["scoped", "regex_literal"]

_RE2_SPECIAL = re.compile(r"([\\.^$*+?{}\[\]|()])")


def regex_literal(value: str) -> str:
    """`value` as an RE2 pattern matching exactly it, quoted for a PromQL double-quoted string."""
    pattern = _RE2_SPECIAL.sub(r"\\\1", value)
    return pattern.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_IN_NEGATIVE_MATCHER = re.compile(r'!~\s*"[^"]*$')


RATE_WINDOW = "$rate_window"  # stands for the spec's prometheus.rate_window, as in the generated rules
DEFAULT_RATE_WINDOW = "5m"


def scoped(expr: str, labels: Mapping[str, str], rate_window: str = DEFAULT_RATE_WINDOW) -> str:
    """`expr` with every placeholder replaced by the escaped label value, and `$rate_window` by the rules'
    rate window (so triage judges the same stretch of time the alert did). An absent label becomes `.*` in a
    `=~` matcher (all series) and the empty string in a `!~` matcher (excludes only series without it)."""
    expr = expr.replace(RATE_WINDOW, rate_window)
    def repl(m: re.Match) -> str:
        value = labels.get(m.group(1))
        if value:
            return regex_literal(value)
        return "" if _IN_NEGATIVE_MATCHER.search(expr[:m.start()]) else ".*"
    return PLACEHOLDER.sub(repl, expr)
