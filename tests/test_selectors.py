"""Selectors in one place: the spec's `selectors` section (inferwatch/selectors.py) is parsed as Prometheus parses
label matchers, and every query inferwatch generates or runs selects a source's series with that source's
selector: rules (expressions and the queries their annotations run), dashboards (panels and variables), and
the runbooks' evidence queries as triage runs them. Checked with the defaults and with selectors as the
Prometheus Operator writes them, by walking each query's PromQL tree (promql-parser, a port of Prometheus'
own parser)."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import promql_parser as pp
import pytest
import yaml

from inferwatch.dashboards.generate import dashboards
from inferwatch.deploy.central import WATCH_SOURCES, watch_jobs
from inferwatch.deploy.prometheus import prometheus_config, scrape_jobs, unmatched_selectors
from inferwatch.rules.generate import PROMETHEUS_RULE, RULES_DIR, outputs
from inferwatch.rules.metricrefs import template_queries
from inferwatch.selectors import (
    DEFAULT_JOBS,
    DEFAULT_SELECTORS,
    SCRAPE_SERIES,
    SOURCES,
    Matcher,
    SelectorError,
    parse,
    source_of,
)
from inferwatch.spec import PrometheusReplica, Spec, SpecError, spec_from_dict
from inferwatch.triage.engine import triage_alert
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.sources import QueryResult
from selector_support import OPERATOR, spec_with
from test_rules import promtool

SELECTOR_SETS = {"default": None, "operator": OPERATOR}
_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}
# Series every process of a client library exposes (Go's and Python's process and runtime collectors,
# Prometheus' dialer): like `up`, they need some source's selector.
PROCESS_SERIES = ("process_", "go_", "net_conntrack_")


@pytest.fixture(scope="module", params=list(SELECTOR_SETS))
def spec(request) -> Spec:
    return spec_with(SELECTOR_SETS[request.param])


# ------------------------------------------------------------------------------------------------ parsing
def _theirs(text: str) -> list[tuple[str, str, str]]:
    body = text.strip()
    body = body if body.startswith("{") else "{" + body + "}"
    return [(m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value) for m in pp.parse(body).matchers.matchers]


@pytest.mark.parametrize("text, expected", [
    ('job="inferwatch-gpu"', [("job", "=", "inferwatch-gpu")]),
    ('job="gpu-operator/nvidia-dcgm-exporter"', [("job", "=", "gpu-operator/nvidia-dcgm-exporter")]),
    ('namespace="triton", service="triton-metrics"',
     [("namespace", "=", "triton"), ("service", "=", "triton-metrics")]),
    ('{job="nvidia-dcgm-exporter"}', [("job", "=", "nvidia-dcgm-exporter")]),
    ("job='single', service!=\"\"", [("job", "=", "single"), ("service", "!=", "")]),
    ('job=~"dcgm.*|gpu" ,namespace!~"kube-.*",', [("job", "=~", "dcgm.*|gpu"), ("namespace", "!~", "kube-.*")]),
    (r'job="a\"b\\c\n"', [("job", "=", 'a"b\\c\n')]),
    (r'job="\x41\u00e9\101"', [("job", "=", "AéA")]),
])
def test_selectors_parse_as_prometheus_parses_them(text, expected):
    selector = parse(text)
    got = [(m.name, m.op, m.value) for m in selector.matchers]
    assert got == expected
    assert got == _theirs(text)
    assert parse(str(selector)) == selector  # what the generators write reads back the same


def test_a_backtick_string_is_raw():
    assert parse(r"job=`a\d`").matchers == (Matcher("job", "=", r"a\d"),)


@pytest.mark.parametrize("text, words", [
    ("", "at least one matcher"),
    ("job", "expected one of = != =~ !~"),
    ("job=inferwatch-gpu", "expected a quoted string"),
    ('job="inferwatch-gpu', "is not closed"),
    ('job="a" service="b"', "expected ','"),
    ('job=~"("', "not a regular expression"),
    ('__name__="up"', "reserved"),
    ('job=~".*"', "every source's"),
    ('job!="triton"', "every source's"),
    (r'job="a\q"', "unknown escape sequence"),
])
def test_a_bad_selector_is_refused_naming_the_field(text, words):
    with pytest.raises(SelectorError, match=re.escape(words)):
        parse(text)
    with pytest.raises(SpecError) as exc:
        spec_from_dict({"selectors": {"gpu": text}})
    assert exc.value.path == "selectors.gpu" and words in str(exc.value)


def test_two_sources_with_one_selector_are_refused():
    with pytest.raises(SpecError, match="selects the same series as selectors.gpu") as exc:
        spec_from_dict({"selectors": {"gpu": 'job="x"', "gateway": ' job = "x" '}})
    assert exc.value.path == "selectors.gateway"


def test_the_engine_selector_may_be_triton_s():
    # A fleet whose engines are all Triton backends: the engines' families are told apart by name.
    spec = spec_from_dict({"selectors": {"triton": 'namespace="triton", service="triton-metrics"',
                                         "engine": 'namespace="triton", service="triton-metrics"'}})
    assert spec.selectors.of("engine") == spec.selectors.of("triton")


def test_defaults_are_the_generated_jobs():
    spec = Spec()
    assert {s: str(spec.selectors.of(s)) for s in SOURCES} == {**{s: f'job="{j}"' for s, j in DEFAULT_JOBS.items()},
                                                              **DEFAULT_SELECTORS}


# The engines' families: on Triton's port (its generated job, the operator's job after Triton's Service) or a
# vLLM server under its own job (a ServiceMonitor's job is its Service's name); other jobs are not engines.
@pytest.mark.parametrize("job, picked", [
    ("triton", True), ("triton-metrics", True), ("vllm", True), ("vllm-llama-3-8b", True),
    ("inferwatch-triton", False), ("inferwatch-gateway", False), ("federate", False), ("my-vllm", False),
])
def test_the_engine_default_picks_triton_and_vllm_jobs(job, picked):
    assert Spec().selectors.of("engine").matches({"job": job, "instance": "x:1"}) is picked


@pytest.mark.parametrize("metric, source", [
    ("nv_trt_llm_kv_cache_block_metrics", "engine"), ("vllm:kv_cache_usage_perc", "engine"),
    ("vllm:gpu_cache_usage_perc", "engine"), ("nv_inference_count", "triton"), ("nv_gpu_utilization", "triton"),
    ("inferwatch_triton_model_ready", "triton_collector"), ("model_version:engine_kv_cache_used:ratio", None),
])
def test_a_series_belongs_to_the_source_of_its_longest_prefix(metric, source):
    assert source_of(metric) == source


# ---------------------------------------------------------------------------------- every query, selected
def vector_selectors(node) -> list:
    """Every VectorSelector of a PromQL tree (inside matrices, subqueries, calls, aggregations, operations)."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        return [node]
    if kind == "MatrixSelector":
        return [node.vector_selector]
    if kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
        return vector_selectors(node.expr)
    if kind == "Call":
        return [v for arg in node.args for v in vector_selectors(arg)]
    if kind == "AggregateExpr":
        return vector_selectors(node.expr) + (vector_selectors(node.param) if node.param is not None else [])
    if kind == "BinaryExpr":
        return vector_selectors(node.lhs) + vector_selectors(node.rhs)
    if kind in ("NumberLiteral", "StringLiteral"):
        return []
    raise AssertionError(f"unknown PromQL node {kind}")


