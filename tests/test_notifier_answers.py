"""Every provider answer is read within bounds: the channel's `timeout` is the deadline of the whole send
(connect, request, answer head and body), and at most MAX_ANSWER_BYTES of an answer is read.

Reported: an answer trickled one byte every 5 s held a send slot for 150 s (only a silent hang was cut, at
~11 s), and a 1 GB Slack answer took a send process to 2 GB. The table crosses every channel with the ways
an answer can be slow (silent, a trickled body, trickled status line and headers) or big; the simulator
answers each way (inferwatch/testing/channels.py, modes "hang", "trickle", "trickle_head", "big").
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
import yaml

from inferwatch.notifier.channels import build_channel
from inferwatch.notifier.channels.answer import MAX_ANSWER_BYTES
from inferwatch.notifier.model import Notification, message_from_dict
from inferwatch.spec import spec_from_dict
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, PROVIDER_OF, notifier_process, reset_sims, simulators, spec_data, wait_for, webhook  # noqa: F401

DEADLINE_S = 1.0
CHANNELS = ("phone", "call", "oncall-slack", "llm-wecom")
BODY = {"phone": ("GpuXidCritical", "L1"), "call": ("GpuXidCritical", "L1"),
        "oncall-slack": ("TritonServerDown", "L2"), "llm-wecom": ("LlmTtftP95High", "L3")}


@pytest.fixture(scope="module")
def sims():
    yield from simulators()


def send(sims, name: str):
    data = spec_data(sims)
    for c in data["channels"].values():
        c["timeout"] = f"{DEADLINE_S:g}s"
    channel = build_channel(name, spec_from_dict(data).channels[name])
    alertname, layer = BODY[name]
    t0 = time.monotonic()
    result = channel.send(Notification(channel=name, groups=[message_from_dict(webhook(alertname, layer))]))
    return result, time.monotonic() - t0


@pytest.mark.parametrize("mode, would_take_s", [("hang", 30.0), ("trickle", 100.0), ("trickle_head", 40.0)])
@pytest.mark.parametrize("name", CHANNELS)
def test_a_slow_answer_is_cut_at_the_deadline_and_retried(sims, name, mode, would_take_s):
    provider = getattr(sims, PROVIDER_OF[name])
    provider.set_mode(mode, hang_s=would_take_s)
    result, took = send(sims, name)
    assert not result.ok and result.retryable and result.reason == "timeout", result
    # The answer would take `would_take_s`; the send ends at its deadline (plus scheduling on a busy machine).
    assert took < DEADLINE_S + 4.0 < would_take_s, took
    if mode != "hang":  # cut by the deadline itself, not by a per-read timeout
        assert f"within {DEADLINE_S:g}s" in result.detail


@pytest.mark.parametrize("name", CHANNELS)
def test_a_slow_answer_within_the_deadline_is_still_taken(sims, name):
    getattr(sims, PROVIDER_OF[name]).latency_s = DEADLINE_S / 3
    result, _ = send(sims, name)
    assert result.ok, result


@pytest.mark.parametrize("name", CHANNELS)
def test_a_huge_answer_is_read_up_to_the_bound_and_the_rest_discarded(sims, name):
    provider = getattr(sims, PROVIDER_OF[name])
    provider.set_mode("big")
    provider.answer_sent = 0
    result, _ = send(sims, name)
    assert not result.ok and result.retryable and result.reason == "http_5xx", result
    assert result.detail.startswith("HTTP 503 service_unavailable ...")
    # Of a 1 GiB answer only what the socket buffers hold left the simulator before the client hung up.
    wait_for(lambda: provider.answer_sent > 0, what="the answer started")
    assert provider.answer_sent < 32 * 2**20, provider.answer_sent


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        out += [int(c) for c in children]
    return out


def test_the_real_notifier_keeps_its_send_processes_small_and_its_slots_free(tmp_path):
    """The notifier CLI with one send process: a 1 GiB Slack answer, then an answer trickled for 100 s."""
    with ProviderSimulators() as sims:
        data = spec_data(sims, send_processes=1, retry_initial="200ms", retry_max="1s")
        data["channels"]["oncall-slack"]["timeout"] = f"{DEADLINE_S:g}s"
        spec_file = tmp_path / "spec.yaml"
        spec_file.write_text(yaml.safe_dump(data))
        with notifier_process(spec_file, tmp_path / "data", tmp_path / "stderr") as (proc, url):
            sims.slack.set_mode("big")
            r = requests.post(url + "/alerts", json=webhook("TritonServerDown", "L2", group="big"), headers=AUTH,
                              timeout=10)
            assert r.status_code == 200
            wait_for(lambda: sims.slack.attempts >= 3, what="three huge answers")
            senders = _children(proc.pid)
            assert senders
            peak = max(_peak_rss_bytes(p) for p in senders)
            print(f"\n1 GiB answers x{sims.slack.attempts}: send process peak RSS {peak / 2**20:.0f} MiB, "
                  f"answer bytes taken {sims.slack.answer_sent / 2**20:.1f} MiB")
            assert peak < 256 * 2**20  # was 2 GB
            assert sims.slack.answer_sent < sims.slack.attempts * 32 * 2**20

            sims.slack.set_mode("trickle")
            attempts = sims.slack.attempts
            wait_for(lambda: sims.slack.attempts >= attempts + 3, timeout=30, what="three trickled answers cut")
            sims.slack.set_mode("ok")
            wait_for(lambda: any("TritonServerDown" in t for t in sims.slack.texts()), what="the delivery")
            log = (tmp_path / "stderr").read_text()
            assert "timeout, DeadlineExceeded: no complete answer within 1s" in log
            assert len(max(log.splitlines(), key=len)) < MAX_ANSWER_BYTES  # error texts stay short
