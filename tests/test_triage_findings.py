"""Every finding of every runbook, judged on example values (tests/triage_cases.py) with the thresholds of
the repository's inferwatch.yaml: made when its evidence holds; not made when its own condition is not met;
not made when the alert's own condition does not hold; not made without its evidence, and then listed as
not judged with the missing values named. The table is generated from the runbooks, so a new finding
without a case fails `test_every_finding_has_a_case`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferwatch.spec import load_spec
from inferwatch.triage.condition import judge as judge_condition
from inferwatch.triage.condition import names_in, presence_only_names
from inferwatch.triage.engine import BUILTIN_UNITS, judge, resolve_thresholds
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.thresholds import condition_value
from triage_cases import ABSENCE_IS_THE_FINDING, CONDITION, FINDINGS

SPEC = load_spec(Path(__file__).resolve().parents[1] / "inferwatch.yaml")
RUNBOOKS = load_runbooks()
ALL_FINDINGS = [(alert, f.cause) for alert, rb in RUNBOOKS.items() for f in rb.findings]
FAULT_TIME = 1_700_000_000.0


def finding_of(alert: str, cause: str):
    return next(f for f in RUNBOOKS[alert].findings if f.cause == cause)


def values_for(alert: str, *layers: dict) -> dict:
    """Every name of the page: queries missing unless given, thresholds from the spec for the case's labels."""
    rb = RUNBOOKS[alert]
    values: dict = {name: None for name in rb.queries}
    for t in resolve_thresholds(rb, SPEC, CONDITION[alert].labels, FAULT_TIME):
        values[t.name] = condition_value(t.value)
    for layer in layers:
        values.update(layer)
    return values


def run(alert: str, values: dict):
    rb = RUNBOOKS[alert]
    units = {**{q.name: q.unit for q in rb.queries.values()}, **{n: r.unit for n, r in rb.thresholds.items()},
             **BUILTIN_UNITS}
    return judge(rb, CONDITION[alert].labels, values, units)


def compared(alert: str, cause: str) -> list[str]:
    """Evidence values the finding compares or computes with (not only asks about with nodata/has)."""
    tree = finding_of(alert, cause).condition
    return sorted(names_in(tree) - presence_only_names(tree) - set(RUNBOOKS[alert].thresholds)
                  - {"rate_window", "fault_time"})


def test_every_finding_has_a_case():
    missing = [k for k in ALL_FINDINGS if k not in FINDINGS]
    stale = [k for k in FINDINGS if k not in ALL_FINDINGS]
    assert not missing, f"findings without a case in tests/triage_cases.py: {missing}"
    assert not stale, f"cases for findings no runbook has: {stale}"
    assert sorted(CONDITION) == sorted(RUNBOOKS), "every runbook needs a CONDITION row in tests/triage_cases.py"


@pytest.mark.parametrize("alert", sorted(RUNBOOKS))
def test_alert_condition_holds_and_does_not(alert):
    case = CONDITION[alert]
    holds = run(alert, values_for(alert, case.holds))
    assert holds.condition.holds is True, holds.condition
    assert "{" not in holds.condition.summary and "no data" not in holds.condition.summary.split("(")[0]
    not_met = run(alert, values_for(alert, case.holds, case.not_met))
    assert not_met.condition.holds is False, not_met.condition
    assert not_met.findings == [] and not_met.not_judged == []


@pytest.mark.parametrize("alert", sorted(RUNBOOKS))
def test_alert_condition_without_its_evidence_is_not_checked_and_says_what_is_missing(alert):
    case = CONDITION[alert]
    variant = RUNBOOKS[alert].condition_for(case.labels)
    needed = sorted(names_in(variant.condition) - presence_only_names(variant.condition)
                    - set(RUNBOOKS[alert].thresholds))
    assert needed, "a condition compares at least one evidence value"
    result = run(alert, values_for(alert, case.holds, {name: None for name in needed}))
    assert result.condition.holds is None
    assert set(result.condition.missing) == set(needed)


def test_a_threshold_the_alert_labels_cannot_resolve_leaves_the_condition_unchecked():
    """LlmTtftP95High without its tier label: the target is unknown, so the condition is not judged."""
    rb = RUNBOOKS["LlmTtftP95High"]
    values = {name: None for name in rb.queries} | {"ttft_p95_seconds": 0.8, "request_rate": 10}
    values |= {t.name: condition_value(t.value) for t in resolve_thresholds(rb, SPEC, {"model": "llm"}, FAULT_TIME)}
    result = judge(rb, {"model": "llm"}, values)
    assert result.condition.holds is None and result.condition.missing == ["ttft_target_seconds"]


