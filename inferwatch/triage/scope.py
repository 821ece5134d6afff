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


def scoped(expr: str, labels: Mapping[str, str]) -> str:
    """`expr` with every placeholder replaced by the escaped label value, or `.*` when the label is absent."""
    def repl(m: re.Match) -> str:
        value = labels.get(m.group(1))
        return regex_literal(value) if value else ".*"
    return PLACEHOLDER.sub(repl, expr)
