"""Spec values a runbook page names: the alert rule's thresholds and windows, read from the same spec the
rules are generated from, so triage judges the alert's condition with the threshold the rule uses.

A path is dot-separated: a field of a spec section (`for` is the field `for_`), a key of a mapping, or for a
list of named entries (`layers.L3.burn_rate_windows`) the entry whose `name` is the segment. `{label}` in a
segment is the alert's label value. `a | b` takes the first path that resolves to a set value (a per-model
override, then the layer default):

    layers.L2.models.{model}.queue_p95_seconds | layers.L2.queue_p95_seconds

Built-in names every page may use: `rate_window` (prometheus.rate_window, the rules' rate() window) and
`fault_time` (unix seconds of the fault: the alert's startsAt, else --at, else now). In queries only, each
source's selector (spec `selectors`): `$gpu_selector`, `$triton_selector`, `$triton_collector_selector`,
`$gateway_selector`, `$notifier_selector`, written inside a metric's braces (`DCGM_FI_DEV_GPU_TEMP{$gpu_selector,
UUID=~"..."}`) and replaced by the selector's matchers (`job="inferwatch-gpu"`).

In a condition a value is a number (a duration in seconds); in a query `$name` is replaced by its PromQL
form (a duration as `5m`, a number as `0.5`, a list as an RE2 alternation `48|63|64` for a `=~` matcher).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from inferwatch.rules.builders import num, regex_alternation
from inferwatch.selectors import SOURCES
from inferwatch.spec import Duration, Spec

__all__ = ["BUILTINS", "SELECTOR_PARAMS", "Threshold", "resolve", "query_form", "condition_value", "QUERY_PARAM",
           "selector_params"]

BUILTINS = ("rate_window", "fault_time")
# Query-only parameters: source -> `$<source>_selector` (inferwatch.selectors.SOURCES).
SELECTOR_PARAMS = {source: f"{source}_selector" for source in SOURCES}
QUERY_PARAM = re.compile(r"\$(?!labels\b)([a-z][a-z0-9_]*)")  # not {{ $labels.x }}
_LABEL = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclasses.dataclass(frozen=True)
class Threshold:
    """A resolved spec value. `value` is None when the path does not resolve; `reason` then says why."""

    name: str
    path: str
    value: Any = None
    reason: str | None = None


def resolve(name: str, path: str, spec: Spec, labels: Mapping[str, str]) -> Threshold:
    """Resolve `path` (see the module doc) against `spec` with the alert's `labels`. Never raises."""
    reasons = []
    for alternative in (p.strip() for p in path.split("|")):
        value, reason = _walk(alternative, spec, labels)
        if value is not None:
            return Threshold(name, path, value)
        reasons.append(reason)
    return Threshold(name, path, None, reasons[-1])


def builtin(name: str, spec: Spec, fault_time: float) -> Threshold:
    if name == "rate_window":
        return Threshold(name, "prometheus.rate_window", spec.prometheus.rate_window)
    return Threshold(name, "fault time", fault_time)


def _walk(path: str, spec: Spec, labels: Mapping[str, str]) -> tuple[Any, str | None]:
    node: Any = spec
    walked = []
    for segment in path.split("."):
        missing = [m for m in _LABEL.findall(segment) if not labels.get(m)]
        if missing:
            return None, f"the alert has no `{missing[0]}` label"
        segment = _LABEL.sub(lambda m: labels[m.group(1)], segment)
        walked.append(segment)
        node = _child(node, segment)
        if node is None:
            return None, f"the spec sets no {'.'.join(walked)}"
    return node, None


def _child(node: Any, segment: str) -> Any:
    if isinstance(node, Mapping):
        return node.get(segment)
    if isinstance(node, list):
        return next((e for e in node if getattr(e, "name", None) == segment), None)
    if dataclasses.is_dataclass(node):
        for attr in (segment, f"{segment}_"):
            if attr in {f.name for f in dataclasses.fields(node)}:
                return getattr(node, attr)
    return None


def selector_params(spec: Spec) -> dict[str, str]:
    """`<source>_selector` -> the spec's selector text for that source (the matchers inside a metric's braces)."""
    return {param: str(spec.selectors.of(source)) for source, param in SELECTOR_PARAMS.items()}


def condition_value(value: Any) -> float | None:
    """A threshold as a condition reads it: numbers as floats, durations in seconds; lists are not numbers."""
    if isinstance(value, Duration):
        return value.seconds
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def query_form(value: Any) -> str:
    """A threshold as PromQL text: `5m`, `0.5`, `48|63|64` (escaped for a =~ matcher), unix seconds."""
    if isinstance(value, Duration):
        return str(value)
    if isinstance(value, (list, tuple)):
        return regex_alternation(list(value))
    if isinstance(value, float) and value > 1e9:  # a unix time (fault_time): millisecond precision
        return f"{value:.3f}"
    return num(value)