def unselected(expr: str, spec: Spec) -> list[str]:
    """'<metric>: ...' for every selector in `expr` of a source's series that lacks one of the source's
    matchers; Prometheus' own per-target series (`up`, `scrape_*`) and per-process ones (PROCESS_SERIES) need
    some source's."""
    problems = []
    wanted = {s: set(spec.selectors.of(s).matchers) for s in SOURCES}
    for vs in vector_selectors(pp.parse(expr)):
        have = {Matcher(m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value) for m in vs.matchers.matchers}
        name = vs.name or ""
        if name == "up" or name.startswith((SCRAPE_SERIES[1], *PROCESS_SERIES)):
            if not any(w <= have for w in wanted.values()):
                problems.append(f"{name}: selects no source's targets ({sorted(map(str, have))})")
            continue
        source = source_of(name)
        if source is None:
            if ":" not in name and name != "ALERTS":
                problems.append(f"{name}: not a series of any source nor a recorded one")
            continue
        missing = wanted[source] - have
        if missing:
            problems.append(f"{name}: lacks the {source} selector's {sorted(map(str, missing))}")
    return problems


def annotation_queries(text: str) -> list[str]:
    """The PromQL an annotation template runs: `printf "<query>" ... | query`, %q/%s filled in."""
    found = re.findall(r'printf\s+"((?:[^"\\]|\\.)*)"[^|}]*\|\s*query', text)
    return [q for raw in found for q in template_queries(f'printf "{raw}"')]


