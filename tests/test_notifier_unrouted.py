"""Alerts no route matches are never dropped: they go to the catch-all (`notifier.unrouted_receivers`,
default the L2 route's receivers, else every chat channel), are counted in inferwatch_notifier_unrouted_total,
and with no channel at all are kept as `unrouted` dead letters that `outbox list` shows."""

from __future__ import annotations

import json

import pytest
import requests

from inferwatch.cli import main
from inferwatch.notifier.routing import Router
from inferwatch.notifier.service import NotifierService
from inferwatch.spec import spec_from_dict
from inferwatch.specload import SpecError
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, spec_data, wait_for, webhook


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


def start(tmp_path, data):
    return NotifierService(spec_from_dict(data), tmp_path / "data", port=0).start()


def post(svc, body):
    return requests.post(svc.url + "/alerts", data=json.dumps(body), headers=AUTH, timeout=10)


def metrics(svc) -> str:
    return requests.get(svc.url + "/metrics", timeout=10).text


def test_catch_all_defaults_to_the_l2_receivers_then_to_chat_channels(sims):
    data = spec_data(sims)
    assert Router(spec_from_dict(data)).receivers({"severity": "critical"}) == ["oncall-slack"]
    data["routes"] = [r for r in data["routes"] if r["match"].get("layer") != "L2"]
    assert Router(spec_from_dict(data)).receivers({"severity": "critical"}) == \
        ["oncall-slack", "llm-wecom", "owners-wecom"]
    data["notifier"]["unrouted_receivers"] = ["owners-wecom"]
    assert Router(spec_from_dict(data)).receivers({"severity": "critical"}) == ["owners-wecom"]
    data["notifier"]["unrouted_receivers"] = ["nope"]
    with pytest.raises(SpecError, match="notifier.unrouted_receivers"):
        spec_from_dict(data)


def test_unrouted_alert_is_delivered_to_the_catch_all_and_counted(sims, tmp_path):
    sims.set_mode("ok")
    svc = start(tmp_path, spec_data(sims))
    try:
        assert "inferwatch_notifier_unrouted_total 0.0" in metrics(svc)
        r = post(svc, webhook("SomethingNew", layer="", group="stray"))
        assert r.status_code == 200 and r.json() == {"status": "accepted", "deliveries": 1, "unrouted": True}
        wait_for(lambda: svc.outbox.counts()["delivered"] == 1, what="catch-all delivery")
        assert any("SomethingNew" in t for t in sims.slack.texts())
        assert "inferwatch_notifier_unrouted_total 1.0" in metrics(svc)
        post(svc, webhook("TritonServerDown", "L2", group="routed"))  # a routed alert is not counted
        assert "inferwatch_notifier_unrouted_total 1.0" in metrics(svc)
    finally:
        svc.stop()


def test_with_no_channel_to_take_it_the_alert_is_an_unrouted_dead_letter(sims, tmp_path, capsys):
    data = spec_data(sims, unrouted_receivers=[])
    svc = start(tmp_path, data)
    try:
        text = metrics(svc)
        assert 'inferwatch_notifier_dead_letters_total{channel="unrouted",reason="unrouted"} 0.0' in text
        r = post(svc, webhook("SomethingNew", layer="", group="stray-dead"))
        assert r.status_code == 200 and r.json()["unrouted"] is True
        dead = svc.outbox.list(("dead",))
        assert [(d.channel, d.last_reason, d.group_key) for d in dead] == [("unrouted", "unrouted", "stray-dead")]
        text = metrics(svc)
        assert "inferwatch_notifier_unrouted_total 1.0" in text
        assert 'inferwatch_notifier_dead_letters_total{channel="unrouted",reason="unrouted"} 1.0' in text
    finally:
        svc.stop()
    spec_file = tmp_path / "spec.json"  # JSON is YAML
    spec_file.write_text(json.dumps(data))
    args = ["--spec", str(spec_file), "--data-dir", str(tmp_path / "data")]
    assert main(["notifier", "outbox", "list", *args]) == 0
    out = capsys.readouterr().out
    assert f"{dead[0].id:>6}  dead" in out and "[unrouted]" in out and "stray-dead" in out
    # Replaying it cannot work (no such channel): refused, not left pending forever.
    assert main(["notifier", "outbox", "retry", str(dead[0].id), *args]) == 2
    assert "does not declare" in capsys.readouterr().err


def test_routes_test_shows_the_catch_all(sims, tmp_path, capsys):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec_data(sims)))
    assert main(["notifier", "routes", "test", "--spec", str(spec_file), "team=x", "--verify", "oncall-slack"]) == 0
    assert "catch-all" in capsys.readouterr().out
