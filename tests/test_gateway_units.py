"""Gateway pieces with literal data: SSE splitting, metric definitions, buckets, in-process API, ASGI."""

from __future__ import annotations

import asyncio
import json
import sys
import zlib

import brotli
import pytest

from gateway_support import DONE, chat_chunk, make_spec, usage_chunk
from inferwatch.exporters.gateway import Gateway, GatewayMiddleware
from inferwatch.exporters.gateway.counts import MAX_TOKENS, InvalidCount, cumulative_count, token_count
from inferwatch.exporters.gateway.decoding import TooLarge, Undecodable, decoder_for
from inferwatch.exporters.gateway.meter import RequestMeter
from inferwatch.exporters.gateway.metrics import (
    DURATION_BUCKETS,
    ITL_BUCKETS,
    OUTPUT_TOKENS_BUCKETS,
    TOKENS_PER_SECOND_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    GatewayMetrics,
    code_label,
)
from inferwatch.exporters.gateway.protocols import _count_after
from inferwatch.exporters.gateway.routes import Classifier
from inferwatch.exporters.gateway.sse import ErrorEvent, EventTooLarge, SseSplitter

if sys.version_info >= (3, 14):
    from compression.zstd import ZstdCompressor
else:
    from backports.zstd import ZstdCompressor

LABELS = {"tenant": "acme", "model": "toy_llm", "tier": "realtime"}


def test_buckets_hold_slo_edges_fine_below_50ms_and_reach_minutes():
    for edge in (0.1, 0.2, 0.25, 0.3, 0.5, 1, 2, 5, 10, 20):
        assert edge in TTFT_BUCKETS
    for buckets in (TTFT_BUCKETS, ITL_BUCKETS, TPOT_BUCKETS, DURATION_BUCKETS):
        assert list(buckets) == sorted(set(buckets))
        assert sum(1 for b in buckets if b < 0.05) >= 4 and buckets[-1] >= 60
    assert OUTPUT_TOKENS_BUCKETS[0] == 1 and TOKENS_PER_SECOND_BUCKETS[-1] >= 1000


def test_sse_split_across_reads_several_per_read_crlf_and_comments():
    s = SseSplitter()
    assert s.feed(b"data: {\"a\"") == []
    assert s.feed(b":1}\n\ndata: x\n\n: ping\n\ndata:\n\n") == [b'{"a":1}', b"x", b""]
    assert s.feed(b"data: y\r") == []
    assert s.feed(b"\n\r\nevent: m\ndata: p\ndata: q\n\n") == [b"y", b"p\nq"]


# (JSON text of the value, the count or the InvalidCount reason): what an upstream may put in a count field.
COUNT_VALUES = [
    ("12", 12), ("0", 0), ("12.0", 12), ("[7]", 7), (" [ 7 ]", 7), ("null", None), (str(MAX_TOKENS), MAX_TOKENS),
    ("-5", "negative"), ("-7", "negative"), ("true", "not an integer"), ("false", "not an integer"),
    ("1.5", "not an integer"), ('"12"', "not an integer"), ("{}", "not an integer"), ("[]", "not an integer"),
    ("99999999999999999999999", f"above {MAX_TOKENS}"), ("1e23", f"above {MAX_TOKENS}"),
    (str(MAX_TOKENS + 1), f"above {MAX_TOKENS}"), ("-0.5", "not an integer"),
]


@pytest.mark.parametrize("text, want", COUNT_VALUES, ids=[r[0] for r in COUNT_VALUES])
def test_count_fields_read_without_parsing_json_and_refuse_what_is_not_a_count(text, want):
    data = b'{"text_output":"x","output_token_count":' + text.encode() + b',"z":1}'
    parsed = json.loads(text)
    if isinstance(want, str):
        with pytest.raises(InvalidCount) as found:
            _count_after(data, b'"output_token_count":', "output_token_count")
        assert (found.value.field, found.value.why) == ("output_token_count", want)
        with pytest.raises(InvalidCount):  # the parsed value (OpenAI usage) is judged the same way
            token_count(parsed[0] if isinstance(parsed, list) and parsed else parsed, "usage.completion_tokens")
    else:
        assert _count_after(data, b'"output_token_count":', "output_token_count") == want
    assert _count_after(b'{"text_output":"output_token_count"}', b'"output_token_count":', "x") is None


def test_a_cumulative_count_may_not_go_back():
    assert cumulative_count(5, 5, "usage.completion_tokens") == 5
    with pytest.raises(InvalidCount, match="below an earlier"):
        cumulative_count(4, 5, "usage.completion_tokens")
    assert InvalidCount("f", "negative", "x" * 100).value.endswith("...")  # the logged value stays short


