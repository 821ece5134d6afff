"""Every API an LLM server speaks, through the real gateway process (`inferwatch exporter gateway`) in front of
scripted upstreams writing each dialect's bytes (dialect_fixtures.py) at set times: what a complete answer is,
cancellation only before it, errors in every shape, several choices, per-chunk vs per-token timing, embeddings,
and the spec's route table. Each row runs as its own tenant, so its metrics stand apart."""

from __future__ import annotations

import json
import socket
import zlib

import pytest

from dialect_fixtures import (
    APIS,
    CHAT,
    COMPLETIONS,
    DONE,
    EMBEDDINGS,
    MESSAGES,
    RESPONSES,
    RESPONSES_FAILED,
    RESPONSES_INCOMPLETE,
    RESPONSES_TOKENS,
    chat,
    chat_usage,
    data,
)
from gateway_support import GatewayProcess, Script, ScriptedUpstream, through, timed_through, wait_until

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "stream": True}
LATER = ("sleep", 3.0)  # the upstream's body ends well after the client has gone


def gzip_items(items: list) -> list:
    """The script's bytes compressed with gzip, flushed per item, as a streaming server must."""
    c = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    out = [c.compress(i) + c.flush(zlib.Z_SYNC_FLUSH) if isinstance(i, bytes) else i for i in items]
    return out + [c.flush()]


# ------------------------------------------------------------------ each API × how its stream ends
# (row, api, case): the script and what the gateway must record are derived from the API's fixtures.
CASES = ("complete", "hangup_at_end", "client_cancels", "server_error", "truncated", "upstream_cuts", "compressed")
API_ROWS = [(f"{api}_{case}", api, case) for api in APIS for case in CASES] + [
    ("chat_hangup_after_usage", "chat", "hangup_after_usage"),  # finish_reason and usage, before [DONE]
    ("chat_hangup_after_finish", "chat", "hangup_after_finish"),  # no usage yet: the client left early
]


def api_script(api: str, case: str) -> tuple[list, bytes | None, dict]:
    """(script items, the bytes after which the client hangs up or None, what the usage record must say)."""
    path, tokens, end, marker, error, (inputs, outputs), counted, (_, code, kind) = APIS[api]
    ok = {"outcome": "ok", "input_tokens": inputs, "output_tokens": outputs, "method": "usage"}
    if case == "complete":
        return tokens + end + [marker], None, ok
    if case == "compressed":
        return gzip_items(tokens + end + [marker]), None, ok
    if case == "hangup_at_end":
        return tokens + end + [marker, LATER], marker, ok
    if case == "hangup_after_usage":
        return tokens + end + [LATER, marker], end[-1], ok
    if case == "hangup_after_finish":
        return tokens + [end[0], LATER] + end[1:] + [marker], end[0], {"outcome": "cancelled"}
    if case == "client_cancels":
        return tokens + [LATER] + end + [marker], tokens[-1], {"outcome": "cancelled", "output_tokens": counted}
    if case == "server_error":
        return tokens + [error], None, {"outcome": "error", "output_tokens": counted, "error_code": code,
                                        "error_type": kind, "method": "events"}
    if case == "truncated":  # a clean end of the body without the end marker
        return tokens, None, {"outcome": "error", "output_tokens": counted, "error_type": "truncated",
                              "method": "events"}
    if case == "upstream_cuts":  # the upstream drops the connection mid-stream
        return tokens + [("cut",)], None, {"outcome": "error", "output_tokens": counted, "method": "events"}
    raise AssertionError(case)


