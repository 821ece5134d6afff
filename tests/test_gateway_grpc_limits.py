"""The gRPC listener's bounds under hostile clients and upstreams: clients that never read, idle streams that
hold call slots, reused request ids, an unreachable Triton, credentials in the upstream address.

The flooding upstream is a scripted server of Triton's real service definition (tritonclient's messages) that
answers each request with large responses as fast as the transport takes them: what a misbehaving model
does, and what the real Triton's toy model cannot send."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import grpc
import psutil
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway_support import TEST_SPEC, GatewayProcess, RunningProxy, make_spec, refused_port, wait_until
from inferwatch.loops import close_stopped_loop
from inferwatch.testing.process import free_port

TENANT = [("x-tenant-id", "acme"), ("x-service-name", "chat-web")]
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


class FloodingUpstream:
    """A gRPC server (its own loop thread) answering every ModelStreamInfer request with `count` responses of
    `size` bytes of text each, or, with `count=0`, nothing until the call ends."""

    def __init__(self, count: int = 400, size: int = 1 << 20):
        self.count, self.size = count, size
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(15)

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start(ready))
        self.loop.run_forever()

    async def _start(self, ready):
        upstream = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                async def handle(requests, context):
                    async for raw in requests:
                        req = service_pb2.ModelInferRequest.FromString(raw)
                        for _ in range(upstream.count):
                            resp = service_pb2.ModelStreamInferResponse()
                            resp.infer_response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
                            resp.infer_response.id = req.id
                            resp.infer_response.raw_output_contents.append(
                                upstream.size.to_bytes(4, "little") + b"x" * upstream.size)
                            yield resp.SerializeToString()
                    if upstream.count == 0:
                        await asyncio.sleep(3600)
                return grpc.stream_stream_rpc_method_handler(handle)

        self.server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20)])
        self.server.add_generic_rpc_handlers((Handler(),))
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()
        ready.set()

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        close_stopped_loop(self.loop, self.thread)


NON_READER = """
import asyncio, sys, grpc
from tritonclient.grpc import service_pb2
async def main():
    channel = grpc.aio.insecure_channel(sys.argv[1], options=[("grpc.max_receive_message_length", 64 << 20)])
    calls = []
    for i in range(int(sys.argv[2])):
        async def requests(i=i):
            yield service_pb2.ModelInferRequest(model_name="toy_llm", id=str(i)).SerializeToString()
            await asyncio.sleep(3600)
        calls.append(channel.stream_stream("%s")(requests(), metadata=[("x-tenant-id", "acme")]))
    print("open", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
""" % STREAM


def test_clients_that_never_read_hold_a_bounded_amount_each(tmp_path):
    """Without the window bound (gRPC's BDP probing on) ten such streams grew the gateway by ~380 MB (about
    38 MB each, 1 MiB messages); with it, by a few MB each."""
    upstream = FloodingUpstream()
    port = free_port()
    gw = GatewayProcess("http://127.0.0.1:9", dict(TEST_SPEC), tmp_path, extra_args=(
        "--grpc-upstream", f"127.0.0.1:{upstream.port}", "--grpc-port", str(port)))
    client = None
    try:
        before = psutil.Process(gw.pid).memory_info().rss
        client = subprocess.Popen([sys.executable, "-c", NON_READER, f"127.0.0.1:{port}", "10"],
                                  stdout=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "open"
        # Growth settles once every stream's windows are full; wait until two reads a second apart agree.
        samples = []

        def settled():
            samples.append(psutil.Process(gw.pid).memory_info().rss)
            return len(samples) > 3 and abs(samples[-1] - samples[-3]) < 4 << 20
        wait_until(settled, timeout=30, what="the gateway's memory to settle")
        grown = samples[-1] - before
        assert grown < 100 << 20, f"the gateway grew by {grown >> 20} MiB for 10 streams that never read"
        client.kill()
        client.wait(10)
        # The client left mid-write: each call is counted (cancelled), none logs an error (the gateway runs
        # with -v: gRPC's own DEBUG lines may show tracebacks of the cancellation, which are not errors).
        wait_until(lambda: (gw.value("gateway_grpc_calls_total", method="ModelStreamInfer", code="CANCELLED")
                            or 0) == 10, timeout=30, what="10 cancelled calls counted")
        errors = [line for line in gw.log_path.read_text().splitlines() if " ERROR " in line]
        assert errors == []
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        gw.process.stop()
        upstream.stop()


def test_a_stream_idle_both_ways_is_closed_after_the_upstream_timeout():
    upstream = FloodingUpstream(count=0)
    p = RunningProxy("http://127.0.0.1:9", spec=make_spec(upstream_timeout="2s"),
                     grpc_upstream=f"127.0.0.1:{upstream.port}")
    try:
        started = time.monotonic()
        with grpc.insecure_channel(p.grpc_address) as channel:
            call = channel.stream_stream(STREAM)(iter([service_pb2.ModelInferRequest(
                model_name="toy_llm", id="idle").SerializeToString()]), metadata=TENANT, timeout=60)
            with pytest.raises(grpc.RpcError) as raised:
                list(call)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "gateway.upstream_timeout" in raised.value.details()
        assert time.monotonic() - started < 30
        assert p.value("gateway_grpc_calls_closed_total", reason="idle") == 1
        p.wait_requests(1, outcome="timeout")
    finally:
        p.stop()
        upstream.stop()


def test_at_the_call_cap_the_call_idle_longest_makes_room():
    upstream = FloodingUpstream(count=0)
    p = RunningProxy("http://127.0.0.1:9", spec=make_spec(max_connections=16),
                     grpc_upstream=f"127.0.0.1:{upstream.port}")
    channel = grpc.insecure_channel(p.grpc_address)
    try:
        hogs = [channel.stream_stream(STREAM)(iter([]), metadata=TENANT, timeout=120) for _ in range(16)]
        wait_until(lambda: len(p.grpc._active) == 16, what="16 idle calls held")
        newcomer = channel.stream_stream(STREAM)(iter([]), metadata=TENANT, timeout=120)
        wait_until(lambda: p.value("gateway_grpc_calls_closed_total", reason="cap") == 1,
                   what="the call idle longest closed")
        closed = [h for h in hogs if h.done()]
        assert len(closed) == 1 and closed[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert not newcomer.done()
        for h in hogs + [newcomer]:
            h.cancel()
    finally:
        channel.close()
        p.stop()
        upstream.stop()


def test_an_unreachable_triton_is_unavailable_without_its_address():
    with refused_port() as port:
        p = RunningProxy("http://127.0.0.1:9", grpc_upstream=f"127.0.0.1:{port}")
        try:
            with grpc.insecure_channel(p.grpc_address) as channel:
                with pytest.raises(grpc.RpcError) as raised:
                    service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(),
                                                                                 timeout=20)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
            assert str(port) not in raised.value.details() and "127.0.0.1" not in raised.value.details()
        finally:
            p.stop()


@pytest.mark.parametrize("address", ["user:s3cret@127.0.0.1:8001", "127.0.0.1", "http://triton:8001",
                                     "triton:0", "triton:99999", ":8001"])
def test_grpc_upstream_must_be_host_and_port_without_credentials(address, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("tenants: [acme]\n")
    done = subprocess.run([sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--upstream",
                           "http://127.0.0.1:8000", "--grpc-upstream", address, "--spec", str(spec)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--grpc-upstream" in done.stderr and "s3cret" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