def test_meter_definitions_with_a_literal_clock():
    metrics = GatewayMetrics()
    series = metrics.series("acme", "toy_llm", "realtime")
    meter = RequestMeter(series, streamed=True, started=0.0)
    assert metrics.registry.get_sample_value("gateway_requests_in_flight", LABELS) == 1
    meter.tokens(1, now=0.2)          # TTFT 0.2
    meter.tokens(2, now=0.3)          # gap 0.1 over 2 tokens: two ITL observations of 0.05
    meter.tokens(1, now=0.4)          # ITL 0.1
    usage = meter.finish("ok", 200, now=0.5)
    v = lambda name, **extra: metrics.registry.get_sample_value(name, {**LABELS, **extra})  # noqa: E731
    assert v("gateway_time_to_first_token_seconds_sum") == pytest.approx(0.2)
    assert v("gateway_inter_token_latency_seconds_count") == 3
    assert v("gateway_inter_token_latency_seconds_sum") == pytest.approx(0.2)
    assert v("gateway_time_per_output_token_seconds_sum") == pytest.approx((0.4 - 0.2) / 3)
    assert v("gateway_output_tokens_per_second_sum") == pytest.approx(4 / 0.5)
    assert v("gateway_request_duration_seconds_sum") == pytest.approx(0.5)
    assert v("gateway_tokens_total", type="output") == 4
    assert v("gateway_requests_in_flight") == 0
    assert (usage.output_tokens, usage.method, usage.outcome) == (4, "events", "ok")
    assert meter.finish("error", 500) is None  # a second finish records nothing


def test_cancelled_request_is_metered_but_not_in_length_or_tpot():
    metrics = GatewayMetrics()
    meter = RequestMeter(metrics.series("acme", "toy_llm", "realtime"), streamed=True, started=0.0)
    meter.tokens(1, now=0.1)
    meter.tokens(1, now=0.2)
    meter.finish("cancelled", 200, now=0.3)
    v = lambda name, **extra: metrics.registry.get_sample_value(name, {**LABELS, **extra})  # noqa: E731
    assert v("gateway_tokens_total", type="output") == 2
    assert v("gateway_requests_total", code="200", outcome="cancelled") == 1
    assert v("gateway_output_tokens_count") == 0 and v("gateway_time_per_output_token_seconds_count") == 0


IN_PROCESS_COUNTS = [(-5, None), (True, None), (False, None), (1e23, None), (1.5, None), ("12", None),
                     (10**23, None), (None, 4), (12, 12), (12.0, 12)]


@pytest.mark.parametrize("value, want", IN_PROCESS_COUNTS, ids=[repr(r[0]) for r in IN_PROCESS_COUNTS])
def test_in_process_usage_with_an_impossible_count_is_unmetered_not_raised(value, want):
    """The in-process API applies the proxy's rule (counts.py): your handler is never broken by a count it
    passes on from an upstream; the request is unmetered (invalid_count) instead."""
    records = []
    gateway = Gateway(make_spec(), usage_sink=records.append)
    with gateway.request(tenant="acme", service="chat-web", model="toy_llm") as req:
        req.tokens(4)
        req.usage(output_tokens=value, input_tokens=3)
    [usage] = records
    invalid = want is None
    assert (usage.outcome, usage.output_tokens) == ("ok", want)
    assert (usage.input_tokens, usage.unmetered) == ((None, "invalid_count") if invalid else (3, None))
    reg = gateway.metrics.registry
    assert reg.get_sample_value("gateway_tokens_total", {**LABELS, "type": "output"}) == want
    assert reg.get_sample_value("gateway_unmetered_responses_total",
                                {"model": "toy_llm", "reason": "invalid_count"}) == (1 if invalid else None)


def test_in_process_api_outcomes():
    gateway = Gateway(make_spec())
    with gateway.request(tenant="acme", service="chat-web", model="toy_llm") as req:
        req.tokens(1)
        req.tokens(3)
        req.usage(output_tokens=5, input_tokens=2)
    with pytest.raises(RuntimeError):
        with gateway.request(tenant="acme", service="chat-web", model="toy_llm") as req:
            req.tokens(1)
            raise RuntimeError("engine died")
    with pytest.raises(asyncio.CancelledError):
        with gateway.request(tenant="nobody", service="chat-web", model="toy_llm"):
            raise asyncio.CancelledError()
    reg = gateway.metrics.registry
    assert reg.get_sample_value("gateway_tokens_total", {**LABELS, "type": "output"}) == 6
    assert reg.get_sample_value("gateway_tokens_total", {**LABELS, "type": "input"}) == 2
    assert reg.get_sample_value("gateway_requests_total", {**LABELS, "code": "200", "outcome": "ok"}) == 1
    assert reg.get_sample_value("gateway_requests_total", {**LABELS, "code": "500", "outcome": "error"}) == 1
    other = {"tenant": "other", "model": "toy_llm", "tier": "realtime", "code": "499", "outcome": "cancelled"}
    assert reg.get_sample_value("gateway_requests_total", other) == 1


