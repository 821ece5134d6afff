"""Triage judges an alert's condition with the rule's own thresholds: for every alerting rule the generator
writes from a spec (the repository's and the demo's, whose windows and thresholds differ), each number the
runbook's `condition` computes from spec values, each window and each list it puts in a query appears in
that rule's expression. A spec change that moves a rule's threshold moves triage's with it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from inferwatch.rules.builders import num
from inferwatch.rules.generate import rule_groups
from inferwatch.rules.model import Alert, Recording
from inferwatch.spec import Duration, load_spec
from inferwatch.triage.condition import names_in
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.thresholds import resolve, selector_params

ROOT = Path(__file__).resolve().parents[1]
SPECS = {"repository": ROOT / "inferwatch.yaml", "demo": ROOT / "examples" / "demo" / "inferwatch.demo.yaml"}
RUNBOOKS = load_runbooks()


def rules(spec) -> list[Alert]:
    return [r for groups in rule_groups(spec).values() for g in groups for r in g.rules if isinstance(r, Alert)]


def rule_text(spec, rule: Alert) -> str:
    """The alert's expression and the recording rules it reads (recursively), those of other tiers/windows
    left out: where its thresholds and bucket edges are written."""
    recordings = [r for groups in rule_groups(spec).values() for g in groups for r in g.rules
                  if isinstance(r, Recording)]
    text, seen = rule.expr, set()
    while True:
        used = [r for r in recordings if id(r) not in seen and has_token(text, r.record)
                and all(rule.labels.get(k, v) == v for k, v in r.labels.items())]
        if not used:
            return text
        seen |= {id(r) for r in used}
        text += "\n" + "\n".join(r.expr for r in used)


def label_sets(spec, rule: Alert) -> list[dict]:
    """The rule's own labels (its severity among them, as Alertmanager sends it), once per model with a
    per-model override and once for any other model."""
    models = sorted(spec.layers.L2.models) + ["some-other-model"]
    return [{**rule.labels, "severity": rule.severity, "alertname": rule.alert, "model": m} for m in models]


def threshold_expressions(tree: ast.Expression, thresholds: set[str]) -> list[ast.expr]:
    """Largest sub-expressions made only of thresholds and numbers (with at least one threshold)."""
    out: list[ast.expr] = []

    def pure(node) -> bool:
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        return bool(names) and names <= thresholds and not any(isinstance(n, ast.Call) for n in ast.walk(node))

    def visit(node) -> None:
        if isinstance(node, ast.expr) and pure(node):
            out.append(node)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree.body)
    return out


def has_token(expr: str, token: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(token)}(?![\w.])", expr) is not None


CASES = [(spec_name, rule_index) for spec_name,
         path in SPECS.items() for rule_index in range(len(rules(load_spec(path))))]


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_every_generated_alert_has_a_page_with_a_condition(spec_name):
    names = {r.alert for r in rules(load_spec(SPECS[spec_name]))}
    assert names <= set(RUNBOOKS)
    assert all(RUNBOOKS[n].conditions for n in names)


@pytest.mark.parametrize("spec_name, rule_index", CASES, ids=[f"{s}-{i}" for s, i in CASES])
def test_condition_thresholds_are_the_rules(spec_name, rule_index):
    spec = load_spec(SPECS[spec_name])
    rule = rules(spec)[rule_index]
    runbook = RUNBOOKS[rule.alert]
    text = rule_text(spec, rule)
    for labels in label_sets(spec, rule):
        tree = runbook.condition_for(labels).condition
        resolved = {t: resolve(t, ref.path, spec, labels) for t, ref in runbook.thresholds.items()}
        needed = (names_in(tree) | {p for n in names_in(tree) if n in runbook.queries
                                    for p in runbook.queries[n].params}) & set(resolved)
        assert all(resolved[n].value is not None for n in needed), resolved
        numbers = {t: (r.value.seconds if isinstance(r.value, Duration) else r.value) for t, r in resolved.items()
                   if r.value is not None}
        checked = []
        for node in threshold_expressions(tree, set(runbook.thresholds)):
            value = eval(compile(ast.Expression(node), "<condition>", "eval"), {}, dict(numbers))  # noqa: S307 - names + numbers only
            token = num(float(f"{value:.10g}"))
            assert has_token(text, token), (f"{rule.alert} {labels}: condition part {ast.unparse(node)} = {token} "
                                            f"is not in the rule:\n{text}")
            checked.append(token)
        # Windows, lists and source selectors the condition's queries take from the spec are the rule's too.
        selectors = selector_params(spec)
        for q in (runbook.queries[n] for n in names_in(tree) if n in runbook.queries):
            for param in q.params - {"rate_window", "fault_time"}:
                if param in selectors:
                    assert selectors[param] in text, f"{rule.alert}: ${param} = {selectors[param]} is not in the rule"
                    checked.append(selectors[param])
                    continue
                value = resolved[param].value
                tokens = [str(value)] if isinstance(value, Duration) else [str(v) for v in value] \
                    if isinstance(value, list) else [num(value)]
                for token in tokens:
                    assert token in text, f"{rule.alert}: ${param} = {token} is not in the rule:\n{text}"
                checked += tokens
        if names_in(tree) & set(runbook.thresholds):
            assert checked, f"{rule.alert}: no threshold of the condition was checked"
