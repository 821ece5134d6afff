"""The gateway's gRPC listener in front of the real Triton (its gRPC port), driven by `tritonclient.grpc`:
every call forwarded, LLM streams and unary calls metered per request, billing trailers, failures passed on."""

from __future__ import annotations

import bisect
import queue
import subprocess
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from gateway_support import RunningProxy, make_spec, wait_until
from inferwatch.exporters.gateway.metrics import TTFT_BUCKETS

TENANT = [("x-tenant-id", "acme"), ("x-service-name", "chat-web")]
ACME = {"tenant": "acme", "model": "toy_llm", "tier": "realtime"}


@pytest.fixture
def proxy(triton):
    p = RunningProxy(triton.url, grpc_upstream=f"127.0.0.1:{triton.grpc_port}")
    yield p
    p.stop()


def toy_inputs(max_tokens=4, first_token_delay_ms=5, token_delay_ms=1, fail=0.0):
    inputs = []
    for name, dtype, value in (("text_input", "BYTES", np.array([b"hi"], dtype=object)),
                               ("max_tokens", "INT32", np.array([max_tokens], dtype=np.int32)),
                               ("first_token_delay_ms", "INT32", np.array([first_token_delay_ms], dtype=np.int32)),
                               ("token_delay_ms", "INT32", np.array([token_delay_ms], dtype=np.int32)),
                               ("fail", "FP32", np.array([fail], dtype=np.float32))):
        tensor = grpcclient.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


class Stream:
    """A tritonclient stream whose responses (result, error, arrival time) land in a queue."""

    def __init__(self, address: str, headers=TENANT):
        self.client = grpcclient.InferenceServerClient(address)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error,
                                                                                     time.perf_counter())),
                                 headers=dict(headers))

    def send(self, request_id: str, **knobs) -> float:
        sent = time.perf_counter()
        self.client.async_stream_infer("toy_llm", toy_inputs(**knobs), request_id=request_id)
        return sent

    def take(self, n: int, timeout: float = 20.0) -> list:
        return [self.responses.get(timeout=timeout) for _ in range(n)]

    def close(self):
        self.client.stop_stream()
        self.client.close()


def token_count(result) -> int:
    return int(result.as_numpy("output_token_count")[-1])


def test_stream_tokens_exact_and_ttft_agrees_with_the_client(proxy):
    stream = Stream(proxy.grpc_address)
    try:
        sent = stream.send("r1", max_tokens=7, first_token_delay_ms=120)
        got = stream.take(7)
    finally:
        stream.close()
    assert [e for _, e, _ in got] == [None] * 7
    assert token_count(got[-1][0]) == 7
    client_ttft = got[0][2] - sent
    proxy.wait_requests(1, **ACME, outcome="ok", code="200")
    assert proxy.value("gateway_tokens_total", **ACME, type="output") == 7
    assert proxy.value("gateway_token_count_method_total", model="toy_llm", method="count_field") == 1
    assert proxy.value("gateway_inter_token_latency_seconds_count", **ACME) == 6
    gateway_ttft = proxy.value("gateway_time_to_first_token_seconds_sum", **ACME)
    assert proxy.value("gateway_time_to_first_token_seconds_count", **ACME) == 1
    # The gateway sees the request after the client sent it and the first response before the client gets it.
    assert abs(bisect.bisect_left(TTFT_BUCKETS, gateway_ttft) - bisect.bisect_left(TTFT_BUCKETS, client_ttft)) <= 1
    assert 0.12 <= gateway_ttft <= client_ttft
    assert [(u.output_tokens, u.outcome, u.method) for u in proxy.usages] == [(7, "ok", "count_field")]
    assert proxy.value("gateway_grpc_calls_total", method="ModelStreamInfer", code="OK") == 1


def test_requests_multiplexed_on_one_stream_are_metered_each(proxy):
    stream = Stream(proxy.grpc_address)
    try:
        for rid, n in (("a", 3), ("b", 9), ("c", 5)):
            stream.send(rid, max_tokens=n, token_delay_ms=3)
        got = stream.take(17)
    finally:
        stream.close()
    assert {r.get_response().id for r, _, _ in got} == {"a", "b", "c"}
    proxy.wait_requests(3, **ACME, outcome="ok")
    assert sorted(u.output_tokens for u in proxy.usages) == [3, 5, 9]
    assert proxy.value("gateway_tokens_total", **ACME, type="output") == 17
    assert proxy.value("gateway_requests_in_flight", **ACME) == 0


def raw_request(request_id: str, model: str = "toy_llm", max_tokens: int = 4, token_delay_ms: int = 1,
                first_token_delay_ms: int = 5) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, dtype, raw in (("text_input", "BYTES", len(b"hi").to_bytes(4, "little") + b"hi"),
                             ("max_tokens", "INT32", np.array([max_tokens], np.int32).tobytes()),
                             ("token_delay_ms", "INT32", np.array([token_delay_ms], np.int32).tobytes()),
                             ("first_token_delay_ms", "INT32", np.array([first_token_delay_ms], np.int32).tobytes())):
        tensor = req.inputs.add()
        tensor.name, tensor.datatype = name, dtype
        tensor.shape.append(1)
        req.raw_input_contents.append(raw)
    return req


