"""Pure parts of triage: the finding-condition language, the evidence-block parser, scoping, formatting."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.spec import Duration, load_spec
from inferwatch.triage.condition import (
    ConditionError,
    compile_condition,
    evaluate,
    judge,
    missing_names,
    names_in,
    presence_only_names,
)
from inferwatch.triage.engine import format_value
from inferwatch.triage.evidence import RunbookError, load_runbook
from inferwatch.triage.scope import regex_literal, scoped
from inferwatch.triage.thresholds import query_form, resolve


def holds(text: str, **values) -> bool:
    return evaluate(compile_condition(text), values)


def test_conditions_compare_and_combine():
    assert holds("a > 0.5 and b < 2 * a", a=1.0, b=1.5)
    assert not holds("a > 0.5 and b < 2 * a", a=1.0, b=2.5)
    assert holds("a > 1 or b > 1", a=0.0, b=2.0)
    assert holds("0.1 < a <= 1", a=1.0) and not holds("0.1 < a <= 1", a=1.01)
    assert holds("not a > 1", a=0.5)


@pytest.mark.parametrize("text, values, verdict", [
    ("a > 1", {"a": None}, None),                              # no data: undecided, not false
    ("a > 1 and b > 1", {"a": 0.0, "b": None}, False),         # a decides
    ("a > 1 and b > 1", {"a": 2.0, "b": None}, None),          # b would decide
    ("a > 1 or b > 1", {"a": 2.0, "b": None}, True),           # a decides
    ("a > 1 or b > 1", {"a": 0.0, "b": None}, None),
    ("not a > 1", {"a": None}, None),                          # not unknown is unknown
    ("nodata(a) or a > 1", {"a": None}, True),
    ("has(a) and a > 1", {"a": None}, False),
    ("a / b > 1", {"a": 1.0, "b": 0.0}, None),                 # division by zero: undefined
    ("0 < a < b", {"a": 5.0, "b": None}, None),
    ("0 < a < b", {"a": -1.0, "b": None}, False),
])
def test_three_valued_logic_tells_not_met_from_missing(text, values, verdict):
    assert judge(compile_condition(text), values) is verdict


def test_missing_names_lists_the_evidence_that_would_decide():
    tree = compile_condition("has(x) and (nodata(f) or f > 1) and a > 2 * b")
    assert missing_names(tree, {"x": 1.0, "f": None, "a": None, "b": None}) == ["a", "b"]
    assert presence_only_names(tree) == {"x"}


def test_missing_values_never_satisfy_a_comparison():
    assert not holds("a > 0.5", a=None)
    assert not holds("a < 0.5", a=None)
    assert not holds("a * 2 > b", a=None, b=1.0)
    assert not holds("a / b > 1", a=1.0, b=0.0)  # division by zero is missing, not an error
    assert holds("nodata(a) and has(b)", a=None, b=0.0)


@pytest.mark.parametrize("text", ["__import__('os')", "a.b > 1", "a[0] > 1", "open(a)", "'x' == a",
                                  "lambda: 1", "a if b else c", "a ** 2 > 1"])
def test_conditions_refuse_anything_but_arithmetic_and_comparison(text):
    with pytest.raises(ConditionError):
        compile_condition(text)


def test_unknown_names_are_reported():
    tree = compile_condition("a > 1 and nodata(b)")
    assert names_in(tree) == {"a", "b"}
    with pytest.raises(ConditionError, match="unknown evidence value 'a'"):
        evaluate(tree, {"b": 1.0})


BLOCK = """# X

