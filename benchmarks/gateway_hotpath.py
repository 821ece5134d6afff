"""Where the gateway's time per event and per request goes, measured apart from the machine's other load.

1. In process, no sockets: one upstream connection of the lean client (exporters/gateway/upstream.py) fed a
   32-event chunked Triton stream read by read, relayed to a transport that drops the bytes, with metering
   (the gateway's hot path) and without (the relay alone). CPU time per event (time.process_time), the
   median of --rounds rounds. The difference is what metering costs per event.
2. Server round trip: sequential requests (one at a time, keep-alive) to a trivial handler, each server in its
   own process on uvloop: the gateway's own server (exporters/gateway/httpserver.py, httptools), aiohttp's
   server (what the gateway used before), uvicorn with httptools and a raw ASGI app (when uvicorn is
   importable; it is not a dependency: `pip install uvicorn` to include it) and a bare protocol that answers
   the same bytes without parsing; p50 and minimum microseconds per round trip, and the server's CPU per
   request (from /proc). What the server side adds to every request's path, the TTFT path included.
Prints a final JSON line.

    .venv/bin/python benchmarks/gateway_hotpath.py [--requests 2000] [--round-trips 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inferwatch.testing.process import ManagedProcess, free_port  # noqa: E402

EVENTS = [b'data: {"model_name":"toy_llm","model_version":"1","output_token_count":%d,"text_output":"tok "}\n\n'
          % (i + 1) for i in range(32)]
ANSWER = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"


class _Sink:
    """A client transport that takes every write and is never full."""

    def write(self, data):
        pass

    def writelines(self, parts):
        pass

    def is_closing(self):
        return False

    def get_write_buffer_size(self):
        return 0

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def close(self):
        pass


async def hot_path(requests: int, rounds: int) -> dict:
    from inferwatch.exporters.gateway import Gateway
    from inferwatch.exporters.gateway.proxy import _Relay
    from inferwatch.exporters.gateway.upstream import Connection, Pool
    from inferwatch.spec import spec_from_dict

    gateway = Gateway(spec_from_dict({"tenants": ["t0"], "models": ["toy_llm"]}))
    pool = Pool("http://127.0.0.1:9", 5)
    reads = [b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS]
    headers = {"x-tenant-id": "t0"}

    def one(metered: bool) -> None:
        conn = Connection(pool)
        conn.connection_made(_Sink())
        ex = gateway.exchange("POST", "/v2/models/toy_llm/generate_stream", headers, b"{}")
        resp = conn.send(b"POST / HTTP/1.1\r\n\r\n", b"")
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        ex.response_start(200, "text/event-stream")
        resp.relay(_Relay(conn.transport, True, ex.chunk if metered else None, resp).write)
        for data in reads:
            conn.data_received(data)
        conn.data_received(b"0\r\n\r\n")
        ex.finish()

    out = {}
    for metered in (False, True):
        for _ in range(200):
            one(metered)
        per_event = []
        for _ in range(rounds):
            t0 = time.process_time()
            for _ in range(requests):
                one(metered)
            per_event.append((time.process_time() - t0) / requests / len(EVENTS) * 1e6)
        out["metered" if metered else "relay_only"] = round(statistics.median(per_event), 2)
    return out


def serve(kind: str, port: int) -> None:
    import uvloop

    if kind == "aiohttp":
        from aiohttp import web

        async def handler(request):
            await request.read()
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(b"x")
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        uvloop.install()
        web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handler_cancellation=True)
        return
    if kind == "uvicorn":
        import uvicorn

        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            more = True
            while more:
                more = (await receive()).get("more_body", False)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", lifespan="off",
                    access_log=False, log_level="warning")
        return
    if kind == "gateway":
        from inferwatch.exporters.gateway.bounds import ConnectionBounds
        from inferwatch.exporters.gateway.httpserver import HttpServer

        def handler(request, conn):
            conn.start(200, None, [], None)
            conn.write(b"x")
            conn.end()

        async def main():
            bounds = ConnectionBounds(max_connections=4096, header_timeout_s=10, body_timeout_s=60, idle_timeout_s=75)
            await HttpServer(handler, max_body_bytes=1 << 20, bounds=bounds).start("127.0.0.1", port)
            await asyncio.Event().wait()

        uvloop.run(main())
        return

    class Answer(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            self.transport.write(ANSWER)

    async def main():
        server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_trips(port: int, count: int) -> tuple[float, float]:
    request = b"POST /v2/models/toy_llm/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            s.sendall(request)
            buf = b""
            while not buf.endswith(b"0\r\n\r\n"):
                buf += s.recv(65536)
            times.append((time.perf_counter() - t0) * 1e6)
            time.sleep(0.002)
    times.sort()
    return round(times[len(times) // 2]), round(times[0])


def tcp_ok(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="32-event streams per round (default 2000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default 5)")
    ap.add_argument("--round-trips", type=int, default=1000, help="sequential requests per server (default 1000)")
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return 0
    load0 = os.getloadavg()[0]
    hot = asyncio.run(hot_path(args.requests, args.rounds))
    print(f"per event, in process: relay {hot['relay_only']} us, relay + metering {hot['metered']} us",
          file=sys.stderr)
    servers = {}
    kinds = ["gateway", "aiohttp", "uvicorn", "protocol"]
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        kinds.remove("uvicorn")
    for kind in kinds:
        port = free_port()
        proc = ManagedProcess(kind, [sys.executable, __file__, "--serve", kind, str(port)],
                              Path(os.devnull), ready=lambda port=port: tcp_ok(port))
        proc.start(timeout=30)
        try:
            round_trips(port, 50)  # warm-up
            cpu0 = cpu_seconds(proc.proc.pid)
            p50, low = round_trips(port, args.round_trips)
            cpu = (cpu_seconds(proc.proc.pid) - cpu0) / args.round_trips * 1e6
            servers[kind] = {"p50_us": p50, "min_us": low, "cpu_us_per_request": round(cpu)}
        finally:
            proc.stop()
        print(f"round trip, {kind:8s}: p50 {p50} us, min {low} us, server CPU {servers[kind]['cpu_us_per_request']} "
              f"us per request", file=sys.stderr)
    print(json.dumps({
        "relay_us_per_event": hot["relay_only"], "relay_and_metering_us_per_event": hot["metered"],
        "metering_us_per_event": round(hot["metered"] - hot["relay_only"], 2),
        "round_trips": servers, "uvicorn_skipped": None if "uvicorn" in servers else "uvicorn not importable",
        "load_average_1m_before": round(load0, 2), "load_average_1m_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
