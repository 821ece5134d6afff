"""What the messages say: counts that never over-claim (resolved alerts in a firing group shown as
resolved, Alertmanager's truncated alerts counted apart), every label and annotation reachable, long
fields cut with a marker saying how much, and PagerDuty's 512 KB limit met with every alert kept.
Channel classes against the local provider simulators, and the issue's example through a running notifier.
"""

from __future__ import annotations

import json
import re

import pytest
import requests

from inferwatch.notifier.channels import build_channel
from inferwatch.notifier.channels.base import json_bytes
from inferwatch.notifier.model import Notification, message_from_dict
from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channel_text import wecom_display
from notifier_support import AUTH, make_spec, reset_sims, send_via, simulators, wait_for, webhook  # noqa: F401 - reset_sims is an autouse fixture


@pytest.fixture(scope="module")
def sims():
    yield from simulators()


def group(name: str, status: str, firing: int, resolved: int, truncated: int, layer: str = "L2") -> dict:
    """A webhook whose group has `firing` + `resolved` alerts and `truncated` alerts left out."""
    body = webhook(name, layer, n=firing + resolved, status=status)
    for i, alert in enumerate(body["alerts"]):
        alert["status"] = "firing" if i < firing else "resolved"
        alert["endsAt"] = "0001-01-01T00:00:00Z" if i < firing else "2030-01-01T00:00:00Z"
    body["truncatedAlerts"] = truncated
    return body


# ------------------------------------------------------------------------------------------------ counts
COUNTS = [  # status, firing, resolved, truncatedAlerts, title
    ("firing", 2, 1, 12,  # the issue's
     "[FIRING:2+] GroupCounts — at least 2 firing, at least 1 resolved, 12 more not included (15 in the group)"),
    ("firing", 3, 0, 0, "[FIRING:3] GroupCounts"),
    ("firing", 1, 0, 5, "[FIRING:1+] GroupCounts — at least 1 firing, 5 more not included (6 in the group)"),
    ("firing", 1, 4, 0, "[FIRING:1] GroupCounts — 1 firing, 4 resolved"),
    ("resolved", 0, 2, 0, "[RESOLVED:2] GroupCounts"),
    ("resolved", 0, 2, 3, "[RESOLVED:2+] GroupCounts — at least 2 resolved, 3 more not included (5 in the group)"),
]


@pytest.mark.parametrize("status, firing, resolved, truncated, title", COUNTS)
def test_chat_titles_count_what_is_there_and_show_each_alert_with_its_status(sims, status, firing, resolved,
                                                                           truncated, title):
    body = group("GroupCounts", status, firing, resolved, truncated)
    slack = send_via(sims, "oncall-slack", body)
    assert slack.body["blocks"][0]["text"]["text"] == title
    alert_blocks = [b["elements"][0]["elements"] for b in slack.body["blocks"]
                    if b["type"] == "rich_text" and b["elements"][0]["elements"][0].get("type") == "emoji"]
    shown = [(els[0]["name"], els[2]["text"]) for els in alert_blocks]
    assert shown == [("rotating_light", "FIRING")] * firing + [("white_check_mark", "RESOLVED")] * resolved
    assert ("not included by Alertmanager" in slack.text) == bool(truncated)
    assert f"{truncated} more alert(s) not included" in slack.text or not truncated

    wecom = send_via(sims, "llm-wecom", body)
    text = wecom.text
    assert text.splitlines()[0].endswith(f">{title}</font>")
    assert text.count('<font color="warning">FIRING</font>') == firing
    assert text.count('<font color="info">RESOLVED</font>') == resolved
    assert (f"{truncated} more alert(s) not included by Alertmanager" in text) == bool(truncated)


@pytest.mark.parametrize("status, firing, resolved, truncated, title", COUNTS)
def test_pagerduty_and_voice_carry_the_counts(sims, status, firing, resolved, truncated, title):
    body = group("GroupCounts", status, firing, resolved, truncated, layer="L1")
    event = send_via(sims, "phone", body).body
    if status == "resolved":
        assert event["event_action"] == "resolve" and "payload" not in event
        return
    assert event["event_action"] == "trigger" and event["payload"]["summary"].startswith(title + " — ")
    details = event["payload"]["custom_details"]
    assert (details["status"], details["num_firing"], details["num_resolved"], details["truncated_alerts"]) == \
        (status, firing, resolved, truncated)
    assert [a["labels"]["instance"] for a in details["firing"]] == [f"i{i}" for i in range(firing)]
    assert [a["labels"]["instance"] for a in details["resolved"]] == [f"i{i}" for i in range(firing, firing + resolved)]
    assert send_via(sims, "call", body).body["text"].startswith(title)


