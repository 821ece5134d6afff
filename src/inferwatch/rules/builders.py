"""Small builders for the shapes that repeat across areas: exporter down, value over a per-model threshold,
a minimum-traffic guard, bucket-edge matchers, burn-rate pairs.

All functions return PromQL text or rule objects; none reads the spec beyond the arguments it is given.
"""

from __future__ import annotations

import re

from inferwatch.rules.identity import TRITON
from inferwatch.rules.model import Alert
from inferwatch.selectors import Selector
from inferwatch.spec import ClusterSettings, Duration

# A model version on one Triton replica (rules/identity.py: `pod` tells replicas behind one Service apart).
MODEL_VERSION = TRITON + ("model", "version")


def by(labels: tuple[str, ...] | list[str]) -> str:
    return ", ".join(labels)


def num(value: float) -> str:
    """A threshold as PromQL reads it: 0.5, 85, 1e-05 (never 85.0, so rules read like hand-written ones)."""
    return repr(float(value)).removesuffix(".0") if float(value).is_integer() else repr(float(value))


def regex_alternation(values: list[str] | list[int]) -> str:
    """`a|b|c` for a =~ matcher, each value escaped (RE2 is fully anchored in label matchers)."""
    return "|".join(re.sub(r"([.+*?()|\[\]{}^$\\])", r"\\\\\1", str(v)) for v in values)


def le_matcher(edge: float) -> str:
    """Matcher for the histogram bucket whose upper bound is `edge`.

    Python's prometheus_client writes `le="1.0"` and Go clients `le="1"`; Prometheus 2.x stores the text as
    scraped (3.x normalises it), so integral edges match both spellings.
    """
    if float(edge).is_integer():
        whole = str(int(edge))
        return f'le=~"{whole}|{whole}[.]0"'
    return f'le="{float(edge)!r}"'


def absent_targets(selector: Selector, cluster: ClusterSettings | None = None) -> str:
    """No target of `selector` is scraped: `absent(up{...})`, which keeps the selector's `=` labels (e.g.
    `job`). With several clusters (`cluster` enabled) a central store holds every cluster's `up`, so absent()
    would wait for the source to vanish from all of them: a cluster whose `up{...}` reported within
    `cluster.lookback` and no longer does is named by its own series (labels: the cluster and the selector's
    `=` labels), and absent() fires only for a source seen nowhere in that lookback. In a Prometheus of one
    cluster (no cluster label on its series) both branches carry the same labels: one alert, never two."""
    up = selector("up")
    if cluster is None or not cluster.enabled:
        return f"absent({up})"
    kept = list(selector.labels)
    seen = f"max_over_time({up}[{cluster.lookback}])"
    return (f"absent({up})\nunless ignoring ({by(kept)})\ngroup({seen})\nor\n"
            f"group by ({by([cluster.label, *kept])}) ({seen})\nunless on ({cluster.label})\n"
            f"group by ({cluster.label}) ({up})")


def exporter_down(alert: str, selector: Selector, *, for_: Duration, severity: str, what: str, has_targets: bool,
                  labels: dict[str, str] | None = None, cluster: ClusterSettings | None = None) -> Alert:
    """`up == 0` for every target `selector` (the source's, spec `selectors`) picks, plus `absent_targets`
    when the spec lists targets for it, so a source whose targets vanished from service discovery is not
    silently healthy."""
    up = selector("up")
    expr = f"{up} == 0"
    if has_targets:
        expr += f"\nor\n{absent_targets(selector, cluster)}"
    description = (f"Prometheus cannot scrape {what} {{{{ with $labels.instance }}}}at {{{{ . }}}} {{{{ end }}}}"
                   f"({_go_template_text(selector.describe())}"
                   f"{{{{ with $labels.node }}}}, node {{{{ . }}}}{{{{ end }}}}): "
                   f"its alerts cannot fire while it is down.")
    return Alert(alert, expr, for_, severity, description, labels=dict(labels or {}))


def _go_template_text(text: str) -> str:
    """Literal text inside an annotation (a Go template): `{{` would open an action, so it is written as one."""
    return text.replace("{{", '{{ "{{" }}')


def over_threshold_by_model(selector, default: float, overrides: dict[str, float], op: str = ">") -> str:
    """`selector op threshold`, with a per-model threshold for each model in `overrides` and the default for
    every other model. `selector` is a metric name, or a function from a matcher text (`{model="x"}` or "")
    to an expression, for thresholds on an aggregation."""

    def sel(extra: str) -> str:
        if callable(selector):
            return selector(f"{{{extra}}}" if extra else "")
        return f"{selector}{{{extra}}}" if extra else selector

    if not overrides:
        return f"{sel('')} {op} {num(default)}"
    names = sorted(overrides)
    parts = [f'({sel(f"model!~{chr(34)}{regex_alternation(names)}{chr(34)}")} {op} {num(default)})']
    for model in names:
        parts.append(f'({sel(f"model={chr(34)}{model}{chr(34)}")} {op} {num(overrides[model])})')
    return "\nor\n".join(parts)


def ratio(numerator: str, denominator: str, on: tuple[str, ...] | list[str] | None = None) -> str:
    """`numerator / denominator` only where the denominator is above 0.

    A ratio or mean over a window with no event in it (no request, no execution) is 0/0 = NaN in PromQL;
    recorded, NaN draws as a gap or a zero and compares false with every threshold. Filtering the denominator
    with `> 0` records no sample instead: unknown is absent, not a number. `on` lists the labels both sides
    match on (omit it when both sides carry the same labels).
    """
    matching = f" on ({by(on)})" if on else ""
    return f"{numerator}\n/{matching}\n({denominator} > 0)"


def or_zero(expr: str, like: str, on: tuple[str, ...] | list[str]) -> str:
    """`expr`, or 0 for each series of `like` that `expr` lacks: a count with no event yet (no error series
    at all) is 0, and a current value that vanished (a restarted exporter) is 0 against its baseline."""
    return f"(\n{indent(expr)}\n  or on ({by(on)})\n  0 * {like}\n)"


def ratio_or_zero(numerator: str, denominator: str, on: tuple[str, ...] | list[str]) -> str:
    """`ratio` whose numerator is 0 where it has no series: without any error series the ratio is 0, not
    absent; without any event in the window (denominator 0) it is unknown, so no sample (never NaN)."""
    return ratio(or_zero(numerator, denominator, on), denominator, on)


def known(expr: str) -> str:
    """`expr` without NaN samples (NaN compares false, so `>= 0` keeps every real non-negative value):
    histogram_quantile() over a window without observations, a summary quantile without requests."""
    return f"({expr}) >= 0"


def with_min_rate(expr: str, rate_selector: str, minimum: float, on: tuple[str, ...]) -> str:
    """Keep `expr`'s series only where `rate_selector` exceeds `minimum` (the low-traffic guard: a ratio of
    2 errors in 3 requests is not an outage)."""
    return f"(\n{indent(expr)}\n)\nand on ({by(on)})\n{rate_selector} > {num(minimum)}"


def indent(text: str, spaces: int = 2) -> str:
    return "\n".join(" " * spaces + line if line else line for line in text.splitlines())