def _asgi_app(script, status=200):
    async def app(scope, receive, send):
        message = await receive()
        assert message["body"] == b'{"model":"gpt-test","stream":true}'  # replayed unchanged
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for item in script:
            await send({"type": "http.response.body", "body": item, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


def _call(app, path="/v1/chat/completions"):
    sent = []
    body = [{"type": "http.request", "body": b'{"model":"gpt-test","stream":true}', "more_body": False}]

    async def receive():
        return body.pop(0) if body else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(b"x-tenant-id", b"acme"), (b"x-service-name", b"chat-web")]}
    asyncio.run(app(scope, receive, send))
    return sent


def test_asgi_middleware_meters_with_the_same_definitions():
    gateway = Gateway(make_spec())
    script = [chat_chunk("a"), chat_chunk(" b c"), usage_chunk(4, 3), DONE]
    sent = _call(GatewayMiddleware(_asgi_app(script), gateway))
    assert b"".join(m.get("body", b"") for m in sent) == b"".join(script)
    labels = {"tenant": "acme", "model": "gpt-test", "tier": "realtime"}
    reg = gateway.metrics.registry
    assert reg.get_sample_value("gateway_requests_total", {**labels, "code": "200", "outcome": "ok"}) == 1
    assert reg.get_sample_value("gateway_tokens_total", {**labels, "type": "output"}) == 3
    assert reg.get_sample_value("gateway_time_to_first_token_seconds_count", labels) == 1
    # Other paths are not metered.
    _call(GatewayMiddleware(_asgi_app(script), gateway), path="/v1/models")
    assert reg.get_sample_value("gateway_requests_total", {**labels, "code": "200", "outcome": "ok"}) == 1


# ------------------------------------------------------------------ SSE line ends (WHATWG HTML §9.2)
@pytest.mark.parametrize("reads, events", [
    ([b"data: a\r\r"], [b"a"]),                                   # lone CR line ends, released at once
    ([b"data: a\r", b"\r"], [b"a"]),                              # the blank line's CR in the next read
    ([b"data: a\r\n\r", b"\ndata: b\r\n\r\n"], [b"a", b"b"]),      # CRLF split: the LF is skipped
    ([b"data: a\n", b"\n"], [b"a"]),
    ([b"\xef\xbb\xbfdata: a\n\n"], [b"a"]),                        # leading BOM ignored
    ([b"data:a\r\ndata: b\r\n\r\n"], [b"a\nb"]),                   # no space after the colon; two data lines
    ([b"data\n\n"], [b""]),                                       # a field name alone: empty data
    ([b"event: ping\n\n", b"id: 3\n\n"], []),                     # no data: not dispatched
    ([b"data: a\n"], []),                                         # unfinished at the end: discarded
])
def test_sse_line_ends_of_the_specification(reads, events):
    s = SseSplitter()
    got = [e for r in reads for e in s.feed(r)]
    assert got == events


def test_sse_error_event_and_size_limit():
    s = SseSplitter(limit=16)
    (err,) = s.feed(b"event: error\ndata: {}\n\n")
    assert isinstance(err, ErrorEvent) and err == b"{}"
    with pytest.raises(EventTooLarge):
        s.feed(b"data: " + b"x" * 32)
    assert s.feed(b"data: ok\n\n") == [b"ok"]  # the next event is read again