def test_billing_trailers_carry_the_tokens_received_and_upstream_copies_never_pass(proxy):
    with grpc.insecure_channel(proxy.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(iter([raw_request("t1", max_tokens=6), raw_request("t2", max_tokens=2)]),
                                     metadata=TENANT)
        responses = list(call)
        trailers = dict(call.trailing_metadata())
    received = sum(1 for r in responses if r.infer_response.outputs)
    assert received == 8
    # toy_llm reports no input count: the total is unknown, so only the output count is sent (never 0).
    assert trailers.get("x-token-used-output") == "8"
    assert "x-token-used" not in trailers and "x-token-used-input" not in trailers


def test_unary_infer_of_a_classic_model_is_forwarded_counted_not_metered(proxy, triton):
    data = np.arange(32, dtype=np.float32).reshape(2, 16)

    def infer(address):
        client = grpcclient.InferenceServerClient(address)
        tensor = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        try:
            result = client.infer("classifier", [tensor], headers=dict(TENANT))
            return result.as_numpy("PROBABILITIES"), result.as_numpy("LABEL")
        finally:
            client.close()

    via, direct = infer(proxy.grpc_address), infer(f"127.0.0.1:{triton.grpc_port}")
    assert np.array_equal(via[0], direct[0]) and np.array_equal(via[1], direct[1])
    wait_until(lambda: proxy.value("gateway_grpc_calls_total", method="ModelInfer", code="OK") == 1,
               what="ModelInfer counted")
    assert proxy.requests_total() == 0 and proxy.usages == []


def test_unknown_model_not_found_passes_through_with_triton_details(proxy):
    client = grpcclient.InferenceServerClient(proxy.grpc_address)
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata("no_such_model")
    client.close()
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in raised.value.message()
    wait_until(lambda: proxy.value("gateway_grpc_calls_total", method="ModelMetadata", code="NOT_FOUND") == 1,
               what="NOT_FOUND counted")


def test_in_stream_error_is_outcome_error_with_the_tokens_produced(proxy):
    stream = Stream(proxy.grpc_address)
    try:
        stream.send("f1", max_tokens=8, fail=1.0)
        got = stream.take(5)
    finally:
        stream.close()
    assert got[-1][1] is not None and "injected failure" in str(got[-1][1])
    proxy.wait_requests(1, **ACME, outcome="error", code="200")
    assert proxy.value("gateway_tokens_total", **ACME, type="output") == 4
    assert proxy.usages[0].error_type == "triton_error"


def _toy_llm_success(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stats = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            service_pb2.ModelStatisticsRequest(name="toy_llm"))
    return sum(m.inference_stats.success.count for m in stats.model_stats)


def test_client_cancel_cancels_the_upstream_call(proxy, triton):
    direct = f"127.0.0.1:{triton.grpc_port}"
    before = _toy_llm_success(direct)
    channel = grpc.insecure_channel(proxy.grpc_address)
    call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
        iter([raw_request("c1", max_tokens=2000, token_delay_ms=10)]), metadata=TENANT)
    for _, _response in zip(range(3), call, strict=False):
        pass
    started = time.monotonic()
    call.cancel()
    proxy.wait_requests(1, **ACME, outcome="cancelled", code="499")
    # toy_llm ends a cancelled request at its next token (it would run 20 s otherwise): Triton counts it done.
    wait_until(lambda: _toy_llm_success(direct) > before, timeout=10, what="Triton ending the cancelled request")
    assert time.monotonic() - started < 10
    produced = proxy.value("gateway_tokens_total", **ACME, type="output")
    assert 3 <= produced < 2000
    channel.close()
    wait_until(lambda: proxy.value("gateway_grpc_calls_total", method="ModelStreamInfer", code="CANCELLED") == 1,
               what="cancelled call counted")


def test_client_deadline_is_propagated_and_metered_timeout(proxy):
    with grpc.insecure_channel(proxy.grpc_address) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter([raw_request("d1", max_tokens=500, token_delay_ms=10)]), metadata=TENANT, timeout=0.5)
        with pytest.raises(grpc.RpcError) as raised:
            list(call)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    proxy.wait_requests(1, **ACME, outcome="timeout")


def test_message_above_the_limit_is_resource_exhausted(triton):
    p = RunningProxy(triton.url, spec=make_spec(max_body_bytes=64 * 1024),
                     grpc_upstream=f"127.0.0.1:{triton.grpc_port}")
    try:
        big = raw_request("big")
        big.raw_input_contents[0] = (70 * 1024).to_bytes(4, "little") + b"x" * (70 * 1024)
        with grpc.insecure_channel(p.grpc_address) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                list(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([big]), timeout=10))
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        p.stop()