def test_the_issue_example_through_the_notifier_on_every_channel(sims, tmp_path):
    """Alertmanager-shaped POSTs to a running notifier: status firing, 2 firing + 1 resolved, truncatedAlerts 12."""
    svc = NotifierService(make_spec(sims), tmp_path / "data", port=0).start()
    title = "[FIRING:2+] {} — at least 2 firing, at least 1 resolved, 12 more not included (15 in the group)"
    providers = (sims.pagerduty, sims.voice, sims.slack, sims.wecom)
    before = [len(p.received) for p in providers]
    try:
        for layer, name in (("L1", "GpuXidCritical"), ("L2", "TritonModelNotReady"), ("L3", "LlmTtftP95High")):
            r = requests.post(svc.url + "/alerts", json=group(name, "firing", 2, 1, 12, layer), headers=AUTH,
                              timeout=10)
            assert r.status_code == 200, r.text
        wait_for(lambda: all(len(p.received) > n for p, n in zip(providers, before, strict=True)), what="every channel")
        details = sims.pagerduty.received[-1].body["payload"]["custom_details"]
        assert (details["status"], details["num_firing"], details["num_resolved"], details["truncated_alerts"]) \
            == ("firing", 2, 1, 12)
        assert sims.pagerduty.received[-1].body["payload"]["summary"].startswith(title.format("GpuXidCritical"))
        assert sims.voice.received[-1].body["text"].startswith(title.format("GpuXidCritical"))
        assert sims.slack.received[-1].body["blocks"][0]["text"]["text"] == title.format("TritonModelNotReady")
        assert "RESOLVED" in sims.slack.received[-1].text
        assert title.format("LlmTtftP95High") in sims.wecom.received[-1].text
        assert '<font color="info">RESOLVED</font>' in sims.wecom.received[-1].text
    finally:
        svc.stop()


# ------------------------------------------------------------------------------------------------ labels
LABEL_SETS = [
    # shared labels beyond the key ones, per-alert labels, annotations beyond summary/description
    ({"job": "triton", "route": "/v1/chat", "pod": "triton-7f9c", "container": "server", "foo_bar": "x1"},
     [{"gpu": "0", "uuid": "GPU-aa"}, {"gpu": "1", "uuid": "GPU-bb"}],
     {"dashboard": "https://grafana.example/d/x", "custom_note": "call the model owner"}),
    ({"namespace": "llm", "cluster": "bj-1"},
     [{"pod": "p-1"}, {"pod": "p-2", "extra": "only-here"}],
     {"runbook_url": "see the wiki page Triton-restart", "impact": "realtime tier"}),
]


@pytest.mark.parametrize("shared, per_alert, annotations", LABEL_SETS)
def test_every_label_and_annotation_is_reachable_from_the_message(sims, shared, per_alert, annotations):
    body = webhook("LabelsEverywhere", "L2", n=len(per_alert), extra=shared)
    for alert, extra in zip(body["alerts"], per_alert, strict=True):
        alert["labels"].update(extra)
        alert["annotations"].update(annotations)
    pairs = [(k, v) for a in body["alerts"] for k, v in a["labels"].items()]
    notes = [(k, v) for a in body["alerts"] for k, v in a["annotations"].items()]

    slack = send_via(sims, "oncall-slack", body).text
    wecom, _ = wecom_display(send_via(sims, "llm-wecom", body).body)
    for shown in (slack, wecom):
        for k, v in pairs:
            assert v in shown and (f"{k}=" in shown or f"{k}: " in shown or k == "alertname"), (k, v)
        for k, v in notes:  # a runbook URL is the target of a Runbook link
            assert v in shown or (k == "runbook_url" and "Runbook" in shown), (k, v)
    details = send_via(sims, "phone", body).body["payload"]["custom_details"]
    sent = [(a["labels"], a["annotations"]) for a in details["firing"]]
    assert sent == [(a["labels"], a["annotations"]) for a in body["alerts"]]


# ------------------------------------------------------------------------------------------------ sizes
def test_a_long_description_is_cut_on_chat_with_a_marker_and_sent_whole_to_pagerduty(sims):
    body = webhook("LongTrace", "L2", description="Traceback line\n" * 1000)  # 15,000 characters
    marker = re.compile(r" …\[cut ([\d,]+) of 15,000 characters\]")
    slack = send_via(sims, "oncall-slack", body)
    assert marker.search(slack.text) and len(slack.text) < 12_000
    wecom = send_via(sims, "llm-wecom", body)
    assert marker.search(wecom.text) and len(wecom.text.encode()) <= 4096
    event = send_via(sims, "phone", body).body
    assert event["payload"]["custom_details"]["firing"][0]["annotations"]["description"] == "Traceback line\n" * 1000


