"""Real-world streams through the real gateway process (`inferwatch exporter gateway`), each row a local
upstream writing given bytes at given times: SSE framing, what counts as generated output, what ends a
stream well, and mid-stream error objects. Each row runs as its own tenant, so its metrics stand apart."""

from __future__ import annotations

import pytest

from gateway_support import GatewayProcess, Script, ScriptedUpstream, chunk, through, timed_through

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TRITON = "/v2/models/toy_llm/generate_stream"
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "stream": True}
HI = chunk({"content": "Hi"})
STOP = chunk({}, finish="stop")


def sse(*payloads: bytes, end: bytes = b"\n\n") -> bytes:
    return b"".join(b"data: " + p + end for p in payloads)


# ------------------------------------------------------------------------------------------------ rows
# Each row: (id, path, script items, expected outcome, expected output tokens, the write of the first token or
# None). Writes are the script's bytes items, numbered from 0; the gateway's TTFT must lie between the upstream's
# sending that write and the client's receiving it (Timing), on a machine under any load: later than any earlier
# write could have made it, earlier than the next write's arrival when it comes later.
FRAMING = [
    # The input: one event per read ending in a lone CR pair; TTFT is the first write (300 ms), not
    # the second (350 ms), and the last event ([DONE]) is not lost.
    ("cr_cr_one_event_per_read", CHAT, [("at", 0.3), sse(HI, end=b"\r\r"), ("at", 0.35), sse(STOP, end=b"\r\r"),
                                        ("at", 0.4), b"data: [DONE]\r\r"], "ok", 1, 0),
    ("lf", CHAT, [("at", 0.1), sse(HI), sse(STOP), b"data: [DONE]\n\n"], "ok", 1, 0),
    ("crlf", CHAT, [("at", 0.1), sse(HI, end=b"\r\n\r\n"), sse(STOP, end=b"\r\n\r\n"), b"data: [DONE]\r\n\r\n"],
     "ok", 1, 0),
    # CRLF split between reads: the event ends at the CR (first read), the LF of the next read is skipped.
    ("crlf_split_between_reads", CHAT, [("at", 0.3), b"data: " + HI + b"\r\n\r", ("at", 0.6),
                                        b"\n" + sse(STOP, end=b"\r\n\r\n") + b"data: [DONE]\r\n\r\n"],
     "ok", 1, 0),
    ("mixed_endings_in_one_read", CHAT, [b"data: " + HI + b"\n\ndata: " + HI + b"\r\rdata: " + HI +
                                         b"\r\n\r\ndata: " + STOP + b"\r\n\r\ndata: [DONE]\r\n\r\n"],
     "ok", 3, 0),
    ("event_split_over_reads", CHAT, [("at", 0.1), b"data: {\"choices\":[{\"ind", ("at", 0.3),
                                      b"ex\":0,\"delta\":{\"content\":\"Hi\"}}]}\n", ("at", 0.35), b"\n",
                                      sse(STOP), b"data: [DONE]\n\n"], "ok", 1, 2),
    ("bom_comments_multiline_data", CHAT, [b"\xef\xbb\xbf: keep-alive\n\n", b"data: {\"choices\":\n"
                                           b"data: [{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
                                           b"event: message\nid: 7\ndata: " + STOP + b"\n\n", b"data: [DONE]\n\n"],
     "ok", 1, 1),
    ("triton_cr_cr", TRITON, [("at", 0.2), b'data: {"text_output":"a"}\r\r', ("at", 0.4),
                              b'data: {"text_output":"b"}\r\r'], "ok", 2, 0),
]

# What counts as generated output: any non-empty delta field other than `role`; completions `text`.
FIELDS = ["content", "reasoning_content", "reasoning", "tool_calls", "function_call", "refusal", "audio",
          "thinking"]  # "thinking": a name no server uses yet, counted by the rule, not by a list
FIELD_VALUE = {"tool_calls": [{"index": 0, "function": {"arguments": "{\""}}], "function_call": {"arguments": "x"},
               "audio": {"transcript": "hi"}}
