"""The gateway's OpenTelemetry export under the GenAI semantic conventions (docs/gateway-otlp.md): the real
gateway process, driven by real clients through each API's dialect, exports over OTLP/HTTP protobuf to a
local receiver that decodes the real ExportMetricsServiceRequest (tests/otlp_support.py); names, units,
attributes, temporality and bucket bounds are checked against the conventions (semantic-conventions
v1.41.0, gen-ai-metrics.md), and the token sums against the Prometheus counters of the same run."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from dialect_fixtures import APIS, CHAT, COMPLETIONS, DONE, EMBEDDINGS, data
from gateway_support import GatewayProcess, Script, ScriptedUpstream, refused_port, through, wait_until
from inferwatch.spec import SpecError, spec_from_dict
from otlp_support import CUMULATIVE, OtlpReceiver, attributes, histogram_sum, latest

TOKEN = "otlp-test-token-5b1c"  # the collector's credential, given by reference (${OTLP_TEST_AUTH})
GENERATE = "/v2/models/toy_llm/generate"
GENERATE_STREAM = "/v2/models/toy_llm/generate_stream"

# The conventions' ExplicitBucketBoundaries, copied from gen-ai-metrics.md (not from the code under test).
CONVENTIONS = {
    "gen_ai.client.token.usage": ("{token}", [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576,
                                              4194304, 16777216, 67108864]),
    "gen_ai.server.request.duration": ("s", [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                                             20.48, 40.96, 81.92]),
    "gen_ai.server.time_per_output_token": ("s", [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                                  1.0, 2.5]),
    "gen_ai.server.time_to_first_token": ("s", [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                                1.0, 2.5, 5.0, 7.5, 10.0]),
}


def _stream(api: str) -> Script:
    _path, tokens, end, marker, *_ = APIS[api]
    return Script([*tokens, *end, marker])


def _json(doc: dict, status: int = 200) -> Script:
    return Script([json.dumps(doc).encode()], status=status, content_type="application/json")


CHAT_JSON = {"id": "x", "object": "chat.completion", "model": "gpt-test", "usage": {"prompt_tokens": 11,
                                                                                   "completion_tokens": 4},
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]}
COMPLETIONS_STREAM = Script([data({"id": "c", "choices": [{"index": 0, "text": "Hi", "finish_reason": None}]}),
                             data({"id": "c", "choices": [{"index": 0, "text": " you", "finish_reason": "stop"}]}),
                             data({"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
                             DONE])
EMBEDDING = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, -0.2]}],
             "model": "gpt-test", "usage": {"prompt_tokens": 8, "total_tokens": 8}}
TRITON_JSON = Script([b'{"model_name":"toy_llm","text_output":"Hi there","input_token_count":100,'
                      b'"output_token_count":30}'], content_type="application/json")
TRITON_STREAM = Script([b'data: {"text_output":"Hi","input_token_count":100,"output_token_count":10}\n\n',
                        b'data: {"text_output":" there","input_token_count":100,"output_token_count":30}\n\n'])
CHAT_ERROR = Script([*APIS["chat"][1], APIS["chat"][4]])
UPSTREAM_500 = _json({"object": "error", "message": "engine died", "type": "InternalServerError"}, status=500)

# (row = tenant, path, request model, upstream script, gen_ai.operation.name, gen_ai.provider.name,
#  streamed, error.type of the request (None: it succeeded))
ROWS = [
    ("chat_stream", CHAT, "gpt-test", _stream("chat"), "chat", "openai", True, None),
    ("chat_json", CHAT, "gpt-test", _json(CHAT_JSON), "chat", "openai", False, None),
    ("completions_stream", COMPLETIONS, "gpt-test", COMPLETIONS_STREAM, "text_completion", "openai", True, None),
    ("responses_stream", APIS["responses"][0], "gpt-test", _stream("responses"), "chat", "openai", True, None),
    ("messages_stream", APIS["messages"][0], "claude-test", _stream("messages"), "chat", "anthropic", True, None),
    ("embeddings", EMBEDDINGS, "gpt-test", _json(EMBEDDING), "embeddings", "openai", False, None),
    ("triton_generate", GENERATE, None, TRITON_JSON, "text_completion", "triton", False, None),
    ("triton_stream", GENERATE_STREAM, None, TRITON_STREAM, "text_completion", "triton", True, None),
    # an error object mid-stream (code 500 under 200) and an upstream's 500: error.type is the code
    ("chat_error_event", CHAT, "gpt-test", CHAT_ERROR, "chat", "openai", True, "500"),
    ("upstream_500", CHAT, "gpt-test", UPSTREAM_500, "chat", "openai", False, "500"),
]
SPEC = {"tenants": [r[0] for r in ROWS], "models": ["gpt-test", "claude-test", "toy_llm"]}


def _otlp_spec(endpoint: str, **more) -> dict:
    return {**SPEC, "gateway": {"otlp": {"endpoint": endpoint, "interval": "1s",
                                         "headers": {"authorization": "${OTLP_TEST_AUTH}"}, **more}}}


def _drive(gw: GatewayProcess, rows=ROWS) -> None:
    for row, path, model, _script, *_ in rows:
        body = {"text_input": "hi"} if model is None else {"model": model, "prompt": "hi", "input": "hi",
                                                            "messages": [{"role": "user", "content": "hi"}]}
        status, _, _ = through(gw, row, path, body)
        assert status in (200, 500), (row, status)


def _prometheus_tokens(metrics, rows=ROWS) -> dict:
    """{(tenant, type): gateway_tokens_total} of the rows' series (None where Prometheus has no sample)."""
    out = {}
    for row, _path, model, *_ in rows:
        for kind in ("input", "output"):
            out[(row, kind)] = metrics.value("gateway_tokens_total", tenant=row, model=model or "toy_llm",
                                             tier="other", type=kind)
    return out


