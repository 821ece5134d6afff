"""Scope a runbook query to one alert: replace `{{ $labels.x }}` with the alert's label value and `$name`
with a threshold, a built-in or a source's selector in its PromQL form (inferwatch.triage.thresholds).

Values go into a PromQL regex matcher (`=~"..."`), so they are escaped twice: first as an RE2 literal,
then as a PromQL double-quoted string. A label the alert does not carry becomes `.*` (all series), so a
query written for a model still answers for an alert that names only a node.

An alert carrying the cluster label (spec `cluster.label`) scopes every vector selector of the query to its
cluster with `cluster=~"(<name>)?"`: on a central store (every series labelled) that is the alert's cluster
only; on a Prometheus of one cluster (its series unlabelled, the label added to alerts on the way out) it is
every series, as before.
"""

from __future__ import annotations

import re
from typing import Mapping

from inferwatch.rules.cluster import select
from inferwatch.spec import Spec
from inferwatch.triage.evidence import PLACEHOLDER
from inferwatch.triage.thresholds import QUERY_PARAM, selector_params

__all__ = ["scoped", "regex_literal", "DEFAULT_RATE_WINDOW"]

_RE2_SPECIAL = re.compile(r"([\\.^$*+?{}\[\]|()])")
_IN_NEGATIVE_MATCHER = re.compile(r'!~\s*"[^"]*$')
DEFAULT_RATE_WINDOW = "5m"
DEFAULT_SELECTORS = selector_params(Spec())


def regex_literal(value: str) -> str:
    """`value` as an RE2 pattern matching exactly it, quoted for a PromQL double-quoted string."""
    pattern = _RE2_SPECIAL.sub(r"\\\1", value)
    return pattern.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def scoped(expr: str, labels: Mapping[str, str], params: Mapping[str, str] | None = None,
           cluster_label: str | None = None) -> str:
    """`expr` with every label placeholder replaced by the escaped label value and every `$name` by
    `params[name]` (PromQL text; `$rate_window` defaults to 5m, `$<source>_selector` to the default selectors).
    An absent label becomes `.*` in a `=~` matcher (all series) and the empty string in a `!~` matcher
    (excludes only series without it).
    With `cluster_label` and an alert carrying it, every vector selector is scoped to that cluster (module doc).
    Raises KeyError for a `$name` not in `params`: resolve thresholds before scoping."""
    params = {"rate_window": DEFAULT_RATE_WINDOW, **DEFAULT_SELECTORS, **(params or {})}
    expr = QUERY_PARAM.sub(lambda m: params[m.group(1)], expr)

    def repl(m: re.Match) -> str:
        value = labels.get(m.group(1))
        if value:
            return regex_literal(value)
        return "" if _IN_NEGATIVE_MATCHER.search(expr[:m.start()]) else ".*"
    expr = PLACEHOLDER.sub(repl, expr)
    cluster = labels.get(cluster_label) if cluster_label else None
    return select(expr, f'{cluster_label}=~"({regex_literal(cluster)})?"') if cluster else expr
