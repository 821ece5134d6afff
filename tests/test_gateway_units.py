"""Gateway pieces with literal data: SSE splitting, metric definitions, buckets, in-process API, ASGI."""

from __future__ import annotations

import asyncio

import pytest

from gateway_support import chat_chunk, make_spec, usage_chunk, DONE
from inferwatch.exporters.gateway import Gateway, GatewayMiddleware
from inferwatch.exporters.gateway.meter import RequestMeter
from inferwatch.exporters.gateway.metrics import (DURATION_BUCKETS, ITL_BUCKETS, OUTPUT_TOKENS_BUCKETS,
                                                  TOKENS_PER_SECOND_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS,
                                                  GatewayMetrics)
from inferwatch.exporters.gateway.protocols import _int_after
from inferwatch.exporters.gateway.sse import SseSplitter

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


def test_int_after_reads_counts_without_parsing_json():
    assert _int_after(b'{"text_output":"x","output_token_count":42}', b'"output_token_count":') == 42
    assert _int_after(b'{"output_token_count": [7]}', b'"output_token_count":') == 7
    assert _int_after(b'{"text_output":"output_token_count"}', b'"output_token_count":') is None


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
