"""What the gateway's gRPC listener adds to Triton's gRPC streams, against straight to Triton in the same run,
with the same client, against the budget: added time to first response ≤ 1 ms at p50 and ≤ 3 ms at p99 at
--streams concurrent streams (64 by default); saturated responses/s through the gateway ≥ 0.9× direct; the
gateway's CPU per 1,000 forwarded responses printed.

One real Triton (examples/model_repository, the decoupled `toy_llm` streaming one response per token) and
the real `inferwatch exporter gateway --grpc-upstream` process in front of its gRPC port. The client is
grpc.aio in this process, one channel per path, each stream a `ModelStreamInfer` call with one request.

Phases of one run:
1. latency: streams arrive at a steady rate sized for --streams concurrent streams per path (open loop) and
   each arrival goes, in turn, direct or through the gateway, so both see the same machine; TTFT is request
   sent → first response read, by the client; added = percentile(via) − percentile(direct);
2. saturation (--saturate seconds, 0 to skip): --streams closed-loop streams of --saturate-tokens responses
   with no delay, direct, then through the gateway: responses/s of each, and the gateway's CPU (psutil) per
   1,000 responses it forwarded.
--repeat N runs it N times; the final JSON line holds every run, the median of each figure and the verdict.

    .venv/bin/python benchmarks/gateway_grpc.py [--streams 64] [--duration 15] [--saturate 10] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil
from tritonclient.grpc import service_pb2, service_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inferwatch.testing.process import ManagedProcess, free_port  # noqa: E402
from inferwatch.testing.triton import start_triton  # noqa: E402

BUDGET = {"added_ttft_p50_ms": 1.0, "added_ttft_p99_ms": 3.0, "saturated_ratio": 0.9}


def toy_request(tokens: int, first_ms: int, gap_ms: int) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name="toy_llm")
    for name, dtype, raw in (("text_input", "BYTES", (2).to_bytes(4, "little") + b"hi"),
                             ("max_tokens", "INT32", tokens.to_bytes(4, "little")),
                             ("first_token_delay_ms", "INT32", first_ms.to_bytes(4, "little")),
                             ("token_delay_ms", "INT32", gap_ms.to_bytes(4, "little"))):
        tensor = req.inputs.add()
        tensor.name, tensor.datatype = name, dtype
        tensor.shape.append(1)
        req.raw_input_contents.append(raw)
    return req


async def one_stream(stub, request, metadata) -> tuple[float | None, int]:
    """(seconds to the first response or None, responses read) of one ModelStreamInfer call."""
    sent = time.perf_counter()
    first = None
    n = 0
    async for response in stub.ModelStreamInfer(iter([request]), metadata=metadata, timeout=120):
        if response.error_message:
            raise RuntimeError(response.error_message)
        if first is None:
            first = time.perf_counter() - sent
        n += 1
    return first, n


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency_phase(stubs: dict, args) -> dict:
    request = toy_request(args.tokens, args.first_ms, args.gap_ms)
    stream_s = (args.first_ms + (args.tokens - 1) * args.gap_ms) / 1000.0
    interval = stream_s / args.streams / len(stubs)  # steady arrivals: --streams in flight per path
    ttft: dict[str, list[float]] = {name: [] for name in stubs}
    names = list(stubs)
    tasks = []

    async def run(name):
        first, _ = await one_stream(stubs[name], request, args.metadata)
        if first is not None:
            ttft[name].append(first)

    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < args.duration:
        tasks.append(asyncio.ensure_future(run(names[i % len(names)])))
        i += 1
        await asyncio.sleep(max(0.0, start + i * interval - time.perf_counter()))
    await asyncio.gather(*tasks)
    out = {}
    for name, values in ttft.items():
        out[name] = {"streams": len(values), "p50_ms": pct(values, 0.5) * 1000, "p99_ms": pct(values, 0.99) * 1000}
    return out


async def saturation_phase(stub, args, seconds: float) -> int:
    request = toy_request(args.saturate_tokens, 0, 0)
    deadline = time.perf_counter() + seconds
    total = 0

    async def worker():
        nonlocal total
        while time.perf_counter() < deadline:
            total += (await one_stream(stub, request, args.metadata))[1]

    await asyncio.gather(*(worker() for _ in range(args.streams)))
    return total


async def one_run(addresses: dict, gateway_pid: int, args) -> dict:
    channels = {name: grpc.aio.insecure_channel(address) for name, address in addresses.items()}
    stubs = {name: service_pb2_grpc.GRPCInferenceServiceStub(ch) for name, ch in channels.items()}
    try:
        for stub in stubs.values():  # connections and Triton's model warm
            await asyncio.gather(*(one_stream(stub, toy_request(4, 0, 0), args.metadata) for _ in range(32)))
        latency = await latency_phase(stubs, args)
        run = {"latency": latency,
               "added_ttft_p50_ms": latency["gateway"]["p50_ms"] - latency["direct"]["p50_ms"],
               "added_ttft_p99_ms": latency["gateway"]["p99_ms"] - latency["direct"]["p99_ms"]}
        if args.saturate > 0:
            direct = await saturation_phase(stubs["direct"], args, args.saturate)
            gw = psutil.Process(gateway_pid)
            cpu0 = sum(gw.cpu_times()[:2])
            via = await saturation_phase(stubs["gateway"], args, args.saturate)
            cpu = sum(gw.cpu_times()[:2]) - cpu0
            run.update({"saturated_direct_responses_per_s": direct / args.saturate,
                        "saturated_gateway_responses_per_s": via / args.saturate,
                        "saturated_ratio": via / direct if direct else None,
                        "gateway_cpu_ms_per_1k_responses": cpu * 1000 / (via / 1000) if via else None})
        run["load_average_1m"] = os.getloadavg()[0]
        return run
    finally:
        for ch in channels.values():
            await ch.close()


def verdict(figures: dict) -> dict:
    out = {}
    for key, limit in BUDGET.items():
        value = figures.get(key)
        ok = value is not None and (value >= limit if key == "saturated_ratio" else value <= limit)
        out[key] = {"value": value, "limit": limit, "ok": ok}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams per path (default 64)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of the latency phase (default 15)")
    parser.add_argument("--tokens", type=int, default=8, help="responses per stream in the latency phase")
    parser.add_argument("--first-ms", type=int, default=50, help="toy_llm's delay to the first response")
    parser.add_argument("--gap-ms", type=int, default=20, help="toy_llm's delay between responses")
    parser.add_argument("--saturate", type=float, default=10.0, help="seconds per path of saturation (0: skip)")
    parser.add_argument("--saturate-tokens", type=int, default=32, help="responses per saturating stream")
    parser.add_argument("--repeat", type=int, default=1, help="runs (default 1); figures are their medians")
    args = parser.parse_args()
    args.metadata = (("x-tenant-id", "t0"), ("x-service-name", "chat-web"))
    work = Path(tempfile.mkdtemp(prefix="inferwatch-bench-grpc-"))
    triton = start_triton(work / "triton")
    gateway = None
    try:
        (work / "gateway.yaml").write_text(json.dumps({"tenants": ["t0"], "models": ["toy_llm"],
                                                       "tiers": {"realtime": {"services": ["chat-web"]}}}))
        port, http_port, metrics_port = free_port(), free_port(), free_port()
        gateway = ManagedProcess("gateway", [
            sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--upstream", triton.url,
            "--port", str(http_port), "--metrics-port", str(metrics_port), "--spec", str(work / "gateway.yaml"),
            "--grpc-upstream", f"127.0.0.1:{triton.grpc_port}", "--grpc-port", str(port)],
            work / "gateway.log", ready=lambda: _live(f"127.0.0.1:{port}"))
        gateway.start(timeout=60)
        addresses = {"direct": f"127.0.0.1:{triton.grpc_port}", "gateway": f"127.0.0.1:{port}"}
        runs = []
        for i in range(args.repeat):
            runs.append(asyncio.run(one_run(addresses, gateway.proc.pid, args)))
            print(json.dumps({"run": i + 1, **runs[-1]}), file=sys.stderr)
        keys = ("added_ttft_p50_ms", "added_ttft_p99_ms", "saturated_ratio", "gateway_cpu_ms_per_1k_responses",
                "saturated_direct_responses_per_s", "saturated_gateway_responses_per_s")
        medians = {k: statistics.median([r[k] for r in runs if r.get(k) is not None])
                   for k in keys if any(r.get(k) is not None for r in runs)}
        checks = verdict(medians)
        print(json.dumps({"streams": args.streams, **medians, "budget": checks,
                          "within_budget": all(c["ok"] for c in checks.values()), "runs": runs}))
        return 0
    finally:
        if gateway is not None:
            gateway.stop()
        triton.stop()


def _live(address: str) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            return service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(
                service_pb2.ServerLiveRequest(), timeout=2).live
    except grpc.RpcError:
        return False


if __name__ == "__main__":
    sys.exit(main())
