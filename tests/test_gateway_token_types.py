"""Token types (cached prompt, cache-creation prompt, reasoning) read from each API's usage, streamed and not,
with and without the server's details: the real gateway process (`inferwatch exporter gateway`) in front of a
scripted upstream writing each dialect's bytes; the usage log and /metrics must say exactly what the usage
said, and nothing (absent, not 0) where it said nothing.

Field shapes: OpenAI Chat Completions / Completions `usage.prompt_tokens_details.cached_tokens` and
`usage.completion_tokens_details.reasoning_tokens`; Responses `usage.input_tokens_details.cached_tokens` and
`usage.output_tokens_details.reasoning_tokens`; Anthropic Messages `cache_read_input_tokens` and
`cache_creation_input_tokens` beside `input_tokens` (which excludes both); Triton generate reports none.
"""

from __future__ import annotations

import pytest

from dialect_fixtures import CHAT, COMPLETIONS, DONE, MESSAGES, RESPONSES, data, named
from gateway_support import GatewayProcess, Script, ScriptedUpstream, through
from inferwatch.exporters.gateway.meter import RequestMeter
from inferwatch.exporters.gateway.metrics import GatewayMetrics
from inferwatch.exporters.gateway.protocol_messages import MessagesEvents
from inferwatch.exporters.gateway.protocol_responses import ResponsesEvents
from inferwatch.exporters.gateway.protocols import OpenAIEvents

GENERATE = "/v2/models/toy_llm/generate"
GENERATE_STREAM = "/v2/models/toy_llm/generate_stream"
# What the server's usage says in every row: 100 prompt tokens, 30 output tokens; with details 40 of the
# prompt cached (Anthropic: 30 read from the cache and 10 written to it) and 12 of the output reasoning.
WITH = "with"
WITHOUT = "without"
NULL = "null"  # the details objects present but null (some servers write them so)
ZERO = "zero"  # the details present and 0: known zero, a sample of 0 is not written (as for every count)


