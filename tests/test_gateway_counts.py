"""Counts an upstream reports that are not counts, through the real gateway process: each row a local upstream
answering with one value in its count fields (OpenAI `usage`, Triton `output_token_count` /
`input_token_count`), streamed and not. A count is a JSON integer 0..MAX_TOKENS (exporters/gateway/counts.py);
anything else makes the request's counts unknown (no sample, `null`, no X-Token-Used header), is counted in
gateway_unmetered_responses_total{reason="invalid_count"} and logged; the answer and the next request
pipelined on the same connection are never lost."""

from __future__ import annotations

import json
import socket

import pytest

from gateway_support import GatewayProcess, Script, ScriptedUpstream, answers, raw_post, through

CHAT = "/v1/chat/completions"
TRITON_STREAM = "/v2/models/toy_llm/generate_stream"
TRITON_WHOLE = "/v2/models/toy_llm/generate"
HI = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"

# (id, prompt_tokens JSON, completion_tokens JSON, input count, output count, invalid?)
# Streams: without a usable completion_tokens the output count is the events counted (one here).
OPENAI = [
    ("issue_negative", "-5", "-7", None, None, True),
    ("true", "true", "true", None, None, True),
    ("false", "false", "false", None, None, True),
    ("huge_integer", "99999999999999999999999", "99999999999999999999999", None, None, True),
    ("exponent", "1e23", "1e23", None, None, True),
    ("fraction", "1.5", "1.5", None, None, True),
    ("string", '"12"', '"12"', None, None, True),
    ("above_max_tokens", "2147483648", "3", None, None, True),
    ("one_bad_field", "-5", "7", None, None, True),  # a usage object that lies once is not trusted at all
    ("null", "null", "null", None, "events", False),  # not reported: unknown, not an impossible reading
    ("sane", "12", "12", 12, 12, False),
    ("integral_float", "12.0", "12.0", 12, 12, False),  # JSON Schema's integer: a zero fractional part
]
# (id, output_token_count JSON values of two events, input_token_count JSON, input, output, invalid?)
TRITON = [
    ("t_negative", ("1", "-5"), "3", None, None, True),
    ("t_true", ("1", "true"), "3", None, None, True),
    ("t_fraction", ("1", "1.5"), "3", None, None, True),
    ("t_huge", ("1", "99999999999999999999999"), "3", None, None, True),
    ("t_string", ("1", '"12"'), "3", None, None, True),
    ("t_backwards", ("5", "3"), "3", None, None, True),  # a cumulative count that goes back
    ("t_bad_input", ("1", "2"), "-1", None, None, True),
    ("t_sane", ("1", "[2]"), "3", 3, 2, False),
]
ROWS = [r[0] for r in OPENAI] + [r[0] for r in TRITON]
TENANTS = [f"s_{r}" for r in ROWS] + [f"w_{r}" for r in ROWS] + ["next"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    up = ScriptedUpstream()
    up.scripts["next"] = Script([HI, b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}\n\n',
                                 DONE])
    gw = GatewayProcess(up.url, {"tenants": TENANTS, "models": ["toy_llm", "gpt-test"]},
                        tmp_path_factory.mktemp("gateway"))
    yield gw, up
    gw.stop()
    up.stop()


def unmetered(gw, model: str) -> float:
    return gw.value("gateway_unmetered_responses_total", model=model, reason="invalid_count") or 0.0


def check_record(gw, tenant: str, model: str, want_in, want_out, invalid: bool) -> None:
    usage = gw.wait_usage(tenant=tenant)
    assert usage["outcome"] == "ok" and usage["code"] == 200
    assert (usage["input_tokens"], usage["output_tokens"]) == (want_in, want_out)
    assert usage["unmetered"] == ("invalid_count" if invalid else None)
    labels = {"tenant": tenant, "model": model, "tier": "other"}
    for kind, want in (("input", want_in), ("output", want_out)):
        assert gw.value("gateway_tokens_total", **labels, type=kind) == want  # None: no sample, never 0


