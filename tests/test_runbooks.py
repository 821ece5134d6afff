"""Runbook pages: one per alert the rules generate, each with a well-formed evidence block whose every query
parses and evaluates in a real Prometheus (scoped to sample labels and unscoped)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import requests

from inferwatch.selectors import parse
from inferwatch.spec import load_spec
from inferwatch.triage.engine import query_params, resolve_thresholds
from inferwatch.triage.evidence import PLACEHOLDER, default_runbook_dir, load_runbook
from inferwatch.triage.scope import scoped
from inferwatch.triage.thresholds import QUERY_PARAM, SELECTOR_PARAMS
from triage_scenarios import start_prepared_prometheus

RUNBOOKS = default_runbook_dir()

# The alert names fixed in the project's conventions; the rules generator's registry (when importable) is
# the source of truth and may add more.
CONVENTION_ALERTS = {
    "GpuTemperatureCritical", "GpuMemoryUsageHigh", "GpuMemoryUsageCritical", "GpuLost", "GpuXidCritical",
    "GpuUncorrectableMemoryError", "GpuThrottling", "GpuExporterDown",
    "TritonServerDown", "TritonServerNotReady", "TritonModelNotReady", "TritonModelErrorRatioHigh",
    "TritonQueueTimeP95High", "TritonRequestsRejected", "TritonPendingRequestsHigh", "TritonBatchingIneffective",
    "TritonCanaryRegression", "TritonCollectorDown",
    "LlmTtftP95High", "LlmAvailabilityBurnRate", "LlmTtftBurnRate", "LlmOutputThroughputCollapse",
    "LlmCancellationRatioHigh", "GatewayExporterDown",
    "NotifierDeliveryFailing", "NotifierDeadLetters", "NotifierDown",
}


def expected_alerts() -> set[str]:
    try:
        from inferwatch.rules.names import ALERTS
    except ImportError:
        return set(CONVENTION_ALERTS)
    return set(ALERTS) | CONVENTION_ALERTS


PAGES = sorted(p for p in RUNBOOKS.glob("*.md") if p.stem[:1].isupper())
REQUIRED_SECTIONS = ("What it means", "User impact", "Likely causes", "Evidence", "Actions", "Escalate")
# Label values that exercise escaping: regex metacharacters and a quote must match literally.
SAMPLE_LABELS = {"node": "node-a", "triton": "triton-node-a", "model": "llm-capacity", "version": "1",
                 "tier": "realtime", "tenant": "acme", "gpu": "0", "UUID": "GPU-node-a", "Hostname": "node-a",
                 "instance": "node-a:9400", "channel": "slack", "window": "fast-1h", "signal": "latency",
                 "reason": 'a.b"(c)|*'}
SPEC = load_spec(Path(__file__).resolve().parents[1] / "inferwatch.yaml")


def test_every_alert_has_a_page():
    missing = sorted(expected_alerts() - {p.stem for p in PAGES})
    assert not missing, f"alerts without a runbook page in {RUNBOOKS}: {missing}"


def test_every_page_belongs_to_an_alert():
    orphans = sorted({p.stem for p in PAGES} - expected_alerts())
    assert not orphans, f"runbook pages for no known alert: {orphans}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_page_has_sections_and_a_valid_evidence_block(page):
    runbook = load_runbook(page)  # raises RunbookError naming the file when the block is missing/malformed
    text = page.read_text(encoding="utf-8")
    assert runbook.title == page.stem
    for section in REQUIRED_SECTIONS:
        assert re.search(rf"^## {section}", text, re.M), f"{page.name}: no '## {section}' section"
    assert runbook.findings and runbook.queries
    # Every query is used by a finding or shown as evidence; every finding names a cross-layer place.
    for finding in runbook.findings:
        assert finding.layer in ("L1", "L2", "L3", "network", "config", "external"), finding


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus with the triage scenarios' data, so queries also evaluate over real series."""
    server = start_prepared_prometheus(tmp_path_factory.mktemp("runbook-prom"))
    yield server
    server.stop()


def _query_error(prometheus, expr: str) -> str | None:
    body = requests.get(f"{prometheus.url}/api/v1/query", params={"query": expr}, timeout=10).json()
    return None if body.get("status") == "success" else f"{body.get('errorType')}: {body.get('error')}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_query_parses_and_evaluates_in_prometheus(prometheus, page):
    runbook = load_runbook(page)
    failures = []
    for labels in (SAMPLE_LABELS, {}, {**SAMPLE_LABELS, "cluster": "prod-a"}):
        thresholds = resolve_thresholds(runbook, SPEC, labels, time.time())
        params = query_params(thresholds)
        # With every label given, every spec value resolves; without labels only label-free paths do.
        assert labels is not SAMPLE_LABELS or len(params) == len(thresholds) + len(SELECTOR_PARAMS), thresholds
        assert all("{" in t.path for t in thresholds if t.value is None), thresholds
        for query in runbook.queries.values():
            if query.params - params.keys():
                continue  # triage does not run it either (the value is reported as not run)
            expr = scoped(query.expr, labels, params, cluster_label="cluster")
            assert not PLACEHOLDER.search(expr) and not QUERY_PARAM.search(expr), expr
            assert ('cluster=~"(prod-a)?"' in expr) == ("cluster" in labels), expr
            error = _query_error(prometheus, expr)
            if error:
                failures.append(f"{query.name} ({'scoped' if labels else 'unscoped'}): {error}\n  {expr}")
    assert not failures, f"{page.name}:\n" + "\n".join(failures)


def test_the_query_checker_does_catch_a_parse_error(prometheus):
    assert "bad_data" in _query_error(prometheus, 'sum(rate(x{model=~"a"}[5m])')


def test_scoped_values_match_literally(prometheus):
    """A label value containing regex metacharacters matches only itself (escaped twice: RE2, PromQL)."""
    expr = 'count(nv_inference_count{model=~"{{ $labels.model }}"})'
    assert prometheus.query(scoped(expr, {"model": "llm-capacity"}))[0]["value"][1] == "1"
    assert prometheus.query(scoped(expr, {"model": "llm.capacity"})) == []
    assert prometheus.query(scoped(expr, {"model": "llm-.*"})) == []
    assert int(prometheus.query(scoped(expr, {}))[0]["value"][1]) >= 3  # absent label: every model


def test_an_alert_of_a_named_cluster_reads_only_that_cluster(prometheus):
    """Series of one cluster's Prometheus carry no cluster label: an alert naming the cluster (its external
    label) still reads them; series of a central store (labelled) are read for the alert's cluster only."""
    expr = 'count(nv_inference_count{model=~"{{ $labels.model }}"})'
    labels = {"model": "llm-capacity", "cluster": "prod-a"}
    assert scoped(expr, labels, cluster_label="cluster") == \
        'count(nv_inference_count{cluster=~"(prod-a)?", model=~"llm-capacity"})'
    assert prometheus.query(scoped(expr, labels, cluster_label="cluster"))[0]["value"][1] == "1"
    matcher = parse('cluster=~"(prod-a)?", job="x"').matchers[0]  # what the scoped query holds
    assert matcher.matches({}) and matcher.matches({"cluster": "prod-a"})
    assert not matcher.matches({"cluster": "prod-b"}) and not matcher.matches({"cluster": "prod-a2"})


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_rate_windows_follow_the_spec_not_a_literal_5m(page):
    """Queries mirroring the rules use $rate_window, so a spec with short windows (the demo) is triaged
    over the same stretch of time its alerts judged."""
    runbook = load_runbook(page)
    assert not [q.name for q in runbook.queries.values() if "[5m]" in q.expr]
