"""What the gateway's gRPC listener adds to Triton's gRPC streams, against straight to Triton in the same run,
with the same client, against the budget: added time to first response ≤ 1 ms at p50 and ≤ 3 ms at p99 at
--streams concurrent streams (64 by default); saturated responses/s through the gateway ≥ 0.9× direct; the
gateway's CPU per 1,000 forwarded responses printed.

One real Triton (examples/model_repository, the decoupled `toy_llm` streaming one response per token) and
the real `inferwatch exporter gateway --grpc-upstream` process in front of its gRPC port. The client is
grpc.aio in this process, one channel per path, each stream a `ModelStreamInfer` call with one request.

The two paths are measured in alternating slices (A/B/B/A/A/B ..., --rounds rounds of one slice per path),
so a busy machine weighs on both: a load that comes and goes during the run lands on direct and gateway
slices alike, and each round's figures compare slices seconds apart. Per slice, --streams closed-loop
streams (each starts the next as soon as one ends, so the machine is never offered more than it can serve
and a slow moment does not pile up a queue that later slices inherit):
1. latency (--slice seconds): toy_llm streams of --tokens responses (--first-ms, then --gap-ms apart); TTFT is
   request sent → first response read, by the client; added = percentile(gateway) − percentile(direct) of the
   same round;
2. saturation (--saturate seconds, 0 to skip): streams of --saturate-tokens responses with no delay:
   responses/s of each path, their ratio, and the gateway's CPU (psutil, user + system) per 1,000 responses
   it forwarded.
With --unmetered a second gateway process whose spec meters no model (`gateway.llm_models` naming none of
the served ones) is a third path: what forwarding alone costs, next to forwarding and metering.
Progress goes to stderr, one line per slice. The final JSON line (stdout) holds each round, the median and
min/max over rounds of each figure, the p99 of all rounds' samples pooled, the load average before and after,
and the budget verdict (on the medians over rounds).

    .venv/bin/python benchmarks/gateway_grpc.py [--streams 64] [--rounds 5] [--slice 4] [--saturate 4]
                                                [--unmetered]
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
GATEWAYS = ("gateway", "unmetered")  # the paths through a gateway process (unmetered: with --unmetered)


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


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile of `values` (nearest rank), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def closed_loop(stub, request, metadata, streams: int, seconds: float) -> tuple[list[float], int, float]:
    """`streams` workers running `request` streams back to back for `seconds`: (TTFTs of the streams that
    started in the slice, responses read, wall seconds until the last stream ended)."""
    deadline = time.perf_counter() + seconds
    ttfts: list[float] = []
    counts: list[int] = []  # per stream, appended after the await (a `+=` across an await loses updates)

    async def worker():
        while time.perf_counter() < deadline:
            first, n = await one_stream(stub, request, metadata)
            counts.append(n)
            if first is not None:
                ttfts.append(first)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    return ttfts, sum(counts), time.perf_counter() - start


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def one_slice(kind: str, path: str, stub, gateway: psutil.Process | None, args) -> dict:
    if kind == "latency":
        request, seconds = toy_request(args.tokens, args.first_ms, args.gap_ms), args.slice
    else:
        request, seconds = toy_request(args.saturate_tokens, 0, 0), args.saturate
    cpu0 = cpu_seconds(gateway) if gateway is not None else 0.0
    ttfts, responses, wall = await closed_loop(stub, request, args.metadata, args.streams, seconds)
    cpu = cpu_seconds(gateway) - cpu0 if gateway is not None else 0.0
    out = {"streams_run": len(ttfts), "responses": responses, "responses_per_s": responses / wall,
           "ttft_p50_ms": _ms(pct(ttfts, 0.5)), "ttft_p99_ms": _ms(pct(ttfts, 0.99)), "ttfts": ttfts}
    if gateway is not None and responses:
        out["gateway_cpu_ms_per_1k_responses"] = cpu * 1000 / (responses / 1000)
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def round_figures(latency: dict, saturation: dict | None) -> dict:
    d, g = latency["direct"], latency["gateway"]
    out = {"added_ttft_p50_ms": g["ttft_p50_ms"] - d["ttft_p50_ms"],
           "added_ttft_p99_ms": g["ttft_p99_ms"] - d["ttft_p99_ms"],
           "ttft_p50_ratio": g["ttft_p50_ms"] / d["ttft_p50_ms"],
           "direct_ttft_p50_ms": d["ttft_p50_ms"], "direct_ttft_p99_ms": d["ttft_p99_ms"],
           "latency_gateway_cpu_ms_per_1k_responses": g.get("gateway_cpu_ms_per_1k_responses")}
    if saturation is not None:
        sd, sg = saturation["direct"], saturation["gateway"]
        out.update({"saturated_direct_responses_per_s": sd["responses_per_s"],
                    "saturated_gateway_responses_per_s": sg["responses_per_s"],
                    "saturated_ratio": sg["responses_per_s"] / sd["responses_per_s"] if sd["responses_per_s"] else None,
                    "gateway_cpu_ms_per_1k_responses": sg.get("gateway_cpu_ms_per_1k_responses")})
        su = saturation.get("unmetered")
        if su is not None:
            out.update({"unmetered_saturated_ratio": su["responses_per_s"] / sd["responses_per_s"]
                        if sd["responses_per_s"] else None,
                        "unmetered_gateway_cpu_ms_per_1k_responses": su.get("gateway_cpu_ms_per_1k_responses")})
    u = latency.get("unmetered")
    if u is not None:
        out.update({"unmetered_added_ttft_p50_ms": u["ttft_p50_ms"] - d["ttft_p50_ms"],
                    "unmetered_latency_gateway_cpu_ms_per_1k_responses": u.get("gateway_cpu_ms_per_1k_responses")})
    return out


async def measure(addresses: dict, pids: dict[str, int], args) -> dict:
    """`addresses`: path → gRPC address; `pids`: path → the gateway process behind it (direct: none)."""
    channels = {name: grpc.aio.insecure_channel(address) for name, address in addresses.items()}
    stubs = {name: service_pb2_grpc.GRPCInferenceServiceStub(ch) for name, ch in channels.items()}
    processes = {name: psutil.Process(pid) for name, pid in pids.items()}
    paths = list(addresses)
    rounds: list[dict] = []
    pooled: dict[str, list[float]] = {path: [] for path in paths}
    try:
        for stub in stubs.values():  # connections and Triton's model warm
            await asyncio.gather(*(one_stream(stub, toy_request(4, 0, 0), args.metadata) for _ in range(32)))
        for r in range(args.rounds):
            order = paths if r % 2 == 0 else paths[::-1]  # A B, B A, ...: neither path always goes first
            kinds = ("latency", "saturation") if args.saturate > 0 else ("latency",)
            slices: dict[str, dict] = {kind: {} for kind in kinds}
            for kind in kinds:
                for path in order:
                    s = slices[kind][path] = await one_slice(kind, path, stubs[path], processes.get(path), args)
                    if kind == "latency":
                        pooled[path].extend(s.pop("ttfts"))
                    else:
                        s.pop("ttfts")
                    print(json.dumps({"round": r + 1, "slice": kind, "path": path, **_rounded(s),
                                      "load_average_1m": os.getloadavg()[0]}), file=sys.stderr, flush=True)
            rounds.append({**round_figures(slices["latency"], slices.get("saturation")), "slices": slices})
            print(json.dumps({"round": r + 1, **_rounded({k: v for k, v in rounds[-1].items() if k != "slices"})}),
                  file=sys.stderr, flush=True)
        return {"rounds": rounds,
                "pooled_ttft_p99_ms": {path: _ms(pct(pooled[path], 0.99)) for path in paths},
                "pooled_added_ttft_p99_ms": _ms(pct(pooled["gateway"], 0.99) - pct(pooled["direct"], 0.99))}
    finally:
        for ch in channels.values():
            await ch.close()


def summary(rounds: list[dict]) -> dict:
    """Median, min and max over rounds of each figure."""
    out = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def verdict(medians: dict) -> dict:
    out = {}
    for key, limit in BUDGET.items():
        value = medians.get(key)
        ok = value is not None and (value >= limit if key == "saturated_ratio" else value <= limit)
        out[key] = {"value": value, "limit": limit, "ok": ok}
    return out


def _rounded(d: dict) -> dict:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams per slice (default 64)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of one slice per path (default 5)")
    parser.add_argument("--slice", type=float, default=4.0, help="seconds of each latency slice (default 4)")
    parser.add_argument("--tokens", type=int, default=8, help="responses per stream in the latency slices")
    parser.add_argument("--first-ms", type=int, default=50, help="toy_llm's delay to the first response")
    parser.add_argument("--gap-ms", type=int, default=20, help="toy_llm's delay between responses")
    parser.add_argument("--saturate", type=float, default=4.0, help="seconds of each saturation slice (0: skip)")
    parser.add_argument("--saturate-tokens", type=int, default=32, help="responses per saturating stream")
    parser.add_argument("--unmetered", action="store_true",
                        help="also a gateway metering nothing: the cost of forwarding alone")
    args = parser.parse_args()
    args.metadata = (("x-tenant-id", "t0"), ("x-service-name", "chat-web"))
    work = Path(tempfile.mkdtemp(prefix="inferwatch-bench-grpc-"))
    triton = start_triton(work / "triton")
    gateways: dict[str, ManagedProcess] = {}
    try:
        base = {"tenants": ["t0"], "models": ["toy_llm"], "tiers": {"realtime": {"services": ["chat-web"]}}}
        addresses = {"direct": f"127.0.0.1:{triton.grpc_port}"}
        for name in GATEWAYS[:2 if args.unmetered else 1]:
            spec = {**base, "gateway": {"llm_models": ["no-served-model"]}} if name == "unmetered" else base
            (work / f"{name}.yaml").write_text(json.dumps(spec))
            port, http_port, metrics_port = free_port(), free_port(), free_port()
            gateways[name] = ManagedProcess(name, [
                sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--upstream", triton.url,
                "--port", str(http_port), "--metrics-port", str(metrics_port), "--spec", str(work / f"{name}.yaml"),
                "--grpc-upstream", f"127.0.0.1:{triton.grpc_port}", "--grpc-port", str(port)],
                work / f"{name}.log", ready=lambda port=port: _live(f"127.0.0.1:{port}"))
            gateways[name].start(timeout=60)
            addresses[name] = f"127.0.0.1:{port}"
        load_before = os.getloadavg()[0]
        result = asyncio.run(measure(addresses, {n: g.proc.pid for n, g in gateways.items()}, args))
        figures = summary(result["rounds"])
        checks = verdict({k: v["median"] for k, v in figures.items()})
        print(json.dumps({"streams": args.streams, "rounds": args.rounds,
                          **{k: v["median"] for k, v in figures.items()}, "over_rounds": figures,
                          "pooled_ttft_p99_ms": result["pooled_ttft_p99_ms"],
                          "pooled_added_ttft_p99_ms": result["pooled_added_ttft_p99_ms"],
                          "load_average_1m": [load_before, os.getloadavg()[0]], "budget": checks,
                          "within_budget": all(c["ok"] for c in checks.values()), "per_round": result["rounds"]}))
        return 0
    finally:
        for gateway in gateways.values():
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
