"""The generated Alertmanager config: committed and current, accepted by `amtool check-config`, routes
checked with `amtool config routes test`; and the real Alertmanager delivering through the notifier to
each layer's channel, with inhibition and the notifier-bypassing fallback receiver."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import requests
import yaml

from conftest import REPO_ROOT
from inferwatch.deploy.alertmanager import PATH, config, inhibit_rules, outputs, secret_files
from inferwatch.spec import load_spec, spec_from_dict
from notifier_support import notifier_behind_alertmanager, wait_for

COMMITTED = REPO_ROOT / PATH


def amtool(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("amtool")
    if not binary:
        pytest.fail("amtool not found; install it with: apt-get install -y prometheus-alertmanager", pytrace=False)
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def test_committed_config_is_what_the_spec_generates():
    assert COMMITTED.read_text() == outputs(load_spec(REPO_ROOT / "inferwatch.yaml"))[PATH]


def test_amtool_check_config_accepts_it():
    r = amtool("check-config", str(COMMITTED))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(inhibit_rules(load_spec(REPO_ROOT / 'inferwatch.yaml')))} inhibit rules" in r.stdout


@pytest.mark.parametrize("labels, receiver", [
    (["alertname=GpuLost", "layer=L1", "severity=critical", "node=n1"], "notifier-l1"),
    (["alertname=TritonModelNotReady", "layer=L2", "severity=critical"], "notifier-l2"),
    (["alertname=LlmTtftP95High", "layer=L3", "severity=warning", "tenant=acme"], "notifier-l3"),
    (["alertname=NotifierDown", "layer=L1", "severity=critical", "component=notifier"], "notifier-fallback"),
    (["alertname=NotifierDeadLetters", "layer=L1", "component=notifier"], "notifier-fallback"),
    # The self-alerts about intake and routing must not depend on the notifier's own routing either.
    (["alertname=NotifierUnroutedAlerts", "layer=L1", "severity=warning", "component=notifier"], "notifier-fallback"),
    (["alertname=NotifierOutboxUnwritable", "layer=L1", "component=notifier"], "notifier-fallback"),
    (["alertname=NotifierWebhooksRefused", "layer=L1", "severity=warning", "component=notifier"], "notifier-fallback"),
    (["alertname=SomethingElse"], "notifier-default"),
    # The heartbeat goes to the dead man's switch only, whatever other labels it carries.
    (["alertname=InferwatchHeartbeat", "component=heartbeat", "layer=L1", "severity=info"], "heartbeat"),
])
def test_amtool_routes_test(labels, receiver):
    r = amtool("config", "routes", "test", f"--config.file={COMMITTED}", f"--verify.receivers={receiver}", *labels)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == receiver


def test_no_secret_is_inline_and_resolved_notifications_are_sent():
    cfg = yaml.safe_load(COMMITTED.read_text())
    for rec in cfg["receivers"]:
        for wh in rec.get("webhook_configs", []):
            assert wh["send_resolved"] is True
            assert "credentials_file" in wh["http_config"]["authorization"]
            assert "credentials" not in wh["http_config"]["authorization"]
        for pd in rec.get("pagerduty_configs", []):
            assert "routing_key_file" in pd and "routing_key" not in pd


def test_real_alertmanager_delivers_each_layer_to_its_channel(alertmanager_factory, tmp_path):
    grouping = {"L1": ["alertname", "node", "gpu"], "L2": ["alertname", "node"], "L3": ["alertname", "tenant"]}
    with notifier_behind_alertmanager(tmp_path, grouping) as (sims, svc, data):
        config = tmp_path / "alertmanager.yml"
        config.write_text(outputs(spec_from_dict(data))[PATH])
        am = alertmanager_factory(config)

        def alert(name, layer, severity="critical", **labels):
            return {"labels": {"alertname": name, "layer": layer, "severity": severity, **labels},
                    "annotations": {"summary": f"{name} summary.", "description": f"{name} on {labels}",
                                    "runbook_url": f"https://runbooks.example/{name}.md"},
                    "generatorURL": "http://prometheus.example/graph"}

        am.post_alerts([
            alert("GpuLost", "L1", node="node-b", gpu="3"),
            alert("TritonModelNotReady", "L2", node="node-c", model="classifier"),
            alert("LlmTtftP95High", "L3", "warning", tenant="acme", model="toy_llm"),
            # Inhibited: a down Triton hides the queue symptom of that server; a critical burn rate hides its
            # warning twin of the same tier and SLO (tests/test_notifier_inhibition.py has the whole table).
            alert("TritonServerDown", "L2", node="node-a", triton="t-a"),
            alert("TritonQueueTimeP95High", "L2", "warning", node="node-a", triton="t-a", model="classifier"),
            alert("LlmAvailabilityBurnRate", "L3", "critical", tier="realtime", slo="availability", window="fast-1h"),
            alert("LlmAvailabilityBurnRate", "L3", "warning", tier="realtime", slo="availability",
                  window="fast-1d"),
            # The notifier's own alert bypasses it: Alertmanager's PagerDuty integration pages directly.
            alert("NotifierDeliveryFailing", "L1", component="notifier"),
        ])
        wait_for(lambda: any("GpuLost" in t for t in sims.pagerduty.texts()), what="L1 on phone")
        wait_for(lambda: any("TritonModelNotReady" in t for t in sims.slack.texts()), what="L2 on Slack")
        wait_for(lambda: any("LlmTtftP95High" in t for t in sims.wecom.texts()), what="L3 on WeCom")
        wait_for(lambda: any("TritonServerDown" in t for t in sims.slack.texts()), what="TritonServerDown")
        wait_for(lambda: any("NotifierDeliveryFailing" in t for t in sims.pagerduty.texts()), what="fallback page")
        wait_for(lambda: any("LlmAvailabilityBurnRate" in t for t in sims.wecom.texts()), what="burn rate page")
        fallback = [r for r in sims.pagerduty.received if "NotifierDeliveryFailing" in r.text][0]
        assert fallback.body["client"].startswith("inferwatch alertmanager")  # sent by Alertmanager itself
        assert not any("NotifierDeliveryFailing" in t for t in sims.slack.texts() + sims.wecom.texts())
        gpu = [r for r in sims.pagerduty.received if "GpuLost" in r.text][0].body
        assert gpu["payload"]["source"] == "node-b" and gpu["payload"]["severity"] == "critical"
        wecom = [t for t in sims.wecom.texts() if "LlmTtftP95High" in t][0]
        assert "tenant: acme" in wecom and "[Runbook](https://runbooks.example/LlmTtftP95High.md)" in wecom
        inhibited = {(a["labels"]["alertname"], a["labels"]["severity"]) for a in am.alerts()
                     if a["status"]["state"] == "suppressed"}
        assert inhibited == {("TritonQueueTimeP95High", "warning"), ("LlmAvailabilityBurnRate", "warning")}
        assert not any("TritonQueueTimeP95High" in t for t in sims.slack.texts())
        burn = [t for t in sims.wecom.texts() if "LlmAvailabilityBurnRate" in t]
        assert burn and all("fast-1d" not in t for t in burn), burn
        # Resolve: Alertmanager sends resolved notifications (send_resolved) and PagerDuty closes the incident.
        resolved = alert("GpuLost", "L1", node="node-b", gpu="3")
        resolved["endsAt"] = "2000-01-01T00:00:00Z"
        am.post_alerts([resolved])
        wait_for(lambda: any(r.body.get("event_action") == "resolve" for r in sims.pagerduty.received),
                 timeout=60, what="the resolve event")
        dead = [ln for ln in requests.get(svc.url + "/metrics").text.splitlines()
                if ln.startswith("inferwatch_notifier_notifications_total{") and 'outcome="dead_lettered"}' in ln
                and not ln.endswith(" 0.0")]
        assert not dead, dead


def _file_values(node) -> set[str]:
    if isinstance(node, dict):
        found = {v for k, v in node.items() if k.endswith("_file") and isinstance(v, str)}
        return found.union(*(_file_values(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_file_values(v) for v in node))
    return set()


def test_own_stack_steps_name_every_secret_file_alertmanager_reads():
    spec = load_spec(REPO_ROOT / "inferwatch.yaml")
    files = secret_files(spec)
    assert _file_values(config(spec)) == {path for path, _ in files.values()}
    page = (REPO_ROOT / "docs" / "own-stack.md").read_text()
    steps = page.split("## Use it with your own Triton and Prometheus\n", 1)[1].split("\n## ", 1)[0]
    for field, (path, _) in files.items():
        assert f"`{field}`" in steps and f"`{path}`" in steps, field
    assert "`notifier.fallback_pagerduty_url`" in steps


def test_fallback_routing_key_file_and_url_come_from_the_spec():
    spec = spec_from_dict({"notifier": {"fallback_routing_key_file": "/run/secrets/pd-key",
                                        "fallback_pagerduty_url": "https://events.eu.pagerduty.com/v2/enqueue"}})
    fallback = next(r for r in config(spec)["receivers"] if r["name"] == "notifier-fallback")["pagerduty_configs"][0]
    assert fallback["routing_key_file"] == "/run/secrets/pd-key"
    assert fallback["url"] == "https://events.eu.pagerduty.com/v2/enqueue"


def test_real_alertmanager_sends_the_heartbeat_to_the_dead_mans_switch_only(alertmanager_factory, tmp_path):
    """The always-firing InferwatchHeartbeat reaches the switch (notifier.heartbeat_url, with its bearer token
    file) again every heartbeat_interval, and never the notifier."""
    import http.server
    import threading

    pings: list[str] = []

    class Switch(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            pings.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    switch = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Switch)
    threading.Thread(target=switch.serve_forever, daemon=True).start()
    try:
        with notifier_behind_alertmanager(tmp_path, {"L1": ["alertname"]}) as (sims, svc, data):
            (tmp_path / "hb-token").write_text("hb-secret-token\n")
            data["notifier"].update(heartbeat_url=f"http://127.0.0.1:{switch.server_address[1]}/ping",
                                    heartbeat_token_file=str(tmp_path / "hb-token"), heartbeat_interval="2s")
            config = tmp_path / "alertmanager.yml"
            config.write_text(outputs(spec_from_dict(data))[PATH])
            am = alertmanager_factory(config)
            am.post_alerts([{"labels": {"alertname": "InferwatchHeartbeat", "component": "heartbeat", "layer": "L1",
                                        "severity": "info"},
                             "annotations": {"summary": "The alerting path is alive."}}])
            wait_for(lambda: len(pings) >= 2, timeout=30, what="two heartbeat pings")
            assert set(pings) == {"Bearer hb-secret-token"}
            assert svc.accepted == 0  # the notifier never saw it
    finally:
        switch.shutdown()