OUTPUT_FIELDS = [
    # The input: reasoning first (200 ms), the answer later (800 ms): TTFT is the reasoning token.
    ("reasoning_then_content", CHAT, [("at", 0.2), sse(chunk({"reasoning": "Let me think"})), ("at", 0.8),
                                      sse(chunk({"content": "42"})), b"data: [DONE]\n\n"], "ok", 2, 0),
] + [
    (f"field_{f}", CHAT, [("at", 0.1), sse(chunk({f: FIELD_VALUE.get(f, "tok")})),
                          sse(chunk({f: FIELD_VALUE.get(f, "tok")})), sse(STOP), b"data: [DONE]\n\n"],
     "ok", 2, 0) for f in FIELDS
] + [
    ("completions_text", COMPLETIONS, [("at", 0.1), sse(chunk(text="a")), sse(chunk(text="b")),
                                       sse(chunk(text="", finish="stop")), b"data: [DONE]\n\n"], "ok", 2, 0),
    # An event stream is UTF-8 decoded with replacement (WHATWG HTML §9.2.6): an event with an invalid byte is
    # the event the client sees (U+FFFD in its text), so it carries its token. The input: 2 events, 2.
    ("invalid_utf8_content", CHAT, [sse(HI), b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe"}}]}\n\n',
                                    sse(STOP), b"data: [DONE]\n\n"], "ok", 2, 0),
    ("truncated_utf8_sequence", CHAT, [sse(chunk({"content": "a"})), b'data: {"choices":[{"index":0,"delta":'
                                       b'{"content":"\xe2\x82"}}]}\n\n', sse(STOP), b"data: [DONE]\n\n"], "ok", 2, 0),
    ("invalid_utf8_completions", COMPLETIONS, [b'data: {"choices":[{"index":0,"text":"\xc0\xaf"}]}\n\n',
                                               sse(chunk(text="b", finish="stop")), b"data: [DONE]\n\n"], "ok", 2, 0),
    ("invalid_utf8_triton", TRITON, [b'data: {"text_output":"\xff"}\n\n', b'data: {"text_output":"b"}\n\n'],
     "ok", 2, 0),
    ("nothing_generated", CHAT, [sse(chunk({"role": "assistant", "content": ""}), chunk({"content": None}),
                                     chunk({"tool_calls": [], "refusal": None, "reasoning": ""}), STOP),
                                 b"data: [DONE]\n\n"], "ok", 0, None),
]

# What ends a stream well: [DONE], or a finish_reason for every choice then a clean end of the body.
ENDS = [
    ("finish_reason_then_close", CHAT, [sse(chunk({"content": "x"}, finish="stop"))], "ok", 1, 0),
    ("finish_then_usage_then_close", CHAT, [sse(HI, chunk({"content": "!"}, finish="length"),
                                                b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,'
                                                b'"total_tokens":8}}')], "ok", 5, 0),
    ("done_without_finish_reason", CHAT, [sse(HI, HI), b"data: [DONE]\n\n"], "ok", 2, 0),
    ("neither_is_truncated", CHAT, [sse(HI, HI)], "error", 2, 0),
    ("two_choices_one_unfinished", CHAT, [sse(chunk({"content": "a"}, index=0), chunk({"content": "b"}, index=1),
                                              chunk({}, finish="stop", index=0))], "error", 2, 0),
    ("two_choices_both_finished", CHAT, [sse(chunk({"content": "a"}, index=0), chunk({"content": "b"}, index=1),
                                             chunk({}, finish="stop", index=0), chunk({}, finish="stop", index=1))],
     "ok", 2, 0),
    ("triton_clean_end", TRITON, [b'data: {"text_output":"a"}\n\n'], "ok", 1, 0),
    ("cut_after_finish_reason", CHAT, [sse(chunk({"content": "x"}, finish="stop")), ("cut",)], "error", 1,
     0),
]

ROWS = FRAMING + OUTPUT_FIELDS + ENDS

# Mid-stream error objects: (id, path, error event bytes, code label, usage error_code, usage error_type)
ERRORS = [
    ("vllm_500", CHAT, sse(b'{"error":{"message":"engine died","type":"InternalServerError","code":500}}'),
     "500", 500, "InternalServerError"),
    ("code_503", CHAT, sse(b'{"error":{"message":"busy","type":"ServiceUnavailableError","code":503}}'),
     "503", 503, "ServiceUnavailableError"),
    ("code_string", CHAT, sse(b'{"error":{"message":"slow down","type":"rate_limit","code":"rate_limit_exceeded"}}'),
     "other", "rate_limit_exceeded", "rate_limit"),
    ("code_unknown_number", CHAT, sse(b'{"error":{"message":"?","type":"x","code":7}}'), "other", 7, "x"),
    ("tgi_error_type", CHAT, sse(b'{"error":"queue full","error_type":"overloaded"}'), "200", None, "overloaded"),
    ("event_named_error", CHAT, b'event: error\ndata: {"message":"bad gateway","code":502}\n\n', "502", 502, None),
    ("triton_error_event", TRITON, b'data: {"error":"model crashed"}\n\n', "200", None, None),
    # vLLM's flat ErrorResponse (no `error` member): an error, not a success.
    ("vllm_flat_error", CHAT, sse(b'{"object":"error","message":"engine died","type":"InternalServerError",'
                                  b'"param":null,"code":500}'), "500", 500, "InternalServerError"),
    ("flat_error_event_named", CHAT, b'event: error\ndata: {"object":"error","message":"no","type":"BadRequestError",'
                                     b'"code":400}\n\n', "400", 400, "BadRequestError"),
    ("flat_error_completions", COMPLETIONS, sse(b'{"object":"error","message":"x","type":"ServiceUnavailableError",'
                                                b'"code":503}'), "503", 503, "ServiceUnavailableError"),
    ("triton_flat_error", TRITON, sse(b'{"object":"error","message":"x","type":"InternalServerError","code":500}'),
     "500", 500, "InternalServerError"),
    ("error_invalid_utf8", CHAT, sse(b'{"error":{"message":"\xff","type":"InternalServerError","code":500}}'),
     "500", 500, "InternalServerError"),
]

