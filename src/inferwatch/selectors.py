"""PromQL label selectors, one per source, in the manner of a monitoring mixin's config: the spec's `selectors`
section says how this Prometheus tells each source's series apart (`job="inferwatch-gpu"` by default,
`job="nvidia-dcgm-exporter"` or `namespace="triton", service="triton-metrics"` where the Prometheus Operator
names the jobs). Every rule, recording rule, dashboard query, runbook evidence query and triage query selects
a source's series through `Selector`, the one place a source's selector becomes matchers; the generated
scrape configuration and the Kubernetes monitors write the labels a selector's `=` matchers ask for.

A selector is the text between the braces of a PromQL vector selector: comma-separated matchers
`name op "value"` with op `=`, `!=`, `=~` or `!~` and a PromQL string (double- or single-quoted with Go
escapes, or a backtick raw string), e.g. `job="triton"` or `namespace="triton", service=~"triton-.*"`.
Regular expressions are anchored at both ends, as in Prometheus.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Mapping

__all__ = ["SOURCES", "DEFAULT_JOBS", "DEFAULT_SELECTORS", "METRIC_PREFIXES", "SCRAPE_SERIES", "source_of",
           "Matcher", "Selector", "SelectorError", "parse", "default_selector", "go_string", "label_arg"]

# source -> what it is (spec field names and docs).
SOURCES = {
    "gpu": "GPU exporter (inferwatch's or dcgm-exporter)",
    "triton": "Triton's own /metrics",
    "triton_collector": "inferwatch Triton collector",
    "gateway": "gateway exporter",
    "notifier": "notifier",
    "alertmanager": "Alertmanager peers (the alerting path watching itself)",
    "prometheus": "Prometheus replicas (their own /metrics)",
    "prometheus_alerts": "Prometheus replicas' firing alerts, read from each one's /federate (HA)",
    "engine": "LLM engines' own families (TensorRT-LLM and vLLM backends on Triton's /metrics, a vLLM server)",
    "victoriametrics": "the central store, single-node VictoriaMetrics (its own /metrics)",
    "vmagent": "the edge vmagent writing to the central store (its own /metrics)",
    "vmalert": "vmalert evaluating the rules on the central store (its own /metrics)",
}
# The jobs of the generated Prometheus configuration: the selectors' defaults.
DEFAULT_JOBS = {
    "gpu": "inferwatch-gpu",
    "triton": "triton",
    "triton_collector": "inferwatch-triton",
    "gateway": "inferwatch-gateway",
    "notifier": "inferwatch-notifier",
    "alertmanager": "inferwatch-alertmanager",
    "prometheus": "inferwatch-prometheus",
    "prometheus_alerts": "inferwatch-prometheus-alerts",
    "victoriametrics": "inferwatch-victoriametrics",
    "vmagent": "inferwatch-vmagent",
    "vmalert": "inferwatch-vmalert",
}
# source -> name prefixes of the series it exposes (dcgm-exporter's DCGM_FI_*/DCGM_EXP_* included).
METRIC_PREFIXES = {
    "gpu": ("DCGM_", "inferwatch_gpu_"),
    "triton": ("nv_",),
    "triton_collector": ("inferwatch_triton_",),
    "gateway": ("gateway_",),
    "notifier": ("inferwatch_notifier_",),
    "alertmanager": ("alertmanager_",),
    "prometheus": ("prometheus_",),
    "prometheus_alerts": (),  # ALERTS, Prometheus' own series, with a `replica` label
    # TensorRT-LLM backend's nv_trt_llm_* (longer than Triton's nv_: source_of takes the longest prefix),
    # vLLM's vllm:* (a vLLM server, or Triton's vLLM backend re-exporting them).
    "engine": ("nv_trt_llm_", "vllm:"),
    # vmagent's persistent queue shares the vm_ prefix of VictoriaMetrics: listed first, so it is vmagent's.
    "vmagent": ("vmagent_", "vm_persistentqueue_"),
    "vmalert": ("vmalert_",),
    "victoriametrics": ("vm_",),
}
# Sources without a job of their own: their default selector, where the job default does not apply.
# `engine`: the engines' families come from Triton's :8002 (job `triton`, or the Prometheus Operator's job
# named after Triton's Service, `triton-...`) or from a vLLM server scraped under its own job (the Prometheus
# Operator names it after the Service, `vllm-...`); the family names (METRIC_PREFIXES) tell them apart.
DEFAULT_SELECTORS = {
    "engine": 'job=~"triton.*|vllm.*"',
}
# Series Prometheus writes for every target (`up`, `scrape_duration_seconds` ...): any source's selector.
SCRAPE_SERIES = ("up", "scrape_")
OPS = ("=~", "!~", "!=", "=")  # longest first: `=~` before `=`

_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SPACE = re.compile(r"\s*")
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
                   "'": "'", '"': '"'}


class SelectorError(ValueError):
    """A selector text that is not a PromQL matcher list; the message says where and what was expected."""


def source_of(metric: str) -> str | None:
    """The source whose series `metric` is (by name prefix), or None for a recorded series, Prometheus' own
    (`up`, `scrape_*`, `ALERTS`) or an unknown name."""
    found = [(len(prefix), source) for source, prefixes in METRIC_PREFIXES.items() for prefix in prefixes
             if metric.startswith(prefix)]
    return max(found)[1] if found else None


def default_selector(source: str) -> str:
    """The selector of `source` where the spec gives none: DEFAULT_SELECTORS, else its generated job."""
    return DEFAULT_SELECTORS.get(source) or f'job="{DEFAULT_JOBS[source]}"'


def label_arg(name: str) -> str:
    """An alert's label `name` as a Go-template argument (`(index $labels "name")`), "" where the alert lacks
    it. `$labels.name` on a missing label is nil, not "": Prometheus renders with `missingkey=zero`, vmalert
    before 1.90 does not (its changelog: `missingkey=zero` from 1.90), so a `printf "...%q..." $labels.pod |
    query` there runs `pod=%!q(<nil>)`, the query fails and vmalert drops the whole alert (vmalert fails a rule
    on any template error, where Prometheus writes the error into the annotation). `index` of a missing map
    key is the element type's zero value in every Go version, so both engines get ""."""
    return f'(index $labels "{go_string(name)}")'