def leave_at(gw: GatewayProcess, row: str, path: str, body: dict, marker: bytes) -> bytes:
    """POST through the gateway on a raw connection, read until `marker` has arrived, then hang up (as the
    official `openai` client does at `data: [DONE]`). The socket timeout bounds a broken build."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Tenant-ID: {row}\r\n"
            f"X-Script: {row}\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    got = b""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as s:
        s.sendall(head + payload)
        while marker not in got:
            part = s.recv(65536)
            assert part, f"the stream ended before {marker[:40]!r}"
            got += part
    return got


# ------------------------------------------------------------------------- several choices (n > 1)
PERIOD = 0.2  # each choice produces a token every PERIOD; the choices are staggered by PERIOD / n
STEPS = 3


def choices_script(n: int, usage: bool, logprobs: bool = False, path: str = CHAT) -> tuple[list, dict]:
    """(script items, choice -> the numbers of the writes carrying its tokens, in order; see Timing)."""
    timed = []
    for t in range(STEPS):
        for c in range(n):
            extra = {"logprobs": {"content": [{"token": "x", "logprob": -0.1}]}} if logprobs else {}
            if path == COMPLETIONS:
                doc = data({"object": "text_completion", "choices": [{"index": c, "text": "x", "finish_reason": None}]})
            else:
                doc = chat({"content": "x"}, index=c, **extra)
            timed.append((0.1 + t * PERIOD + c * PERIOD / n, c, doc))
    items: list = []
    writes: dict[int, list[int]] = {c: [] for c in range(n)}
    for k, (at, c, doc) in enumerate(sorted(timed, key=lambda p: p[0])):
        items += [("at", at), doc]
        writes[c].append(k)
    items += [chat({}, finish="stop", index=c) for c in range(n)]
    if usage:
        items.append(chat_usage(5, n * STEPS))
    return items + [DONE], writes


# (row, path, n, usage, logprobs)
CHOICE_ROWS = [(f"n{n}_{'usage' if u else 'nousage'}", CHAT, n, u, False) for n in (1, 2, 4) for u in (True, False)]
CHOICE_ROWS += [("n2_logprobs", CHAT, 2, False, True), ("n2_completions", COMPLETIONS, 2, True, False)]

# ------------------------------------------------------------------------------- embeddings & bodies
EMBEDDING = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, -0.2]}],
             "model": "gpt-test", "usage": {"prompt_tokens": 8, "total_tokens": 8}}
# (row, path, status, answer, X-Token-Used-Input, -Output, X-Token-Used, usage record fields)
BODY_ROWS = [
    ("emb_ok", EMBEDDINGS, 200, EMBEDDING, "8", "0", "8", {"outcome": "ok", "input_tokens": 8, "output_tokens": 0}),
    ("emb_total_only", EMBEDDINGS, 200, {**EMBEDDING, "usage": {"total_tokens": 6}}, "6", "0", "6",
     {"outcome": "ok", "input_tokens": 6}),
    ("emb_no_usage", EMBEDDINGS, 200, {k: v for k, v in EMBEDDING.items() if k != "usage"}, None, None, None,
     {"outcome": "ok", "input_tokens": None, "output_tokens": None}),
    ("emb_flat_error_400", EMBEDDINGS, 400, {"object": "error", "message": "too long", "type": "BadRequestError",
                                             "param": None, "code": 400}, None, None, None,
     {"outcome": "error", "code": 400, "error_type": "BadRequestError"}),
    ("emb_error_under_200", EMBEDDINGS, 200, {"error": {"message": "x", "type": "InternalServerError", "code": 500}},
     None, None, None, {"outcome": "error", "error_code": 500}),
    ("resp_body", RESPONSES, 200, {"id": "resp_1", "object": "response", "status": "completed", "output": [],
                                   "usage": {"input_tokens": 4, "output_tokens": 6, "total_tokens": 10},
                                   "error": None}, "4", "6", "10", {"outcome": "ok", "method": "usage"}),
    ("resp_body_failed", RESPONSES, 200, {"id": "resp_1", "object": "response", "status": "failed", "output": [],
                                          "usage": None, "error": {"code": "server_error", "message": "x"}},
     None, None, None, {"outcome": "error", "error_code": "server_error"}),
    ("msg_body", MESSAGES, 200, {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                 "stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 5}},
     "3", "5", "8", {"outcome": "ok"}),
    ("msg_body_529", MESSAGES, 529, {"type": "error", "error": {"type": "overloaded_error", "message": "x"}},
     None, None, None, {"outcome": "error", "code": 529, "error_type": "overloaded_error"}),
]

# Responses' other terminal events: incomplete (max_output_tokens) is a whole answer; failed is an error.
TERMINAL_ROWS = [
    ("resp_incomplete", RESPONSES_TOKENS + [RESPONSES_INCOMPLETE], {"outcome": "ok", "output_tokens": 12}),
    ("resp_failed", RESPONSES_TOKENS + [RESPONSES_FAILED], {"outcome": "error", "error_code": "server_error",
                                                            "output_tokens": 3}),
]

CUSTOM_PATH = "/custom/v9/generate-chat"
TENANTS = ([r[0] for r in API_ROWS] + [r[0] for r in CHOICE_ROWS] + [r[0] for r in BODY_ROWS]
           + [r[0] for r in TERMINAL_ROWS] + ["custom_route", "unknown_route"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    up = ScriptedUpstream()
    spec = {"tenants": TENANTS, "models": ["gpt-test"], "gateway": {"routes": {CUSTOM_PATH: "openai"}}}
    gw = GatewayProcess(up.url, spec, tmp_path_factory.mktemp("gateway"))
    yield gw, up
    gw.stop()
    up.stop()


def labels(row: str) -> dict:
    return {"tenant": row, "model": "gpt-test", "tier": "other"}


@pytest.mark.parametrize("row, api, case", API_ROWS, ids=[r[0] for r in API_ROWS])
def test_each_api_is_metered_by_how_its_answer_ended(stack, row, api, case):
    gw, up = stack
    items, hangup, expected = api_script(api, case)
    headers = {"Content-Encoding": "gzip"} if case == "compressed" else {}
    up.scripts[row] = Script(items, headers=headers)
    path = APIS[api][0]
    if hangup is not None:
        leave_at(gw, row, path, BODY, hangup)
    else:
        status, _headers, raw = through(gw, row, path, BODY)
        # The client gets the bytes untouched; a cut stream is cut for the client too (never shown whole).
        assert status == 200 and raw == (None if case == "upstream_cuts" else up.scripts[row].body())
    usage = gw.wait_usage(tenant=row)
    assert {k: usage[k] for k in expected} == expected
    assert usage["unmetered"] is None
    code_label = APIS[api][7][0] if case == "server_error" else "200"
    scrape = gw.snapshot()  # the request has ended (usage written): one scrape reads its values
    assert scrape.value("gateway_requests_total", **labels(row), code=code_label, outcome=usage["outcome"]) == 1
    # TTFT is the first generated token of any kind (reasoning first in every fixture): observed once.
    assert scrape.value("gateway_time_to_first_token_seconds_count", **labels(row)) == 1
    if usage["outcome"] == "ok":
        assert scrape.value("gateway_tokens_total", **labels(row), type="output") == APIS[api][5][1]


@pytest.mark.parametrize("row, path, n, usage, logprobs", CHOICE_ROWS, ids=[r[0] for r in CHOICE_ROWS])
def test_each_choice_is_its_own_sequence(stack, row, path, n, usage, logprobs):
    gw, up = stack
    items, writes = choices_script(n, usage, logprobs, path)
    up.scripts[row] = Script(items)
    status, _headers, _raw, timing = timed_through(gw, up, row, path, {**BODY, "n": n})
    assert status == 200
    record = gw.wait_usage(tenant=row)
    assert (record["outcome"], record["output_tokens"]) == ("ok", n * STEPS)  # tokens add up over the choices
    assert record["method"] == ("usage" if usage else "events")
    # The request has ended (its usage record is written): its values no longer move, one scrape reads them.
    scrape = gw.snapshot()
    v = lambda name: scrape.value(name, **labels(row))  # noqa: E731
    # Bounds from when each write left the upstream and reached the client (Timing), not fixed windows, so
    # they hold under any load. TTFT: the first token of any choice (write 0, at 0.1 s), not a later one.
    lo, hi = timing.ttft_bounds(0)
    assert lo <= v("gateway_time_to_first_token_seconds_sum") <= hi
    # Time per output chunk: every gap inside one choice is PERIOD, however the choices interleave; a choice's
    # gaps add up to its first-to-last span, bounded per choice and summed.
    gaps = n * (STEPS - 1)
    spans = [timing.gap_bounds(w[0], w[-1]) for w in writes.values()]
    span_lo, span_hi = sum(b[0] for b in spans), sum(b[1] for b in spans)
    assert v("gateway_time_per_output_chunk_seconds_count") == gaps
    assert span_lo <= v("gateway_time_per_output_chunk_seconds_sum") <= span_hi
    # TPOT once per choice, each its span over its STEPS - 1 gaps (the figure was PERIOD / n:
    # interleaved choices as one).
    assert v("gateway_time_per_output_token_seconds_count") == n
    assert span_lo / (STEPS - 1) <= v("gateway_time_per_output_token_seconds_sum") <= span_hi / (STEPS - 1)
    if logprobs:  # each chunk's count is known: per-token ITL too
        assert v("gateway_inter_token_latency_seconds_count") == gaps
        assert span_lo <= v("gateway_inter_token_latency_seconds_sum") <= span_hi
    else:  # a chunk's count is unknown: no per-token figure is made up
        assert v("gateway_inter_token_latency_seconds_count") is None or \
            v("gateway_inter_token_latency_seconds_count") == 0


@pytest.mark.parametrize("row, path, status, answer, used_in, used_out, used, expected", BODY_ROWS,
                         ids=[r[0] for r in BODY_ROWS])
def test_non_streamed_answers_bill_their_tokens(stack, row, path, status, answer, used_in, used_out, used,
                                                expected):
    gw, up = stack
    body = json.dumps(answer).encode()
    up.scripts[row] = Script([body], status=status, content_type="application/json")
    got, headers, raw = through(gw, row, path, {"model": "gpt-test", "input": "hello"})
    assert got == status and raw == body
    assert (headers.get("X-Token-Used-Input"), headers.get("X-Token-Used-Output"),
            headers.get("X-Token-Used")) == (used_in, used_out, used)
    usage = gw.wait_usage(tenant=row)
    assert {k: usage[k] for k in expected} == expected
    if used_in is not None:
        assert gw.value("gateway_tokens_total", **labels(row), type="input") == int(used_in)
    assert gw.value("gateway_time_to_first_token_seconds_count", **labels(row)) == 0


@pytest.mark.parametrize("row, items, expected", TERMINAL_ROWS, ids=[r[0] for r in TERMINAL_ROWS])
def test_responses_terminal_events(stack, row, items, expected):
    gw, up = stack
    up.scripts[row] = Script(items)
    assert through(gw, row, RESPONSES, BODY)[0] == 200
    usage = gw.wait_usage(tenant=row)
    assert {k: usage[k] for k in expected} == expected


def test_spec_routes_add_a_metered_path_and_unknown_paths_pass_through(stack):
    gw, up = stack
    up.scripts["custom_route"] = Script([chat({"content": "a"}), chat({}, finish="stop"), chat_usage(2, 1), DONE])
    assert through(gw, "custom_route", CUSTOM_PATH, BODY)[0] == 200
    usage = gw.wait_usage(tenant="custom_route")
    assert (usage["outcome"], usage["input_tokens"], usage["output_tokens"]) == ("ok", 2, 1)
    up.scripts["unknown_route"] = Script([chat({"content": "a"}), DONE])
    assert through(gw, "unknown_route", "/v1/files", BODY)[0] == 200
    wait_until(lambda: gw.value("gateway_requests_total", **labels("custom_route"), code="200", outcome="ok") == 1)
    assert gw.usages(tenant="unknown_route") == []
    assert not [s for s in gw.samples() if s.labels.get("tenant") == "unknown_route"]


# ------------------------------------------------------------------------------- the route table itself
ROUTE_ROWS = [  # (path, spec routes, protocol or None)
    ("/v1/chat/completions", {}, "openai"),
    ("/V1/Chat/Completions/", {}, "openai"),
    ("/v1/completions", {}, "openai"),
    ("/v1/responses", {}, "responses"),
    ("/v1/messages", {}, "messages"),
    ("/v1/embeddings", {}, "embeddings"),
    ("/v1/responses/resp_1", {}, None),  # retrieving a stored response bills nothing
    ("/v1/models", {}, None),
    ("/v1/rerank", {}, None),
    ("/v1/rerank", {"/v1/rerank": "embeddings"}, "embeddings"),
    ("/v1/messages", {"/v1/messages": "openai"}, "openai"),
    (CUSTOM_PATH, {CUSTOM_PATH: "openai"}, "openai"),
]


@pytest.mark.parametrize("path, routes, protocol", ROUTE_ROWS)
def test_route_table(path, routes, protocol):
    from inferwatch.exporters.gateway.routes import Classifier

    route = Classifier(None, routes).classify("POST", path, b'{"model": "m"}')
    assert (route.protocol if route else None) == protocol
    if route is not None:
        assert route.model == "m"
    assert Classifier(None, routes).classify("GET", path, b"") is None


def test_every_protocol_has_its_reader():
    from inferwatch.exporters.gateway.readers import READERS
    from inferwatch.exporters.gateway.routes import DEFAULT_ROUTES, PROTOCOLS

    assert set(READERS) == set(PROTOCOLS) | {"triton"}
    assert set(DEFAULT_ROUTES.values()) <= set(PROTOCOLS)


@pytest.mark.parametrize("routes, field", [({"/v1/x": "grpc"}, "gateway.routes./v1/x"),
                                           ({"v1/x": "openai"}, "gateway.routes")])
def test_spec_refuses_a_route_it_cannot_meter(routes, field):
    from inferwatch.spec import spec_from_dict
    from inferwatch.specload import SpecError

    with pytest.raises(SpecError) as err:
        spec_from_dict({"gateway": {"routes": routes}})
    assert field in str(err.value)


def test_interleaved_choices_are_separate_sequences():
    """The issue's case in the meter itself: two choices, a token each 0.2 s, staggered by 0.1 s."""
    from inferwatch.exporters.gateway.meter import RequestMeter
    from inferwatch.exporters.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics()
    meter = RequestMeter(metrics.series("t", "m", "x"), streamed=True, clock=lambda: 0.0, started=0.0)
    for t in range(4):
        meter.tokens(1, 0.1 + 0.2 * t, seq=0, exact=True)
        meter.tokens(1, 0.2 + 0.2 * t, seq=1, exact=True)
    meter.finish("ok", 200, now=1.0)
    v = lambda name: metrics.registry.get_sample_value(name, {"tenant": "t", "model": "m", "tier": "x"})  # noqa: E731
    assert v("gateway_time_to_first_token_seconds_sum") == pytest.approx(0.1)
    assert v("gateway_inter_token_latency_seconds_count") == 6
    assert v("gateway_inter_token_latency_seconds_sum") / 6 == pytest.approx(0.2)
    assert v("gateway_time_per_output_chunk_seconds_sum") / 6 == pytest.approx(0.2)
    assert v("gateway_time_per_output_token_seconds_count") == 2
    assert v("gateway_time_per_output_token_seconds_sum") / 2 == pytest.approx(0.2)
    assert metrics.registry.get_sample_value("gateway_tokens_total", {"tenant": "t", "model": "m", "tier": "x",
                                                                     "type": "output"}) == 8
