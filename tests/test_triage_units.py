"""Pure parts of triage: the finding-condition language, the evidence-block parser, scoping, formatting."""

from __future__ import annotations

import pytest

from inferwatch.triage.condition import ConditionError, compile_condition, evaluate, names_in
from inferwatch.triage.engine import format_value
from inferwatch.triage.evidence import RunbookError, load_runbook
from inferwatch.triage.scope import regex_literal, scoped


def holds(text: str, **values) -> bool:
    return evaluate(compile_condition(text), values)


def test_conditions_compare_and_combine():
    assert holds("a > 0.5 and b < 2 * a", a=1.0, b=1.5)
    assert not holds("a > 0.5 and b < 2 * a", a=1.0, b=2.5)
    assert holds("a > 1 or b > 1", a=0.0, b=2.0)
    assert holds("0.1 < a <= 1", a=1.0) and not holds("0.1 < a <= 1", a=1.01)
    assert holds("not a > 1", a=0.5)


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
queries:
  q:
    expr: sum(up{job=~"{{ $labels.job }}"})
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
    assert runbook.queries["q"].labels == {"job"}


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


def test_scoping_uses_the_rules_rate_window():
    expr = 'rate(x{m=~"{{ $labels.model }}"}[$rate_window])'
    assert scoped(expr, {"model": "m"}) == 'rate(x{m=~"m"}[5m])'
    assert scoped(expr, {"model": "m"}, rate_window="20s") == 'rate(x{m=~"m"}[20s])'


@pytest.mark.parametrize("value, unit, shown", [
    (None, "seconds", "no data"), (0.0123, "seconds", "12 ms"), (2.5, "seconds", "2.50 s"),
    (0.873, "ratio", "87.3 %"), (3 * 2**30, "bytes", "3.00 GiB"), (2048, "mib", "2.00 GiB"), (86, "celsius", "86 °C"),
])
def test_values_are_shown_in_their_unit(value, unit, shown):
    assert format_value(value, unit) == shown
