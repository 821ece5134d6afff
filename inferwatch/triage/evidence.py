"""Runbook pages and their machine-readable evidence blocks.

Each `runbooks/<AlertName>.md` holds exactly one fenced block whose info string is ``yaml evidence``:

```yaml
queries:                       # name → PromQL; `{{ $labels.x }}` is replaced by the alert's label x
  queue_p95_seconds:
    expr: max(nv_inference_queue_summary_us{quantile="0.95", model=~"{{ $labels.model }}"}) / 1e6
    unit: seconds              # seconds | ratio | percent | count | per_second | celsius | bytes | mib | watts
    help: Triton P95 queue time of the model
findings:                      # tried in order; the first that holds is the top finding
  - cause: capacity            # short id, stable for tools
    layer: L2                  # where the cause lies: L1 | L2 | L3 | network | config | external
    when: queue_p95_seconds > 0.5 and gpu_util_ratio > 0.85     # see inferwatch.triage.condition
    summary: Requests wait in Triton's queue while the GPU is saturated.
    action: Add instances or replicas; see "Actions".
```

Placeholders must sit inside a regex matcher (``label=~"{{ $labels.x }}"`` or ``label!~"..."``) so that an
alert without that label widens the query (``.*``; for ``!~`` the empty string, excluding nothing real)
instead of breaking it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from inferwatch.triage.condition import ConditionError, compile_condition, names_in

__all__ = ["RunbookError", "EvidenceQuery", "Finding", "Runbook", "load_runbook", "load_runbooks",
           "PLACEHOLDER", "UNITS", "default_runbook_dir"]

EVIDENCE_BLOCK = re.compile(r"^```yaml[ \t]+evidence[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
PLACEHOLDER = re.compile(r"\{\{\s*\$labels\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# A placeholder must be the whole or part of a =~ matcher's string: label=~"...{{ $labels.x }}..."
_IN_REGEX_MATCHER = re.compile(r'[=!]~\s*"[^"]*$')
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
class Runbook:
    alert: str
    path: Path
    title: str
    queries: dict[str, EvidenceQuery]
    findings: list[Finding]


def default_runbook_dir() -> Path:
    """runbooks/ of the source tree this package runs from, else ./runbooks."""
    here = Path(__file__).resolve().parents[2] / "runbooks"
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
    queries: dict[str, EvidenceQuery] = {}
    for name, q in data["queries"].items():
        where = f"{path}: queries.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise RunbookError(f"{where}: names are lower_snake_case identifiers")
        if not isinstance(q, dict) or not isinstance(q.get("expr"), str) or not q["expr"].strip():
            raise RunbookError(f"{where}: needs an `expr` string")
        unit = q.get("unit", "count")
        if unit not in UNITS:
            raise RunbookError(f"{where}: unit {unit!r} is not one of {', '.join(UNITS)}")
        for m in PLACEHOLDER.finditer(q["expr"]):
            if not _IN_REGEX_MATCHER.search(q["expr"][:m.start()]):
                raise RunbookError(f"{where}: placeholder {m.group(0)} must sit inside a "
                                   f'=~"..." or !~"..." matcher')
        queries[name] = EvidenceQuery(name, q["expr"].strip(), unit, str(q.get("help", "")))
    findings: list[Finding] = []
    for i, f in enumerate(data.get("findings") or []):
        where = f"{path}: findings[{i}]"
        if not isinstance(f, dict) or not all(isinstance(f.get(k), str) for k in ("cause", "layer", "when", "summary")):
            raise RunbookError(f"{where}: needs cause, layer, when and summary strings")
        finding = Finding(f["cause"], f["layer"], f["when"], f["summary"].strip(), str(f.get("action", "")).strip())
        try:
            unknown = names_in(finding.condition) - queries.keys()
        except ConditionError as exc:
            raise RunbookError(f"{where}: {exc}") from None
        if unknown:
            raise RunbookError(f"{where}: `when` names unknown values {sorted(unknown)}")
        findings.append(finding)
    if not findings:
        raise RunbookError(f"{path}: evidence block needs at least one finding")
    title_match = re.search(r"^#\s+(.+)$", text, re.M)
    return Runbook(path.stem, path, title_match.group(1).strip() if title_match else path.stem, queries, findings)


def load_runbooks(directory: Path | None = None) -> dict[str, Runbook]:
    """Every page in `directory` (default: default_runbook_dir()), keyed by alert name."""
    directory = Path(directory or default_runbook_dir())
    return {p.stem: load_runbook(p) for p in sorted(directory.glob("*.md")) if p.stem[:1].isupper()}
