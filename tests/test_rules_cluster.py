"""Several clusters (spec `cluster`): the generated rules keep the cluster label and pass the rules' own
promtool tests with and without it.

- read with Prometheus' parser (promql-parser, tests/promql_labels.py): where every series carries `cluster`
  (a central store), every branch of every alert and recording rule carries it, except the absent() branch
  that fires when a source is seen in no cluster at all;
- rules/tests/*.yml, unchanged, against rules generated with a cluster name: a Prometheus of one cluster
  (series without the label) alerts exactly as before;
- the same tests rewritten for a central store holding two clusters with the same series (each labelled
  a or b): every expected alert and recorded sample comes once per cluster, labelled with it, and each
  description starts with "Cluster <name>: " — no sum adds the two, no matching joins them;
- an exporter's targets vanishing from one cluster fire its exporter-down alert for that cluster only.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from inferwatch.rules.cluster import keep_label, select
from inferwatch.rules.generate import RULES_DIR, outputs
from inferwatch.rules.names import ALERTS
from inferwatch.spec import spec_from_dict
from promtool_support import promtool_test_files
from rule_labels import alert_rules
from test_rules import TESTS_DIR, promtool

REPO = Path(__file__).resolve().parents[1]
CLUSTERS = ("a", "b")
# Exporter-down alerts whose expected labels name no target come from absent(): no cluster has the source.
ABSENT_FORMS = {"GpuExporterDown", "TritonServerDown", "TritonCollectorDown", "GatewayExporterDown", "NotifierDown"}
# Alerts with an absent() branch besides branches that keep the cluster (every peer's `up` gone).
ABSENT_BRANCHES = ABSENT_FORMS | {"AlertmanagerClusterDegraded"}


def clustered_spec(name: str = "a"):
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    return spec_from_dict({**raw, "cluster": {"name": name}})


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory) -> Path:
    """rules/generated/*.yml as a spec naming cluster `a` generates them, beside a copy of rules/tests."""
    root = tmp_path_factory.mktemp("cluster-rules")
    (root / "generated").mkdir()
    (root / "tests").mkdir()
    for rel, text in outputs(clustered_spec()).items():
        if rel.startswith(RULES_DIR):
            (root / "generated" / Path(rel).name).write_text(text)
    return root


def run_promtool(root: Path, files: dict[str, dict]) -> None:
    for name, data in files.items():
        (root / "tests" / name).write_text(yaml.safe_dump(data, sort_keys=False, width=10**6, allow_unicode=True))
    passed, failed = promtool_test_files(promtool(), list(files), root / "tests")
    assert passed == len(files) and not failed, failed


# ------------------------------------------------------------------------------------------- the rewrite
@pytest.mark.parametrize("expr, kept, selected", [
    ('sum by (model) (rate(x{job="a"}[5m]))\n/ on (model) group_left (node)\ny',
     'sum by (cluster, model) (rate(x{job="a"}[5m]))\n/ on (cluster, model) group_left (node)\ny',
     'sum by (model) (rate(x{c=~"$c", job="a"}[5m]))\n/ on (model) group_left (node)\ny{c=~"$c"}'),
    ("max without (slo_window) (r{tier=\"t\"}) > 1 and ignoring (x) count(z) by (a)",
     "max without (slo_window) (r{tier=\"t\"}) > 1 and ignoring (x) count(z) by (cluster, a)",
     "max without (slo_window) (r{c=~\"$c\", tier=\"t\"}) > 1 and ignoring (x) count(z{c=~\"$c\"}) by (a)"),
    ('changes((max by (gpu) (g{le=~"1|1[.]0"}))[5m:]) > 0 or label_replace(v, "by", "on (x)", "a", "(.+)")',
     'changes((max by (cluster, gpu) (g{le=~"1|1[.]0"}))[5m:]) > 0 or label_replace(v, "by", "on (x)", "a", "(.+)")',
     'changes((max by (gpu) (g{c=~"$c", le=~"1|1[.]0"}))[5m:]) > 0 or label_replace(v{c=~"$c"}, "by", "on (x)", '
     '"a", "(.+)")'),
    ("sum by (cluster, tier) (x offset 1d) and on (cluster) vector(1)",
     "sum by (cluster, tier) (x offset 1d) and on (cluster) vector(1)",
     'sum by (cluster, tier) (x{c=~"$c"} offset 1d) and on (cluster) vector(1)'),
])
def test_the_rewrite_touches_groupings_and_selectors_only(expr, kept, selected):
    assert keep_label(expr, "cluster") == kept
    assert select(expr, 'c=~"$c"') == selected


# ------------------------------------------------------------------------------------ labels, by parser
def test_every_alert_keeps_the_cluster_where_series_carry_it():
    missing = []
    for rule in alert_rules(clustered_spec(), series_labels=("cluster",)):
        for branch in rule.branches:
            absent_only = rule.alert in ABSENT_BRANCHES and "instance" not in branch.possible
            # The heartbeat (vector(1)) reads no series: the cluster reaches it as Prometheus' external label.
            if "cluster" not in branch.guaranteed and not absent_only and rule.alert != "InferwatchHeartbeat":
                missing.append(f"{rule.alert}: {sorted(branch.guaranteed)}")
    assert not missing, "\n".join(missing)


def test_every_recording_rule_keeps_the_cluster_where_series_carry_it():
    from promql_labels import Branch, LabelFlow
    from rule_labels import JOB_OF_PREFIX

    files = outputs(clustered_spec())
    rules = [r for rel, text in files.items() if rel.startswith(RULES_DIR)
             for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "record" in r]
    recorded: dict[str, list] = {}
    for r in rules:
        recorded.setdefault(r["record"], []).append((r.get("labels") or {}, r["expr"]))

    def source(name, equal):  # only the cluster matters here: every raw series carries it
        assert name == "up" or any(name.startswith(p) for p, _ in JOB_OF_PREFIX), name
        return [Branch(frozenset({"cluster"}), frozenset({"cluster"}))]

    flow = LabelFlow(source, recorded)
    lost = [r["record"] for r in rules if any("cluster" not in b.guaranteed for b in flow.branches(r["expr"]))]
    assert not lost


def test_without_a_cluster_name_the_rules_are_unchanged():
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    plain = {k: v for k, v in outputs(spec_from_dict(raw)).items() if k.startswith(RULES_DIR)}
    committed = {k: (REPO / k).read_text() for k in plain}
    assert plain == committed
    # no cluster label in a matcher, a by/on list or a template (names and prose may say "cluster")
    assert not re.search(r'\bcluster\s*(=|!=|=~|!~)|[(,]\s*cluster\s*[,)]|\$labels\.cluster', "".join(plain.values()))


# ------------------------------------------------------------------------------ promtool, one cluster
def _test_files() -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(TESTS_DIR.glob("*.yml"))}


def test_one_cluster_per_prometheus_alerts_as_before(rules_dir):
    """Series without the cluster label (Prometheus adds it on the way out): the unchanged tests pass, every
    description unchanged too (promtool has no external labels, so `$externalLabels.cluster` is empty)."""
    run_promtool(rules_dir, _test_files())


# ----------------------------------------------------------------------------- promtool, central store
_SERIES = re.compile(r"^([^{]*)(?:\{(.*)\})?$", re.S)


def _in_cluster(series: str, cluster: str) -> str:
    name, labels = _SERIES.match(series.strip()).groups()
    return f'{name}{{cluster="{cluster}"{"," + labels if labels else ""}}}'


def _expected_alerts(check: dict) -> list:
    out = []
    for alert in check.get("exp_alerts") or []:
        labels = alert.get("exp_labels") or {}
        # An absent() form names no target: neither its instance nor its node (TritonServerDown's per-replica
        # alerts carry node, triton and pod, no instance).
        if check["alertname"] == "InferwatchHeartbeat" or (
                check["alertname"] in ABSENT_FORMS and "instance" not in labels and "node" not in labels):
            # absent(): the source is missing from every cluster, so from none in particular; the heartbeat
            # (vector(1)) reads no series: one for the store, whatever clusters write to it
            out.append(alert)
            continue
        for cluster in CLUSTERS:
            copy_ = copy.deepcopy(alert)
            copy_["exp_labels"] = {**labels, "cluster": cluster}
            ann = copy_.get("exp_annotations") or {}
            if "description" in ann:
                ann["description"] = f"Cluster {cluster}: {ann['description']}"
            out.append(copy_)
    return out


def central(data: dict) -> dict:
    """A rules/tests file rewritten for a central store holding clusters a and b with the same series."""
    data = copy.deepcopy(data)
    for case in data["tests"]:
        case["input_series"] = [{**s, "series": _in_cluster(s["series"], c)}
                                for s in case.get("input_series", []) for c in CLUSTERS]
        for check in case.get("alert_rule_test", []):
            if check.get("exp_alerts"):
                check["exp_alerts"] = _expected_alerts(check)
        for check in case.get("promql_expr_test", []):
            samples = []
            for sample in check.get("exp_samples") or []:
                for cluster in CLUSTERS:
                    samples.append({**sample, "labels": _in_cluster(sample.get("labels", "{}"), cluster)})
            if check.get("exp_samples") is not None:
                check["exp_samples"] = samples
    return data


def test_a_central_store_with_two_clusters_alerts_once_per_cluster(rules_dir):
    run_promtool(rules_dir, {f"central-{name}": central(data) for name, data in _test_files().items()})


def test_an_exporter_vanishing_from_one_cluster_fires_there_only(rules_dir):
    """Cluster b's GPU exporter (and Triton) targets vanish from the store while cluster a's keep reporting:
    GpuExporterDown and TritonServerDown fire for cluster b, labelled with it, and resolve after the lookback
    (1h); cluster a stays silent."""
    up = {"gpu": 'up{{cluster="{c}",job="inferwatch-gpu",instance="g:9400",node="n"}}',
          "triton": 'up{{cluster="{c}",job="triton",instance="t:8002",node="n",triton="triton-0"}}'}
    inputs = [{"series": up[s].format(c="a"), "values": "1x100"} for s in up]
    inputs += [{"series": up[s].format(c="b"), "values": "1x5 stale"} for s in up]
    info = ALERTS["GpuExporterDown"]
    gpu_b = {"exp_labels": {"cluster": "b", "job": "inferwatch-gpu", "layer": "L1", "severity": "critical"},
             "exp_annotations": {
                 "summary": info.summary, "runbook_url": f"{clustered_spec().runbook_base_url}GpuExporterDown.md",
                 "description": "Cluster b: Prometheus cannot scrape the GPU exporter (job inferwatch-gpu): its "
                                "alerts cannot fire while it is down."}}
    triton_b = {"exp_labels": {"cluster": "b", "job": "triton", "layer": "L2", "severity": "critical"},
                "exp_annotations": {
                    "summary": ALERTS["TritonServerDown"].summary,
                    "runbook_url": f"{clustered_spec().runbook_base_url}TritonServerDown.md",
                    "description": "Cluster b: Triton (every target of job triton) does not answer (metrics endpoint "
                                   "down or liveness failing): every model it serves is unavailable."}}
    data = {"rule_files": ["../generated/gpu.yml", "../generated/triton.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": [
                {"eval_time": "8m", "alertname": "GpuExporterDown"},  # inside `for` (5m)
                {"eval_time": "12m", "alertname": "GpuExporterDown", "exp_alerts": [gpu_b]},
                {"eval_time": "12m", "alertname": "TritonServerDown", "exp_alerts": [triton_b]},
                {"eval_time": "70m", "alertname": "GpuExporterDown"},  # the lookback has passed
            ]}]}
    run_promtool(rules_dir, {"vanished.yml": data})