def _otlp_tokens(exports, rows=ROWS) -> dict:
    by_instance = latest(exports)
    out = {}
    for row, *_ in rows:
        for kind in ("input", "output"):
            count, total = histogram_sum(by_instance, "gen_ai.client.token.usage",
                                         **{"inferwatch.tenant": row, "gen_ai.token.type": kind})
            out[(row, kind)] = total if count else None  # no point: unknown (as Prometheus has no sample)
    return out


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    up = ScriptedUpstream()
    for row, _path, _model, script, *_ in ROWS:
        up.scripts[row] = script
    receiver = OtlpReceiver()
    gw = GatewayProcess(up.url, _otlp_spec(receiver.url), tmp_path_factory.mktemp("gateway"),
                        env={**os.environ, "OTLP_TEST_AUTH": f"Bearer {TOKEN}"})
    try:
        _drive(gw)
        wait_until(lambda: len(gw.usages()) == len(ROWS), what="a usage record per row")
        metrics = gw.snapshot()
        want = _prometheus_tokens(metrics)
        # Cumulative points: an export after the last request carries every total.
        wait_until(lambda: _otlp_tokens(receiver.received()) == want, timeout=30,
                   what="OTLP token sums equal to gateway_tokens_total")
        yield gw, receiver, metrics
    finally:
        gw.stop()
        up.stop()
        receiver.stop()


def test_names_units_temporality_and_bounds_are_the_conventions(ran):
    _, receiver, _ = ran
    (metrics,) = latest(receiver.received()).values()  # one writer: the gateway process
    assert set(metrics) == set(CONVENTIONS)
    for name, (unit, bounds) in CONVENTIONS.items():
        metric = metrics[name]
        assert metric.unit == unit, name
        assert metric.WhichOneof("data") == "histogram", name
        assert metric.histogram.aggregation_temporality == CUMULATIVE, name
        for point in metric.histogram.data_points:
            assert list(point.explicit_bounds) == bounds, name
            assert len(point.bucket_counts) == len(bounds) + 1 and sum(point.bucket_counts) == point.count, name


def test_token_sums_equal_the_prometheus_counters(ran):
    _, receiver, metrics = ran
    want = _prometheus_tokens(metrics)
    assert want[("chat_stream", "input")] == 9 and want[("triton_stream", "output")] == 30  # the scripts' usage
    assert want[("upstream_500", "output")] is None  # unknown, no sample: and no OTLP point either
    assert _otlp_tokens(receiver.received()) == want


@pytest.mark.parametrize("row, path, model, script, operation, provider, streamed, error", ROWS,
                         ids=[r[0] for r in ROWS])
def test_attributes_per_dialect(ran, row, path, model, script, operation, provider, streamed, error):
    gw, receiver, metrics = ran
    by_instance = latest(receiver.received())
    (points,) = by_instance.values()
    durations = [attributes(p) for p in points["gen_ai.server.request.duration"].histogram.data_points
                 if attributes(p)["inferwatch.tenant"] == row]
    expected = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider,
                "gen_ai.request.model": model or "toy_llm", "inferwatch.tenant": row, "inferwatch.tier": "other"}
    assert durations == [expected | ({"error.type": error} if error else {})]
    count, _ = histogram_sum(by_instance, "gen_ai.server.request.duration", **{"inferwatch.tenant": row})
    prom_count = sum(metrics.value("gateway_request_duration_seconds_count", tenant=row, model=m, tier="other")
                     or 0 for m in ("gpt-test", "claude-test", "toy_llm"))
    assert count == prom_count == 1
    ttft, _ = histogram_sum(by_instance, "gen_ai.server.time_to_first_token", **{"inferwatch.tenant": row})
    assert ttft == (1 if streamed and error is None else 0)  # successful streamed responses only
    tpot, _ = histogram_sum(by_instance, "gen_ai.server.time_per_output_token", **{"inferwatch.tenant": row})
    prom_tpot = metrics.value("gateway_time_per_output_token_seconds_count", tenant=row, model=model or "toy_llm",
                              tier="other")
    assert tpot == prom_tpot


