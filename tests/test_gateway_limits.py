"""Bounded memory: the real gateway process holds at most gateway.max_answer_bytes of a non-streamed answer
(or of one stream event) to meter it; larger ones stream through unmetered, counted and logged once. The
memory test measures the process's peak resident set while three answers far above the cap pass at once."""

from __future__ import annotations

import concurrent.futures
import json

import pytest
import requests

from gateway_support import GatewayProcess, Script, ScriptedUpstream

CAP = 1024 * 1024
HUGE = 128 * 1024 * 1024  # per answer; three at once
PIECE = b"x" * 65536
CHAT = "/v1/chat/completions"
ANSWER = json.dumps({"object": "chat.completion", "choices": [],
                     "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}).encode()
# Stated bound (docs/gateway.md#limits-and-secrets): per answer in flight, the cap twice (the bytes held and the
# copy parsed) plus aiohttp's transport buffers; the rest is the interpreter's allocator slack.
BOUND_KIB = (3 * 2 * CAP + 32 * 1024 * 1024) // 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    up = ScriptedUpstream()
    spec = {"tenants": ["small", "huge0", "huge1", "huge2", "event"], "models": ["gpt-test"],
            "gateway": {"max_answer_bytes": CAP}}
    gw = GatewayProcess(up.url, spec, tmp_path_factory.mktemp("gateway"))
    yield gw, up
    gw.stop()
    up.stop()


def post(gw, tenant: str, body: dict) -> tuple[int, dict, int]:
    """(status, headers, bytes received), reading the answer in pieces so the test itself holds little."""
    with requests.post(gw.url + CHAT, json=body, headers={"X-Tenant-ID": tenant, "X-Script": tenant},
                       stream=True, timeout=120) as resp:
        size = sum(len(p) for p in resp.raw.stream(65536, decode_content=False))
        return resp.status_code, dict(resp.headers), size


def test_answer_under_the_cap_is_metered(stack):
    gw, up = stack
    up.scripts["small"] = Script([ANSWER], content_type="application/json")
    status, headers, size = post(gw, "small", {"model": "gpt-test"})
    assert (status, size, headers["X-Token-Used"]) == (200, len(ANSWER), "5")


def test_answers_far_above_the_cap_stream_through_unmetered_within_the_memory_bound(stack):
    gw, up = stack
    for i in range(3):
        # One announces its size (Content-Length), two are chunked: the cap is found while reading.
        up.scripts[f"huge{i}"] = Script([ANSWER[:-1], ("bulk", HUGE - len(ANSWER), PIECE)],
                                        content_type="application/json", length=HUGE - 1 if i == 0 else None)
    baseline = gw.memory_kib()["VmRSS"]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda i: post(gw, f"huge{i}", {"model": "gpt-test"}), range(3)))
    peak = gw.memory_kib()["VmHWM"]
    growth = peak - baseline
    print(f"\ngateway memory: baseline RSS {baseline / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, growth "
          f"{growth / 1024:.1f} MiB while 3 answers of {HUGE / 2**20:.0f} MiB passed (cap {CAP / 2**20:.0f} MiB; "
          f"bound {BOUND_KIB / 1024:.0f} MiB)")
    for i, (status, headers, size) in enumerate(results):
        assert status == 200 and size == HUGE - 1
        assert "X-Token-Used" not in headers
        usage = gw.wait_usage(tenant=f"huge{i}")
        assert (usage["outcome"], usage["output_tokens"], usage["unmetered"]) == ("ok", None, "too_large")
    assert growth < BOUND_KIB
    assert gw.value("gateway_unmetered_responses_total", model="gpt-test", reason="too_large") == 3
    lines = [line for line in gw.output().splitlines() if "forwarded unmetered" in line]
    assert 1 <= len(lines) <= 2, lines  # once per kind: announced size and size found while reading


def test_stream_event_above_the_cap_stops_metering_not_the_stream(stack):
    gw, up = stack
    items = [b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n', b"data: ",
             ("bulk", 3 * CAP, PIECE), b"\n\n", b"data: [DONE]\n\n"]
    up.scripts["event"] = Script(items)
    status, _headers, size = post(gw, "event", {"model": "gpt-test", "stream": True})
    assert status == 200 and size == len(items[0]) + 6 + 3 * CAP + 2 + len(items[4])
    usage = gw.wait_usage(tenant="event")
    assert (usage["outcome"], usage["output_tokens"], usage["unmetered"]) == ("ok", None, "too_large")