def rule_queries(spec: Spec) -> list[tuple[str, str]]:
    out = []
    for rel, text in outputs(spec).items():
        if not rel.startswith(RULES_DIR):
            continue
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule["record"]
                out.append((name, rule["expr"]))
                out += [(f"{name} annotation", q) for a in (rule.get("annotations") or {}).values()
                        for q in annotation_queries(a)]
    return out


def grafana(expr: str) -> str:
    """A panel's PromQL as Grafana sends it: time macros filled in, `All` variables as `.*`."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?[a-z_]+\}?", ".*", expr)


def dashboard_queries(spec: Spec) -> list[tuple[str, str]]:
    out = []
    for key, data in dashboards(spec).items():
        for panel in data["panels"]:
            out += [(f"{key} / {panel['title']}", grafana(t["expr"])) for t in panel.get("targets", [])]
        for variable in data["templating"]["list"]:
            if variable["type"] == "query":
                m = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"], re.S)
                assert m, variable["query"]
                out.append((f"{key} / variable {variable['name']}", grafana(m.group(1))))
    return out


class RecordingSource:
    """Triage's Prometheus, recording every query the engine runs (answering none)."""

    at = 1_700_000_000.0

    def __init__(self):
        self.queries: list[tuple[str, str]] = []

    def query(self, name: str, expr: str) -> QueryResult:
        self.queries.append((name, expr))
        return QueryResult(name, expr)


LABELS = {"node": "node-a", "triton": "triton-0", "model": "classifier", "version": "1", "tier": "realtime",
          "tenant": "acme", "gpu": "0", "UUID": "GPU-a", "Hostname": "node-a", "instance": "node-a:9400",
          "channel": "slack", "window": "fast-1h", "signal": "latency", "reason": "REJECTED", "xid": "79",
          "slo": "availability", "source": "gateway", "job": "j"}


def triage_queries(spec: Spec) -> list[tuple[str, str]]:
    out = []
    for alert, runbook in load_runbooks().items():
        source = RecordingSource()
        triage_alert(alert, LABELS, runbook, source, "", spec=spec)
        assert source.queries, alert
        out += [(f"{alert}: {name}", expr) for name, expr in source.queries]
    return out


@pytest.mark.parametrize("collect", [rule_queries, dashboard_queries, triage_queries],
                         ids=["rules", "dashboards", "triage"])
def test_every_query_selects_each_source_with_its_selector(spec, collect):
    queries = collect(spec)
    assert len(queries) > 25
    problems = [f"{where}: {p}" for where, expr in queries for p in unselected(expr, spec)]
    assert problems == []


@pytest.mark.parametrize("expr, words", [
    ("rate(nv_inference_count[5m])", "lacks the triton selector"),
    ('sum(DCGM_FI_DEV_GPU_TEMP{job="inferwatch-triton"})', "lacks the gpu selector"),
    ('absent(up{node="a"})', "selects no source's targets"),
    ('max_over_time(scrape_duration_seconds{instance="x"}[5m])', "selects no source's targets"),
    ("gateway_request{job=\"inferwatch-gateway\"} / nv_inference_typo", "lacks the triton selector"),
    ("sum(rate(my_metric[5m]))", "not a series of any source"),
])
def test_the_check_catches_a_series_selected_without_its_selector(expr, words):
    problems = unselected(expr, Spec())
    assert problems and words in problems[0], problems


