"""The notifier's enrichment hook: the top triage finding from a real Prometheus, and nothing (never an
exception, never a wait past the deadline) when Prometheus is dead or hangs."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from inferwatch.spec import load_spec
from inferwatch.testing.process import free_port
from inferwatch.triage import hook
from triage_scenarios import start_prepared_prometheus

SPEC_PATH = Path(__file__).resolve().parents[1] / "inferwatch.yaml"


@pytest.fixture(scope="module")
def prepared_prometheus(tmp_path_factory):
    server = start_prepared_prometheus(tmp_path_factory.mktemp("hook-prom"))
    yield server
    server.stop()


def test_enricher_gives_the_top_finding(prepared_prometheus):
    enrich = hook.make_enricher(prepared_prometheus.url, timeout=10)
    text = enrich({"alertname": "LlmTtftP95High", "model": "llm-batching", "tier": "realtime"})
    assert text.startswith("likely cause: batching-configuration (L2): Triton executes requests one by one")


def test_enrichment_layer_reads_the_same_on_wecom(prepared_prometheus):
    """The finding's `(L3)` and any other character reach a WeCom reader exactly as the hook wrote them."""
    from inferwatch.notifier.channels import build_channel
    from inferwatch.notifier.model import Notification, message_from_dict
    from inferwatch.spec import spec_from_dict
    from inferwatch.testing.channel_text import wecom_display

    enrich = hook.make_enricher(prepared_prometheus.url, timeout=10)
    text = enrich({"alertname": "LlmTtftP95High", "model": "llm-gateway", "tier": "realtime"})
    assert text.startswith("likely cause: gateway-network (L3): ")
    spec = spec_from_dict({"channels": {"w": {"type": "wecom", "url": "http://127.0.0.1:9/x"}}})
    alert = {"status": "firing", "labels": {"alertname": "LlmTtftP95High"}, "annotations": {}}
    group = message_from_dict({"version": "4", "status": "firing", "alerts": [alert], "groupKey": "g"})
    body = build_channel("w", spec.channels["w"]).build_body(Notification("w", [group], enrichment=text))
    shown, _ = wecom_display(body)
    assert f"Triage: {text}" in shown


def test_enricher_gives_nothing_for_an_alert_without_a_page_or_finding(prepared_prometheus):
    enrich = hook.make_enricher(prepared_prometheus.url, timeout=10)
    assert enrich({"alertname": "NoSuchAlert"}) is None
    assert enrich({"alertname": "LlmTtftP95High", "model": "no-such-model"}) is None


@pytest.mark.parametrize("labels", [
    # TTFT P95 138 ms against the realtime target of 300 ms (the evidence otherwise reads "slow after scheduling")
    {"alertname": "LlmTtftP95High", "model": "llm-fast", "tier": "realtime", "tenant": "acme"},
    # queue P95 5 ms against classifier's 250 ms (batches of 1 against a preferred 8 otherwise read "batching")
    {"alertname": "TritonQueueTimeP95High", "model": "classifier", "triton": "triton-node-k", "node": "node-k"},
], ids=["ttft-under-target", "queue-under-threshold"])
def test_enricher_adds_no_finding_when_the_alert_condition_does_not_hold(prepared_prometheus, labels):
    enrich = hook.make_enricher(prepared_prometheus.url, timeout=10, spec=load_spec(SPEC_PATH))
    assert enrich(labels) is None
    # The same evidence through the engine: the finding's own condition would have held.
    from inferwatch.triage.engine import triage_alert
    from inferwatch.triage.evidence import load_runbooks
    from inferwatch.triage.sources import PrometheusSource
    result = triage_alert(labels["alertname"], labels, load_runbooks()[labels["alertname"]],
                          PrometheusSource(prepared_prometheus.url), "", spec=load_spec(SPEC_PATH))
    assert result.condition.holds is False and result.findings == []


def test_enricher_gives_nothing_when_prometheus_is_down():
    enrich = hook.make_enricher(f"http://127.0.0.1:{free_port()}", timeout=5)
    assert enrich({"alertname": "LlmTtftP95High", "model": "llm-capacity"}) is None