@pytest.mark.parametrize("alert, cause", ALL_FINDINGS, ids=lambda x: x)
def test_finding_is_made_when_its_evidence_holds(alert, cause):
    case = FINDINGS[(alert, cause)]
    result = run(alert, values_for(alert, CONDITION[alert].holds, case.holds))
    assert result.condition.holds is not False
    made = {f.cause: f for f in result.findings}
    assert cause in made, (result.findings, result.not_judged)
    # The summary names only values that are there: none left unfilled, none of its condition's shown as missing.
    assert not re.search(r"\{[a-z_]+\}", made[cause].summary), made[cause].summary


@pytest.mark.parametrize("alert, cause", ALL_FINDINGS, ids=lambda x: x)
def test_finding_is_not_made_when_its_condition_is_not_met(alert, cause):
    case = FINDINGS[(alert, cause)]
    values = values_for(alert, CONDITION[alert].holds, case.holds, case.not_met)
    assert judge_condition(finding_of(alert, cause).condition, values) is False
    result = run(alert, values)
    assert cause not in {f.cause for f in result.findings}
    assert cause not in {f.cause for f in result.not_judged}


@pytest.mark.parametrize("alert, cause", ALL_FINDINGS, ids=lambda x: x)
def test_no_finding_is_made_when_the_alert_condition_does_not_hold(alert, cause):
    values = values_for(alert, CONDITION[alert].holds, FINDINGS[(alert, cause)].holds, CONDITION[alert].not_met)
    result = run(alert, values)
    assert result.condition.holds is False
    assert result.findings == [] and result.not_judged == []


@pytest.mark.parametrize("alert, cause", ALL_FINDINGS, ids=lambda x: x)
def test_finding_is_not_made_without_its_evidence_and_the_missing_values_are_named(alert, cause):
    case = FINDINGS[(alert, cause)]
    base = values_for(alert, CONDITION[alert].holds, case.holds)
    if (alert, cause) in ABSENCE_IS_THE_FINDING:
        name, holds_when_missing = ABSENCE_IS_THE_FINDING[(alert, cause)]
        result = run(alert, {**base, name: None})
        assert (cause in {f.cause for f in result.findings}) is holds_when_missing
        assert cause not in {f.cause for f in result.not_judged}
        return
    names = compared(alert, cause)
    assert names, "a finding that compares no evidence must be listed in ABSENCE_IS_THE_FINDING"
    # All of its evidence missing: not made, listed as not judged with every missing value named.
    result = run(alert, {**base, **{n: None for n in names}})
    assert cause not in {f.cause for f in result.findings}
    [entry] = [f for f in result.not_judged if f.cause == cause]
    assert set(entry.missing) <= set(names) and entry.missing
    # Each value missing on its own: still made only through another branch of an `or`; otherwise not judged,
    # naming that value. Never dropped silently.
    for name in names:
        result = run(alert, {**base, name: None})
        if cause in {f.cause for f in result.findings}:
            assert " or " in finding_of(alert, cause).when, f"{cause} made without {name}"
            continue
        [entry] = [f for f in result.not_judged if f.cause == cause]
        assert name in entry.missing


def test_the_issue_examples_as_judged_values():
    """The four reported over-reaches, on values (the same rows run through real Prometheus in test_triage.py)."""
    ttft = run("LlmTtftP95High", values_for("LlmTtftP95High", CONDITION["LlmTtftP95High"].holds,
                                            FINDINGS[("LlmTtftP95High", "slow-after-scheduling")].holds,
                                            {"ttft_p95_seconds": 0.138}))
    assert ttft.condition.holds is False and ttft.findings == []
    assert ttft.condition.summary.startswith("TTFT P95 138 ms; the tier's target is 300 ms")
    queue = run("TritonQueueTimeP95High", values_for(
        "TritonQueueTimeP95High", CONDITION["TritonQueueTimeP95High"].holds,
        FINDINGS[("TritonQueueTimeP95High", "batching-configuration")].holds, {"queue_p95_seconds": 0.005}))
    assert queue.condition.holds is False and queue.findings == []
    assert "5 ms" in queue.condition.summary and "250 ms" in queue.condition.summary
    gpu = run("GpuTemperatureCritical", values_for("GpuTemperatureCritical", {"temperature_celsius": 90,
                                                                              "gpu_util_percent": 20}))
    assert gpu.findings == []
    assert {f.cause: f.missing for f in gpu.not_judged} == {"node-cooling": ["other_gpus_max_celsius"],
                                                            "gpu-cooling": ["other_gpus_max_celsius"]}
    errors = run("TritonModelErrorRatioHigh", values_for(
        "TritonModelErrorRatioHigh", CONDITION["TritonModelErrorRatioHigh"].holds,
        {"backend_per_second": 3, "failures_per_second": 3, "rejected_per_second": 0, "canceled_per_second": 0}))
    assert [f.cause for f in errors.findings] == ["backend-errors"]
    assert [(f.cause, f.missing) for f in errors.not_judged] == [("new-version-errors",
                                                                  ["version_ready_before_fault_seconds"])]
