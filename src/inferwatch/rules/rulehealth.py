"""The generated rule groups watching their own evaluation: a group whose rules fail to evaluate records nothing
and alerts on nothing, silently (a many-to-many match, a query over a limit, a timeout). Prometheus counts
each failed rule evaluation in `prometheus_rule_evaluation_failures_total{rule_group="<file>;<group>"}` (its
rule manager's metrics), scraped from Prometheus' own /metrics (spec `selectors.prometheus`).

PrometheusRuleEvaluationFailing: failures of a generated group (names `inferwatch-*`) in every rate window
for the rate window plus L1's `for`, so one transient failure (a query timeout) never pages, while a rule
that fails at each evaluation does within minutes; layer L1 (the platform owner's phone) with
`component: alerting`, like the other alerts about the alerting path. Identity: the Prometheus
(`instance`) and the group (`rule_group`). A central store evaluating the rules with vmalert counts failures
in vmalert's own metrics instead, which this rule does not read.
"""

from __future__ import annotations

from inferwatch.rules.model import Alert, Group
from inferwatch.spec import Duration, Spec

LABELS = {"component": "alerting"}
# Every generated group's name starts so (rules/*.py); rule_group is "<rule file path>;<group name>".
GENERATED_GROUPS = 'rule_group=~".*;inferwatch-.*"'


def groups(spec: Spec) -> list[Group]:
    prometheus = spec.selectors.of("prometheus")
    window = str(spec.prometheus.rate_window)
    failures = prometheus("prometheus_rule_evaluation_failures_total", GENERATED_GROUPS)
    return [Group("inferwatch-rulehealth.alerts", [
        Alert("PrometheusRuleEvaluationFailing",
              f"sum by (instance, rule_group) (increase({failures}[{window}])) > 0",
              Duration(spec.prometheus.rate_window.ms + spec.layers.L1.for_.ms), "critical",
              f"Rule group {{{{ $labels.rule_group }}}} on Prometheus {{{{ $labels.instance }}}} failed "
              f"{{{{ $value | printf \"%.0f\" }}}} rule evaluations over the last {window}: the rules that failed "
              f"record nothing and the alerts reading them cannot fire. Prometheus' log names the rule and the "
              f"error (e.g. many-to-many matching).",
              labels=dict(LABELS)),
    ])]