TENANTS = [r[0] for r in ROWS] + [r[0] for r in ERRORS] + ["http_429"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    up = ScriptedUpstream()
    spec = {"tenants": TENANTS, "models": ["toy_llm", "gpt-test"]}
    gw = GatewayProcess(up.url, spec, tmp_path_factory.mktemp("gateway"))
    yield gw, up
    gw.stop()
    up.stop()


def model_of(path: str) -> str:
    return "toy_llm" if path.startswith("/v2/") else "gpt-test"


@pytest.mark.parametrize("row, path, items, outcome, tokens, first", ROWS, ids=[r[0] for r in ROWS])
def test_stream_is_metered_right(stack, row, path, items, outcome, tokens, first):
    gw, up = stack
    script = up.scripts[row] = Script(items)
    status, _headers, raw, timing = timed_through(gw, up, row, path, BODY)
    assert status == 200
    if ("cut",) in items:
        assert raw is None  # the gateway cut the client's stream too: a truncated answer is not shown whole
    else:
        assert raw == script.body()  # the client gets the bytes untouched
    usage = gw.wait_usage(tenant=row)
    labels = {"tenant": row, "model": model_of(path), "tier": "other"}
    assert (usage["outcome"], usage["output_tokens"], usage["unmetered"]) == (outcome, tokens, None)
    assert gw.value("gateway_requests_total", **labels, code="200", outcome=outcome) == 1
    ttft_count = gw.value("gateway_time_to_first_token_seconds_count", **labels)
    if first is None:
        assert ttft_count == 0
    else:
        assert ttft_count == 1
        observed = gw.value("gateway_time_to_first_token_seconds_sum", **labels)
        lo, hi = timing.ttft_bounds(first)
        assert lo <= observed <= hi, f"TTFT {observed:.3f}s outside [{lo:.3f}, {hi:.3f}] (write {first})"
    if outcome == "error" and ("cut",) not in items:
        assert usage["error_type"] == "truncated"


@pytest.mark.parametrize("row, path, error, label, error_code, error_type", ERRORS, ids=[r[0] for r in ERRORS])
def test_mid_stream_error_keeps_code_type_and_partial_tokens(stack, row, path, error, label, error_code, error_type):
    gw, up = stack
    if path == TRITON:
        tokens = [b'data: {"text_output":"a"}\n\n', b'data: {"text_output":"b"}\n\n']
    else:
        tokens = [sse(chunk({"content": "one"})), sse(chunk({"content": " two"}))]
    up.scripts[row] = Script(tokens + [error, b"data: [DONE]\n\n"])
    status, _headers, raw = through(gw, row, path, BODY)
    assert status == 200 and raw == up.scripts[row].body()
    usage = gw.wait_usage(tenant=row)
    assert usage["outcome"] == "error" and usage["code"] == 200  # the HTTP status the client got
    assert (usage["error_code"], usage["error_type"]) == (error_code, error_type)
    assert usage["output_tokens"] == 2  # tokens sent before the error are kept
    labels = {"tenant": row, "model": model_of(path), "tier": "other"}
    assert gw.value("gateway_requests_total", **labels, code=label, outcome="error") == 1
    assert gw.value("gateway_tokens_total", **labels, type="output") == 2


def test_http_error_answer_keeps_its_status_and_type(stack):
    gw, up = stack
    up.scripts["http_429"] = Script([b'{"error":{"message":"slow down","type":"rate_limit",'
                                     b'"code":"rate_limit_exceeded"}}'], status=429, content_type="application/json")
    status, headers, _raw = through(gw, "http_429", CHAT, BODY)
    assert status == 429 and "X-Token-Used" not in headers
    usage = gw.wait_usage(tenant="http_429")
    assert (usage["outcome"], usage["code"], usage["error_type"]) == ("error", 429, "rate_limit")
    assert usage["output_tokens"] is None and usage["input_tokens"] is None
    labels = {"tenant": "http_429", "model": "gpt-test", "tier": "other"}
    assert gw.value("gateway_requests_total", **labels, code="429", outcome="error") == 1
