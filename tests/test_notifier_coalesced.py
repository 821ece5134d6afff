"""A digest (several groups in one chat message, when a destination's rate holds messages back) tells its groups
apart: each group's line names its status, alert name, severity, the labels that differ between the groups and its
runbook link; what does not fit the provider's limit is counted by name in an "…and N more group(s)" line.
A table of digests (the issue's 22 groups of one alertname on different GPUs, groups on different models, on
different tenants, different alerts, nodes of several GPUs each, one firing and one resolved, one too large for
either provider) through the real channel code to the provider simulators (real HTTP), which enforce each
provider's limits."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from inferwatch.notifier.channels import build_channel
from inferwatch.notifier.channels.slack import MESSAGE_MAX_CHARS
from inferwatch.notifier.channels.wecom import MARKDOWN_MAX_BYTES, TEXT_MAX_BYTES
from inferwatch.notifier.model import Notification, message_from_dict
from inferwatch.testing.channel_text import slack_text_chars, wecom_display
from inferwatch.testing.channels import ProviderSimulators, Received
from notifier_support import make_spec, send_via, webhook

MORE = re.compile(r"…and (\d+) more group\(s\) not shown: (.*?) — ")
COUNTED = re.compile(r"(\d+) × (\S+) \((firing|resolved)\)")


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


def group(name: str, layer: str, key: str, status: str = "firing", severity: str = "critical", **labels) -> dict:
    return webhook(name, layer, group=f"{name}-{key}", status=status, severity=severity, extra=labels)


def gpus() -> list[dict]:  # the example: 22 pages of one alertname on different GPUs of one node
    return [group("GpuXidError", "L1", f"gpu{i}", gpu=str(i)) for i in range(22)]


def models() -> list[dict]:
    return [group("TritonQueueTimeP95High", "L3", m, severity="warning", model=m)
            for m in ("llama-3-8b", "qwen2-7b", "bge-m3", "whisper-large")]


def tenants() -> list[dict]:  # "acme & co" has a character WeCom markdown cannot show exactly: a text message
    return [group("GatewayTenantErrorRatioHigh", "L3", t, tenant=t) for t in ("acme & co", "globex", "initech")]


def different_alerts() -> list[dict]:
    return [group("GpuXidError", "L1", "g0", gpu="0"), group("TritonServerDown", "L2", "t1", triton="triton-1")]


def firing_and_resolved() -> list[dict]:  # the resolved one first: firing groups come first in the message
    return [group("TritonServerDown", "L2", "t0", status="resolved", triton="triton-0"),
            group("TritonServerDown", "L2", "t1", triton="triton-1")]


def nodes() -> list[dict]:  # a group per node, its alerts on several GPUs: the GPUs are named by their values
    bodies = []
    for node, n in (("node-a", 5), ("node-b", 2)):
        body = webhook("GpuEccErrorsHigh", "L1", n=n, group=f"ecc-{node}", extra={"node": node})
        for i, alert in enumerate(body["alerts"]):
            alert["labels"]["gpu"] = str(i)
        bodies.append(body)
    return bodies


def too_many() -> list[dict]:
    return [group("LlmTtftP95High" if i % 3 == 0 else "TritonQueueTimeP95High", "L3", f"m{i}",
                  status="resolved" if i % 10 == 9 else "firing", severity="warning",
                  model=f"llama-3-70b-instruct-awq-{i:03d}") for i in range(300)]


# case, groups, what tells each group apart on its line (one label per group)
CASES = [
    ("22 GPUs of one alertname", gpus, lambda b: f"gpu={b['commonLabels']['gpu']}"),  # the example
    ("models", models, lambda b: f"model={b['commonLabels']['model']}"),
    ("tenants", tenants, lambda b: f"tenant={b['commonLabels']['tenant']}"),
    ("different alerts", different_alerts,
     lambda b: next(f"{k}={v}" for k, v in b["commonLabels"].items() if k in ("gpu", "triton"))),
    ("nodes of several GPUs", nodes, lambda b: {"node-a": "node=node-a gpu=0,1,2,+2",
                                                 "node-b": "node=node-b gpu=0,1"}[b["commonLabels"]["node"]]),
    ("one firing, one resolved", firing_and_resolved, lambda b: f"triton={b['commonLabels']['triton']}"),
    ("cut to the limit", too_many, lambda b: f"model={b['commonLabels']['model']}"),
]


def slack_lines(got: Received) -> list[tuple[str, list[str]]]:
    """(what a person sees, link URLs) per line of the message's rich-text blocks."""
    lines: list[tuple[str, list[str]]] = []
    for block in got.body["blocks"]:
        if block["type"] != "rich_text":
            continue
        text, urls = "", []
        for el in block["elements"][0]["elements"]:
            if el["type"] == "emoji":
                text += f":{el['name']}:"
            elif el["type"] == "link":
                text += el["text"]
                urls.append(el["url"])
            else:
                parts = el["text"].split("\n")
                text += parts[0]
                for part in parts[1:]:
                    lines.append((text, urls))
                    text, urls = part, []
        lines.append((text, urls))
    return lines


