"""Triage one alert: resolve the page's spec thresholds, run its evidence queries scoped to the alert's
labels, check the alert's own condition, then say which likely causes the values point to.

- The alert's condition (the rule's expression, with the rule's thresholds from the spec) is judged first.
  When it does not hold at the evaluation time, no cause is named: the result says so plainly.
- Findings are tried in page order; every one that holds is reported, the first is the *top finding*.
- A finding whose evidence is missing is not made; it is listed in `not_judged` with the values that had
  no data (three-valued logic, inferwatch.triage.condition).
- Before any of that, each source the page reads is checked for freshness (inferwatch.triage.freshness): the
  queries of a source that stopped reporting are not run, so neither the condition nor a finding is judged
  from the last values it sent; `stale_sources` says which source and why.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import re
import time
from typing import Mapping

from inferwatch.spec import Duration, Spec
from inferwatch.triage.condition import ConditionError, missing_names
from inferwatch.triage.condition import judge as judge_condition
from inferwatch.triage.estimates import bucket_of, split_quantile
from inferwatch.triage.evidence import Runbook
from inferwatch.triage.identity import with_identity
from inferwatch.triage.scope import scoped
from inferwatch.triage.share import ExactShare, compared_with, exact_share, quantile_of, share_text
from inferwatch.triage.sources import PrometheusSource, QueryResult
from inferwatch.triage.thresholds import (
    BUILTINS,
    SELECTOR_PARAMS,
    Threshold,
    builtin,
    condition_value,
    query_form,
    resolve,
    selector_params,
)
from inferwatch.upstreams import TRITON, kind_of, upstream_of

__all__ = ["Evidence", "MatchedFinding", "UnjudgedFinding", "ConditionVerdict", "Judgement", "AlertTriage",
           "triage_alert", "judge", "format_value", "resolve_thresholds", "query_params", "BUILTIN_UNITS"]

BUILTIN_UNITS = {"rate_window": "seconds", "fault_time": "timestamp"}


@dataclasses.dataclass
class Evidence:
    result: QueryResult
    unit: str
    help: str
    skipped: str | None = None  # why the query was not run (a threshold it needs is unknown)
    bucket: tuple[float, float] | None = None  # a histogram_quantile's bucket (lower, upper), in `unit`

    @property
    def shown(self) -> str:
        if self.skipped:
            return "not run"
        if self.result.error:
            return "error"
        return shown_value(self.result.value, self.unit, self.bucket)


@dataclasses.dataclass
class MatchedFinding:
    cause: str
    layer: str
    summary: str
    action: str


@dataclasses.dataclass
class UnjudgedFinding:
    """A finding not made because values it needs are missing (`missing`: their names, in order)."""

    cause: str
    layer: str
    missing: list[str]


@dataclasses.dataclass
class ConditionVerdict:
    """The alert's own condition: `holds` True, False, or None when `missing` values leave it undecided."""

    holds: bool | None
    when: str
    summary: str
    missing: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Judgement:
    condition: ConditionVerdict
    findings: list[MatchedFinding]
    not_judged: list[UnjudgedFinding]


