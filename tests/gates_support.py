"""What decides a canary gate's behaviour outside its controller, for the gate tests: the arguments filled
as each controller fills them, the success/failure condition subset inferwatch.deploy.gates emits evaluated as
Argo Rollouts evaluates it, and an analysis run's phase from its measurements (Argo's assessMetricStatus).

Argo Rollouts v1.9: `{{args.<name>}}` substituted in the query (an unresolved one is an error); a condition
is an `expr` expression over `result` (a vector query gives a list of floats); a measurement is Failed when
the failure condition holds, Successful when the success condition holds, else Inconclusive
(utils/evaluate.EvaluateResult); a metric is Failed once failed measurements exceed `failureLimit`,
Inconclusive once inconclusive ones exceed `inconclusiveLimit`, Successful after `count` measurements.
prometheus-adapter v0.12: `<<.Series>>` and `<<.LabelMatchers>>` in an external rule's metricsQuery.
Flagger v1.44: Go templates `{{ target }}`, `{{ namespace }}`, `{{ interval }}`, `{{ variables.<key> }}`
(missingkey=error); a value outside `thresholdRange` fails the check, no value halts it.
"""

from __future__ import annotations

import re

SUCCESSFUL, FAILED, INCONCLUSIVE, RUNNING, ERROR = "Successful", "Failed", "Inconclusive", "Running", "Error"


def fill_argo(query: str, args: dict[str, str]) -> str:
    """`{{args.name}}` replaced by its value; KeyError naming an argument the template uses and `args` lacks."""
    return re.sub(r"\{\{args\.([A-Za-z0-9_.-]+)\}\}", lambda m: args[m.group(1)], query)


def adapter_query(rule: dict, selector: dict[str, str]) -> str:
    """prometheus-adapter v0.12's query for an HPA's external metric (pkg/naming BuildExternal): `<<.Series>>`
    the discovered series' name, `<<.LabelMatchers>>` the HPA selector's matchers joined by `,` (a rule with
    `namespaced: false` adds no namespace matcher)."""
    series = rule["seriesQuery"].split("{")[0]
    matchers = ",".join(f'{k}="{v}"' for k, v in selector.items())
    return rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)


def fill_flagger(query: str, *, target: str, namespace: str, interval: str, variables: dict[str, str]) -> str:
    """Flagger's template functions replaced; KeyError for a variable not given (Flagger: missingkey=error)."""
    values = {"target": target, "namespace": namespace, "interval": interval}

    def one(m: re.Match) -> str:
        name = m.group(1)
        if name.startswith("variables."):
            return variables[name.removeprefix("variables.")]
        return values[name]

    out = re.sub(r"\{\{ *([a-z]+(?:\.[A-Za-z0-9_]+)?) *\}\}", one, query)
    if "{{" in out:
        raise ValueError(f"unrendered template in {out!r}")
    return out


_CLAUSE = re.compile(r"^(len\(result\)|result\[(\d+)\])\s*(==|!=|<=|>=|<|>)\s*(-?[0-9.]+(?:e-?[0-9]+)?)$")
_OPS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<=": lambda a, b: a <= b,
        ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, ">": lambda a, b: a > b}


def condition(expr: str, result: list[float]) -> bool:
    """The subset inferwatch.deploy.gates emits: clauses `len(result) OP N` or `result[i] OP N` joined by `&&`,
    evaluated left to right with short-circuit as `expr` does. ValueError for anything outside the subset;
    IndexError where `result[i]` is read past the end (Argo: the measurement errors)."""
    for clause in expr.split("&&"):
        m = _CLAUSE.match(clause.strip())
        if not m:
            raise ValueError(f"not in the evaluated subset: {clause.strip()!r}")
        left = len(result) if m.group(1) == "len(result)" else result[int(m.group(2))]
        if not _OPS[m.group(3)](left, float(m.group(4))):
            return False
    return True


def measurement(metric: dict, result: list[float]) -> str:
    """One Argo measurement's phase from a vector query's values (EvaluateResult, both conditions given)."""
    try:
        failed = condition(metric["failureCondition"], result)
        succeeded = condition(metric["successCondition"], result)
    except IndexError:
        return ERROR
    if failed:
        return FAILED
    return SUCCESSFUL if succeeded else INCONCLUSIVE


def run_phase(metric: dict, phases: list[str]) -> str:
    """The metric's phase after `phases` (its measurements so far, in order)."""
    if phases.count(FAILED) > metric.get("failureLimit", 0):
        return FAILED
    if phases.count(INCONCLUSIVE) > metric.get("inconclusiveLimit", 0):
        return INCONCLUSIVE
    if phases.count(ERROR) > metric.get("consecutiveErrorLimit", 4):
        return ERROR
    if len(phases) >= metric.get("count", 1):
        return SUCCESSFUL
    return RUNNING


def flagger_check(metric: dict, values: list[float]) -> str:
    """One Flagger check of a Canary analysis metric: "halt" without a value, else "pass" or "fail" against
    thresholdRange (Flagger reads the first sample)."""
    if not values or values[0] != values[0]:
        return "halt"
    bounds = metric.get("thresholdRange", {})
    if "min" in bounds and values[0] < bounds["min"] or "max" in bounds and values[0] > bounds["max"]:
        return "fail"
    return "pass"
