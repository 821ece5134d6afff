"""Where a stream's end marker falls, against the official `openai` client: 100 complete streams per timing
(500 with INFERWATCH_STREAM_END_STREAMS=500), every one metered `ok` with the server's counts.

The client stops at `data: [DONE]` and closes its connection (before the body's end when the body has not
ended yet), so each timing of the upstream's last writes is a different race between the client's hang-up
and the gateway's relay and metering of those bytes: `[DONE]` in the same write as the usage chunk or in its
own, split across two writes, the body ending 0, 1 or 50 ms after it or kept open (the gateway then sees the
client leave first). A stream whose end reached the client is complete, whatever the client does next."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from dialect_fixtures import DONE, chat, chat_usage
from gateway_support import GatewayProcess, Script, ScriptedUpstream, wait_until

openai = pytest.importorskip("openai")

# 100 streams per timing in `make test` (the suite's time); INFERWATCH_STREAM_END_STREAMS=500 for the issue's
# figure. A race that hits 1 % of streams shows in 100 with probability 63 % per row, over 20 rows near 100 %.
STREAMS = int(os.environ.get("INFERWATCH_STREAM_END_STREAMS", "100"))
PROMPT, COMPLETION = 5, 12
_TOKENS = [chat({"role": "assistant", "content": ""})] + [chat({"content": f" w{i}"}) for i in range(COMPLETION)]
_FINISH, _USAGE = chat({}, finish="stop"), chat_usage(PROMPT, COMPLETION)

# row -> the items after the token chunks (gateway_support.play: bytes are one write each). With no
# finish_reason (an upstream that sends none, as some do) only `[DONE]` tells that the answer is complete.
ENDINGS = {
    "done-same-write-end-0ms": [_FINISH + _USAGE + DONE],
    "done-same-write-end-1ms": [_FINISH + _USAGE + DONE, ("sleep", 0.001)],
    "done-same-write-end-50ms": [_FINISH + _USAGE + DONE, ("sleep", 0.05)],
    "done-own-write-end-0ms": [_FINISH, _USAGE, DONE],
    "done-own-write-end-1ms": [_FINISH, _USAGE, DONE, ("sleep", 0.001)],
    "done-own-write-end-50ms": [_FINISH, _USAGE, DONE, ("sleep", 0.05)],
    "done-own-write-kept-open": [_FINISH, _USAGE, DONE, ("sleep", 5.0)],
    "done-split-across-writes": [_FINISH, _USAGE, DONE[:9], ("sleep", 0.001), DONE[9:], ("sleep", 0.001)],
    "usage-then-done-late": [_FINISH, _USAGE, ("sleep", 0.002), DONE],
    "no-finish-same-write-end-0ms": [_USAGE + DONE],
    "no-finish-same-write-end-1ms": [_USAGE + DONE, ("sleep", 0.001)],
    "no-finish-same-write-end-50ms": [_USAGE + DONE, ("sleep", 0.05)],
    "no-finish-own-write-end-0ms": [_USAGE, DONE],
    "no-finish-own-write-end-1ms": [_USAGE, DONE, ("sleep", 0.001)],
    "no-finish-own-write-end-50ms": [_USAGE, DONE, ("sleep", 0.05)],
    "no-finish-own-write-kept-open": [_USAGE, DONE, ("sleep", 5.0)],
    "no-finish-split-across-writes": [_USAGE, DONE[:9], ("sleep", 0.001), DONE[9:], ("sleep", 0.001)],
    # What the client takes for the end marker (`startswith("[DONE]")`), with what some servers add after it.
    "no-finish-done-trailing-space": [_USAGE, b"data: [DONE] \n\n"],
    "no-finish-done-trailing-space-kept-open": [_USAGE, b"data: [DONE] \n\n", ("sleep", 5.0)],
    "no-finish-done-crlf-kept-open": [_USAGE, b"data: [DONE]\r\n\r\n", ("sleep", 5.0)],
}
TENANTS = {row: f"se{i}" for i, row in enumerate(ENDINGS)}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    up = ScriptedUpstream()
    for row, ending in ENDINGS.items():
        up.scripts[row] = Script(_TOKENS + ending)
    gw = GatewayProcess(up.url, {"tenants": list(TENANTS.values()), "models": ["gpt-test"]},
                        tmp_path_factory.mktemp("stream-end"), verbose=False)
    yield gw
    gw.stop()
    up.stop()


@pytest.mark.slow
@pytest.mark.parametrize("row", list(ENDINGS))
def test_every_complete_stream_is_ok(gateway, row):
    tenant = TENANTS[row]
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=30,
                           default_headers={"X-Tenant-ID": tenant, "X-Script": row})

    def one(_: int) -> int | None:
        stream = client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}],
                                                stream=True, stream_options={"include_usage": True})
        usage = None
        for part in stream:  # the client stops at [DONE] and closes the response
            if part.usage is not None:
                usage = part.usage.completion_tokens
        return usage

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(one, range(STREAMS)))
    assert seen == [COMPLETION] * STREAMS  # the client read every answer whole
    wait_until(lambda: len(gateway.usages(tenant=tenant)) >= STREAMS, timeout=60, what=f"{STREAMS} records")
    records = gateway.usages(tenant=tenant)
    outcomes = {o: sum(r["outcome"] == o for r in records) for o in ("ok", "cancelled", "error")}
    exact = sum((r["input_tokens"], r["output_tokens"]) == (PROMPT, COMPLETION) for r in records)
    print(f"{row}: ok {outcomes['ok']} / cancelled {outcomes['cancelled']} / error {outcomes['error']}, "
          f"exact {exact} of {len(records)}")
    assert (len(records), outcomes, exact) == (STREAMS, {"ok": STREAMS, "cancelled": 0, "error": 0}, STREAMS)