def go_string(value: str) -> str:
    """`value` as the body of a PromQL (Go) double-quoted string: backslash, quote and control characters
    escaped."""
    out = []
    for ch in value:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class Matcher:
    """One label matcher. `op` is `=`, `!=`, `=~` or `!~`; `value` is the unescaped string."""

    name: str
    op: str
    value: str

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{go_string(self.value)}"'

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a series with `labels` satisfies this matcher (a missing label reads as "")."""
        have = labels.get(self.name, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        found = re.fullmatch(self.value, have) is not None
        return found if self.op == "=~" else not found

    @property
    def matches_empty(self) -> bool:
        return self.matches({})


@dataclasses.dataclass(frozen=True)
class Selector:
    """A source's matchers. `str()` is the text inside a vector selector's braces; calling it writes a
    selector for one metric: `sel("DCGM_FI_DEV_GPU_TEMP", 'gpu="0"')` ->
    `DCGM_FI_DEV_GPU_TEMP{job="inferwatch-gpu", gpu="0"}`."""

    matchers: tuple[Matcher, ...]

    def __str__(self) -> str:
        return ", ".join(str(m) for m in self.matchers)

    def __call__(self, metric: str, *extra: str) -> str:
        """`metric{<this selector>, <extra matchers>...}`; empty extras are left out."""
        inner = ", ".join([str(self), *(e for e in extra if e)])
        return f"{metric}{{{inner}}}"

    def with_matchers(self, *extra: str) -> str:
        """The matcher text with `extra` matchers appended (for a selector written by hand around it)."""
        return ", ".join([str(self), *(e for e in extra if e)])

    def describe(self) -> str:
        """The selector in words for a message: `job inferwatch-gpu`, `namespace triton, service=~"t-.*"`."""
        return ", ".join(f"{m.name} {m.value}" if m.op == "=" and m.value else str(m) for m in self.matchers)

    @property
    def labels(self) -> dict[str, str]:
        """label -> value of the `=` matchers with a non-empty value: the labels every selected series
        carries (what `absent()` of it keeps, what a scrape configuration must write)."""
        return {m.name: m.value for m in self.matchers if m.op == "=" and m.value}

    @property
    def only_equalities(self) -> bool:
        return all(m.op == "=" for m in self.matchers)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a series with `labels` is selected."""
        return all(m.matches(labels) for m in self.matchers)