@dataclasses.dataclass
class AlertTriage:
    """Everything triage learned about one alert. `error` is set when there was nothing to run."""

    alert: str
    labels: dict[str, str]
    runbook_url: str
    evidence: list[Evidence] = dataclasses.field(default_factory=list)
    thresholds: list[Threshold] = dataclasses.field(default_factory=list)
    condition: ConditionVerdict | None = None
    findings: list[MatchedFinding] = dataclasses.field(default_factory=list)
    not_judged: list[UnjudgedFinding] = dataclasses.field(default_factory=list)
    evaluated_at: float | None = None
    fault_time: float | None = None
    error: str | None = None
    stale_sources: list = dataclasses.field(default_factory=list)  # freshness.SourceState of each stale source
    exact_shares: list = dataclasses.field(default_factory=list)  # share.ExactShare: the condition's headline

    @property
    def top(self) -> MatchedFinding | None:
        return self.findings[0] if self.findings else None

    def why_missing(self, name: str) -> str:
        """'<help> (no data)' for an evidence value, '<path>: <reason>' for a threshold."""
        for t in self.thresholds:
            if t.name == name:
                return f"spec value {t.path}: {t.reason or 'not a number'}"
        for e in self.evidence:
            if e.result.name == name:
                if e.skipped:
                    return f"{e.help} (not run: {e.skipped})"
                if e.result.error:
                    return f"{e.help} (query failed: {e.result.error})"
                return f"{e.help} (no data)"
        return "no data"

    def to_dict(self) -> dict:
        """The JSON shape of `triage --json` (docs/triage.md#json-output): unknown values are null, never 0."""
        return {
            "alert": self.alert,
            "labels": self.labels,
            "runbook_url": self.runbook_url,
            "error": self.error,
            "evaluated_at": _rfc3339(self.evaluated_at),
            "fault_time": _rfc3339(self.fault_time),
            "condition": None if self.condition is None else {
                "holds": self.condition.holds, "when": self.condition.when, "summary": self.condition.summary,
                "missing": [{"name": n, "why": self.why_missing(n)} for n in self.condition.missing]},
            "top_cause": self.top.cause if self.top else None,
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "not_judged": [{"cause": f.cause, "layer": f.layer,
                            "missing": [{"name": n, "why": self.why_missing(n)} for n in f.missing]}
                           for f in self.not_judged],
            "stale_sources": [{"source": st.source, "up": st.up, "age_seconds": st.age_s, "reason": st.reason,
                               "scrape_interval_seconds": st.interval_s, "interval_from": st.interval_from}
                              for st in self.stale_sources],
            "exact_shares": [{"query": x.query, "threshold": x.threshold_name, "threshold_value": x.threshold,
                              "quantile": x.quantile, "share": x.share} for x in self.exact_shares],
            "thresholds": [{"name": t.name, "spec": t.path, "value": _json_value(t.value), "reason": t.reason}
                           for t in self.thresholds],
            "evidence": [{"name": e.result.name, "value": e.result.value, "unit": e.unit, "shown": e.shown,
                          "estimate_bucket": None if e.bucket is None else
                          [e.bucket[0], None if e.bucket[1] == float("inf") else e.bucket[1]],
                          "help": e.help, "query": e.result.expr, "series_count": e.result.series_count,
                          "top_series": [{"labels": lbl, "value": v} for lbl, v in e.result.series],
                          "error": e.result.error, "skipped": e.skipped} for e in self.evidence],
        }


def shown_value(value: float | None, unit: str, bucket: tuple[float, float] | None) -> str:
    """`format_value`, and for a histogram estimate the bucket it lies in (inferwatch.triage.estimates)."""
    from inferwatch.triage.estimates import estimate_text

    text = format_value(value, unit)
    if value is None or bucket is None:
        return text
    lower, upper = bucket
    return estimate_text(text, format_value(lower, unit), None if upper == float("inf") else format_value(upper, unit))


def format_value(value: float | None, unit: str) -> str:
    """Human form of a value: seconds → ms/s/min, ratio → %, bytes/MiB → GiB, None → 'no data'."""
    if value is None:
        return "no data"
    if unit == "seconds":
        if abs(value) < 1:
            return f"{value * 1000:.0f} ms"
        return f"{value:.2f} s" if abs(value) < 120 else f"{value / 60:.1f} min"
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
    if unit == "timestamp":
        return _rfc3339(value) or "no data"
    return f"{value:.4g}"


