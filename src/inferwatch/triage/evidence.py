"""Runbook pages and their machine-readable evidence blocks.

Each `runbooks/<AlertName>.md` holds exactly one fenced block whose info string is ``yaml evidence``:

```yaml
thresholds:                    # name → spec path (inferwatch.triage.thresholds): the rule's own numbers
  queue_target_seconds: layers.L2.models.{model}.queue_p95_seconds | layers.L2.queue_p95_seconds
condition:                     # the alert rule's condition over the values below, checked first
  when: queue_p95_seconds > queue_target_seconds
  summary: Queue P95 {queue_p95_seconds} against {queue_target_seconds}.
queries:                       # name → PromQL; `{{ $labels.x }}` is replaced by the alert's label x,
  queue_p95_seconds:           # `$name` by a threshold, a built-in ($rate_window, $fault_time) or a source's
                               # selector ($triton_selector: spec selectors.triton), inside a metric's braces
    expr: max(nv_inference_queue_summary_us{$triton_selector, quantile="0.95", model=~"{{ $labels.model }}"}) / 1e6
    unit: seconds              # seconds | ratio | percent | count | per_second | celsius | bytes | mib | watts
    help: Triton P95 queue time of the model
findings:                      # tried in order; every one that holds is reported, the first is the top
  - cause: capacity            # short id, stable for tools
    layer: L2                  # where the cause lies: L1 | L2 | L3 | network | config | external
    when: queue_p95_seconds > 0.5 and gpu_util_ratio > 0.85     # see inferwatch.triage.condition
    summary: Requests wait in Triton's queue while the GPU is saturated.
    action: Add instances or replicas; see "Actions".
```

`condition` may instead be a list of variants, each with `match: {label: value}`; the first whose labels
all equal the alert's is used, one without `match` is the default (an alert rule with one expression per
`signal`). Placeholders must sit inside a regex matcher (``label=~"{{ $labels.x }}"`` or
``label!~"..."``) so that an alert without that label widens the query (``.*``; for ``!~`` the empty
string, excluding nothing real) instead of breaking it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from inferwatch.triage.condition import ConditionError, compile_condition, names_in
from inferwatch.triage.thresholds import BUILTINS, QUERY_PARAM, SELECTOR_PARAMS

__all__ = ["RunbookError", "EvidenceQuery", "Finding", "AlertCondition", "ThresholdRef", "Runbook",
           "load_runbook", "load_runbooks", "PLACEHOLDER", "UNITS", "default_runbook_dir"]

EVIDENCE_BLOCK = re.compile(r"^```yaml[ \t]+evidence[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
PLACEHOLDER = re.compile(r"\{\{\s*\$labels\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# A placeholder must be the whole or part of a =~ matcher's string: label=~"...{{ $labels.x }}..."
_IN_REGEX_MATCHER = re.compile(r'[=!]~\s*"[^"]*$')
_IN_BRACES = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*\{[^{}]*$")  # after `metric{` and other matchers, before `}`
UNITS = ("seconds", "ratio", "percent", "count", "per_second", "celsius", "bytes", "mib", "watts")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class RunbookError(ValueError):
    """A runbook page is missing, has no evidence block, or its block is malformed (message names the file)."""


@dataclasses.dataclass(frozen=True)
class EvidenceQuery:
    name: str
    expr: str
    unit: str = "count"
    help: str = ""

    @property
    def labels(self) -> set[str]:
        """Alert labels this query is scoped by."""
        return set(PLACEHOLDER.findall(self.expr))

    @property
    def params(self) -> set[str]:
        """Thresholds and built-ins (`$name`) the query text uses."""
        return set(QUERY_PARAM.findall(self.expr))


@dataclasses.dataclass(frozen=True)
class Finding:
    cause: str
    layer: str
    when: str
    summary: str
    action: str = ""

    @property
    def condition(self):
        return compile_condition(self.when)


@dataclasses.dataclass(frozen=True)
class ThresholdRef:
    """A spec value the page names: `path` as in inferwatch.triage.thresholds, shown in `unit`."""

    name: str
    path: str
    unit: str = "count"


@dataclasses.dataclass(frozen=True)
class AlertCondition:
    """The alert rule's own condition over the page's values. `match`: labels selecting this variant."""

    when: str
    summary: str
    match: tuple[tuple[str, str], ...] = ()

    @property
    def condition(self):
        return compile_condition(self.when)

    def applies_to(self, labels) -> bool:
        return all(labels.get(k) == v for k, v in self.match)


@dataclasses.dataclass(frozen=True)
class Runbook:
    alert: str
    path: Path
    title: str
    queries: dict[str, EvidenceQuery]
    findings: list[Finding]
    thresholds: dict[str, ThresholdRef] = dataclasses.field(default_factory=dict)
    conditions: list[AlertCondition] = dataclasses.field(default_factory=list)

    def condition_for(self, labels) -> AlertCondition | None:
        """The condition variant for an alert with `labels`: the first whose `match` fits, else None."""
        return next((c for c in self.conditions if c.applies_to(labels)), None)

    @property
    def value_names(self) -> set[str]:
        return set(self.queries) | set(self.thresholds) | set(BUILTINS)


def default_runbook_dir() -> Path:
    """runbooks/ of the source tree this package runs from, else ./runbooks."""
    here = Path(__file__).resolve().parents[3] / "runbooks"
    return here if here.is_dir() else Path("runbooks")


def load_runbook(path: Path) -> Runbook:
    """Parse and check one page. Raises RunbookError('<file>: <what is wrong>')."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RunbookError(f"{path}: cannot read: {exc.strerror}") from None
    blocks = EVIDENCE_BLOCK.findall(text)
    if len(blocks) != 1:
        raise RunbookError(f"{path}: expected exactly one ```yaml evidence block, found {len(blocks)}")
    try:
        data = yaml.safe_load(blocks[0])
    except yaml.YAMLError as exc:
        raise RunbookError(f"{path}: evidence block is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("queries"), dict) or not data["queries"]:
        raise RunbookError(f"{path}: evidence block needs a non-empty `queries` mapping")
    thresholds = _thresholds(path, data.get("thresholds"))
    queries: dict[str, EvidenceQuery] = {}
    for name, q in data["queries"].items():
        where = f"{path}: queries.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise RunbookError(f"{where}: names are lower_snake_case identifiers")
        if name in thresholds or name in BUILTINS or name in SELECTOR_PARAMS.values():
            raise RunbookError(f"{where}: the name is already a threshold, a built-in or a selector")
        if not isinstance(q, dict) or not isinstance(q.get("expr"), str) or not q["expr"].strip():
            raise RunbookError(f"{where}: needs an `expr` string")
        unit = q.get("unit", "count")
        if unit not in UNITS:
            raise RunbookError(f"{where}: unit {unit!r} is not one of {', '.join(UNITS)}")
        for m in PLACEHOLDER.finditer(q["expr"]):
            if not _IN_REGEX_MATCHER.search(q["expr"][:m.start()]):
                raise RunbookError(f"{where}: placeholder {m.group(0)} must sit inside a "
                                   f'=~"..." or !~"..." matcher')
        query = EvidenceQuery(name, q["expr"].strip(), unit, str(q.get("help", "")))
        unknown = query.params - set(thresholds) - set(BUILTINS) - set(SELECTOR_PARAMS.values())
        if unknown:
            raise RunbookError(f"{where}: ${sorted(unknown)[0]} is neither a threshold of the page nor a "
                               f"built-in ({', '.join(BUILTINS)}) nor a selector "
                               f"({', '.join('$' + p for p in SELECTOR_PARAMS.values())})")
        for m in QUERY_PARAM.finditer(query.expr):
            if m.group(1) in SELECTOR_PARAMS.values() and not _IN_BRACES.search(query.expr[:m.start()]):
                raise RunbookError(f"{where}: ${m.group(1)} must sit inside a metric's braces, e.g. "
                                   f"up{{${m.group(1)}}}")
        queries[name] = query
    known = set(queries) | set(thresholds) | set(BUILTINS)
    conditions = _conditions(path, data.get("condition"), known)
    findings: list[Finding] = []
    for i, f in enumerate(data.get("findings") or []):
        where = f"{path}: findings[{i}]"
        if not isinstance(f, dict) or not all(isinstance(f.get(k), str) for k in ("cause", "layer", "when", "summary")):
            raise RunbookError(f"{where}: needs cause, layer, when and summary strings")
        finding = Finding(f["cause"], f["layer"], f["when"], f["summary"].strip(), str(f.get("action", "")).strip())
        _check_names(where, finding.when, known)
        findings.append(finding)
    if not findings:
        raise RunbookError(f"{path}: evidence block needs at least one finding")
    causes = [f.cause for f in findings]
    if len(set(causes)) != len(causes):
        twice = sorted({c for c in causes if causes.count(c) > 1})
        raise RunbookError(f"{path}: a cause is named by two findings: {twice}")
    title_match = re.search(r"^#\s+(.+)$", text, re.M)
    return Runbook(path.stem, path, title_match.group(1).strip() if title_match else path.stem, queries, findings,
                   thresholds, conditions)


def _check_names(where: str, when: str, known: set[str]) -> None:
    try:
        unknown = names_in(compile_condition(when)) - known
    except ConditionError as exc:
        raise RunbookError(f"{where}: {exc}") from None
    if unknown:
        raise RunbookError(f"{where}: `when` names unknown values {sorted(unknown)}")


def _thresholds(path: Path, raw) -> dict[str, ThresholdRef]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RunbookError(f"{path}: `thresholds` must map names to spec paths")
    out = {}
    for name, ref in raw.items():
        where = f"{path}: thresholds.{name}"
        if not isinstance(name, str) or not _NAME.match(name) or name in BUILTINS or name in SELECTOR_PARAMS.values():
            raise RunbookError(f"{where}: names are lower_snake_case identifiers other than {', '.join(BUILTINS)}")
        if isinstance(ref, str):
            ref = {"spec": ref}
        if not isinstance(ref, dict) or not isinstance(ref.get("spec"), str) or not ref["spec"].strip():
            raise RunbookError(f"{where}: expected a spec path or {{spec: PATH, unit: UNIT}}")
        unit = ref.get("unit", "count")
        if unit not in UNITS:
            raise RunbookError(f"{where}: unit {unit!r} is not one of {', '.join(UNITS)}")
        out[name] = ThresholdRef(name, ref["spec"].strip(), unit)
    return out


def _conditions(path: Path, raw, known: set[str]) -> list[AlertCondition]:
    if raw is None:
        raise RunbookError(f"{path}: evidence block needs a `condition` (the alert rule's own condition)")
    variants = raw if isinstance(raw, list) else [raw]
    out = []
    for i, c in enumerate(variants):
        where = f"{path}: condition" + (f"[{i}]" if isinstance(raw, list) else "")
        if not isinstance(c, dict) or not isinstance(c.get("when"), str) or not isinstance(c.get("summary"), str):
            raise RunbookError(f"{where}: needs `when` and `summary` strings")
        match = c.get("match") or {}
        if not isinstance(match, dict) or not all(isinstance(v, str) for v in match.values()):
            raise RunbookError(f"{where}: `match` maps label names to values")
        _check_names(where, c["when"], known)
        out.append(AlertCondition(c["when"], c["summary"].strip(), tuple(sorted(match.items()))))
    if not out or out[-1].match:
        raise RunbookError(f"{path}: the last condition variant must have no `match` (the default)")
    return out


def load_runbooks(directory: Path | None = None) -> dict[str, Runbook]:
    """Every page in `directory` (default: default_runbook_dir()), keyed by alert name."""
    directory = Path(directory or default_runbook_dir())
    return {p.stem: load_runbook(p) for p in sorted(directory.glob("*.md")) if p.stem[:1].isupper()}
