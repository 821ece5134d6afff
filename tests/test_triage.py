"""`inferwatch triage` against a real Prometheus serving prepared data (backfilled TSDB blocks) and a real
Alertmanager holding firing alerts: it must name the right cause for each cross-layer situation, and fail
clearly when a server is unreachable."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from pathlib import Path

import pytest

from inferwatch import cli
from inferwatch.testing.process import free_port
from triage_scenarios import FAST_TTFT_P95_SECONDS, SITUATIONS, TTFT_P95_SECONDS, start_prepared_prometheus

SPEC = Path(__file__).resolve().parents[1] / "inferwatch.yaml"  # realtime TTFT target 300 ms, classifier queue 250 ms


@pytest.fixture(scope="module")
def data_now() -> float:
    """The present of the prepared data: time-based findings are judged at it (`--at`), not at the moment a
    test happens to run, which on a busy machine is minutes later."""
    return time.time()


@pytest.fixture(scope="module")
def prepared_prometheus(tmp_path_factory, data_now):
    """A real Prometheus whose TSDB holds the 30 minutes before `data_now` of every situation in SITUATIONS."""
    server = start_prepared_prometheus(tmp_path_factory.mktemp("triage-prom"), now=data_now)
    yield server
    server.stop()


def triage_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = cli.main(["triage", *argv, "--spec", str(SPEC), "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def triage_text(capsys, *argv: str) -> tuple[int, str]:
    """The terminal view, at a width where no sentence wraps (rich reads COLUMNS)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "400")
        rc = cli.main(["triage", *argv, "--spec", str(SPEC)])
    return rc, capsys.readouterr().out


def evidence(result: dict) -> dict:
    return {e["name"]: e["value"] for e in result["evidence"]}


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
    # The node's GPU exporter reports its GPUs, so "none lost" is a known 0, not missing.
    assert (values["metrics_scrape_up"], values["api_up"], values["gpus_lost_on_node"]) == (0, 1, 0)
    assert result["condition"]["holds"] is True
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
    rc, out = triage_text(capsys, "LlmTtftP95High", "--label", "model=llm-capacity", "--label", "tier=realtime",
                          "--prometheus", prepared_prometheus.url)
    assert rc == 0
    assert "The alert's condition holds" in out
    assert "TTFT P95 ≈ 825 ms, a histogram estimate between 300 ms and 1.00 s; the tier's target is 300 ms" in out
    assert "likely cause: capacity (L2)" in out
    assert "600 ms" in out  # triton_queue_p95_seconds, human-formatted
    assert "LlmTtftP95High.md" in out


def test_unscoped_alert_without_data_matches_no_finding(prepared_prometheus, capsys):
    rc, doc = triage_json(capsys, "LlmTtftP95High", "--label", "model=no-such-model",
                          "--prometheus", prepared_prometheus.url)
    assert rc == 0
    [result] = doc["alerts"]
    assert result["top_cause"] is None
    # Every value of this model is missing; only the count of models Triton reports at all has one.
    assert all(e["value"] is None for e in result["evidence"] if e["name"] != "triton_models_reporting")
    # Unknown is null, never 0: no tier label, so no target; no data, so the condition is not judged.
    thresholds = {t["name"]: t for t in result["thresholds"]}
    assert thresholds["ttft_target_seconds"]["value"] is None
    assert thresholds["ttft_target_seconds"]["reason"] == "the alert has no `tier` label"
    assert result["condition"]["holds"] is None
    assert {m["name"] for m in result["condition"]["missing"]} == {"ttft_p95_seconds", "ttft_target_seconds",
                                                                   "request_rate"}


# ---------------------------------------------------------------- the alert's own condition and missing evidence
def test_ttft_under_its_target_names_no_cause(prepared_prometheus, capsys):
    """TTFT P95 138 ms against the realtime tier's 300 ms, with the short-queue/idle-GPU evidence that used
    to read as 'slow after scheduling': the alert's condition does not hold, so no cause is named."""
    args = ("LlmTtftP95High", "--label", "model=llm-fast", "--label", "tier=realtime", "--label", "tenant=acme",
            "--prometheus", prepared_prometheus.url)
    rc, doc = triage_json(capsys, *args)
    assert rc == 0
    [result] = doc["alerts"]
    assert evidence(result)["ttft_p95_seconds"] == pytest.approx(FAST_TTFT_P95_SECONDS, rel=0.02)
    assert evidence(result)["triton_queue_p95_seconds"] == pytest.approx(0.005)
    assert result["condition"]["holds"] is False
    assert (result["top_cause"], result["findings"], result["not_judged"]) == (None, [], [])
    rc, out = triage_text(capsys, *args)
    assert "The alert's condition does not hold at" in out
    assert "TTFT P95 ≈ 138 ms, a histogram estimate between 100 ms and 200 ms; the tier's target is 300 ms" in out
    assert "no cause is named" in out
    assert "likely cause" not in out and "slow-after-scheduling" not in out


def test_queue_under_the_models_own_threshold_names_no_cause(prepared_prometheus, capsys):
    """Queue P95 5 ms against classifier's 250 ms (its per-model threshold in the spec), while batches of 1
    against a preferred 8 would read as 'batching configuration'."""
    rc, doc = triage_json(capsys, "TritonQueueTimeP95High", "--label", "model=classifier",
                          "--label", "triton=triton-node-k", "--label", "node=node-k",
                          "--prometheus", prepared_prometheus.url)
    assert rc == 0
    [result] = doc["alerts"]
    assert evidence(result)["queue_p95_seconds"] == pytest.approx(0.005)
    assert evidence(result)["preferred_batch_size"] == 8 and evidence(result)["batch_size_avg"] == pytest.approx(1)
    assert {t["name"]: t["value"] for t in result["thresholds"]}["queue_target_seconds"] == 0.25
    assert result["condition"]["holds"] is False
    assert "5 ms at P95 in the queue against a threshold of 250 ms" in result["condition"]["summary"]
    assert (result["top_cause"], result["findings"]) == (None, [])