```yaml evidence
thresholds:
  limit: layers.L2.models.{model}.queue_p95_seconds | layers.L2.queue_p95_seconds
condition:
  when: q > limit
  summary: q is {q}
queries:
  q:
    expr: sum(rate(up{job=~"{{ $labels.job }}"}[$rate_window]))
    unit: count
findings:
  - cause: c
    layer: L2
    when: q > 1
    summary: s {q}
```
"""


def page(tmp_path, text: str):
    path = tmp_path / "X.md"
    path.write_text(text)
    return path


def test_a_good_block_loads(tmp_path):
    runbook = load_runbook(page(tmp_path, BLOCK))
    assert runbook.alert == "X" and list(runbook.queries) == ["q"] and runbook.findings[0].cause == "c"
    assert runbook.queries["q"].labels == {"job"} and runbook.queries["q"].params == {"rate_window"}
    assert runbook.thresholds["limit"].path.startswith("layers.L2.models.{model}")
    assert runbook.condition_for({}).when == "q > limit"


@pytest.mark.parametrize("broken, message", [
    (BLOCK.replace("```yaml evidence", "```yaml"), "exactly one ```yaml evidence block, found 0"),
    (BLOCK + BLOCK[4:], "found 2"),
    (BLOCK.replace("when: q > 1", "when: r > 1"), "unknown values ['r']"),
    (BLOCK.replace("when: q > 1", "when: q.x > 1"), "Attribute is not allowed"),
    (BLOCK.replace('job=~"{{ $labels.job }}"', 'job="{{ $labels.job }}"'), "must sit inside a =~"),
    (BLOCK.replace("unit: count", "unit: furlongs"), "unit 'furlongs'"),
    (BLOCK.replace("  q:\n", "  Q-1:\n"), "lower_snake_case"),
    (BLOCK.replace("    layer: L2\n", ""), "needs cause, layer, when and summary"),
    (BLOCK.replace("summary: s {q}", "summary: a: b: c"), "not valid YAML"),
    (BLOCK.replace("condition:\n  when: q > limit\n  summary: q is {q}\n", ""), "needs a `condition`"),
    (BLOCK.replace("when: q > limit", "when: q > nope"), "condition: `when` names unknown values ['nope']"),
    (BLOCK.replace("[$rate_window]", "[$window]"), "$window is neither a threshold"),
    (BLOCK.replace("  limit: layers", "  q: layers").replace("q > limit", "q > 1"), "already a threshold"),
    (BLOCK.replace("condition:\n  when", "condition:\n  - match: {signal: x}\n    when").replace(
        "\n  summary: q is", "\n    summary: q is"), "last condition variant must have no `match`"),
    (BLOCK.replace("    summary: s {q}\n", "    summary: s {q}\n  - cause: c\n    layer: L2\n    when: q > 2\n"
                                            "    summary: t\n"), "a cause is named by two findings"),
])
def test_broken_blocks_name_the_file_and_the_problem(tmp_path, broken, message):
    with pytest.raises(RunbookError) as exc:
        load_runbook(page(tmp_path, broken))
    assert str(exc.value).startswith(str(tmp_path / "X.md")) and message in str(exc.value)


def test_scoping_escapes_for_re2_and_promql():
    assert regex_literal('a.b"c') == 'a\\\\.b\\"c'
    expr = 'x{m=~"{{ $labels.model }}", u!~"{{ $labels.uuid }}"}'
    assert scoped(expr, {"model": "m-1", "uuid": "G"}) == 'x{m=~"m-1", u!~"G"}'
    assert scoped(expr, {}) == 'x{m=~".*", u!~""}'


def test_scoping_uses_the_rules_rate_window_and_thresholds():
    expr = 'rate(x{m=~"{{ $labels.model }}", xid=~"$xids"}[$rate_window] @ $fault_time)'
    params = {"xids": "48|79", "fault_time": "1700000000.000"}
    assert scoped(expr, {"model": "m"}, params) == 'rate(x{m=~"m", xid=~"48|79"}[5m] @ 1700000000.000)'
    assert scoped(expr, {"model": "m"}, {**params, "rate_window": "20s"}).endswith("[20s] @ 1700000000.000)")
    with pytest.raises(KeyError):
        scoped(expr, {})  # thresholds are resolved before scoping; the engine skips a query it cannot scope


@pytest.mark.parametrize("path, labels, value, reason", [
    ("tiers.{tier}.ttft_p95_seconds", {"tier": "realtime"}, 0.3, None),
    ("tiers.{tier}.ttft_p95_seconds", {}, None, "the alert has no `tier` label"),
    ("tiers.{tier}.ttft_p95_seconds", {"tier": "gold"}, None, "the spec sets no tiers.gold"),
    ("layers.L2.models.{model}.queue_p95_seconds | layers.L2.queue_p95_seconds", {"model": "classifier"}, 0.25, None),
    ("layers.L2.models.{model}.queue_p95_seconds | layers.L2.queue_p95_seconds", {"model": "llm"}, 0.5, None),
    ("layers.L2.models.{model}.error_ratio | layers.L2.error_ratio", {"model": "classifier"}, 0.01, None),
    ("layers.L2.for", {}, Duration.parse("5m"), None),
    ("layers.L3.burn_rate_windows.{window}.long", {"window": "slow-6h"}, Duration.parse("6h"), None),
    ("layers.L3.burn_rate_windows.{window}.long", {"window": "nope"}, None,
     "the spec sets no layers.L3.burn_rate_windows.nope"),
])
def test_thresholds_resolve_from_the_spec_with_the_alert_labels(path, labels, value, reason):
    spec = load_spec(Path(__file__).resolve().parents[1] / "inferwatch.yaml")
    t = resolve("x", path, spec, labels)
    assert (t.value, t.reason) == (value, reason)


@pytest.mark.parametrize("value, form", [
    (Duration.parse("5m"), "5m"), (0.25, "0.25"), (85.0, "85"), ([48, 79], "48|79"),
    (["hw_slowdown", "a.b"], "hw_slowdown|a\\\\.b"), (1700000000.5, "1700000000.500"),
])
def test_thresholds_take_their_promql_form_in_queries(value, form):
    assert query_form(value) == form


@pytest.mark.parametrize("value, unit, shown", [
    (None, "seconds", "no data"), (0.0123, "seconds", "12 ms"), (2.5, "seconds", "2.50 s"),
    (0.873, "ratio", "87.3 %"), (3 * 2**30, "bytes", "3.00 GiB"), (2048, "mib", "2.00 GiB"), (86, "celsius", "86 °C"),
])
def test_values_are_shown_in_their_unit(value, unit, shown):
    assert format_value(value, unit) == shown