def test_with_operator_selectors_no_default_job_is_left():
    spec = spec_with(OPERATOR)
    files = outputs(spec)
    texts = [files[PROMETHEUS_RULE]] + [t for rel, t in files.items() if rel.startswith(RULES_DIR)]
    texts += [expr for _where, expr in dashboard_queries(spec) + triage_queries(spec)]
    defaults = re.compile("|".join(re.escape(f'job="{j}"') for j in DEFAULT_JOBS.values()))
    assert [t for t in texts if defaults.search(t)] == []
    assert any('namespace="triton", service="triton-metrics"' in t for t in texts)


# ------------------------------------------------------------------------- what the generators scrape
def test_the_generated_scrape_config_gives_each_source_what_its_selector_picks(spec, tmp_path):
    # Two Prometheus replicas: the federated-alerts job exists only with replicas.
    spec = dataclasses.replace(spec, ha=dataclasses.replace(spec.ha, prometheus=[
        PrometheusReplica("prom-a:9090", "a"), PrometheusReplica("prom-b:9090", "b")]))
    jobs = scrape_jobs(spec)
    # The engines have no job of their own: their families are on Triton's port (or a vLLM server's job).
    # The central store's programs are the store's watcher's jobs (deploy/central/watch-prometheus.yml).
    assert {source for source, _job in jobs} == set(SOURCES) - set(DEFAULT_SELECTORS) - set(WATCH_SOURCES)
    central = dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, name="eu-1"),
                                  central_store=dataclasses.replace(spec.central_store, url="http://vm:8428"))
    assert {source for source, _job in watch_jobs(central)} == set(WATCH_SOURCES)
    jobs = jobs + watch_jobs(central)
    for source, job in jobs:
        for static in job["static_configs"]:
            labels = {"job": job["job_name"], "instance": static["targets"][0], **static.get("labels", {})}
            assert spec.selectors.of(source).matches(labels), (source, labels)
            others = [s for s in SOURCES if s not in (source, "engine") and spec.selectors.of(s).matches(labels)]
            assert others == [], (source, labels)
            assert spec.selectors.of("engine").matches(labels) is (source == "triton"), (source, labels)
    assert unmatched_selectors(spec) == []
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({**prometheus_config(spec), "rule_files": []}))
    out = subprocess.run([promtool(), "check", "config", str(config)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_kubernetes_monitors_write_the_labels_the_selectors_ask_for(spec):
    from inferwatch.deploy.kubernetes.monitoring import monitors

    sources = {"inferwatch-gpu-exporter": "gpu", "inferwatch-triton-server": "triton",
               "inferwatch-triton-collector": "triton_collector", "inferwatch-gateway": "gateway",
               "inferwatch-notifier": "notifier", "inferwatch-alertmanager": "alertmanager",
               "inferwatch-prometheus": "prometheus", "inferwatch-prometheus-alerts": "prometheus_alerts"}
    for monitor in monitors(spec):
        source = sources[monitor["metadata"]["name"]]
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        for endpoint in endpoints:
            # The operator applies these after its own target labels: the last write of a label wins.
            written = {r["targetLabel"]: r["replacement"] for r in endpoint["relabelings"] if r["action"] == "replace"
                       and "replacement" in r and not r.get("sourceLabels")}
            assert spec.selectors.of(source).matches(written), (source, written)


def test_check_warns_about_a_selector_the_generated_scrape_config_cannot_satisfy(tmp_path, capsys):
    from inferwatch.cli import main

    path = tmp_path / "spec.yaml"
    path.write_text("selectors:\n  gpu: 'job=~\"nvidia-dcgm-exporter|dcgm\"'\n"
                    "  triton: 'namespace=\"triton\", service=\"triton-metrics\"'\n")
    assert main(["check", "--spec", str(path)]) == 0
    err = capsys.readouterr().err
    assert 'warning: selectors.gpu: job=~"nvidia-dcgm-exporter|dcgm" does not pick the generated target' in err
    assert "warning: selectors.triton:" not in err  # `=` matchers are written into the generated scrape config


def test_two_sources_given_one_job_are_refused_by_generate():
    spec = spec_from_dict({"selectors": {"gpu": 'job="shared"', "gateway": 'job="shared", service="gw"'}})
    with pytest.raises(SpecError) as exc:
        outputs(spec)
    assert exc.value.path == "selectors.gateway" and "'shared'" in str(exc.value)