def wecom_lines(got: Received) -> list[tuple[str, list[str]]]:
    markdown = got.body["msgtype"] == "markdown"
    content = got.body["markdown" if markdown else "text"]["content"]
    out = []
    for line in content.split("\n"):
        if markdown:
            shown = wecom_display({"msgtype": "markdown", "markdown": {"content": line}})[0]
            out.append((shown, re.findall(r"\[Runbook\]\((\S+?)\)", line)))
        else:
            out.append((line, re.findall(r"Runbook: (\S+)", line)))
    return out


def check_digest(got: Received, lines: list[tuple[str, list[str]]], bodies: list[dict], tells) -> None:
    shown = {}
    for body in bodies:
        name, status = body["commonLabels"]["alertname"], body["status"]
        want = [f"[{status.upper()}:{len(body['alerts'])}] {name} · {body['commonLabels']['severity']} · ", tells(body)]
        on = [(text, urls) for text, urls in lines if all(w in text for w in want)
              and re.search(re.escape(tells(body)) + r"(\s|$)", text)]
        assert len(on) <= 1, on  # one line per group
        if on:
            text, urls = on[0]
            assert urls == [f"https://runbooks.example/{name}.md"], text
            shown[tells(body)] = text
    # Lines never repeat: each names what tells its group apart.
    group_lines = [t for t, _ in lines if re.search(r"\[(FIRING|RESOLVED):", t)]
    assert len(group_lines) == len(set(group_lines)) == len(shown)
    # Firing groups first.
    statuses = [t[t.index("[") + 1:t.index(":", t.index("["))] for t in group_lines]
    assert statuses == sorted(statuses, key=lambda s: s != "FIRING")
    omitted = [b for b in bodies if tells(b) not in shown]
    more = MORE.search("\n".join(t for t, _ in lines))
    if not omitted:
        assert more is None
        return
    # Never dropped silently: the groups not shown are counted, by name and status.
    assert more and int(more.group(1)) == len(omitted), more
    counted = Counter({(n, s): int(c) for c, n, s in COUNTED.findall(more.group(2))})
    assert counted == Counter((b["commonLabels"]["alertname"], b["status"]) for b in omitted)


@pytest.mark.parametrize("case, bodies, tells", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("channel", ["oncall-slack", "llm-wecom"])
def test_each_group_of_a_digest_is_named_by_what_tells_it_apart(sims, channel, case, bodies, tells):
    bodies = bodies()
    got = send_via(sims, channel, bodies)  # accepted: within the simulator's limits
    assert f"{len(bodies)} notifications" in got.text
    if channel == "oncall-slack":
        assert slack_text_chars(got.body["blocks"]) <= MESSAGE_MAX_CHARS and len(got.body["blocks"]) <= 50
        lines = slack_lines(got)
    else:
        limit = MARKDOWN_MAX_BYTES if got.body["msgtype"] == "markdown" else TEXT_MAX_BYTES
        content = got.body[got.body["msgtype"]]["content"]
        assert len(content.encode("utf-8")) <= limit
        assert (got.body["msgtype"] == "text") == (case == "tenants")  # "acme & co" is not markdown-safe
        lines = wecom_lines(got)
    check_digest(got, lines, bodies, tells)
    if case == "cut to the limit":
        assert MORE.search("\n".join(t for t, _ in lines))  # 300 groups fit neither provider
    if case == "one firing, one resolved":
        assert ":white_check_mark: [RESOLVED:1]" in got.text if channel == "oncall-slack" else \
            '<font color="info">[RESOLVED:1] TritonServerDown</font>' in got.body["markdown"]["content"]


@pytest.mark.parametrize("channel, limit_attr, limit", [("oncall-slack", "max_total_chars", 1_200),
                                                        ("llm-wecom", "max_markdown_bytes", 1_500)])
def test_a_digest_resent_smaller_after_too_long_still_counts_every_group(sims, channel, limit_attr, limit):
    # A provider measuring more strictly than documented: the channel learns the size, the resend is smaller
    # and what it leaves out is counted.
    provider = sims.slack if channel == "oncall-slack" else sims.wecom
    setattr(provider, limit_attr, limit)
    bodies = gpus()
    ch = build_channel(channel, make_spec(sims).channels[channel])
    n = Notification(channel=channel, groups=[message_from_dict(b) for b in bodies])
    first = ch.send(n)
    assert (first.ok, first.reason) == (False, "too_long")
    n.budget_factor = 0.5
    assert ch.send(n).ok
    ch.close()
    got = provider.received[-1]
    lines = slack_lines(got) if channel == "oncall-slack" else wecom_lines(got)
    check_digest(got, lines, bodies, lambda b: f"gpu={b['commonLabels']['gpu']}")
    assert MORE.search("\n".join(t for t, _ in lines))
