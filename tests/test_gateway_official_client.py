"""The official `openai` Python client through the real gateway process: 500 complete streams, none metered
`cancelled` or `error`, every usage count equal to the server's.

The client stops reading at `data: [DONE]` and closes the response before the body's last chunk. Here the
upstream ends every body a while after `[DONE]`, so every stream meets the race that made about 1 % of
complete streams look cancelled (docs/gateway-apis.md, "What a complete answer is")."""

from __future__ import annotations

import concurrent.futures
import json

import pytest

from dialect_fixtures import DONE, chat, chat_usage
from gateway_support import GatewayProcess, Script, ScriptedUpstream, wait_until

openai = pytest.importorskip("openai")

STREAMS = 500
# Five answers of different lengths (tenant ocK gets answer K), so a record's counts name the answer it metered.
SHAPES = {f"oc{k}": (3 + k, 10 + 7 * k) for k in range(5)}  # tenant -> (prompt tokens, completion tokens)


def answer(prompt: int, completion: int) -> list:
    words = [chat({"content": f" w{i}"}) for i in range(completion // 2)]  # fewer chunks than tokens
    return ([chat({"role": "assistant", "content": ""})] + words + [chat({}, finish="stop"),
            chat_usage(prompt, completion), DONE, ("sleep", 0.05)])


@pytest.mark.slow
def test_official_client_streams_are_complete_and_exact(tmp_path):
    up = ScriptedUpstream()
    for tenant, (prompt, completion) in SHAPES.items():
        up.scripts[tenant] = Script(answer(prompt, completion))
    gw = GatewayProcess(up.url, {"tenants": list(SHAPES), "models": ["gpt-test"]}, tmp_path, verbose=False)
    try:
        clients = {t: openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=30,
                                    default_headers={"X-Tenant-ID": t, "X-Script": t}) for t in SHAPES}

        def one(i: int) -> tuple[str, int | None]:
            tenant = f"oc{i % len(SHAPES)}"
            stream = clients[tenant].chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True,
                stream_options={"include_usage": True})
            usage = None
            for part in stream:  # the client stops at [DONE] and closes the response
                if part.usage is not None:
                    usage = part.usage.completion_tokens
            return tenant, usage

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            seen = list(pool.map(one, range(STREAMS)))
        assert all(usage == SHAPES[tenant][1] for tenant, usage in seen)  # the client read every answer whole
        wait_until(lambda: len(gw.usages()) >= STREAMS, timeout=60, what=f"{STREAMS} usage records")
        records = gw.usages()
        outcomes = {o: sum(r["outcome"] == o for r in records) for o in ("ok", "cancelled", "error")}
        exact = sum((r["input_tokens"], r["output_tokens"]) == SHAPES[r["tenant"]] for r in records)
        print(f"official openai {openai.__version__}: ok {outcomes['ok']} / cancelled {outcomes['cancelled']} / "
              f"error {outcomes['error']}, tokens equal to the server's in {exact} of {len(records)}")
        assert (len(records), outcomes, exact) == (STREAMS, {"ok": STREAMS, "cancelled": 0, "error": 0}, STREAMS)
        ok = sum(gw.value("gateway_requests_total", tenant=t, model="gpt-test", tier="other", code="200",
                          outcome="ok") or 0 for t in SHAPES)
        assert ok == STREAMS
        billed = sum(gw.value("gateway_tokens_total", tenant=t, model="gpt-test", tier="other", type="output")
                     for t in SHAPES)
        assert billed == sum(SHAPES[t][1] for t, _ in seen)
    finally:
        gw.stop()
        up.stop()


@pytest.mark.slow
def test_official_client_responses_and_embeddings(tmp_path):
    """The same client on the Responses API (no `[DONE]`: the client reads to the body's end) and on
    embeddings (input tokens only): every call `ok`, counts equal to the server's."""
    from dialect_fixtures import RESPONSES_END, RESPONSES_MARKER, RESPONSES_TOKENS, RESPONSES_USAGE

    up = ScriptedUpstream()
    up.scripts["resp"] = Script(RESPONSES_TOKENS + RESPONSES_END + [RESPONSES_MARKER])
    embedding = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}],
                 "model": "gpt-test", "usage": {"prompt_tokens": 8, "total_tokens": 8}}
    up.scripts["emb"] = Script([json.dumps(embedding).encode()], content_type="application/json")
    gw = GatewayProcess(up.url, {"tenants": ["resp", "emb"], "models": ["gpt-test"]}, tmp_path, verbose=False)
    try:
        def client(tenant: str):
            return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=30,
                                 default_headers={"X-Tenant-ID": tenant, "X-Script": tenant})

        responses, embeddings = client("resp"), client("emb")
        calls = 50
        for _ in range(calls):
            done = [e for e in responses.responses.create(model="gpt-test", input="hi", stream=True)
                    if e.type == "response.completed"]
            assert done[0].response.usage.output_tokens == RESPONSES_USAGE["output_tokens"]
            raw = embeddings.embeddings.with_raw_response.create(model="gpt-test", input="hello",
                                                                 encoding_format="float")
            assert raw.headers["X-Token-Used"] == "8" and raw.parse().usage.prompt_tokens == 8
        wait_until(lambda: len(gw.usages()) >= 2 * calls, timeout=60, what="usage records")
        for tenant, counts in (("resp", (RESPONSES_USAGE["input_tokens"], RESPONSES_USAGE["output_tokens"])),
                               ("emb", (8, 0))):
            records = gw.usages(tenant=tenant)
            got = {(r["outcome"], r["input_tokens"], r["output_tokens"]) for r in records}
            print(f"official openai {tenant}: {len(records)} calls, {got}")
            assert (len(records), got) == (calls, {("ok", *counts)})
    finally:
        gw.stop()
        up.stop()