def openai_usage(details: str) -> dict:
    usage = {"prompt_tokens": 100, "completion_tokens": 30, "total_tokens": 130}
    if details == WITH:
        usage |= {"prompt_tokens_details": {"cached_tokens": 40, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 12, "audio_tokens": 0,
                                                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}
    elif details == NULL:
        usage |= {"prompt_tokens_details": None, "completion_tokens_details": None}
    elif details == ZERO:
        usage |= {"prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}
    return usage


def responses_usage(details: str) -> dict:
    usage = {"input_tokens": 100, "output_tokens": 30, "total_tokens": 130}
    if details == WITH:
        usage |= {"input_tokens_details": {"cached_tokens": 40}, "output_tokens_details": {"reasoning_tokens": 12}}
    elif details == NULL:
        usage |= {"input_tokens_details": None, "output_tokens_details": None}
    elif details == ZERO:
        usage |= {"input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    return usage


def messages_usage(details: str) -> dict:
    if details == WITH:
        return {"input_tokens": 60, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 10,
                "output_tokens": 30}
    if details == NULL:
        return {"input_tokens": 100, "cache_read_input_tokens": None, "cache_creation_input_tokens": None,
                "output_tokens": 30}
    if details == ZERO:
        return {"input_tokens": 100, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
                "output_tokens": 30}
    return {"input_tokens": 100, "output_tokens": 30}


def chat_script(streamed: bool, details: str, completions: bool = False) -> Script:
    usage = openai_usage(details)
    if not streamed:
        choice = {"index": 0, "text": "Hi there"} if completions else {"index": 0, "message": {
            "role": "assistant", "content": "Hi there"}}
        return Script([data({"id": "x", "object": "chat.completion", "choices": [{**choice, "finish_reason": "stop"}],
                             "usage": usage})[6:-2]], content_type="application/json")
    def piece(**c):
        return data({"id": "x", "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "finish_reason": None, **c}]})
    if completions:
        chunks = [piece(text="Hi"), piece(text=" there"), piece(text="", finish_reason="stop")]
    else:
        chunks = [piece(delta={"role": "assistant", "content": ""}), piece(delta={"reasoning_content": "hm"}),
                  piece(delta={"content": "Hi"}), piece(delta={}, finish_reason="stop")]
    return Script(chunks + [data({"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}), DONE])


def responses_script(streamed: bool, details: str) -> Script:
    response = {"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-test", "output": [],
                "usage": responses_usage(details), "error": None}
    if not streamed:
        return Script([data(response)[6:-2]], content_type="application/json")
    return Script([named("response.created", {"sequence_number": 0, "response": {**response, "usage": None,
                                                                                   "status": "in_progress"}}),
                   named("response.reasoning_text.delta", {"sequence_number": 1, "delta": "hm"}),
                   named("response.output_text.delta", {"sequence_number": 2, "delta": "Hi"}),
                   named("response.completed", {"sequence_number": 3, "response": response})])


def messages_script(streamed: bool, details: str) -> Script:
    usage = messages_usage(details)
    if not streamed:
        return Script([data({"id": "msg_1", "type": "message", "role": "assistant", "model": "gpt-test",
                             "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn",
                             "usage": usage})[6:-2]], content_type="application/json")
    start = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
    return Script([named("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                       "content": [], "model": "gpt-test", "usage": start}}),
                   named("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
                   named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
                   named("content_block_stop", {"index": 0}),
                   named("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 30}}),
                   named("message_stop", {})])


def triton_script(streamed: bool, details: str) -> Script:
    if not streamed:
        return Script([b'{"model_name":"toy_llm","text_output":"Hi there","input_token_count":100,'
                       b'"output_token_count":30}'], content_type="application/json")
    return Script([b'data: {"text_output":"Hi","input_token_count":100,"output_token_count":10}\n\n',
                   b'data: {"text_output":" there","input_token_count":100,"output_token_count":30}\n\n'])


CACHED, CREATED, REASONING = "cached_input_tokens", "cache_creation_input_tokens", "reasoning_tokens"
# (api, path, script builder, what the usage log's token types are with details WITH)
APIS = {
    "chat": (CHAT, chat_script, {CACHED: 40, CREATED: None, REASONING: 12}),
    "completions": (COMPLETIONS, lambda s, d: chat_script(s, d, completions=True),
                    {CACHED: 40, CREATED: None, REASONING: 12}),
    "responses": (RESPONSES, responses_script, {CACHED: 40, CREATED: None, REASONING: 12}),
    "messages": (MESSAGES, messages_script, {CACHED: 30, CREATED: 10, REASONING: None}),
}
NONE = {CACHED: None, CREATED: None, REASONING: None}
ROWS = [(f"{api}_{'stream' if streamed else 'body'}_{details}", api, streamed, details)
        for api in APIS for streamed in (True, False) for details in (WITH, WITHOUT, NULL, ZERO)]
ROWS += [(f"triton_{'stream' if streamed else 'body'}", "triton", streamed, WITHOUT) for streamed in (True, False)]
TENANTS = [r[0] for r in ROWS]


def expected(api: str, details: str) -> dict:
    if details == WITH:
        return APIS[api][2]
    if details == ZERO:
        return {k: (None if v is None else 0) for k, v in APIS[api][2].items()}
    return NONE


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    up = ScriptedUpstream()
    for row, api, streamed, details in ROWS:
        build = triton_script if api == "triton" else APIS[api][1]
        up.scripts[row] = build(streamed, details)
    gw = GatewayProcess(up.url, {"tenants": TENANTS, "models": ["gpt-test", "toy_llm"]},
                        tmp_path_factory.mktemp("gateway"))
    yield gw
    gw.stop()
    up.stop()


@pytest.mark.parametrize("row, api, streamed, details", ROWS, ids=[r[0] for r in ROWS])
def test_token_types_in_usage_log_and_metrics(stack, row, api, streamed, details):
    if api == "triton":
        path = GENERATE_STREAM if streamed else GENERATE
        body = {"text_input": "hi", "parameters": {"stream": streamed}}
    else:
        path = APIS[api][0]
        body = {"model": "gpt-test", "stream": streamed} | (
            {"prompt": "hi"} if api == "completions" else {"input": "hi"} if api == "responses"
            else {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64})
    status, _, raw = through(stack, row, path, body)
    assert status == 200 and raw, (status, raw)
    record = stack.wait_usage(tenant=row)
    want = NONE if api == "triton" else expected(api, details)
    assert (record["outcome"], record["input_tokens"], record["output_tokens"]) == ("ok", 100, 30), record
    assert {k: record[k] for k in want} == want
    metrics = stack.snapshot()
    labels = {"tenant": row, "model": "toy_llm" if api == "triton" else "gpt-test", "tier": "other"}
    assert metrics.value("gateway_tokens_total", **labels, type="input") == 100
    for key, kind in ((CACHED, "cached_input"), (CREATED, "cache_creation_input"), (REASONING, "reasoning")):
        # Unknown and 0 alike write no sample (a count is added only when it is > 0, as for input/output).
        value = metrics.value("gateway_token_details_total", **labels, type=kind)
        assert value == (want[key] or None), (kind, value)


# ---------------------------------------------------------------- a part above its whole is impossible
PART_ROWS = [
    ("chat_cached_above_prompt", OpenAIEvents, b'{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,'
     b'"prompt_tokens_details":{"cached_tokens":11}}}', "usage.prompt_tokens_details.cached_tokens"),
    ("chat_reasoning_above_completion", OpenAIEvents, b'{"choices":[],"usage":{"prompt_tokens":10,'
     b'"completion_tokens":5,"completion_tokens_details":{"reasoning_tokens":6}}}',
     "usage.completion_tokens_details.reasoning_tokens"),
    ("chat_cached_negative", OpenAIEvents, b'{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,'
     b'"prompt_tokens_details":{"cached_tokens":-1}}}', "usage.prompt_tokens_details.cached_tokens"),
    ("responses_cached_above_input", ResponsesEvents, b'{"type":"response.completed","response":{"usage":'
     b'{"input_tokens":10,"output_tokens":5,"input_tokens_details":{"cached_tokens":12}}}}',
     "usage.input_tokens_details.cached_tokens"),
    ("responses_reasoning_not_integer", ResponsesEvents, b'{"type":"response.completed","response":{"usage":'
     b'{"input_tokens":10,"output_tokens":5,"output_tokens_details":{"reasoning_tokens":1.5}}}}',
     "usage.output_tokens_details.reasoning_tokens"),
    ("messages_cache_read_string", MessagesEvents, b'{"type":"message_start","message":{"usage":'
     b'{"input_tokens":10,"cache_read_input_tokens":"3"}}}', "usage.cache_read_input_tokens"),
]


@pytest.mark.parametrize("row, reader, event, field", PART_ROWS, ids=[r[0] for r in PART_ROWS])
def test_impossible_token_type_is_an_invalid_count(row, reader, event, field):
    """A token type that is not a count, or exceeds the count it is part of, raises InvalidCount naming its
    field: exchange.py then makes the request unmetered (reason invalid_count), never a clamped value."""
    from inferwatch.exporters.gateway.counts import InvalidCount

    meter = RequestMeter(GatewayMetrics().series("t", "m", "x"), streamed=True)
    with pytest.raises(InvalidCount) as caught:
        reader(meter).event(event, 1.0)
    assert caught.value.field == field


def test_in_process_api_token_types():
    """Gateway.request's usage(...) takes the same token types, with the same checks."""
    from inferwatch.exporters.gateway.api import Gateway
    from inferwatch.spec import spec_from_dict

    records = []
    gw = Gateway(spec_from_dict({"tenants": ["acme"], "models": ["m"]}), usage_sink=records.append)
    with gw.request(tenant="acme", model="m") as req:
        req.tokens(3)
        req.usage(output_tokens=30, input_tokens=100, cached_input_tokens=40, reasoning_tokens=12)
    with gw.request(tenant="acme", model="m") as req:
        req.usage(output_tokens=30, input_tokens=100, cached_input_tokens=101)
    assert (records[0].cached_input_tokens, records[0].reasoning_tokens) == (40, 12)
    assert (records[1].unmetered, records[1].input_tokens, records[1].cached_input_tokens) == \
        ("invalid_count", None, None)
