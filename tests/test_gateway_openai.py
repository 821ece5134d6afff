"""Gateway proxy in front of a local upstream emitting the documented OpenAI streaming format."""

from __future__ import annotations

import pytest
import requests
import urllib3

from gateway_support import DONE, OpenAIUpstream, RunningProxy, chat_chunk, usage_chunk

HEADERS = {"X-Tenant-ID": "globex", "X-Service-Name": "nightly-batch"}
LABELS = {"tenant": "globex", "model": "gpt-test", "tier": "batch"}
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}


@pytest.fixture
def upstream():
    u = OpenAIUpstream()
    yield u
    u.stop()


@pytest.fixture
def proxy(upstream):
    p = RunningProxy(upstream.url)
    yield p
    p.stop()


def post(proxy, body=BODY, path="/v1/chat/completions"):
    with requests.post(proxy.url + path, json=body, headers=HEADERS, stream=True, timeout=20) as resp:
        return resp.status_code, resp.raw.read()


def test_usage_chunk_gives_exact_totals_with_multi_token_chunks(proxy, upstream):
    upstream.script = [
        chat_chunk("", role="assistant"),          # role-only first chunk: not a token
        b": keep-alive\n\n",                        # comment: not a token
        chat_chunk("Hello"), ("sleep", 0.01),
        chat_chunk(" big multi token chunk"),       # several tokens in one chunk
        b"data:\n\n",                               # empty event
        chat_chunk("!", finish="stop"),
        usage_chunk(prompt=11, completion=7),
        DONE,
    ]
    status, raw = post(proxy)
    assert status == 200 and raw == b"".join(i for i in upstream.script if isinstance(i, bytes))
    proxy.wait_requests(1)
    assert proxy.requests_total(**LABELS, outcome="ok", code="200") == 1
    assert proxy.value("gateway_tokens_total", **LABELS, type="output") == 7
    assert proxy.value("gateway_tokens_total", **LABELS, type="input") == 11
    assert proxy.value("gateway_token_count_method_total", model="gpt-test", method="usage") == 1
    assert proxy.value("gateway_time_to_first_token_seconds_count", **LABELS) == 1
    assert proxy.value("gateway_output_tokens_sum", **LABELS) == 7
    assert upstream.bodies[0] == BODY  # request forwarded unchanged


def test_continuous_usage_counts_every_token_of_a_multi_token_chunk(proxy, upstream):
    u = lambda n: {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}  # noqa: E731
    upstream.script = [chat_chunk("a", usage=u(1)), chat_chunk(" b c d", usage=u(4)),
                       chat_chunk(" e", finish="stop", usage=u(5)), usage_chunk(3, 5), DONE]
    assert post(proxy)[0] == 200
    proxy.wait_requests(1)
    assert proxy.value("gateway_tokens_total", **LABELS, type="output") == 5
    # ITL once per token after the first: the 3-token chunk counts 3 times.
    assert proxy.value("gateway_inter_token_latency_seconds_count", **LABELS) == 4


def test_logprobs_give_the_token_count_of_a_chunk_without_usage(proxy, upstream):
    lp = {"content": [{"token": t, "logprob": -0.1} for t in ("x", "y", "z")]}
    upstream.script = [chat_chunk("xyz", logprobs=lp), chat_chunk("w"), DONE]
    body = {k: v for k, v in BODY.items() if k != "stream_options"}
    assert post(proxy, body)[0] == 200
    proxy.wait_requests(1)
    assert proxy.requests_total(**LABELS, outcome="ok") == 1
    assert proxy.value("gateway_tokens_total", **LABELS, type="output") == 4
    assert proxy.value("gateway_token_count_method_total", model="gpt-test", method="events") == 1


def test_stream_cut_before_usage_is_an_error_metered_from_events(proxy, upstream):
    upstream.script = [chat_chunk("one"), chat_chunk(" two"), chat_chunk(" three"), ("cut",)]
    # The proxy cuts the client's stream too, so the client sees a truncated answer, not a whole one.
    with pytest.raises(urllib3.exceptions.ProtocolError):
        post(proxy)
    proxy.wait_requests(1)
    assert proxy.requests_total(**LABELS, outcome="error") == 1
    assert proxy.value("gateway_tokens_total", **LABELS, type="output") == 3
    assert proxy.value("gateway_token_count_method_total", model="gpt-test", method="events") == 1
    assert proxy.value("gateway_time_per_output_token_seconds_count", **LABELS) == 0


def test_stream_ending_without_done_is_incomplete(proxy, upstream):
    upstream.script = [chat_chunk("one"), chat_chunk(" two")]
    assert post(proxy)[0] == 200
    proxy.wait_requests(1)
    assert proxy.requests_total(**LABELS, outcome="error") == 1


def test_error_event_mid_stream(proxy, upstream):
    upstream.script = [chat_chunk("one"), b'data: {"error": {"message": "engine died", "type": "server"}}\n\n', DONE]
    assert post(proxy)[0] == 200
    proxy.wait_requests(1)
    assert proxy.requests_total(**LABELS, outcome="error", code="200") == 1
    assert proxy.value("gateway_tokens_total", **LABELS, type="output") == 1


def test_non_streamed_usage_sets_x_token_used(proxy, upstream):
    upstream.non_stream_body = {"id": "c1", "object": "chat.completion", "model": "gpt-test",
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hey"},
                                             "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}
    resp = requests.post(proxy.url + "/v1/chat/completions", json={**BODY, "stream": False}, headers=HEADERS,
                         timeout=10)
    assert resp.status_code == 200 and resp.json() == upstream.non_stream_body
    assert (resp.headers["X-Token-Used"], resp.headers["X-Token-Used-Input"],
            resp.headers["X-Token-Used-Output"]) == ("14", "5", "9")
    proxy.wait_requests(1)
    assert proxy.value("gateway_tokens_total", **LABELS, type="output") == 9
    assert proxy.value("gateway_time_to_first_token_seconds_count", **LABELS) == 0
    assert proxy.usages[0].input_tokens == 5 and proxy.usages[0].outcome == "ok"


def test_completions_endpoint_and_undeclared_model(proxy, upstream):
    text = b'data: {"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"hi"}]}\n\n'
    upstream.script = [text, text, usage_chunk(1, 2), DONE]
    assert post(proxy, {"model": "secret-finetune-42", "prompt": "x", "stream": True}, "/v1/completions")[0] == 200
    proxy.wait_requests(1)
    other = {**LABELS, "model": "other"}
    assert proxy.value("gateway_tokens_total", **other, type="output") == 2