def judge(runbook: Runbook, labels: Mapping[str, str], values: Mapping[str, float | None],
          units: Mapping[str, str] | None = None,
          buckets: Mapping[str, tuple[float, float]] | None = None) -> Judgement:
    """The pure part of triage: the alert's condition and the findings over `values` (every query,
    threshold and built-in name of the page → number or None). `units` formats values in summaries;
    `buckets` names the histogram bucket of each quantile estimate, which summaries then show.
    Raises ConditionError when a condition reads a value that is not a number (a list threshold)."""
    units = dict(units or {})
    buckets = dict(buckets or {})
    shown = {name: shown_value(v, units.get(name, "count"), buckets.get(name)) for name, v in values.items()}
    variant = runbook.condition_for(labels)
    holds = judge_condition(variant.condition, values)
    verdict = ConditionVerdict(holds, variant.when, _fill(variant.summary, shown),
                               missing_names(variant.condition, values) if holds is None else [])
    out = Judgement(verdict, [], [])
    if holds is False:
        return out  # the alert's condition does not hold: no cause for a fault that is not there
    for finding in runbook.findings:
        result = judge_condition(finding.condition, values)
        if result is True:
            out.findings.append(MatchedFinding(finding.cause, finding.layer, _fill(finding.summary, shown),
                                               _fill(finding.action, shown)))
        elif result is None:
            out.not_judged.append(UnjudgedFinding(finding.cause, finding.layer,
                                                  missing_names(finding.condition, values)))
    return out


def triage_alert(alert: str, labels: Mapping[str, str], runbook: Runbook | None, source: PrometheusSource,
                 runbook_url: str, *, spec: Spec | None = None, fault_time: float | None = None,
                 max_workers: int = 8) -> AlertTriage:
    """Run `runbook`'s queries (concurrently, at most `max_workers` at a time) scoped to `labels`, with the
    thresholds of `spec` (default: the built-in defaults), at the source's time (`source.at`, else now);
    `fault_time` (unix seconds, default: the evaluation time) anchors time-based evidence. Never raises for
    a failing query: its error is kept on its Evidence."""
    spec = spec or Spec()
    evaluated_at = source.at if source.at is not None else time.time()
    result = AlertTriage(alert, dict(labels), runbook_url, evaluated_at=evaluated_at,
                         fault_time=fault_time if fault_time is not None else evaluated_at)
    if runbook is None:
        result.error = f"no runbook page for {alert}"
        return result
    result.thresholds = resolve_thresholds(runbook, spec, labels, result.fault_time)
    params = query_params(result.thresholds, spec)
    reasons = {t.name: t.reason for t in result.thresholds if t.value is None}
    queries = list(runbook.queries.values())
    from inferwatch.triage.freshness import check_sources, sources_read

    states = check_sources(source, sources_read(q.expr for q in queries), labels, params, spec)
    result.stale_sources = [st for st in states.values() if st.stale]

    not_triton = _not_served_by_triton(spec, labels)

    def run(query) -> Evidence:
        if not_triton and query.params & _TRITON_PARAMS:
            return Evidence(QueryResult(query.name, query.expr), query.unit, query.help, skipped=not_triton)
        unresolved = sorted(query.params - params.keys())
        if unresolved:
            return Evidence(QueryResult(query.name, query.expr), query.unit, query.help,
                            skipped=f"${unresolved[0]} unknown: {reasons.get(unresolved[0])}")
        stale = [states[s] for s in sources_read([query.expr], data_only=True) if s in states and states[s].stale]
        if stale:
            return Evidence(QueryResult(query.name, query.expr), query.unit, query.help, skipped=stale[0].reason)
        expr = scoped(*with_identity(query.expr, labels, spec), params, cluster_label=spec.cluster.label)
        evidence = Evidence(source.query(query.name, expr), query.unit, query.help)
        quantile = split_quantile(expr)
        if quantile is not None and evidence.result.value is not None:
            edges = source.label_values(quantile[0], "le")
            if edges:
                lower, upper = bucket_of(evidence.result.value * quantile[1], [float(e) for e in edges])
                evidence.bucket = (lower / quantile[1], upper / quantile[1])
        return evidence

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(queries)))) as pool:
        result.evidence = list(pool.map(run, queries))
    values: dict[str, float | None] = {e.result.name: e.result.value for e in result.evidence}
    values.update({t.name: condition_value(t.value) for t in result.thresholds})
    units = {**{q.name: q.unit for q in queries}, **{n: r.unit for n, r in runbook.thresholds.items()},
             **BUILTIN_UNITS}
    buckets = {e.result.name: e.bucket for e in result.evidence if e.bucket is not None}
    try:
        verdict = judge(runbook, labels, values, units, buckets)
    except ConditionError as exc:  # a condition reading a list threshold: a page error, reported, not raised
        result.error = f"{runbook.path}: {exc}"
        return result
    result.condition, result.findings, result.not_judged = verdict.condition, verdict.findings, verdict.not_judged
    result.exact_shares = _exact_shares(runbook, labels, result, values, source)
    if result.exact_shares and result.condition is not None:
        heads = [share_text(x.share, format_value(x.threshold, units.get(x.threshold_name, "count")), x.quantile)
                 for x in result.exact_shares]
        result.condition.summary = "; ".join(heads) + ". " + result.condition.summary
    return result