def _pagerduty_event(sims, body) -> tuple[dict, bytes]:
    got = send_via(sims, "phone", body)
    assert len(got.raw) <= 512_000
    return got.body["payload"]["custom_details"], got.raw


def test_pagerduty_over_512kb_cuts_the_largest_fields_first_and_keeps_every_alert(sims):
    body = webhook("HugeGroup", "L1", n=31)
    big = body["alerts"][0]["annotations"]
    for i in range(40):  # one alert with 40 annotations of 15,000 characters: 600 KB alone
        big[f"trace_{i}"] = f"{i:02d}" + "x" * 14_998
    details, _ = _pagerduty_event(sims, body)
    assert [a["labels"]["instance"] for a in details["firing"]] == [f"i{i}" for i in range(31)]
    cut = details["firing"][0]["annotations"]
    for i in range(40):
        assert re.fullmatch(rf"{i:02d}x* …\[cut [\d,]+ of 15,000 characters\]", cut[f"trace_{i}"])
    for sent, alert in zip(details["firing"][1:], body["alerts"][1:], strict=True):  # the small alerts are untouched
        assert sent["annotations"] == alert["annotations"] and sent["labels"] == alert["labels"]


def test_pagerduty_many_large_alerts_are_all_kept_each_cut_alike(sims):
    body = webhook("ManyLarge", "L1", n=60, description="d" * 15_000)  # 900 KB of descriptions
    details, raw = _pagerduty_event(sims, body)
    assert len(details["firing"]) == 60
    kept = {len(a["annotations"]["description"]) for a in details["firing"]}
    assert len(kept) == 1 and kept.pop() < 15_000
    assert len(raw) > 400_000  # cut no more than needed


def test_pagerduty_too_many_alerts_for_any_details_lists_them_by_name_and_counts_the_rest(sims):
    body = webhook("Storm", "L1", n=8000, extra={"pod": "p" * 40})
    for i, a in enumerate(body["alerts"]):
        a["labels"]["shard"] = f"s{i:05d}" + "z" * 60
    details, raw = _pagerduty_event(sims, body)
    lines = details["firing"]
    more = int(re.fullmatch(r"…and (\d+) more", lines[-1]).group(1))
    assert all(line.startswith("Storm{") for line in lines[:-1]) and len(lines) - 1 + more == 8000
    assert details["num_firing"] == 8000 and "did not fit" in details["note"]
    assert json.loads(raw)["payload"]["summary"].startswith("[FIRING:8000] Storm")


def test_every_size_measure_is_the_bytes_sent(sims):
    body = webhook("Sizes", "L1", n=3, description="温度" * 100)
    spec = make_spec(sims)
    ch = build_channel("phone", spec.channels["phone"])
    assert ch.send(Notification(channel="phone", groups=[message_from_dict(body)])).ok
    assert ch.last_size == len(sims.pagerduty.received[-1].raw) == len(json_bytes(sims.pagerduty.received[-1].body))


@pytest.mark.parametrize("where", ["group label", "key label", "other label", "description", "annotation",
                                   "summary"])
@pytest.mark.parametrize("channel", ["oncall-slack", "llm-wecom", "phone", "call"])
def test_a_16k_value_anywhere_still_fits_every_channel(sims, channel, where):
    long = "v" * 16_000  # the longest value intake keeps
    body = webhook("LongValue", "L2", extra={"model": long} if where in ("group label", "key label") else {})
    alert = body["alerts"][0]
    if where == "group label":
        body["groupLabels"]["model"] = long
    elif where == "other label":
        alert["labels"]["pod"] = long
    elif where in ("description", "annotation", "summary"):
        alert["annotations"][{"annotation": "trace"}.get(where, where)] = long
    got = send_via(sims, channel, body)  # the simulators enforce each provider's limits
    marker = re.compile(r" …\[cut [\d,]+ of [\d,]+ characters\]")
    in_title = where in ("group label", "summary")
    if channel in ("oncall-slack", "llm-wecom"):
        assert marker.search(got.raw.decode())
    elif channel == "phone":
        assert long in got.raw.decode()  # custom_details keeps it whole: 16 KB fits PagerDuty's event
        assert bool(marker.search(got.body["payload"]["summary"])) == in_title
    else:
        assert len(got.body["text"]) <= 200 and bool(marker.search(got.body["text"])) == in_title