def test_enricher_returns_at_its_deadline_while_prometheus_hangs():
    """A Prometheus that accepts connections and never answers: enrich returns None while its worker is
    still waiting on the socket, i.e. the deadline, not the hang, ended the call."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    try:
        before = {t.ident for t in threading.enumerate()}
        enrich = hook.make_enricher(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=1.0,
                                   request_timeout=30.0)
        assert enrich({"alertname": "LlmTtftP95High", "model": "llm-capacity"}) is None
        still_working = [t for t in threading.enumerate() if t.name == "triage-enrich" and t.ident not in before]
        assert still_working, "enrich waited for the hung Prometheus instead of returning at its deadline"
        assert accepted, "the hook never reached the hanging server"
    finally:
        stop.set()
        for conn in accepted:
            conn.close()
        listener.close()


def test_notifier_hook_reads_real_notifications(prepared_prometheus, monkeypatch):
    """`inferwatch.triage.hook:top_finding` as a notifier route's `enrich`, fed the notifier's own
    Notification parsed from an Alertmanager v4 webhook body."""
    model = pytest.importorskip("inferwatch.notifier.model")
    monkeypatch.setenv("INFERWATCH_PROMETHEUS_URL", prepared_prometheus.url)
    monkeypatch.setenv("INFERWATCH_SPEC", str(SPEC_PATH))
    monkeypatch.setattr(hook, "_state", {})
    alert = {"status": "firing", "labels": {"alertname": "LlmTtftP95High", "layer": "L3", "severity": "warning",
                                            "model": "llm-capacity", "tier": "realtime"},
             "annotations": {}, "startsAt": "2024-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
             "generatorURL": "", "fingerprint": "abc"}
    body = {"version": "4", "receiver": "notifier", "status": "firing", "alerts": [alert],
            "groupLabels": {}, "commonLabels": alert["labels"], "commonAnnotations": {}, "externalURL": "",
            "groupKey": "{}:{}", "truncatedAlerts": 0}
    message = model.parse_webhook(json.dumps(body).encode())
    notification = model.Notification(channel="wecom", groups=[message])
    assert hook.top_finding(notification).startswith("likely cause: capacity (L2)")
    resolved = model.Notification(channel="wecom", groups=[model.parse_webhook(json.dumps(
        {**body, "status": "resolved", "alerts": [{**alert, "status": "resolved"}]}).encode())])
    assert hook.top_finding(resolved) == ""


def _notification(model_module, *alerts: dict):
    body = {"version": "4", "receiver": "notifier", "status": "firing", "alerts": list(alerts), "groupLabels": {},
            "commonLabels": {}, "commonAnnotations": {}, "externalURL": "", "groupKey": "{}:{}", "truncatedAlerts": 0}
    return model_module.Notification(channel="slack", groups=[model_module.parse_webhook(json.dumps(body).encode())])


def _alert(labels: dict, starts_at: float, fingerprint: str) -> dict:
    return {"status": "firing", "labels": labels, "annotations": {}, "generatorURL": "", "fingerprint": fingerprint,
            "startsAt": dt.datetime.fromtimestamp(starts_at, dt.timezone.utc).isoformat().replace("+00:00", "Z"),
            "endsAt": "0001-01-01T00:00:00Z"}


def test_notifier_hook_skips_alerts_whose_condition_does_not_hold_and_uses_startsat(prepared_prometheus, monkeypatch):
    """A coalesced notification: the first alert's fault is gone (TTFT under target), the second's version
    loaded 3 min ago. The hook names the second's cause, judged against its startsAt."""
    model = pytest.importorskip("inferwatch.notifier.model")
    monkeypatch.setenv("INFERWATCH_PROMETHEUS_URL", prepared_prometheus.url)
    monkeypatch.setenv("INFERWATCH_SPEC", str(SPEC_PATH))
    monkeypatch.setattr(hook, "_state", {})
    now = time.time()
    healthy = _alert({"alertname": "LlmTtftP95High", "layer": "L3", "model": "llm-fast", "tier": "realtime",
                      "tenant": "acme"}, now - 60, "a")
    errors = {"alertname": "TritonModelErrorRatioHigh", "layer": "L2", "model": "llm-newver", "version": "2",
              "triton": "triton-node-l", "node": "node-l"}
    assert hook.top_finding(_notification(model, healthy)) == ""
    assert hook.top_finding(_notification(model, healthy, _alert(errors, now - 120, "b"))).startswith(
        "likely cause: new-version-errors (L2): Backend errors")
    # A fault that began 20 min ago, before version 2 was loaded: the version cannot have started it.
    assert hook.top_finding(_notification(model, _alert(errors, now - 1200, "c"))).startswith(
        "likely cause: backend-errors (L2)")