def test_resource_headers_and_self_metric(ran):
    gw, receiver, _ = ran
    exports = receiver.received()
    assert all(headers.get("authorization") == f"Bearer {TOKEN}" for headers, _ in exports)
    resource = attributes(exports[-1][1].resource_metrics[0].resource)
    assert resource["service.name"] == "inferwatch-gateway" and resource["service.instance.id"]
    assert exports[-1][1].resource_metrics[0].scope_metrics[0].scope.name == "inferwatch.gateway"
    assert gw.value("gateway_otlp_exports_total", result="success") >= 1
    assert gw.value("gateway_otlp_exports_total", result="failure") == 0
    assert TOKEN not in gw.output()


@pytest.mark.parametrize("collector", ["answers_500", "down"])
def test_a_failing_collector_does_not_disturb_the_gateway(tmp_path, collector):
    """Requests are served and metered as ever; every failed export is counted, logged without the header."""
    with contextlib.ExitStack() as stack:
        receiver = OtlpReceiver(status=500) if collector == "answers_500" else None
        if receiver is not None:
            stack.callback(receiver.stop)
            endpoint = receiver.url
        else:
            endpoint = f"http://127.0.0.1:{stack.enter_context(refused_port())}/v1/metrics"
        up = ScriptedUpstream()
        stack.callback(up.stop)
        up.scripts["chat_stream"] = _stream("chat")
        gw = GatewayProcess(up.url, _otlp_spec(endpoint, timeout="1s"), tmp_path,
                            env={**os.environ, "OTLP_TEST_AUTH": f"Bearer {TOKEN}"})
        stack.callback(gw.stop)
        _failing_collector(gw, up, receiver)


def _failing_collector(gw: GatewayProcess, up: ScriptedUpstream, receiver: OtlpReceiver | None) -> None:
    # Requests before, between and after failed exports (the SDK exports nothing until a point exists).
    for n in (1, 2, 3):
        status, _, raw = through(gw, "chat_stream", CHAT, {"model": "gpt-test", "messages": []})
        assert status == 200 and raw == up.scripts["chat_stream"].body()
        wait_until(lambda n=n: (gw.value("gateway_otlp_exports_total", result="failure") or 0) >= n, timeout=30,
                   what=f"{n} failed exports counted")
    assert gw.value("gateway_tokens_total", tenant="chat_stream", model="gpt-test", tier="other",
                    type="output") == 36
    assert gw.process.proc.poll() is None
    assert gw.value("gateway_otlp_exports_total", result="success") == 0
    if receiver is not None:
        assert receiver.received(), "the failing collector was reached"
    log = gw.output()
    assert "OTLP export to 127.0.0.1:" in log and TOKEN not in log
    assert log.count("OTLP export to") == 1  # once a minute, however many exports failed


OTLP_ERRORS = [
    # (the spec's gateway.otlp, the field the error names, a word of its message)
    ({"endpoint": "otel-collector:4318"}, "gateway.otlp.endpoint", "http(s) URL"),
    ({"endpoint": "http://user:pw@collector:4318/v1/metrics"}, "gateway.otlp.endpoint", "user:password@"),
    ({"endpoint": "http://c:99999/v1/metrics"}, "gateway.otlp.endpoint", "http(s) URL"),
    ({"endpoint": "http://c:4318/v1/metrics", "interval": "500ms"}, "gateway.otlp.interval", "1s to 1h"),
    ({"endpoint": "http://c:4318/v1/metrics", "interval": "2h"}, "gateway.otlp.interval", "1s to 1h"),
    ({"endpoint": "http://c:4318/v1/metrics", "timeout": "0s"}, "gateway.otlp.timeout", "more than 0s"),
    ({"endpoint": "http://c:4318/v1/metrics", "headers": {"bad name": "${X}"}}, "gateway.otlp.headers",
     "header names"),
    ({"endpoint": "http://c:4318/v1/metrics", "headers": {"authorization": "Bearer ${X}"}},
     "gateway.otlp.headers.authorization", "${ENV_VAR}"),
    ({"endpoint": "http://c:4318/v1/metrics", "service_name": ""}, "gateway.otlp.service_name", "service name"),
    ({"endpoint": "http://c:4318/v1/metrics", "max_attribute_sets": 0}, "gateway.otlp.max_attribute_sets",
     "1-100000"),
    ({"endpoint": "http://c:4318/v1/metrics", "protocol": "grpc"}, "gateway.otlp", "protocol"),
]


