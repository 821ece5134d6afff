"""The replica alerts (rules/ha.py) as the HA spec generates them (examples/ha/inferwatch.ha.yaml: three
Alertmanager peers, two Prometheus replicas), in promtool: a peer down and a peer that did not join fire
AlertmanagerClusterDegraded, a whole cluster does not. (rules/tests/ha.yml covers the repository spec.)"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from ha_support import ha_spec
from inferwatch.rules.generate import outputs
from inferwatch.rules.ha import restart_settle_s, tolerance

RUNBOOK = "https://github.com/inferwatch/inferwatch/blob/main/runbooks/AlertmanagerClusterDegraded.md"
SUMMARY = "The Alertmanager cluster has fewer members than configured."


def _peer(i: int, up: str, members: str) -> list[dict]:
    labels = f'job="inferwatch-alertmanager",instance="am-{i}:9093",node="am-{i}"'
    return [{"series": f"up{{{labels}}}", "values": up},
            {"series": f"alertmanager_cluster_members{{{labels}}}", "values": members}]


def _alert(description: str, **labels) -> dict:
    return {"exp_labels": {"component": "alerting", "layer": "L1", "severity": "warning", **labels},
            "exp_annotations": {"summary": SUMMARY, "description": description, "runbook_url": RUNBOOK}}


def test_three_peer_cluster_alerts(tmp_path):
    spec = ha_spec()
    assert restart_settle_s(spec) == 34 and str(tolerance(spec)) == "8s"
    (tmp_path / "ha.yml").write_text(outputs(spec)["rules/generated/ha.yml"])
    tests = {"rule_files": ["ha.yml"], "evaluation_interval": "10s", "tests": [
        {"name": "a peer down, then a peer that does not see the others; a whole cluster is silent",
         "interval": "10s",
         "input_series": [*_peer(0, "1x30", "3x30"), *_peer(1, "1x30", "3x3 1x26"), *_peer(2, "1 1 1 0x27", "3x30")],
         "alert_rule_test": [
             {"eval_time": "20s", "alertname": "AlertmanagerClusterDegraded"},
             {"eval_time": "50s", "alertname": "AlertmanagerClusterDegraded"},  # inside `for` (30s)
             {"eval_time": "90s", "alertname": "AlertmanagerClusterDegraded", "exp_alerts": [
                 _alert("Only 2 of the 3 Alertmanager peers answer: one more failure and notifications wait for the "
                        "last ones (or stop)."),
                 _alert("The Alertmanager at am-1:9093 sees 1 of the 3 cluster members configured: it has not joined "
                        "its peers, so both sides send (duplicates).",
                        job="inferwatch-alertmanager", instance="am-1:9093", node="am-1")]}]},
        {"name": "a peer down while its survivors see each other: one alert, not one per survivor",
         "interval": "10s",
         "input_series": [*_peer(0, "1x30", "3x3 2x26"), *_peer(1, "1x30", "3x3 2x26"),
                          *_peer(2, "1 1 1 0x27", "3x30")],
         "alert_rule_test": [
             {"eval_time": "90s", "alertname": "AlertmanagerClusterDegraded", "exp_alerts": [
                 _alert("Only 2 of the 3 Alertmanager peers answer: one more failure and notifications wait for the "
                        "last ones (or stop).")]}]},
        {"name": "no Alertmanager scraped at all: said so, not a degraded cluster",
         "interval": "10s",
         "input_series": [{"series": 'up{job="inferwatch-gpu",instance="g:9400",node="n"}', "values": "1x30"}],
         "alert_rule_test": [
             {"eval_time": "90s", "alertname": "AlertmanagerClusterDegraded", "exp_alerts": [
                 _alert('Alertmanager peers are not scraped: selector up{job="inferwatch-alertmanager"} matches no '
                        "target, so nothing here watches the Alertmanager cluster (check the scrape configuration "
                        "before the peers).", job="inferwatch-alertmanager")]}]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.fail("promtool missing: make system-deps", pytrace=False)
    result = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
