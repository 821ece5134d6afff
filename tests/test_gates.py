"""deploy/kubernetes/gates/: the canary gates and scaler `inferwatch generate` writes, validated offline
against the Argo Rollouts, Flagger and KEDA CRD schemas (tests/fixtures/gates/crds, see update_crd_schemas.py
there); their queries read only the alerts' recording rules and parse in promtool; one spec change moves the
alert and every gate together; and the condition evaluator the behaviour test relies on (gates_support.py)
is checked against a table here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gates_support import (
    ERROR,
    FAILED,
    INCONCLUSIVE,
    RUNNING,
    SUCCESSFUL,
    adapter_query,
    condition,
    fill_argo,
    fill_flagger,
    flagger_check,
    measurement,
    run_phase,
)
from inferwatch.deploy.gates import generate as ggen
from inferwatch.deploy.gates import objects
from inferwatch.rules.generate import outputs as rules_outputs
from inferwatch.rules.generate import rule_groups
from inferwatch.rules.metricrefs import metric_names
from inferwatch.rules.model import Alert, Recording
from inferwatch.spec import SpecError, spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ggen.OUT_DIR
CRDS = ROOT / "tests/fixtures/gates/crds"
KINDS = {"AnalysisTemplate", "MetricTemplate", "ScaledObject", "HorizontalPodAutoscaler"}
COMPONENTS = ("kustomization.yaml", "keda/kustomization.yaml", "hpa/kustomization.yaml")


def _raw() -> dict:
    return yaml.safe_load((ROOT / "inferwatch.yaml").read_text())


def _docs(files: dict[str, str]) -> list[dict]:
    """Every object of every component, in their order."""
    out = []
    for kustomization in (c for c in COMPONENTS if c in files):
        folder = kustomization.removesuffix("kustomization.yaml")
        for name in yaml.safe_load(files[kustomization])["resources"]:
            out += [d for d in yaml.safe_load_all(files[folder + name]) if d]
    return out


def _gate_files(spec) -> dict[str, str]:
    """The component for `spec` as on disk (its generator alone: `render_all` runs every generator)."""
    return {rel.removeprefix(ggen.OUT_DIR + "/"): text for rel, text in ggen.outputs(spec).items()}


def committed() -> dict[str, str]:
    return {str(p.relative_to(OUT)): p.read_text(encoding="utf-8") for p in OUT.rglob("*.yaml")}


def schema_of(doc: dict) -> dict:
    return json.loads((CRDS / f"{doc['kind'].lower()}-{doc['apiVersion'].split('/')[-1]}.json").read_text())


def errors_of(doc: dict, schema: dict | None = None) -> list[str]:
    if doc["kind"] == "HorizontalPodAutoscaler":
        try:
            kubernetes_validate.validate(doc, "1.37", strict=True)
        except kubernetes_validate.ValidationError as exc:
            return [f"{list(exc.path)}: {exc.message}"]
        return []
    validator = jsonschema.Draft202012Validator(schema or schema_of(doc))
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(doc)]


def analysis_errors(block: dict) -> list[str]:
    """The Canary snippet's `analysis` against the Canary CRD's spec.analysis schema."""
    schema = json.loads((CRDS / "canary-v1beta1.json").read_text())["properties"]["spec"]["properties"]["analysis"]
    return [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft202012Validator(schema).iter_errors(block)]


def gate_queries(files: dict[str, str]) -> dict[str, str]:
    """{object/metric: query} of every gate and trigger."""
    out = {}
    for doc in _docs(files):
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "AnalysisTemplate":
            out |= {f"{name}/{m['name']}": m["provider"]["prometheus"]["query"] for m in doc["spec"]["metrics"]}
        elif doc["kind"] == "MetricTemplate":
            out[name] = doc["spec"]["query"]
        elif doc["kind"] == "ScaledObject":
            out |= {f"{name}/{t['name']}": t["metadata"]["query"] for t in doc["spec"]["triggers"]}
    if ggen.ADAPTER_CONFIG in files:
        for rule in yaml.safe_load(files[ggen.ADAPTER_CONFIG])["externalRules"]:
            out[f"adapter/{rule['name']['as']}"] = adapter_query(rule, {"model": "classifier"})
    return out


# -------------------------------------------------------------------------------------------- freshness
def test_committed_gates_are_what_the_spec_generates():
    files = _gate_files(spec_from_dict(_raw()))
    assert set(files) == set(committed()), "run `inferwatch generate`"
    for name, text in files.items():
        assert committed()[name] == text, f"{ggen.OUT_DIR}/{name} is stale: run `inferwatch generate`"


def test_each_component_lists_every_object_file_of_its_folder():
    files = committed()
    assert set(COMPONENTS) <= set(files)
    not_resources = {ggen.ANALYSIS_SNIPPET, ggen.ADAPTER_CONFIG}
    for kustomization in COMPONENTS:
        component = yaml.safe_load(files[kustomization])
        assert component["kind"] == "Component" and component["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
        folder = kustomization.removesuffix("kustomization.yaml")
        here = {n.removeprefix(folder) for n in files
                if n.startswith(folder) and "/" not in n.removeprefix(folder)} - {"kustomization.yaml"}
        assert set(component["resources"]) == here - {n.removeprefix(folder) for n in not_resources}, kustomization


# ---------------------------------------------------------------------------------------------- schemas
def test_every_object_validates_against_its_crd():
    docs = _docs(committed())
    assert {d["kind"] for d in docs} == KINDS
    assert len(docs) == 6  # two AnalysisTemplates, two MetricTemplates, one ScaledObject, one HPA
    for doc in docs:
        assert errors_of(doc) == [], f"{doc['kind']}/{doc['metadata']['name']}"
    snippet = yaml.safe_load(committed()[ggen.ANALYSIS_SNIPPET])
    assert analysis_errors(snippet["analysis"]) == []


@pytest.mark.parametrize("kind,path,field", [
    ("AnalysisTemplate", ["spec", "metrics", 0], "failureLimits"),
    ("AnalysisTemplate", ["spec", "metrics", 0, "provider", "prometheus"], "adress"),
    ("MetricTemplate", ["spec", "provider"], "adress"),
    ("ScaledObject", ["spec", "triggers", 0], "metadataa"),
    ("ScaledObject", ["spec"], "maxReplicas"),
    ("HorizontalPodAutoscaler", ["spec", "metrics", 0, "external"], "metricName"),
])
def test_a_misspelt_field_fails_validation(kind, path, field):
    """The schemas are strict: an unknown field fails (so the validation above can fail)."""
    doc = next(d for d in _docs(committed()) if d["kind"] == kind)
    node = doc
    for key in path:
        node = node[key]
    node[field] = node.get(field, "x") or "x"
    assert any(field in e for e in errors_of(doc)), field


def test_a_misspelt_analysis_field_fails_validation():
    block = objects.canary_analysis(spec_from_dict(_raw()))
    block["metrics"][0]["thresholdRnage"] = {"max": 0}
    assert analysis_errors(block)


# ------------------------------------------------------------------------------------------ the queries
def test_queries_read_only_the_alerts_recording_rules():
    """Never a second copy of the PromQL: every series a gate selects is a recording rule that an alert of the
    same spec reads; every series a trigger selects is one its alert reads (the queue time's recording rule,
    the pending requests' gauge, which TritonPendingRequestsHigh reads with the same selector)."""
    spec = spec_from_dict(_raw())
    groups = [g for area in rule_groups(spec).values() for g in area]
    recorded = {r.record for g in groups for r in g.rules if isinstance(r, Recording)}
    alerts = {}
    for g in groups:
        for r in g.rules:
            if isinstance(r, Alert):
                alerts.setdefault(r.alert, set()).update(metric_names(r.expr))
    queries = gate_queries(_gate_files(spec))
    # 2 templates x 2 signals, 2 MetricTemplates, 2 triggers x 3 models, 2 adapter rules
    assert len(queries) == 2 * 2 + 2 + 2 * 3 + 2
    for name, query in queries.items():
        names = metric_names(query)
        if "/queue-p95-" in name or name == "adapter/inferwatch_triton_queue_p95_seconds":
            assert names <= recorded & alerts["TritonQueueTimeP95High"], (name, names)
        elif "/pending-" in name or name == "adapter/inferwatch_triton_pending_requests":
            assert names == {"nv_inference_pending_request_count"} <= alerts["TritonPendingRequestsHigh"], name
        else:
            assert names and names <= recorded & alerts["TritonCanaryRegression"], (name, names)


def _filled(name: str, query: str) -> str:
    if name.startswith("AnalysisTemplate/"):
        return fill_argo(query, {"model": "classifier", "canary-version": "2", "stable-version": "1",
                                 "canary-hash": "6d4f5b8c7", "stable-hash": "58c9d7f6b4"})
    return fill_flagger(query, target="triton", namespace="triton", interval="1m",
                        variables={"model": "classifier"})


def test_filled_queries_parse_in_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.fail("promtool not found; install it with: apt-get install -y prometheus", pytrace=False)
    queries = gate_queries(_gate_files(spec_from_dict(_raw())))
    rules = [{"record": f"gate:check_{i}:value", "expr": _filled(name, q)}
             for i, (name, q) in enumerate(queries.items())]
    for rule in rules:
        assert "{{" not in rule["expr"], rule
    path = tmp_path / "gates.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "gates", "rules": rules}]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(rules)} rules found" in done.stdout


# One spec change, the alert and every gate: (spec override in layers.L2 or gates, text the alert shows,
# text every gate shows) with the default's texts as the first row's opposite.
@pytest.mark.parametrize("change,alert_text,gate_text,gone", [
    ({"layers": {"L2": {"canary_regression_ratio": 0.02}}}, "1.02 * (", "1.02 * (", "1.05"),
    ({"layers": {"L2": {"min_request_rate": 0.5}}}, "> 0.5", "> 0.5\n", "> 0.1\n"),
    ({"layers": {"L2": {"canary_min_error_ratio_delta": 0.01}}}, ") + 0.01\n", ") + 0.01\n", ") + 0.001\n"),
])
def test_one_spec_change_moves_the_alert_and_every_gate(change, alert_text, gate_text, gone):
    raw = _raw()
    for section, values in change.items():
        for key, sub in values.items():
            raw.setdefault(section, {}).setdefault(key, {}).update(sub)
    before, after = spec_from_dict(_raw()), spec_from_dict(raw)
    alert_before = rules_outputs(before)["rules/generated/triton.yml"]
    alert_after = rules_outputs(after)["rules/generated/triton.yml"]
    canary = [r for g in yaml.safe_load(alert_after)["groups"] for r in g["rules"]
              if r.get("alert") == "TritonCanaryRegression"]
    assert canary and any(alert_text in r["expr"] for r in canary)
    assert alert_after != alert_before
    gates = {n: q for n, q in gate_queries(_gate_files(after)).items() if "Template/" in n}
    old = {n: q for n, q in gate_queries(_gate_files(before)).items() if "Template/" in n}
    assert len(gates) == 6
    for name, query in gates.items():
        is_error_gate = "error-ratio" in name
        if "+ 0.0" in alert_text and not is_error_gate:
            continue  # the absolute margin is the error ratio's alone (the latency gate has none, as the alert)
        assert gate_text in query, name
        assert gone not in query, name
        assert query != old[name], name


def test_the_example_canary_limit_5_to_2_percent_in_one_generate(tmp_path):
    """The issue's example, through the CLI: one `inferwatch generate` with the limit at 2 % rewrites the alert
    and every gate file."""
    raw = _raw()
    assert raw["layers"]["L2"]["canary_regression_ratio"] == 0.05  # the example spec's 5 %
    raw["layers"]["L2"]["canary_regression_ratio"] = 0.02
    spec_path = tmp_path / "inferwatch.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "inferwatch", "generate", "--spec", str(spec_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    written = {p.name: p.read_text() for p in (out / ggen.OUT_DIR).glob("*.yaml")}
    assert "1.02 * (" in (out / "rules/generated/triton.yml").read_text()
    for name in ("argo-analysistemplates.yaml", "flagger-metrictemplates.yaml"):
        assert written[name].count("1.02 * (") == 4 if name.startswith("argo") else 2, name
        assert "1.05" not in written[name]


# ------------------------------------------------------------------------------- the condition evaluator
SPEC_METRIC = objects.analysis_template(spec_from_dict(_raw()), "versions")["spec"]["metrics"][0]


@pytest.mark.parametrize("result,phase", [
    ([0.199], FAILED),           # the bad canary: 20 % errors over a healthy stable
    ([1e-9], FAILED),
    ([0.0], SUCCESSFUL),         # at the limit: not worse
    ([-0.21], SUCCESSFUL),       # the reverse: healthy canary, failing stable
    ([], INCONCLUSIVE),          # too little traffic: no sample
    ([0.1, -0.1], INCONCLUSIVE),  # never emitted (the query sums to one sample); neither condition holds
    ([float("nan")], INCONCLUSIVE),
])
def test_generated_conditions_give_argo_phases(result, phase):
    assert measurement(SPEC_METRIC, result) == phase


@pytest.mark.parametrize("expr,result,expected", [
    ("len(result) == 1 && result[0] <= 0", [0.0], True),
    ("len(result) == 1 && result[0] <= 0", [], False),   # short-circuit: result[0] never read
    ("result[0] > 0.5", [0.7], True),
    ("result[0] >= 1e-3", [0.0005], False),
    ("len(result) != 0", [], False),
])
def test_condition_evaluator(expr, result, expected):
    assert condition(expr, result) is expected


@pytest.mark.parametrize("expr", ["result[0] > 0 || true", "isNaN(result[0])", "result > 0"])
def test_condition_evaluator_refuses_what_it_does_not_know(expr):
    with pytest.raises(ValueError):
        condition(expr, [1.0])


def test_reading_past_the_result_is_an_error_measurement():
    assert measurement({"successCondition": "result[0] <= 0", "failureCondition": "result[0] > 0"}, []) == ERROR


@pytest.mark.parametrize("phases,expected", [
    ([FAILED], RUNNING),                           # failureLimit 1: one failure tolerated
    ([FAILED, FAILED], FAILED),                    # the second: rolled back
    ([SUCCESSFUL, FAILED, SUCCESSFUL, FAILED], FAILED),
    ([SUCCESSFUL] * 4, RUNNING),
    ([SUCCESSFUL] * 5, SUCCESSFUL),                # count 5 reached
    ([SUCCESSFUL, FAILED, SUCCESSFUL, SUCCESSFUL, SUCCESSFUL], SUCCESSFUL),
    ([INCONCLUSIVE] * 2, RUNNING),                 # inconclusiveLimit 2
    ([INCONCLUSIVE] * 3, INCONCLUSIVE),
])
def test_run_phase_follows_the_generated_limits(phases, expected):
    assert (SPEC_METRIC["failureLimit"], SPEC_METRIC["inconclusiveLimit"], SPEC_METRIC["count"]) == (1, 2, 5)
    assert run_phase(SPEC_METRIC, phases) == expected


def test_fill_refuses_a_missing_argument():
    with pytest.raises(KeyError):
        fill_argo('x{model="{{args.model}}"}', {})
    with pytest.raises(KeyError):
        fill_flagger('x{model="{{ variables.model }}"}', target="t", namespace="n", interval="1m", variables={})


@pytest.mark.parametrize("values,expected", [([0.2], "fail"), ([0.0], "pass"), ([-0.2], "pass"), ([], "halt"),
                                             ([float("nan")], "halt")])
def test_flagger_check_of_the_generated_threshold(values, expected):
    metric = objects.canary_analysis(spec_from_dict(_raw()))["metrics"][0]
    assert flagger_check(metric, values) == expected


# ------------------------------------------------------------------------------------- other spec shapes
@pytest.mark.parametrize("gates,field,says", [
    ({"count": 0}, "gates.count", "positive"),
    ({"failure_limit": 5}, "gates.failure_limit", "less than count (5)"),
    ({"inconclusive_limit": -1}, "gates.inconclusive_limit", "non-negative"),
    ({"activation_ratio": 0}, "gates.activation_ratio", "(0, 1]"),
    ({"activation_ratio": 1.5}, "gates.activation_ratio", "(0, 1]"),
    ({"namespace": "Bad_NS!"}, "gates.namespace", "expected a Kubernetes name"),
    ({"deployment": "triton server"}, "gates.deployment", "expected a Kubernetes name"),
    ({"min_replicas": 3, "max_replicas": 2}, "gates.max_replicas", "at least min_replicas (3)"),
    ({"interval": "0s"}, "gates.interval", "positive duration"),
    ({"interval": "soon"}, "gates.interval", "duration"),
])
def test_a_bad_gates_section_is_refused_naming_the_field(gates, field, says):
    with pytest.raises(SpecError) as err:
        spec_from_dict({**_raw(), "gates": gates}, "my.yaml")
    assert field in str(err.value) and says in str(err.value), str(err.value)


def test_with_a_cluster_every_query_reads_that_cluster_only():
    """Several clusters in one store (central_store): a gate of cluster eu-1 never mixes in another's pods."""
    spec = spec_from_dict({**_raw(), "cluster": {"name": "eu-1"},
                           "central_store": {"url": "http://vm:8428", "edge": "vmagent"}})
    files = _gate_files(spec)
    queries = gate_queries(files)
    assert len(queries) == 14
    for name, query in queries.items():
        selectors = re.findall(r"[a-z_:]+\{([^{}]*(?:\{\{[^}]*\}\}[^{}]*)*)\}", query)
        assert selectors and all('cluster="eu-1"' in s.split(", ") for s in selectors), (name, selectors)
    for doc in _docs(files):
        assert errors_of(doc) == [], f"{doc['kind']}/{doc['metadata']['name']}"


def test_without_a_triton_model_there_is_no_scaler():
    # The example's prices name its models; a spec without models prices none.
    raw = {**{k: v for k, v in _raw().items() if k != "billing"}, "models": []}
    files = _gate_files(spec_from_dict(raw))
    assert not {n for n in files if n.startswith(("keda/", "hpa/"))}
    assert yaml.safe_load(files["kustomization.yaml"])["resources"] == ["argo-analysistemplates.yaml",
                                                                         "flagger-metrictemplates.yaml"]


def test_gates_settings_reach_every_controller_object():
    raw = {**_raw(), "gates": {"interval": "30s", "count": 8, "failure_limit": 2, "inconclusive_limit": 3,
                               "namespace": "serving", "deployment": "triton-server", "min_replicas": 2,
                               "max_replicas": 6, "activation_ratio": 0.25}}
    spec = spec_from_dict(raw)
    docs = _docs(_gate_files(spec))
    for doc in docs:
        assert doc["metadata"]["namespace"] == "serving"
        assert errors_of(doc) == []
    for template in (d for d in docs if d["kind"] == "AnalysisTemplate"):
        for m in template["spec"]["metrics"]:
            assert (m["interval"], m["count"], m["failureLimit"], m["inconclusiveLimit"]) == ("30s", 8, 2, 3)
    analysis = objects.canary_analysis(spec)
    assert (analysis["interval"], analysis["threshold"], analysis["iterations"]) == ("30s", 3, 8)
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "triton-server"
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "triton-server"
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (2, 6)
    classifier = next(t for t in scaled["spec"]["triggers"] if t["name"] == "queue-p95-classifier")
    # classifier's own queue_p95_seconds (layers.L2.models) is the threshold, as in TritonQueueTimeP95High
    override = spec.layers.L2.models["classifier"].queue_p95_seconds
    assert float(classifier["metadata"]["threshold"]) == override
    assert float(classifier["metadata"]["activationThreshold"]) == pytest.approx(override * 0.25)


@pytest.mark.parametrize("scaler", ["keda", "hpa"])
def test_an_overlay_opts_into_the_components_with_kustomize(tmp_path, scaler):
    """`components: [.../gates, .../gates/<scaler>]` beside the base, as docs/canary-gates.md says: kustomize
    renders the base and every object of both components as written."""
    from test_kubernetes import BASE, render

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, overlay)],
        "components": [os.path.relpath(OUT, overlay), os.path.relpath(OUT / scaler, overlay)]}))
    rendered = render(overlay)
    files = committed()
    chosen = {k: v for k, v in files.items() if k in ("kustomization.yaml", f"{scaler}/kustomization.yaml")
              or not k.endswith("kustomization.yaml")}
    gates = _docs(chosen)
    assert {d["kind"] for d in gates} == KINDS - {"ScaledObject" if scaler == "hpa" else "HorizontalPodAutoscaler"}
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    by_key = {key(d): d for d in rendered}
    for doc in gates:
        assert by_key.get(key(doc)) == doc, key(doc)
    assert len(rendered) == len(render(BASE)) + len(gates)


@pytest.mark.parametrize("interval, written", [
    ("1m", "1m"), ("30s", "30s"), ("90s", "1m30s"), ("1h", "1h"), ("1d", "24h"),
    ("100000h", "100000h"),  # a new user's value: Prometheus' own form, 4166d16h, is no Go duration
    ("1500ms", "1s500ms"),
])
def test_gate_intervals_are_written_as_go_durations(interval, written):
    from inferwatch.deploy.gates.objects import go_duration
    from inferwatch.spec import Duration

    assert go_duration(Duration.parse(interval)) == written
