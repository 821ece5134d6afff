"""`inferwatch triage` against a real Prometheus serving prepared data (backfilled TSDB blocks) and a real
Alertmanager holding firing alerts: it must name the right cause for each cross-layer situation, and fail
clearly when a server is unreachable."""

from __future__ import annotations

import json
import logging

import pytest

from inferwatch import cli
from inferwatch.testing.process import free_port
from triage_scenarios import SITUATIONS, TTFT_P95_SECONDS, start_prepared_prometheus


@pytest.fixture(scope="module")
def prepared_prometheus(tmp_path_factory):
    """A real Prometheus whose TSDB holds the last 30 minutes of every situation in SITUATIONS."""
    server = start_prepared_prometheus(tmp_path_factory.mktemp("triage-prom"))
    yield server
    server.stop()


def triage_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = cli.main(["triage", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


@pytest.mark.parametrize("situation", SITUATIONS, ids=lambda s: s.expected_cause)
def test_named_alert_names_the_right_cause(prepared_prometheus, capsys, situation):
    rc, doc = triage_json(capsys, "LlmTtftP95High", "--label", f"model={situation.model}",
                          "--label", "tier=realtime", "--prometheus", prepared_prometheus.url)
    assert rc == 0
    [result] = doc["alerts"]
    assert result["top_cause"] == situation.expected_cause, result["findings"]
    values = {e["name"]: e["value"] for e in result["evidence"]}
    assert values["ttft_p95_seconds"] == pytest.approx(TTFT_P95_SECONDS, rel=0.02)
    if situation.queue_p95_seconds is not None:
        assert values["triton_queue_p95_seconds"] == pytest.approx(situation.queue_p95_seconds, rel=0.01)
        assert values["batch_size_avg"] == pytest.approx(situation.batch_size, rel=0.02)
    assert result["runbook_url"].endswith("/LlmTtftP95High.md")
    assert all(e["error"] is None for e in result["evidence"])


def test_slow_model_without_first_response_data_is_not_blamed_on_the_network(prepared_prometheus, capsys):
    """The demo's fault on Triton 2.51: short queue, idle GPU, tiny compute (decoupled Python model), no
    first-response histogram. Triage must say the time goes after scheduling and name the deciding check,
    not assert gateway-network."""
    rc, doc = triage_json(capsys, "LlmTtftP95High", "--label", "model=llm-prefill", "--label", "tier=realtime",
                          "--prometheus", prepared_prometheus.url)
    assert rc == 0
    [result] = doc["alerts"]
    assert [f["cause"] for f in result["findings"]] == ["slow-after-scheduling"]
    values = {e["name"]: e["value"] for e in result["evidence"]}
    assert values["triton_first_response_p95_seconds"] is None
    assert values["triton_compute_seconds"] == pytest.approx(0.001, rel=0.02)
    assert "direct to Triton" in result["findings"][0]["action"]


def test_triton_side_first_response_separates_model_from_network(prepared_prometheus, capsys):
    """Same short queue and idle GPU; only Triton's own TTFT (24.11+ histogram) differs."""
    found = {}
    for model in ("llm-gateway", "llm-slow-model"):
        rc, doc = triage_json(capsys, "LlmTtftP95High", "--label", f"model={model}", "--label", "tier=realtime",
                              "--prometheus", prepared_prometheus.url)
        [result] = doc["alerts"]
        values = {e["name"]: e["value"] for e in result["evidence"]}
        found[model] = (values["triton_first_response_p95_seconds"], [f["cause"] for f in result["findings"]])
    assert found["llm-gateway"][0] == pytest.approx(0.95 / 0.97 * 0.1, rel=0.02)
    assert found["llm-gateway"][1] == ["gateway-network"]
    assert found["llm-slow-model"][0] == pytest.approx(TTFT_P95_SECONDS, rel=0.02)
    assert found["llm-slow-model"][1] == ["model-slow-first-response"]


def test_triton_down_with_api_alive_points_at_the_metrics_port(prepared_prometheus, capsys):
    """A different alert and layer: Triton's :8002 cannot be scraped while its HTTP API answers."""
    rc, doc = triage_json(capsys, "TritonServerDown", "--label", "triton=triton-node-e", "--label", "node=node-e",
                          "--prometheus", prepared_prometheus.url)
    assert rc == 0
    [result] = doc["alerts"]
    values = {e["name"]: e["value"] for e in result["evidence"]}
    assert (values["metrics_scrape_up"], values["api_up"], values["gpus_lost_on_node"]) == (0, 1, None)
    assert result["top_cause"] == "metrics-port-blocked"
    assert [f["cause"] for f in result["findings"]] == ["metrics-port-blocked", "server-down"]


def test_firing_alerts_from_alertmanager_are_triaged_each_with_its_own_scope(
        prepared_prometheus, alertmanager_factory, tmp_path, capsys):
    config = tmp_path / "alertmanager.yml"
    config.write_text("route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n")
    am = alertmanager_factory(config)
    base = {"alertname": "LlmTtftP95High", "layer": "L3", "severity": "warning", "tier": "realtime"}
    am.post_alerts([
        {"labels": {**base, "model": "llm-capacity"},
         "annotations": {"runbook_url": "https://runbooks.example/LlmTtftP95High.md"}},
        {"labels": {**base, "model": "llm-batching"}},
        {"labels": {**base, "model": "llm-gateway"}, "endsAt": "2000-01-01T00:00:00Z"},  # resolved: skipped
    ])
    rc, doc = triage_json(capsys, "--firing", "--prometheus", prepared_prometheus.url,
                          "--alertmanager", am.url)
    assert rc == 0
    by_model = {r["labels"]["model"]: r for r in doc["alerts"]}
    assert set(by_model) == {"llm-capacity", "llm-batching"}
    assert by_model["llm-capacity"]["top_cause"] == "capacity"
    assert by_model["llm-capacity"]["runbook_url"] == "https://runbooks.example/LlmTtftP95High.md"
    assert by_model["llm-batching"]["top_cause"] == "batching-configuration"


def test_terminal_output_shows_values_cause_and_runbook(prepared_prometheus, capsys):
    rc = cli.main(["triage", "LlmTtftP95High", "--label", "model=llm-capacity", "--prometheus",
                   prepared_prometheus.url])
    out = capsys.readouterr().out
    assert rc == 0
    assert "likely cause: capacity (L2)" in out
    assert "600 ms" in out  # triton_queue_p95_seconds, human-formatted
    assert "LlmTtftP95High.md" in out


def test_unscoped_alert_without_data_matches_no_finding(prepared_prometheus, capsys):
    rc, doc = triage_json(capsys, "LlmTtftP95High", "--label", "model=no-such-model",
                          "--prometheus", prepared_prometheus.url)
    assert rc == 0
    [result] = doc["alerts"]
    assert result["top_cause"] is None
    assert all(e["value"] is None for e in result["evidence"])


def test_prometheus_down_is_a_clear_error_and_exit_1(capsys, caplog):
    url = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.DEBUG, logger="inferwatch"):
        rc = cli.main(["triage", "LlmTtftP95High", "--prometheus", url, "--timeout", "2"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"cannot reach Prometheus at {url}: connection refused" in err
    # urllib3 logs "Retrying (Retry(total=...)) after connection broken" at WARNING for each retry; the
    # one-line error above says it all.
    assert not [r for r in caplog.records if r.name.startswith("urllib3")], caplog.text
    assert "Retrying" not in err


def test_prometheus_down_with_json_still_prints_a_json_error(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    rc, doc = triage_json(capsys, "LlmTtftP95High", "--prometheus", url, "--timeout", "2")
    assert rc == 1
    assert doc["alerts"] == [] and "cannot reach Prometheus" in doc["error"]


def test_alertmanager_down_is_a_clear_error_and_exit_1(prepared_prometheus, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    rc = cli.main(["triage", "--firing", "--prometheus", prepared_prometheus.url, "--alertmanager", url,
                   "--timeout", "2"])
    assert rc == 1
    assert f"cannot reach Alertmanager at {url}" in capsys.readouterr().err


def test_unknown_alert_name_is_a_usage_error(prepared_prometheus, capsys):
    rc = cli.main(["triage", "NoSuchAlert", "--prometheus", prepared_prometheus.url])
    assert rc == 2
    assert "no runbook page for alert 'NoSuchAlert'" in capsys.readouterr().err