@pytest.mark.parametrize("node, uuid, made, not_judged", [
    # One GPU: no neighbour data, so neither cooling finding can be made; the output names what is missing.
    ("node-solo", "GPU-solo-0", [], {"node-cooling": ["other_gpus_max_celsius"],
                                     "gpu-cooling": ["other_gpus_max_celsius"]}),
    ("node-rack", "GPU-rack-0", ["gpu-cooling"], {}),   # its neighbour is at 60 °C
    ("node-hot", "GPU-hot-0", ["node-cooling"], {}),    # its neighbour is at 84 °C
])
def test_neighbour_findings_need_a_neighbour(prepared_prometheus, capsys, node, uuid, made, not_judged):
    rc, doc = triage_json(capsys, "GpuTemperatureCritical", "--label", f"node={node}", "--label", f"UUID={uuid}",
                          "--prometheus", prepared_prometheus.url)
    assert rc == 0
    [result] = doc["alerts"]
    assert result["condition"]["holds"] is True and evidence(result)["temperature_celsius"] == 90
    assert [f["cause"] for f in result["findings"]] == made
    assert {f["cause"]: [m["name"] for m in f["missing"]] for f in result["not_judged"]} == not_judged
    if not made:
        rc, out = triage_text(capsys, "GpuTemperatureCritical", "--label", f"node={node}", "--label", f"UUID={uuid}",
                              "--prometheus", prepared_prometheus.url)
        assert "not judged: gpu-cooling (L1), evidence missing — other_gpus_max_celsius: hottest other GPU" in out
        assert "neighbours are cooler" not in out


@pytest.mark.parametrize("model, version, top, new_version", [
    # Four minutes of data: the version was READY from the collector's first poll, its load time unknown.
    ("llm-fresh", "1", "backend-errors", "not judged"),
    # Version 2 became READY 3 min before the fault (now): within `for` + 2 rate windows (15 min).
    ("llm-newver", "2", "new-version-errors", "made"),
    # Version 2 became READY 25 min before the fault: not what started the errors.
    ("llm-oldver", "2", "backend-errors", "not met"),
])
def test_new_version_compares_the_load_time_with_the_fault(prepared_prometheus, data_now, capsys, model, version,
                                                           top, new_version):
    node = {"llm-fresh": "node-i", "llm-newver": "node-l", "llm-oldver": "node-m"}[model]
    rc, doc = triage_json(capsys, "TritonModelErrorRatioHigh", "--label", f"model={model}", "--label",
                          f"version={version}", "--label", f"triton=triton-{node}", "--label", f"node={node}",
                          "--prometheus", prepared_prometheus.url, "--at", str(data_now))
    assert rc == 0
    [result] = doc["alerts"]
    assert result["condition"]["holds"] is True, result["condition"]
    assert result["top_cause"] == top
    ready_before = evidence(result)["version_ready_before_fault_seconds"]
    not_judged = {f["cause"]: [m["name"] for m in f["missing"]] for f in result["not_judged"]}
    if new_version == "not judged":
        assert ready_before is None
        assert not_judged == {"new-version-errors": ["version_ready_before_fault_seconds"]}
    else:
        assert ready_before is not None and "new-version-errors" not in not_judged
        assert ready_before == pytest.approx(180 if new_version == "made" else 1500, abs=60)
    assert ("new-version-errors" in [f["cause"] for f in result["findings"]]) is (new_version == "made")


def test_firing_alerts_compare_with_their_startsat(prepared_prometheus, data_now, alertmanager_factory, tmp_path,
                                                   capsys):
    """With --firing the fault time is the alert's startsAt: the same version is 'new' relative to a fault
    that began a minute after it loaded, and cannot be (it was not loaded yet) for one 20 minutes earlier."""
    config = tmp_path / "alertmanager.yml"
    config.write_text("route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n")
    am = alertmanager_factory(config)
    now = data_now
    labels = {"alertname": "TritonModelErrorRatioHigh", "layer": "L2", "severity": "critical", "model": "llm-newver",
              "version": "2", "triton": "triton-node-l", "node": "node-l"}
    am.post_alerts([{"labels": {**labels, "case": "after-load"}, "startsAt": rfc3339(now - 120)},
                    {"labels": {**labels, "case": "before-load"}, "startsAt": rfc3339(now - 1200)}])
    rc, doc = triage_json(capsys, "--firing", "--prometheus", prepared_prometheus.url, "--alertmanager", am.url)
    assert rc == 0
    by_case = {r["labels"]["case"]: r for r in doc["alerts"]}
    assert by_case["after-load"]["fault_time"] == rfc3339(now - 120)
    assert evidence(by_case["after-load"])["version_ready_before_fault_seconds"] == pytest.approx(60, abs=45)
    assert by_case["after-load"]["top_cause"] == "new-version-errors"
    assert evidence(by_case["before-load"])["version_ready_before_fault_seconds"] is None
    assert by_case["before-load"]["top_cause"] == "backend-errors"


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(int(ts), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
