"""Test support for the notifier: a spec wired to the provider simulators, webhook builders, waiting."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from inferwatch.notifier.channels import build_channel
from inferwatch.notifier.model import Notification, message_from_dict
from inferwatch.spec import spec_from_dict
from inferwatch.testing.channels import ProviderSimulators, Received
from inferwatch.testing.process import free_port, http_ok

FIXTURE = Path(__file__).parent / "fixtures" / "alertmanager-0.25-webhook-truncated.json"
TOKEN = "test-notifier-token-7f3a9c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def spec_data(sims: ProviderSimulators, **notifier) -> dict:
    """Spec data: L1 → PagerDuty + voice, L2 → Slack (escalating to PagerDuty), L3 → WeCom; the model
    `owned` also goes to a second WeCom robot (a model owners' group)."""
    # send_processes 0: sends in the service's threads, so the many in-process services of the tests start no
    # process pools; the pool has its own tests (test_notifier_send_processes, the secrets test, the benchmark).
    settings = {"bearer_token": TOKEN, "retry_initial": "200ms", "retry_max": "1s", "send_processes": 0}
    settings.update(notifier)
    return {
        "channels": {
            "phone": {"type": "pagerduty", "routing_key": sims.pagerduty.routing_key, "url": sims.pagerduty_url},
            "call": {"type": "voice", "url": sims.voice_url,
                     "headers": {"Authorization": f"Bearer {sims.voice.token}"}},
            "oncall-slack": {"type": "slack", "url": sims.slack_url},
            "llm-wecom": {"type": "wecom", "url": sims.wecom_url(0), "mentions": ["zhangsan"]},
            "owners-wecom": {"type": "wecom", "url": sims.wecom_url(1)},
        },
        "routes": [
            {"match": {"layer": "L1"}, "receivers": ["phone", "call"]},
            {"match": {"layer": "L2"}, "receivers": ["oncall-slack"], "escalate_after": "2s",
             "escalate_to": ["phone"]},
            {"match": {"layer": "L3", "model": "owned"}, "receivers": ["owners-wecom"], "continue": True},
            {"match": {"layer": "L3"}, "receivers": ["llm-wecom"]},
        ],
        "notifier": settings,
    }


def make_spec(sims: ProviderSimulators, **notifier):
    return spec_from_dict(spec_data(sims, **notifier))


def webhook(alertname: str = "TritonServerDown", layer: str = "L2", *, n: int = 1, status: str = "firing",
            group: str | None = None, severity: str = "critical", extra: dict | None = None,
            description: str = "") -> dict:
    """An Alertmanager version-4 webhook body for a group of `n` alerts (shape of the real fixture)."""
    common = {"alertname": alertname, "layer": layer, "severity": severity, "node": "node-a", **(extra or {})}
    alerts = []
    for i in range(n):
        labels = dict(common, instance=f"i{i}")
        alerts.append({"status": status, "labels": labels,
                       "annotations": {"summary": f"{alertname} summary.",
                                       "description": description or f"{alertname} on {labels['instance']}",
                                       "runbook_url": f"https://runbooks.example/{alertname}.md"},
                       "startsAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
                       "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2030-01-01T00:00:00Z",
                       "generatorURL": "http://prometheus.example/graph", "fingerprint": f"{i:016x}"})
    key = group or f'{{}}:{{alertname="{alertname}", layer="{layer}"}}'
    return {"version": "4", "groupKey": key, "truncatedAlerts": 0, "status": status, "receiver": "notifier",
            "groupLabels": {"alertname": alertname}, "commonLabels": common, "commonAnnotations": {},
            "externalURL": "http://alertmanager.example:9093", "alerts": alerts}


def fixture_body() -> dict:
    return json.loads(FIXTURE.read_text())


def wait_for(condition, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Poll until `condition()` is truthy; AssertionError naming `what` after `timeout` (not a timed assert:
    the timeout only bounds a hang)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextlib.contextmanager
def notifier_process(spec_file: Path, data_dir: Path, stderr_path: Path, *, verbose: bool = False,
                     env: dict | None = None, preexec_fn=None, stdout_path: Path | None = None,
                     args: tuple[str, ...] = ()):
    """The real `inferwatch notifier` CLI on a free loopback port; yields (process, base URL) once it answers
    /-/healthy, and stops it (SIGTERM, then SIGKILL) when the block ends. stderr (and stdout, when
    `stdout_path` is given) go to files; `args` are more `inferwatch notifier` flags."""
    port = free_port()
    argv = [sys.executable, "-m", "inferwatch.cli", *(["-v"] if verbose else []), "notifier", "--spec",
            str(spec_file), "--port", str(port), "--data-dir", str(data_dir), *args]
    stdout = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
    proc = subprocess.Popen(argv, stdout=stdout, stderr=open(stderr_path, "wb"), env=env, preexec_fn=preexec_fn)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_ok(url + "/-/healthy") or proc.poll() is not None, what="notifier start")
        assert proc.poll() is None, stderr_path.read_text()
        yield proc, url
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def metric(url: str, series: str) -> float:
    """The value of one series (name with its labels, as exposed) on `url`/metrics."""
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no series {series}")
# -------------------------------------------------- channel classes against shared simulators (import both)
def simulators():
    """Body of a module's `sims` fixture: provider simulators its tests share (import `reset_sims` too)."""
    with ProviderSimulators() as s:
        yield s


@pytest.fixture(autouse=True)
def reset_sims(request):
    """Each test that uses `sims` starts with every simulator in mode "ok" and at its documented limits."""
    if "sims" not in request.fixturenames:
        yield
        return
    s = request.getfixturevalue("sims")
    s.reset()
    yield
    s.reset()


PROVIDER_OF = {"phone": "pagerduty", "call": "voice", "oncall-slack": "slack", "llm-wecom": "wecom"}


def send_via(sims: ProviderSimulators, channel: str, body: dict | list[dict], **notification) -> Received:
    """Send `body` through the spec channel `channel` (make_spec's names); what its provider accepted. A list
    of bodies is sent as one digest (the message a rate-limited destination gets for several groups)."""
    spec = make_spec(sims)
    groups = [message_from_dict(b) for b in (body if isinstance(body, list) else [body])]
    result = build_channel(channel, spec.channels[channel]).send(
        Notification(channel=channel, groups=groups, **notification))
    assert result.ok, result
    return getattr(sims, PROVIDER_OF[channel]).received[-1]


@contextlib.contextmanager
def notifier_behind_alertmanager(tmp_path: Path, grouping: dict[str, list[str]], **notifier):
    """Yield (sims, notifier service, spec data) with the notifier on the simulators and the spec data set up so
    its generated Alertmanager config posts to that notifier, with the secret files written and groups
    flushed within seconds (`grouping`: layer -> group_by; `notifier`: more notifier settings)."""
    from inferwatch.notifier.service import NotifierService

    sims = ProviderSimulators().start()
    svc = None
    try:
        data = spec_data(sims, **notifier)
        svc = NotifierService(spec_from_dict(data), tmp_path / "data", port=0).start()
        (tmp_path / "token").write_text(TOKEN + "\n")
        (tmp_path / "pdkey").write_text(sims.pagerduty.routing_key + "\n")
        fast = {"group_wait": "1s", "group_interval": "2s", "repeat_interval": "1h"}
        data["targets"] = {"notifier": svc.url}
        data["notifier"].update(token_file=str(tmp_path / "token"), fallback_routing_key_file=str(tmp_path / "pdkey"),
                                fallback_pagerduty_url=sims.pagerduty_url,
                                grouping={layer: {"group_by": list(by), **fast} for layer, by in grouping.items()})
        yield sims, svc, data
    finally:
        if svc:
            svc.stop()
        sims.stop()