# ------------------------------------------------------------------------ Content-Encoding decoders
def _gzip(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize("encoding, body", [
    ("gzip", _gzip(b"ab") + _gzip(b"cd")),                                   # two gzip members
    ("x-gzip", _gzip(b"abcd")),
    ("deflate", zlib.compress(b"abcd")),                                     # zlib format (RFC 9110)
    ("deflate", zlib.compress(b"abcd", wbits=-zlib.MAX_WBITS)),              # raw DEFLATE, seen in the wild
    ("br", brotli.compress(b"abcd")),
    ("zstd", ZstdCompressor().compress(b"ab", ZstdCompressor.FLUSH_FRAME)
     + ZstdCompressor().compress(b"cd", ZstdCompressor.FLUSH_FRAME)),        # two zstd frames
    ("identity", b"abcd"),
    ("gzip, br", brotli.compress(_gzip(b"abcd"))),
])
def test_decoders_undo_each_encoding_byte_by_byte(encoding, body):
    decoder = decoder_for(encoding)
    if decoder is None:
        assert body == b"abcd"
        return
    assert b"".join(decoder.feed(body[i:i + 1], 1024) for i in range(len(body))) == b"abcd"


def test_decoders_bound_output_and_name_what_they_cannot_decode():
    bomb = _gzip(b"\0" * 10_000_000)  # ~10 KB that expands a thousandfold
    for encoding, data in (("gzip", bomb), ("br", brotli.compress(b"\0" * 10_000_000)),
                           ("zstd", ZstdCompressor().compress(b"\0" * 10_000_000, ZstdCompressor.FLUSH_FRAME))):
        with pytest.raises(TooLarge):
            decoder_for(encoding).feed(data, 1 << 20)
    with pytest.raises(Undecodable, match="'compress'"):
        decoder_for("compress")
    with pytest.raises(Undecodable):
        decoder_for("gzip").feed(b"\x1f\x8b\x08\x00not gzip at all", 1024)


# ------------------------------------------------------------------------------ labels and routes
@pytest.mark.parametrize("code, label", [(200, "200"), (500, "500"), ("503", "503"), (499, "499"), (7, "other"),
                                         ("rate_limit_exceeded", "other"), (None, "other"), (True, "other"),
                                         (599, "other"), (429, "429")])
def test_code_label_is_bounded(code, label):
    assert code_label(code) == label


def test_only_declared_llm_models_are_metered_on_triton_routes():
    default, declared = Classifier(None), Classifier(["classifier"])
    for path, expected in (("/v2/models/toy_llm/generate_stream", "generate_stream"),
                           ("/v2/models/toy_llm/versions/2/generate", "generate"),
                           ("/V2/MODELS/toy_llm/GENERATE/", "generate"), ("/v2/models/classifier/infer", None)):
        route = default.classify("POST", path, b"")
        assert (route.endpoint if route else None) == expected, path
    assert declared.classify("POST", "/v2/models/classifier/infer", b"").model == "classifier"
    assert declared.classify("POST", "/v2/models/toy_llm/generate_stream", b"") is None
    assert declared.classify("POST", "/v1/chat/completions", b'{"model":"x"}').model == "x"  # always metered
    assert default.classify("GET", "/v2/models/toy_llm/generate", b"") is None


def test_unknown_input_count_has_no_sample():
    metrics = GatewayMetrics()
    meter = RequestMeter(metrics.series("acme", "toy_llm", "realtime"), streamed=True, started=0.0)
    meter.tokens(2, now=0.1)
    usage = meter.finish("ok", 200, now=0.2)
    assert (usage.input_tokens, usage.output_tokens) == (None, 2)
    v = lambda t: metrics.registry.get_sample_value("gateway_tokens_total", {**LABELS, "type": t})  # noqa: E731
    assert (v("input"), v("output")) == (None, 2)


def test_bulk_itl_writes_equal_one_observe_per_value():
    """observe_counts (ITL written in bulk per request) leaves the same samples as observe() per value;
    it uses prometheus-client's histogram internals, so this fails if those change."""
    import bisect

    from prometheus_client import CollectorRegistry, Histogram

    from inferwatch.exporters.gateway.metrics import observe_counts

    values = [0.0, 0.0005, 0.0007, 0.01, 0.0123, 0.5, 79.0, 80.0, 81.0, 1e9]
    one, bulk = CollectorRegistry(), CollectorRegistry()
    each = Histogram("itl_seconds", "x", buckets=ITL_BUCKETS, registry=one)
    for v in values:
        each.observe(v)
    counts = [0] * (len(ITL_BUCKETS) + 1)
    for v in values:
        counts[bisect.bisect_left(ITL_BUCKETS, v)] += 1
    observe_counts(Histogram("itl_seconds", "x", buckets=ITL_BUCKETS, registry=bulk), counts, sum(values))
    got = {s.name + str(sorted(s.labels.items())): s.value for m in bulk.collect() for s in m.samples
           if not s.name.endswith("_created")}
    want = {s.name + str(sorted(s.labels.items())): s.value for m in one.collect() for s in m.samples
            if not s.name.endswith("_created")}
    assert got == pytest.approx(want)