@functools.lru_cache(maxsize=256)
def parse(text: str) -> Selector:
    """Parse a selector text (see the module doc); one pair of enclosing braces is allowed. Raises
    SelectorError naming the position and what was expected: a label name, an operator, a string, an invalid
    regular expression, a reserved `__` label, or a selector whose every matcher also matches a series without
    the label (it would select every source's series)."""
    if not isinstance(text, str):
        raise SelectorError(f"expected a string such as 'job=\"triton\"', got {text!r}")
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    matchers: list[Matcher] = []
    pos = _SPACE.match(body, 0).end()
    while pos < len(body):
        name = _NAME.match(body, pos)
        if not name:
            raise SelectorError(f"at {pos + 1}: expected a label name, got {body[pos:pos + 10]!r}")
        pos = _SPACE.match(body, name.end()).end()
        op = next((o for o in OPS if body.startswith(o, pos)), None)
        if op is None:
            raise SelectorError(f"at {pos + 1}: expected one of = != =~ !~ after {name.group(0)!r}, "
                                f"got {body[pos:pos + 10]!r}")
        pos = _SPACE.match(body, pos + len(op)).end()
        value, pos = _string(body, pos)
        matcher = Matcher(name.group(0), op, value)
        _check(matcher)
        matchers.append(matcher)
        pos = _SPACE.match(body, pos).end()
        if pos < len(body):
            if body[pos] != ",":
                raise SelectorError(f"at {pos + 1}: expected ',' between matchers, got {body[pos:pos + 10]!r}")
            pos = _SPACE.match(body, pos + 1).end()
    if not matchers:
        raise SelectorError("expected at least one matcher, such as 'job=\"triton\"'")
    if all(m.matches_empty for m in matchers):
        raise SelectorError(f"{', '.join(map(str, matchers))} also selects series without those labels, i.e. "
                            f"every source's: give at least one matcher a series must carry, such as "
                            f"'job=\"triton\"'")
    return Selector(tuple(matchers))


def _check(matcher: Matcher) -> None:
    if matcher.name.startswith("__"):
        raise SelectorError(f"{matcher.name}: labels starting with __ are reserved (the metric name is chosen by "
                            f"each query, not by the selector)")
    if matcher.op in ("=~", "!~"):
        try:
            re.compile(matcher.value)
        except re.error as exc:
            raise SelectorError(f"{matcher}: not a regular expression ({exc})") from None


def _string(text: str, pos: int) -> tuple[str, int]:
    """A PromQL string literal starting at `pos` -> (value, position after it)."""
    if pos >= len(text) or text[pos] not in "\"'`":
        raise SelectorError(f"at {pos + 1}: expected a quoted string, got {text[pos:pos + 10]!r}")
    quote = text[pos]
    i = pos + 1
    out = []
    while i < len(text):
        ch = text[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch == "\\" and quote != "`":
            value, i = _escape(text, i + 1, quote)
            out.append(value)
            continue
        if ch == "\n" and quote != "`":
            break
        out.append(ch)
        i += 1
    raise SelectorError(f"at {pos + 1}: string {text[pos:pos + 20]!r} is not closed")


def _escape(text: str, i: int, quote: str) -> tuple[str, int]:
    """A Go escape sequence after a backslash at i - 1 -> (character, position after it)."""
    if i >= len(text):
        raise SelectorError("a string ends in a lone backslash")
    ch = text[i]
    if ch in _SIMPLE_ESCAPES and (ch not in "'\"" or ch == quote):
        return _SIMPLE_ESCAPES[ch], i + 1
    for prefix, digits, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if ch == prefix:
            code = text[i + 1:i + 1 + digits]
            if len(code) == digits and all(c in "0123456789abcdefABCDEF" for c in code):
                return chr(int(code, base)), i + 1 + digits
            raise SelectorError(f"at {i}: \\{prefix} needs {digits} hexadecimal digits")
    if ch in "01234567":
        code = text[i:i + 3]
        if len(code) == 3 and all(c in "01234567" for c in code) and int(code, 8) < 256:
            return chr(int(code, 8)), i + 3
        raise SelectorError(f"at {i}: an octal escape needs 3 digits up to \\377")
    raise SelectorError(f"at {i}: unknown escape sequence \\{ch} (write \\\\ for a backslash, as in PromQL)")