def stream_then_next(gw, path: str, tenant: str) -> list:
    """The metered stream and a second request pipelined behind it on one connection: both answers."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as s:
        s.sendall(raw_post(path, tenant, {"model": "gpt-test", "stream": True})
                  + raw_post(CHAT, "next", {"model": "gpt-test", "stream": True}, close=True))
        return answers(s, ["POST", "POST"])


@pytest.mark.parametrize("row, prompt, completion, want_in, want_out, invalid", OPENAI, ids=[r[0] for r in OPENAI])
def test_openai_usage_counts(stack, row, prompt, completion, want_in, want_out, invalid):
    gw, up = stack
    usage = f'{{"prompt_tokens":{prompt},"completion_tokens":{completion}}}'.encode()
    before = unmetered(gw, "gpt-test")
    # Streamed: the shape, the usage chunk after the tokens, then [DONE]; a request pipelined behind it.
    tenant = f"s_{row}"
    script = up.scripts[tenant] = Script([HI, b'data: {"choices":[],"usage":' + usage + b"}\n\n", DONE])
    first, second = stream_then_next(gw, CHAT, tenant)
    assert (first[0], first[2]) == (200, script.body())
    assert (second[0], second[2]) == (200, up.scripts["next"].body())  # the next request is answered
    check_record(gw, tenant, "gpt-test", want_in, 1 if want_out == "events" else want_out, invalid)
    # Not streamed: X-Token-Used-* only for counts that are counts.
    tenant = f"w_{row}"
    body = b'{"choices":[{"index":0,"message":{"content":"Hi"}}],"usage":' + usage + b"}"
    up.scripts[tenant] = Script([body], content_type="application/json")
    status, headers, raw = through(gw, tenant, CHAT, {"model": "gpt-test"})
    assert (status, raw) == (200, body)
    whole_out = None if want_out == "events" else want_out
    assert headers.get("X-Token-Used-Input") == (None if want_in is None else str(want_in))
    assert headers.get("X-Token-Used-Output") == (None if whole_out is None else str(whole_out))
    assert headers.get("X-Token-Used") == (None if whole_out is None else str(want_in + whole_out))
    check_record(gw, tenant, "gpt-test", want_in, whole_out, invalid)
    assert unmetered(gw, "gpt-test") == before + (2 if invalid else 0)


@pytest.mark.parametrize("row, outputs, inputs, want_in, want_out, invalid", TRITON, ids=[r[0] for r in TRITON])
def test_triton_count_fields(stack, row, outputs, inputs, want_in, want_out, invalid):
    gw, up = stack
    before = unmetered(gw, "toy_llm")
    tenant = f"s_{row}"
    events = [b'data: {"text_output":"a","output_token_count":%b,"input_token_count":%b}\n\n'
              % (outputs[0].encode(), inputs.encode()),
              b'data: {"text_output":"b","output_token_count":%b}\n\n' % outputs[1].encode()]
    script = up.scripts[tenant] = Script(events)
    first, second = stream_then_next(gw, TRITON_STREAM, tenant)
    assert (first[0], first[2]) == (200, script.body()) and second[0] == 200
    check_record(gw, tenant, "toy_llm", want_in, want_out, invalid)
    tenant = f"w_{row}"
    body = b'{"model_name":"toy_llm","text_output":"ab","output_token_count":%b,"input_token_count":%b}' % (
        outputs[1].encode(), inputs.encode())
    up.scripts[tenant] = Script([body], content_type="application/json")
    status, headers, raw = through(gw, tenant, TRITON_WHOLE, {"text_input": "hi"})
    assert (status, raw) == (200, body)
    # The whole answer has only the last count: a count that went back in the stream is a fine one here.
    whole_invalid = invalid and row != "t_backwards"
    last = json.loads(outputs[1])
    whole_in, whole_out = (None, None) if whole_invalid else (3, last[0] if isinstance(last, list) else last)
    assert headers.get("X-Token-Used-Output") == (None if whole_out is None else str(whole_out))
    assert headers.get("X-Token-Used-Input") == (None if whole_in is None else str(whole_in))
    check_record(gw, tenant, "toy_llm", whole_in, whole_out, whole_invalid)
    assert unmetered(gw, "toy_llm") == before + int(invalid) + int(whole_invalid)


def test_impossible_counts_are_logged_by_kind_with_the_value_escaped(stack):
    gw, up = stack
    if not gw.usages(tenant="s_issue_negative"):
        test_openai_usage_counts(stack, *OPENAI[0])
    lines = [line for line in gw.output().splitlines() if "invalid_count" in line and "forwarded unmetered" in line]
    assert any("usage.prompt_tokens negative, got -5" in line for line in lines), lines
    # Once a minute per kind: the streamed and the whole answer of one row share a line.
    assert sum("usage.prompt_tokens negative" in line for line in lines) == 1
    assert "Traceback" not in gw.output() and "ValueError" not in gw.output()