def test_triton_killed_mid_stream_is_unavailable_and_outcome_error(triton_factory):
    server = triton_factory()
    p = RunningProxy(server.url, grpc_upstream=f"127.0.0.1:{server.grpc_port}")
    try:
        with grpc.insecure_channel(p.grpc_address) as channel:
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
                iter([raw_request("k1", max_tokens=2000, token_delay_ms=10)]), metadata=TENANT)
            with pytest.raises(grpc.RpcError) as raised:
                for i, _response in enumerate(call):
                    if i == 2:
                        server.process.kill()
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        p.wait_requests(1, **ACME, outcome="error", code="503")
        assert p.usages[0].output_tokens >= 3
    finally:
        p.stop()


@pytest.mark.slow
def test_a_thousand_concurrent_streams_each_metered_exactly(proxy):
    import asyncio

    async def run():
        async with grpc.aio.insecure_channel(proxy.grpc_address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def one(i):
                call = stub.ModelStreamInfer(iter([raw_request(f"s{i}", max_tokens=3, first_token_delay_ms=200)]),
                                             metadata=TENANT, timeout=120)
                return sum([1 async for r in call if r.infer_response.outputs])

            return await asyncio.gather(*(one(i) for i in range(1000)))

    counts = asyncio.run(run())
    assert counts == [3] * 1000
    proxy.wait_requests(1000, **ACME, outcome="ok")
    assert proxy.value("gateway_tokens_total", **ACME, type="output") == 3000
    assert proxy.value("gateway_requests_in_flight", **ACME) == 0


def test_tls_listener_when_the_spec_gives_a_certificate(triton, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    p = RunningProxy(triton.url, grpc_upstream=f"127.0.0.1:{triton.grpc_port}", certificate=cert.read_bytes(),
                     private_key=key.read_bytes())
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"localhost:{p.grpc.port}", credentials) as channel:
            live = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(),
                                                                                 timeout=10)
        assert live.live is True
        with grpc.insecure_channel(p.grpc_address) as channel, pytest.raises(grpc.RpcError):
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(), timeout=3)
    finally:
        p.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_cli_serves_grpc_beside_http_with_forked_metrics(triton, tmp_path, workers):
    from gateway_support import TEST_SPEC, GatewayProcess
    from inferwatch.testing.process import free_port

    port = free_port()
    gw = GatewayProcess(triton.url, dict(TEST_SPEC), tmp_path, extra_args=(
        "--grpc-upstream", f"127.0.0.1:{triton.grpc_port}", "--grpc-port", str(port), "--workers", str(workers)))
    try:
        wait_until(lambda: _live(f"127.0.0.1:{port}"), timeout=30, what="gRPC listener answering")
        for i in range(4):
            stream = Stream(f"127.0.0.1:{port}")
            try:
                stream.send(f"p{i}", max_tokens=5)
                assert token_count(stream.take(5)[-1][0]) == 5
            finally:
                stream.close()
        # /metrics is rendered in a forked child (or summed over workers) while gRPC threads run.
        wait_until(lambda: gw.value("gateway_tokens_total", **ACME, type="output") == 20, timeout=20,
                   what="20 tokens on /metrics")
        wait_until(lambda: len(gw.usages()) == 4, what="4 usage records")
        assert [u["output_tokens"] for u in gw.usages()] == [5] * 4
    finally:
        gw.process.stop()


def _live(address: str) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            return service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(
                service_pb2.ServerLiveRequest(), timeout=2).live
    except grpc.RpcError:
        return False


@pytest.mark.parametrize("row,metadata,trusted,billed,status", [
    # (row, tenant metadata as sent, trusted networks, tenant billed, gRPC status). A value with surrounding
    # spaces cannot be sent: the gRPC client refuses it before it leaves (INTERNAL, client-side).
    ("trusted_peer", [("x-tenant-id", "acme")], None, "acme", grpc.StatusCode.OK),
    ("untrusted_peer_spoofs", [("x-tenant-id", "acme")], ["10.0.0.0/8"], "other", grpc.StatusCode.OK),
    ("two_values", [("x-tenant-id", "acme"), ("x-tenant-id", "globex")], None, None,
     grpc.StatusCode.INVALID_ARGUMENT),
    ("a_list", [("x-tenant-id", "acme, globex")], None, None, grpc.StatusCode.INVALID_ARGUMENT),
])
def test_grpc_tenant_identity_follows_the_http_trust_rules(triton, row, metadata, trusted, billed, status):
    spec = make_spec(tenant_trusted_proxies=trusted) if trusted else make_spec()
    p = RunningProxy(triton.url, spec=spec, grpc_upstream=f"127.0.0.1:{triton.grpc_port}")
    try:
        with grpc.insecure_channel(p.grpc_address) as channel:
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
                iter([raw_request("t", max_tokens=2)]), metadata=metadata + [("x-service-name", "chat-web")],
                timeout=20)
            try:
                list(call)
                got = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                got = exc.code()
        assert got == status, row
        if billed is not None:
            p.wait_requests(1)
            assert [u.tenant for u in p.usages] == [billed], row
        else:
            assert p.usages == [] and p.value("gateway_grpc_calls_total", method="ModelStreamInfer",
                                              code="INVALID_ARGUMENT") == 1
    finally:
        p.stop()
