"""Digests that must shorten: the longest texts are cut first, as many whole alerts as fit stay, and the message
always says how many alerts were shortened or left out; counts of a group Alertmanager cut are lower bounds.
Tables of group sizes (1, 2, 18, 200) × text (ASCII, Chinese) × channel, through the real channel code to the
provider simulators (real HTTP), byte and character limits asserted on what the provider received."""

from __future__ import annotations

import re

import pytest

from inferwatch.notifier.channels.slack import MESSAGE_MAX_CHARS
from inferwatch.notifier.channels.wecom import MARKDOWN_MAX_BYTES, TEXT_MAX_BYTES
from inferwatch.testing.channel_text import wecom_display
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import send_via, webhook

TEXTS = {
    "ascii": "Queue time P95 is above its target on this model; requests wait for a batch slot. " * 3,
    "chinese": "模型队列等待时间的第95百分位超过目标值，请求正在等待批处理槽位。" * 3,
}
SIZES = [1, 2, 18, 200]


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


def group(n: int, text: str, truncated: int = 0) -> dict:
    body = webhook("TritonQueueTimeP95High", "L3", n=n, severity="warning", description=text)
    for i, alert in enumerate(body["alerts"]):
        alert["annotations"]["summary"] = f"Summary of alert i{i}."
    body["truncatedAlerts"] = truncated
    return body


def wecom_accounting(text: str, n: int) -> tuple[int, int, int]:
    """(alerts shown with their summary, listed in one line or left out as counted, shortened as counted) in
    a WeCom text; the one-line alerts counted are there, each once."""
    shown = len(set(re.findall(r"Summary of alert i(\d+)\.", text)))
    left = re.search(r"…and (\d+) more left out", text)
    listed = re.search(r"(\d+) in one line each, without summary and description", text)
    one_liners = re.findall(r"(?m)^FIRING instance=i(\d+)$", text)
    assert len(one_liners) == len(set(one_liners)) == (int(listed.group(1)) if listed else 0), text
    shortened = re.search(r"(\d+) of the (\d+) shown shortened", text)
    if shortened:
        assert int(shortened.group(2)) == shown, text
    counted = (int(left.group(1)) if left else 0) + len(one_liners)
    return shown, counted, int(shortened.group(1)) if shortened else 0


@pytest.mark.parametrize("lang", TEXTS)
@pytest.mark.parametrize("n", SIZES)
def test_wecom_digest_keeps_whole_alerts_and_counts_the_rest(sims, n, lang):
    text = TEXTS[lang]
    got = send_via(sims, "llm-wecom", group(n, text))
    limit = MARKDOWN_MAX_BYTES if got.body["msgtype"] == "markdown" else TEXT_MAX_BYTES
    raw = got.body[got.body["msgtype"]]["content"]
    assert len(raw.encode()) <= limit
    seen, _ = wecom_display(got.body)
    shown, left, shortened = wecom_accounting(seen, n)
    # Every alert is shown with its texts, or in one line and counted, or counted as left out: none vanishes.
    assert shown + left == n, seen
    assert shown >= 1
    if n <= 2:
        assert (shown, left) == (n, 0), seen          # small groups whole
        assert text.strip()[:60] in seen              # their description shown, not only a label
    if n == 18:
        # The 18 alerts: the digest keeps several whole alerts (a regression once kept 1) and uses the
        # room: less than one alert block of the 4,096 bytes stays unused.
        assert shown >= 5, seen
        assert limit - len(raw.encode()) < 700, len(raw.encode())
    if left or shortened:
        assert "to fit" in seen or "shortened" in seen or "in one line each" in seen


def test_wecom_shortens_the_longest_text_first(sims):
    # One alert with a long description among short ones: only it is cut, the short ones stay whole.
    body = group(6, "short description")
    body["alerts"][0]["annotations"]["description"] = "x" * 6000
    got = send_via(sims, "llm-wecom", body)
    seen, _ = wecom_display(got.body)
    shown, left, shortened = wecom_accounting(seen, 6)
    assert (shown, left, shortened) == (6, 0, 1), seen
    assert seen.count("short description") == 5
    assert "…[cut " in seen


COUNTS = [  # present firing, present resolved, truncatedAlerts, title, counts phrase
    (2, 1, 37, "[FIRING:2+]", "at least 2 firing, at least 1 resolved, 37 more not included (40 in the group)"),
    (2, 0, 0, "[FIRING:2]", None),
    (1, 0, 5, "[FIRING:1+]", "at least 1 firing, 5 more not included (6 in the group)"),
    (2, 1, 0, "[FIRING:2]", "2 firing, 1 resolved"),
]


@pytest.mark.parametrize("channel", ["llm-wecom", "oncall-slack", "phone"])
@pytest.mark.parametrize("firing, resolved, truncated, title, phrase", COUNTS)
def test_counts_under_truncated_alerts_are_lower_bounds(sims, channel, firing, resolved, truncated, title, phrase):
    body = group(firing + resolved, "d", truncated)
    for i, alert in enumerate(body["alerts"]):
        if i >= firing:
            alert["status"] = "resolved"
            alert["endsAt"] = "2030-01-01T00:00:00Z"
    got = send_via(sims, channel, body)
    shown = got.text if channel != "llm-wecom" else wecom_display(got.body)[0]
    assert f"{title} TritonQueueTimeP95High" in shown, shown
    if phrase:
        assert phrase in shown, shown
    else:
        assert "firing," not in shown and "at least" not in shown
    if channel == "oncall-slack":
        assert len(got.text) <= MESSAGE_MAX_CHARS


@pytest.mark.parametrize("lang", TEXTS)
@pytest.mark.parametrize("n", SIZES)
def test_slack_digest_counts_what_it_shortens_and_lists(sims, n, lang):
    text = TEXTS[lang] * 4   # ~1,000 characters per description: 18 alerts no longer fit uncut
    got = send_via(sims, "oncall-slack", group(n, text))
    seen = got.text
    assert sum(len(str(b)) for b in got.body["blocks"]) > 0 and len(got.body["blocks"]) <= 50
    shown = len(set(re.findall(r"Summary of alert i(\d+)\.", seen)))
    cut = len(re.findall(r"…\[cut \d[\d,]* of", seen))
    note = re.search(r"(\d+) of the (\d+) alerts shown are shortened", seen)
    assert (int(note.group(1)) if note else 0) == cut and (not note or int(note.group(2)) == shown), seen
    listed = re.findall(r"(?m)^:rotating_light: FIRING instance=i(\d+)$", seen)
    more = re.search(r"…and (\d+) more, see Alertmanager", seen)
    # Every alert whole, in one line, or counted.
    assert shown + len(listed) + (int(more.group(1)) if more else 0) == n, seen
    if shown < n:
        assert f"the other {n - shown} follow in one line each" in seen, seen
