"""CallMeter (grpcmeter.py) with literal messages of Triton's gRPC service definition: tables of how
responses reveal tokens, how requests end, and which metadata crosses the gRPC listener."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from inferwatch.exporters.gateway.grpcmeter import HTTP_STATUS_OF, INFER, STREAM_INFER, CallMeter
from inferwatch.exporters.gateway.grpcproxy import forwarded_metadata, method_label, returned_metadata
from inferwatch.exporters.gateway.labels import LabelPolicy
from inferwatch.exporters.gateway.metrics import GatewayMetrics
from inferwatch.spec import spec_from_dict

SPEC = spec_from_dict({"tenants": ["acme"], "models": ["toy_llm", "classifier"],
                       "tiers": {"realtime": {"services": ["chat-web"]}}})
META = [("x-tenant-id", "acme"), ("x-service-name", "chat-web")]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def meter(method=STREAM_INFER, llm_models=None, metadata=META):
    metrics = GatewayMetrics()
    usages = []
    clock = Clock()
    m = CallMeter(method, metadata, metrics, LabelPolicy(SPEC), llm_models, usages.append, clock=clock)
    return m, metrics, usages, clock


def request(rid="", model="toy_llm") -> bytes:
    return service_pb2.ModelInferRequest(model_name=model, id=rid).SerializeToString()


def infer_response(rid="", count=None, count_type="INT32", text=None, raw=True, final=None, inputs=None):
    r = service_pb2.ModelInferResponse(model_name="toy_llm", id=rid)
    if text is not None:
        out = r.outputs.add(name="text_output", datatype="BYTES", shape=[1])
        if raw:
            r.raw_output_contents.append(len(text).to_bytes(4, "little") + text)
        else:
            out.contents.bytes_contents.append(text)
    for name, value in (("output_token_count", count), ("input_token_count", inputs)):
        if value is None:
            continue
        out = r.outputs.add(name=name, datatype=count_type, shape=[1])
        if raw:
            dtype = {"INT32": np.int32, "INT64": np.int64, "UINT32": np.uint32, "FP32": np.float32}[count_type]
            r.raw_output_contents.append(np.array([value], dtype=dtype).tobytes())
        elif count_type == "INT64":
            out.contents.int64_contents.append(value)
        else:
            out.contents.int_contents.append(value)
    if final is not None:
        r.parameters["triton_final_response"].bool_param = final
    return r


def stream_response(rid="", error="", **kw) -> bytes:
    return service_pb2.ModelStreamInferResponse(error_message=error,
                                                infer_response=infer_response(rid, **kw)).SerializeToString()


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels)


ACME = {"tenant": "acme", "model": "toy_llm", "tier": "realtime"}


@pytest.mark.parametrize("responses,tokens,method", [
    # the count output, raw INT32 (toy_llm, Triton's default raw layout)
    ([dict(count=1, text=b"a "), dict(count=2, text=b"b "), dict(count=3, text=b"c ", final=True)], 3, "count_field"),
    # a chunk carrying several tokens: the cumulative count says how many
    ([dict(count=4, text=b"abcd"), dict(count=9, text=b"efghi", final=True)], 9, "count_field"),
    # INT64 and typed contents instead of raw bytes
    ([dict(count=2, count_type="INT64", raw=False), dict(count=5, count_type="INT64", raw=False, final=True)], 5,
     "count_field"),
    # no count output: one token per response with non-empty text
    ([dict(text=b"x"), dict(text=b""), dict(text=b"y", raw=False), dict(final=True)], 2, "events"),
])
def test_tokens_of_a_stream_by_what_its_responses_carry(responses, tokens, method):
    m, metrics, usages, clock = meter()
    m.request(request("r"))
    for i, kw in enumerate(responses):
        clock.now = 0.1 * (i + 1)
        m.response(stream_response("r", **kw))
    assert [(u.output_tokens, u.method, u.outcome, u.code) for u in usages] == [(tokens, method, "ok", 200)]
    assert sample(metrics, "gateway_tokens_total", **ACME, type="output") == tokens
    assert sample(metrics, "gateway_time_to_first_token_seconds_sum", **ACME) == pytest.approx(0.1)


def test_input_count_output_is_read_and_trailers_carry_the_sum():
    m, _, usages, _ = meter()
    m.request(request("r"))
    m.response(stream_response("r", count=3, inputs=11, text=b"abc", final=True))
    assert (usages[0].input_tokens, usages[0].output_tokens) == (11, 3)
    assert dict(m.token_trailers()) == {"x-token-used-output": "3", "x-token-used-input": "11", "x-token-used": "14"}


@pytest.mark.parametrize("kw,why", [
    (dict(count=-1), "negative"),
    (dict(count=3, count_type="FP32"), "not an integer"),
    (dict(count=2**31, count_type="INT64"), "above"),  # one past the largest count (2^31 - 1)
    (dict(count=2**31, count_type="UINT32"), "above"),
    (dict(count=2**31, count_type="INT64", raw=False), "above"),
    (dict(count=3, inputs=-2), "negative"),  # the input count is held to the same rule
])
def test_a_count_that_is_not_one_makes_the_request_unmetered(kw, why):
    m, metrics, usages, _ = meter()
    seen = []
    m.on_unmetered = lambda reason, model, text, value: seen.append(text)
    m.request(request("r"))
    m.response(stream_response("r", final=True, **kw))
    assert (usages[0].output_tokens, usages[0].unmetered) == (None, "invalid_count")
    assert len(seen) == 1 and why in seen[0]
    assert sample(metrics, "gateway_unmetered_responses_total", model="toy_llm", reason="invalid_count") == 1
    assert m.token_trailers() == []  # unknown is never sent as a count


def test_the_largest_count_is_a_count():
    m, _, usages, _ = meter()
    m.request(request("r"))
    m.response(stream_response("r", count=2**31 - 1, count_type="INT64", final=True))
    assert (usages[0].output_tokens, usages[0].unmetered) == (2**31 - 1, None)


def test_a_count_going_back_is_invalid():
    m, _, usages, _ = meter()
    m.request(request("r"))
    m.response(stream_response("r", count=5))
    m.response(stream_response("r", count=4, final=True))
    assert usages[0].unmetered == "invalid_count"


def test_requests_on_one_stream_are_told_apart_by_id_and_anonymous_ones_in_order():
    m, _, usages, _ = meter()
    for rid in ("a", "b", "", ""):
        m.request(request(rid))
    m.response(stream_response("b", count=2, final=True))
    m.response(stream_response("", count=1, final=True))   # the first anonymous request
    m.response(stream_response("a", count=1))
    m.response(stream_response("", count=4, final=True))   # the second one
    m.response(stream_response("a", error="injected failure"))
    assert [(u.output_tokens, u.outcome) for u in usages] == [(2, "ok"), (1, "ok"), (4, "ok"), (1, "error")]
    assert usages[-1].error_type == "triton_error"


@pytest.mark.parametrize("code,outcome,status", [
    (grpc.StatusCode.OK, "ok", 200),
    (grpc.StatusCode.CANCELLED, "cancelled", 499),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "timeout", 504),
    (grpc.StatusCode.UNAVAILABLE, "error", 503),
    (grpc.StatusCode.INTERNAL, "error", 500),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "error", 429),
    (grpc.StatusCode.NOT_FOUND, "error", 404),
])
def test_the_call_status_ends_every_open_request(code, outcome, status):
    m, metrics, usages, _ = meter()
    m.request(request("a"))
    m.request(request("b"))
    m.response(stream_response("a", count=2))
    m.end(code)
    assert [(u.outcome, u.code) for u in usages] == [(outcome, status)] * 2
    assert sample(metrics, "gateway_requests_total", **ACME, code=str(status), outcome=outcome) == 2
    assert sample(metrics, "gateway_requests_in_flight", **ACME) == 0


def test_every_grpc_status_has_an_http_equivalent():
    assert set(HTTP_STATUS_OF) == set(grpc.StatusCode)


@pytest.mark.parametrize("method,model,llm_models,metered", [
    (STREAM_INFER, "toy_llm", None, True),         # unset: every streamed model
    (STREAM_INFER, "classifier", None, True),
    (INFER, "toy_llm", None, False),               # unset: no unary infer
    (INFER, "toy_llm", frozenset({"toy_llm"}), True),
    (STREAM_INFER, "classifier", frozenset({"toy_llm"}), False),
    ("/inference.GRPCInferenceService/ModelMetadata", "toy_llm", None, False),
])
def test_which_calls_are_llm_calls(method, model, llm_models, metered):
    m, _, usages, _ = meter(method=method, llm_models=llm_models)
    m.request(request("r", model=model))
    m.end(grpc.StatusCode.OK)
    assert len(usages) == (1 if metered else 0)


def test_unary_llm_infer_is_exact_and_not_streamed():
    m, metrics, usages, _ = meter(method=INFER, llm_models=frozenset({"toy_llm"}))
    m.request(request("u"))
    m.response(infer_response("u", count=12).SerializeToString())
    assert [(u.output_tokens, u.outcome) for u in usages] == [(12, "ok")]
    assert sample(metrics, "gateway_time_to_first_token_seconds_count", **ACME) in (None, 0.0)


def test_undeclared_tenant_folds_into_other():
    m, metrics, usages, _ = meter(metadata=[("x-tenant-id", "mallory")])
    m.request(request("r"))
    m.end(grpc.StatusCode.OK)
    assert (usages[0].tenant, usages[0].tier) == ("other", "other")


def test_abandoned_metering_finishes_open_requests_unmetered():
    m, metrics, usages, _ = meter()
    m.request(request("r"))
    m.abandon("meter_error")
    m.response(stream_response("r", count=3, final=True))  # no longer read
    m.end(grpc.StatusCode.OK)
    assert [(u.output_tokens, u.unmetered) for u in usages] == [(None, "meter_error")]
    assert sample(metrics, "gateway_requests_in_flight", **ACME) == 0


@pytest.mark.parametrize("key,to_upstream,to_client", [
    ("x-tenant-id", True, True),
    ("authorization", True, True),
    ("trace-bin", True, True),
    (":authority", False, False),
    ("grpc-timeout", False, False),
    ("grpc-accept-encoding", False, False),
    ("user-agent", False, False),
    ("content-type", False, False),
    ("te", False, False),
    ("x-token-used", True, False),          # an upstream's billing keys never reach the client
    ("x-token-used-output", True, False),
    ("x-token-used-input", True, False),
])
def test_which_metadata_crosses_the_listener(key, to_upstream, to_client):
    md = [(key, "v")]
    assert bool(forwarded_metadata(md)) is to_upstream
    assert bool(returned_metadata(md)) is to_client


@pytest.mark.parametrize("method,label", [
    ("/inference.GRPCInferenceService/ModelStreamInfer", "ModelStreamInfer"),
    ("/inference.GRPCInferenceService/ModelInfer", "ModelInfer"),
    ("/inference.GRPCInferenceService/NoSuchRpc", "other"),
    ("/grpc.health.v1.Health/Check", "other"),
    ("/" + "x" * 500, "other"),
])
def test_method_label_is_bounded(method, label):
    assert method_label(method) == label


def test_requests_open_at_once_under_one_id_are_billed_no_count():
    m, metrics, usages, _ = meter()
    for _ in range(3):
        m.request(request("same"))
    for _request in range(3):
        for n in (1, 2, 3):
            m.response(stream_response("same", count=n, final=n == 3))
    assert [(u.output_tokens, u.unmetered, u.outcome) for u in usages] == [(None, "duplicate_id", "ok")] * 3
    assert sample(metrics, "gateway_unmetered_responses_total", model="toy_llm", reason="duplicate_id") == 3
    assert m.token_trailers() == []


def test_an_id_reused_after_its_request_ended_is_a_new_request():
    m, _, usages, _ = meter()
    m.request(request("r"))
    m.response(stream_response("r", count=2, final=True))
    m.request(request("r"))
    m.response(stream_response("r", count=5, final=True))
    assert [(u.output_tokens, u.unmetered) for u in usages] == [(2, None), (5, None)]


def test_a_message_dropped_for_its_size_makes_the_count_unknown():
    m, _, usages, _ = meter()
    m.request(request("r"))
    m.end(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert [(u.output_tokens, u.unmetered, u.code) for u in usages] == [(None, "too_large", 429)]
    assert m.token_trailers() == []