@pytest.mark.parametrize("otlp, field, word", OTLP_ERRORS, ids=[e[1] + ":" + e[2] for e in OTLP_ERRORS])
def test_spec_errors_name_the_field(otlp, field, word):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"gateway": {"otlp": otlp}})
    assert caught.value.path.startswith(field) and word in str(caught.value), str(caught.value)
    assert "pw" not in str(caught.value)


def test_off_by_default_and_a_missing_secret_stops_the_start(tmp_path):
    """Without an endpoint there is no export (no self-metric either); a header whose variable is unset
    stops the gateway at start with the field named, never a traceback."""
    import subprocess
    import sys

    assert not spec_from_dict({}).gateway.otlp.enabled
    from inferwatch.exporters.gateway.api import Gateway

    assert Gateway(spec_from_dict(SPEC)).metrics.otlp is None
    import yaml

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(_otlp_spec("http://127.0.0.1:4318/v1/metrics")))
    env = {k: v for k, v in os.environ.items() if k != "OTLP_TEST_AUTH"}
    from inferwatch.testing.process import free_port

    done = subprocess.run([sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--upstream",
                           "http://127.0.0.1:9", "--port", str(free_port()), "--metrics-port",
                           str(free_port()), "--spec", str(spec_path)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    # (the log's redaction takes the word after "authorization:" for a credential, hence no "environment")
    assert "gateway.otlp.headers.authorization: " in done.stderr
    assert "variable OTLP_TEST_AUTH is not set" in done.stderr
    assert "Traceback" not in done.stderr


def test_in_process_api_exports_with_its_api(monkeypatch):
    """Gateway.request (the in-process API) records the same points; its `api` names the operation."""
    receiver = OtlpReceiver()
    monkeypatch.setenv("OTLP_TEST_AUTH", "x")
    try:
        from inferwatch.exporters.gateway.api import Gateway

        gateway = Gateway(spec_from_dict(_otlp_spec(receiver.url)))
        with gateway.request(tenant="chat_stream", model="gpt-test", api="completions") as req:
            req.tokens(1)
            req.tokens(1)
            req.usage(output_tokens=2, input_tokens=3)
        with pytest.raises(ValueError, match="api: expected one of"):
            with gateway.request(api="images"):
                pass
        gateway.close()  # the last export, at once
        by_instance = latest(receiver.received())
        assert histogram_sum(by_instance, "gen_ai.client.token.usage",
                             **{"gen_ai.operation.name": "text_completion", "gen_ai.token.type": "input"}) == (1, 3)
    finally:
        receiver.stop()


def test_workers_each_export_and_sum_to_the_prometheus_counters(tmp_path):
    """With --workers 2 each worker exports its own cumulative points under its own service.instance.id;
    summed over the writers they equal the counters the main process serves."""
    up = ScriptedUpstream()
    rows = [r for r in ROWS if r[7] is None]
    for row, _path, _model, script, *_ in rows:
        up.scripts[row] = script
    receiver = OtlpReceiver()
    gw = GatewayProcess(up.url, _otlp_spec(receiver.url), tmp_path, extra_args=("--workers", "2"),
                        env={**os.environ, "OTLP_TEST_AUTH": f"Bearer {TOKEN}"})
    try:
        for _ in range(3):
            _drive(gw, rows)
        wait_until(lambda: len(gw.usages()) == 3 * len(rows), what="every usage record")
        want = _prometheus_tokens(gw.snapshot(), rows)
        wait_until(lambda: _otlp_tokens(receiver.received(), rows) == want, timeout=30,
                   what="OTLP sums over the workers equal to gateway_tokens_total")
        instances = set(latest(receiver.received()))
        assert len(instances) == 2, instances
    finally:
        gw.stop()
        up.stop()
        receiver.stop()


def test_attribute_sets_beyond_the_limit_fold_into_the_overflow_set(monkeypatch):
    """gateway.otlp.max_attribute_sets bounds each metric's sets; the rest is one otel.metric.overflow set,
    so the sums still equal every token metered."""
    receiver = OtlpReceiver()
    monkeypatch.setenv("OTLP_TEST_AUTH", "x")
    try:
        from inferwatch.exporters.gateway.api import Gateway

        spec = _otlp_spec(receiver.url, max_attribute_sets=2)
        gateway = Gateway(spec_from_dict(spec))
        for tenant in SPEC["tenants"][:4]:
            with gateway.request(tenant=tenant, model="gpt-test") as req:
                req.usage(output_tokens=5, input_tokens=10)
        gateway.close()
        (metrics,) = latest(receiver.received()).values()
        points = metrics["gen_ai.client.token.usage"].histogram.data_points
        assert len(points) == 3 and [attributes(p) for p in points].count({"otel.metric.overflow": True}) == 1
        assert sum(p.sum for p in points) == 4 * 15
    finally:
        receiver.stop()
