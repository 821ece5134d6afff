"""Triage one alert: run its runbook's evidence queries scoped to the alert's labels and say which likely
causes the values point to.

Findings are tried in page order; every one that holds is reported, the first is the *top finding*.
When none holds the result says so (the page's prose still lists what to check by hand).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re
from typing import Mapping

from inferwatch.triage.condition import ConditionError, evaluate
from inferwatch.triage.evidence import Runbook
from inferwatch.triage.scope import DEFAULT_RATE_WINDOW, scoped
from inferwatch.triage.sources import PrometheusSource, QueryResult

__all__ = ["Evidence", "MatchedFinding", "AlertTriage", "triage_alert", "format_value"]


@dataclasses.dataclass
class Evidence:
    result: QueryResult
    unit: str
    help: str

    @property
    def shown(self) -> str:
        if self.result.error:
            return "error"
        return format_value(self.result.value, self.unit)


@dataclasses.dataclass
class MatchedFinding:
    cause: str
    layer: str
    summary: str
    action: str


@dataclasses.dataclass
class AlertTriage:
    """Everything triage learned about one alert. `error` is set when there was nothing to run."""

    alert: str
    labels: dict[str, str]
    runbook_url: str
    evidence: list[Evidence] = dataclasses.field(default_factory=list)
    findings: list[MatchedFinding] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def top(self) -> MatchedFinding | None:
        return self.findings[0] if self.findings else None

    def to_dict(self) -> dict:
        return {
            "alert": self.alert,
            "labels": self.labels,
            "runbook_url": self.runbook_url,
            "error": self.error,
            "top_cause": self.top.cause if self.top else None,
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "evidence": [{"name": e.result.name, "value": e.result.value, "unit": e.unit, "shown": e.shown,
                          "help": e.help, "query": e.result.expr, "series_count": e.result.series_count,
                          "top_series": [{"labels": lbl, "value": v} for lbl, v in e.result.series],
                          "error": e.result.error} for e in self.evidence],
        }


def format_value(value: float | None, unit: str) -> str:
    """Human form of an evidence value: seconds → ms/s, ratio → %, bytes/MiB → GiB, None → 'no data'."""
    if value is None:
        return "no data"
    if unit == "seconds":
        return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "ratio":
        return f"{value * 100:.1f} %"
    if unit == "percent":
        return f"{value:.1f} %"
    if unit == "per_second":
        return f"{value:.3g}/s"
    if unit == "celsius":
        return f"{value:.0f} °C"
    if unit == "bytes":
        return f"{value / 2**30:.2f} GiB"
    if unit == "mib":
        return f"{value / 1024:.2f} GiB"
    if unit == "watts":
        return f"{value:.0f} W"
    return f"{value:.4g}"


def triage_alert(alert: str, labels: Mapping[str, str], runbook: Runbook | None, source: PrometheusSource,
                 runbook_url: str, max_workers: int = 8, rate_window: str = DEFAULT_RATE_WINDOW) -> AlertTriage:
    """Run `runbook`'s queries (concurrently, at most `max_workers` at a time) scoped to `labels` and
    evaluate its findings. Never raises for a failing query: its error is kept on its Evidence."""
    result = AlertTriage(alert, dict(labels), runbook_url)
    if runbook is None:
        result.error = f"no runbook page for {alert}"
        return result
    queries = list(runbook.queries.values())
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(queries)))) as pool:
        answers = list(pool.map(lambda q: source.query(q.name, scoped(q.expr, labels, rate_window)), queries))
    result.evidence = [Evidence(a, q.unit, q.help) for q, a in zip(queries, answers)]
    values = {e.result.name: e.result.value for e in result.evidence}
    shown = {e.result.name: e.shown for e in result.evidence}
    for finding in runbook.findings:
        try:
            holds = evaluate(finding.condition, values)
        except ConditionError as exc:  # load_runbook checks names; keep going if a page slipped through
            result.error = str(exc)
            continue
        if holds:
            result.findings.append(MatchedFinding(finding.cause, finding.layer,
                                                  _fill(finding.summary, shown), _fill(finding.action, shown)))
    return result


def _fill(text: str, shown: Mapping[str, str]) -> str:
    """Replace `{name}` with the formatted value of that evidence; other braces stay as written."""
    return re.sub(r"\{([a-z][a-z0-9_]*)\}", lambda m: shown.get(m.group(1), m.group(0)), text)
