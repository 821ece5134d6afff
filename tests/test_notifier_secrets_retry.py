"""Channel secrets are resolved at start-up (a missing one stops the notifier with exit 2 naming the field);
a secret that disappears later is retried, not dead-lettered; `outbox retry` refuses a delivered row
without --force and keeps its created time."""

from __future__ import annotations

import json

import pytest
import requests

from inferwatch.cli import main
from inferwatch.notifier.service import NotifierService
from inferwatch.spec import spec_from_dict
from inferwatch.specload import SpecError
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, spec_data, wait_for, webhook


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


def test_missing_channel_secret_fails_start_up_with_exit_2_naming_the_field(sims, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NOPE_SLACK_URL", raising=False)
    data = spec_data(sims)
    data["channels"]["oncall-slack"]["url"] = "${NOPE_SLACK_URL}"
    with pytest.raises(SpecError, match="channels.oncall-slack.url"):
        NotifierService(spec_from_dict(data), tmp_path / "a", port=0)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(data))
    assert main(["notifier", "--spec", str(spec_file), "--data-dir", str(tmp_path / "b"), "--port", "19999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "channels.oncall-slack.url" in err[0] and "NOPE_SLACK_URL" in err[0]


def test_secret_file_missing_at_send_time_is_retried_until_it_appears(sims, tmp_path):
    sims.set_mode("ok")
    secret = tmp_path / "slack-url"
    secret.write_text(sims.slack_url)
    data = spec_data(sims)
    del data["channels"]["oncall-slack"]["url"]
    data["channels"]["oncall-slack"]["url_file"] = str(secret)
    svc = NotifierService(spec_from_dict(data), tmp_path / "data", port=0).start()
    try:
        secret.unlink()  # e.g. a rotated secret not yet written back
        requests.post(svc.url + "/alerts", json=webhook("TritonServerDown", "L2", group="sec"), headers=AUTH,
                      timeout=10)
        row = wait_for(lambda: next((d for d in svc.outbox.list(("pending", "dead"))
                                     if d.channel == "oncall-slack" and d.attempts > 0), None),
                       what="a failed attempt")
        assert (row.state, row.last_reason) == ("pending", "secret_missing")
        secret.write_text(sims.slack_url)
        wait_for(lambda: svc.outbox.get(row.id).state == "delivered", what="delivery once the file is back")
    finally:
        svc.stop()


def test_retry_of_a_delivered_notification_needs_force_and_keeps_created_time(sims, tmp_path, capsys):
    sims.set_mode("ok")
    data = spec_data(sims)
    svc = NotifierService(spec_from_dict(data), tmp_path / "data", port=0).start()
    try:
        requests.post(svc.url + "/alerts", json=webhook("LlmTtftP95High", "L3", group="done"), headers=AUTH,
                      timeout=10)
        wait_for(lambda: svc.outbox.counts()["delivered"] == 1, what="the delivery")
        d = svc.outbox.list(("delivered",))[0]
        sent = len(sims.wecom.received)
        spec_file = tmp_path / "spec.json"
        spec_file.write_text(json.dumps(data))
        args = ["--spec", str(spec_file), "--data-dir", str(tmp_path / "data")]
        assert main(["notifier", "outbox", "retry", str(d.id), *args]) == 2
        err = capsys.readouterr().err
        assert "already delivered at" in err and "--force" in err
        assert svc.outbox.get(d.id).state == "delivered" and len(sims.wecom.received) == sent
        assert main(["notifier", "outbox", "retry", str(d.id), "--force", *args]) == 0
        wait_for(lambda: len(sims.wecom.received) == sent + 1, what="the forced re-send")
        again = svc.outbox.get(d.id)
        assert again.created_at == d.created_at and again.requeued_at is not None
    finally:
        svc.stop()