def _exact_shares(runbook: Runbook, labels: Mapping[str, str], result: AlertTriage,
                  values: Mapping[str, float | None], source: PrometheusSource) -> list:
    """The exact share within its target of each histogram quantile the alert's condition compares with a
    threshold (inferwatch.triage.share), read from the quantile query's own buckets; none where the target is
    no bucket edge or the histogram saw nothing."""
    when = runbook.condition_for(labels).when
    thresholds = [t.name for t in result.thresholds]
    out = []
    for e in result.evidence:
        quantile = quantile_of(e.result.expr) if not e.skipped and e.result.value is not None else None
        parts = split_quantile(e.result.expr) if quantile is not None else None
        name = compared_with(when, e.result.name, thresholds) if parts is not None else None
        target = values.get(name) if name is not None else None
        if parts is None or target is None:
            continue
        buckets = source.vector(parts[0])
        share = exact_share(buckets or [], target, parts[1])
        if share is not None:
            out.append(ExactShare(e.result.name, name, target, quantile, share))
    return out


# Selectors of Triton's own series and the collector's: evidence that exists only for a Triton model.
_TRITON_PARAMS = frozenset({SELECTOR_PARAMS["triton"], SELECTOR_PARAMS["triton_collector"]})


def _not_served_by_triton(spec: Spec, labels: Mapping[str, str]) -> str | None:
    """Why Triton evidence does not apply to an alert whose `model` is served by another kind of upstream
    (spec `upstreams`), else None."""
    model = labels.get("model")
    if not model or kind_of(spec, model) == TRITON:
        return None
    return f"model {model} is served by upstream {upstream_of(spec, model)} ({kind_of(spec, model)}), not Triton"


def resolve_thresholds(runbook: Runbook, spec: Spec, labels: Mapping[str, str], fault_time: float) -> list[Threshold]:
    """The page's thresholds and the built-ins, resolved for an alert with `labels`."""
    out = [resolve(name, ref.path, spec, labels) for name, ref in runbook.thresholds.items()]
    return out + [builtin(name, spec, fault_time) for name in BUILTINS]


def query_params(thresholds: list[Threshold], spec: Spec | None = None) -> dict[str, str]:
    """`$name` → PromQL text for every threshold that resolved, and each source's `$<source>_selector` from
    `spec` (default: the built-in defaults; see scope.scoped)."""
    return {**selector_params(spec or Spec()),
            **{t.name: query_form(t.value) for t in thresholds if t.value is not None}}


def _fill(text: str, shown: Mapping[str, str]) -> str:
    """Replace `{name}` with the formatted value of that evidence; other braces stay as written."""
    return re.sub(r"\{([a-z][a-z0-9_]*)\}", lambda m: shown.get(m.group(1), m.group(0)), text)


def _rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _json_value(value):
    if isinstance(value, Duration):
        return value.seconds
    return value
