"""The registry's label facts (`ALERTS[...].labels` and `.scope`) are what the generated rule files produce:
read from each alert's PromQL, per branch of its expression (tests/promql_labels.py), with the scrape labels
of the generated prometheus.yml. Inhibition and `inferwatch check` rely on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.rules.names import ALERTS, alert_label_names
from inferwatch.spec import load_spec
from promql_labels import Branch, LabelFlow
from rule_labels import alert_rules

REPO = Path(__file__).resolve().parents[1]
RULE_LABELS = {"layer", "severity"}


@pytest.fixture(scope="module")
def inferred() -> dict[str, list[Branch]]:
    out: dict[str, list[Branch]] = {}
    for rule in alert_rules(load_spec(REPO / "inferwatch.yaml")):
        out.setdefault(rule.alert, []).extend(rule.branches)
    return out


def test_every_registered_alert_is_in_the_rule_files(inferred):
    assert set(inferred) == set(ALERTS)


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_registry_labels_and_scope_are_what_the_rules_produce(inferred, name):
    branches = inferred[name]
    possible = set().union(*(b.possible for b in branches)) - RULE_LABELS
    always = set.intersection(*(set(b.guaranteed) for b in branches)) - RULE_LABELS
    assert set(ALERTS[name].labels) == possible, f"{name}: labels the rules may produce"
    assert set(ALERTS[name].scope) == always, f"{name}: labels every branch of the rule carries"


def test_scope_is_what_absent_leaves(inferred):
    # `up{job="triton"} == 0` names the server and node; `absent(up{job="triton"})` carries only `job`.
    branches = inferred["TritonServerDown"]
    assert {"node", "triton"} <= set(branches[0].guaranteed)
    assert branches[-1].guaranteed == frozenset({"job", "layer", "severity"})
    # Reduced to the replica whichever source saw it, no branch but absent's keeps `job`: nothing is on all.
    assert "job" not in branches[0].guaranteed
    assert ALERTS["TritonServerDown"].scope == ()
    assert "node" not in ALERTS["LlmTtftP95High"].labels  # gateway alerts aggregate across gateways


def _flow() -> LabelFlow:
    def source(name, equal):
        return [Branch(frozenset({"job", "node", "a", "b"}), frozenset({"job", "node", "a", "b", "mig"}))]

    return LabelFlow(source, {"rec:x": [({"slo_window": "5m"}, "sum by (a) (x)"), ({"slo_window": "1h"}, "sum(x)")]})


@pytest.mark.parametrize("expr, guaranteed", [
    ("x", [{"job", "node", "a", "b"}]),
    ('x{c="1"}', [{"job", "node", "a", "b", "c"}]),
    ('x{c=~".*"}', [{"job", "node", "a", "b"}]),           # may be empty: not guaranteed
    ('absent(x{job="j", c!="v"})', [{"job"}]),
    ("sum by (a, z) (rate(x[5m]))", [{"a"}]),                # z never existed
    ("sum without (a) (x)", [{"job", "node", "b"}]),
    ("sum(x) > 3", [set()]),
    ("x / on (a) y", [{"a"}]),                               # one-to-one `on` keeps only those labels
    ("x / ignoring (b) y", [{"job", "node", "a"}]),
    ("sum by (a) (x) > on (a) group_left (node) x", [{"a", "node"}]),
    ("x or absent(y{job=\"j\"})", [{"job", "node", "a", "b"}, {"job"}]),
    ("x and on (a) y", [{"job", "node", "a", "b"}]),
    ('max without (slo_window) (rec:x{slo_window="5m"})', [{"a"}]),
    ("rec:x", [{"a", "slo_window"}, {"slo_window"}]),
    ("histogram_quantile(0.9, sum by (a, le) (rate(x[5m])))", [{"a"}]),
    ("topk by (a) (1, x)", [{"job", "node", "a", "b"}]),
])
def test_label_flow_follows_the_prometheus_engine(expr, guaranteed):
    assert [set(b.guaranteed) for b in _flow().branches(expr)] == guaranteed


def test_label_names_known_to_check_include_every_produced_label(inferred):
    produced = set().union(*(b.possible for bs in inferred.values() for b in bs))
    assert produced | {"alertname"} == alert_label_names()
