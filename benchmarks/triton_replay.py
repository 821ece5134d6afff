"""A replay of Triton's HTTP API for N models, built from answers captured from the real Triton
(benchmarks/data/triton_capture.json, written by triton_capture.py).

Used where the real Triton cannot go: the benchmark's 100 and 500 models (one CPU box cannot load 500
Python-backend models), and fault injection the real server cannot produce on demand (one model whose
config call hangs or fails, a repository index of hundreds of megabytes). Models are `model_0000` ... with
the captured classifier's config and stats.

Run: `python benchmarks/triton_replay.py --models 500 --port 18000 [--slow model_0003 --failing model_0007]
[--index-bytes N] [--stats-bytes N]` (serves the API and /metrics on the same port). `--index-bytes` streams
an index of about N bytes (chunked, no Content-Length); `--stats-bytes` announces a statistics answer of N
bytes and streams it. `GET /replay/requests` answers the number of API requests served so far.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web

CAPTURE = Path(__file__).parent / "data" / "triton_capture.json"


def model_names(n: int) -> list[str]:
    return [f"model_{i:04d}" for i in range(n)]


def build_app(models: int, slow: set[str] = frozenset(), failing: set[str] = frozenset(),
              slow_seconds: float = 30.0, capture: Path = CAPTURE, index_bytes: int = 0,
              stats_bytes: int = 0) -> web.Application:
    cap = json.loads(capture.read_text())
    names = model_names(models)
    index = json.dumps([dict(cap["index_entry"], name=n) for n in names]).encode()
    stats = json.dumps({"model_stats": [dict(cap["model_stat"], name=n) for n in names]}).encode()
    configs = {n: json.dumps(dict(cap["config"], name=n)).encode() for n in names}
    metrics = "\n".join(cap["metrics_header"] + [line.replace('model="classifier"', f'model="{n}"')
                                                 for n in names for line in cap["metrics_model_lines"]]) + "\n"

    served = {"requests": 0}

    @web.middleware
    async def count(request, handler):
        if not request.path.startswith("/replay/"):
            served["requests"] += 1
        return await handler(request)

    async def ok(_request):
        return web.Response(status=200)

    async def huge(request, size: int, announce: bool):
        """Exactly `size` bytes of a JSON list of index entries, written chunk by chunk (never held whole)."""
        entry = json.dumps(dict(cap["index_entry"], name="m" * 40)).encode()
        chunk = (entry + b",") * (65536 // (len(entry) + 1))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if announce:
            resp.content_length = size
        await resp.prepare(request)
        await resp.write(b"[")
        written = 1
        while written + len(chunk) + len(entry) + 1 <= size:
            await resp.write(chunk)
            written += len(chunk)
        await resp.write(entry + b"]" + b" " * (size - written - len(entry) - 1))  # whitespace pads to size
        return resp

    async def repo_index(request):
        if index_bytes:
            return await huge(request, index_bytes, announce=False)
        return web.Response(body=index, content_type="application/json")

    async def all_stats(request):
        if stats_bytes:
            return await huge(request, stats_bytes, announce=True)
        return web.Response(body=stats, content_type="application/json")

    async def requests_served(_request):
        return web.json_response(served)

    async def config(request):
        name = request.match_info["name"]
        if name in slow:
            await asyncio.sleep(slow_seconds)
        if name in failing:
            return web.json_response({"error": f"injected failure for '{name}'"}, status=500)
        if name not in configs:
            return web.json_response({"error": f"Request for unknown model: '{name}' is not found"}, status=404)
        return web.Response(body=configs[name], content_type="application/json")

    async def prom(_request):
        return web.Response(text=metrics, content_type="text/plain")

    app = web.Application(middlewares=[count])
    app.add_routes([web.get("/v2/health/live", ok), web.get("/v2/health/ready", ok),
                    web.post("/v2/repository/index", repo_index), web.get("/v2/models/stats", all_stats),
                    web.get("/v2/models/{name}/config", config), web.get("/metrics", prom),
                    web.get("/replay/requests", requests_served)])
    return app


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--slow", action="append", default=[], help="model whose config call hangs")
    p.add_argument("--failing", action="append", default=[], help="model whose config call answers 500")
    p.add_argument("--index-bytes", type=int, default=0, help="stream a repository index of about N bytes")
    p.add_argument("--stats-bytes", type=int, default=0, help="announce and stream a statistics answer of N bytes")
    p.add_argument("--capture", type=Path, default=CAPTURE, help="captured answers to replay (default: %(default)s)")
    args = p.parse_args()
    web.run_app(build_app(args.models, set(args.slow), set(args.failing), index_bytes=args.index_bytes,
                          stats_bytes=args.stats_bytes, capture=args.capture), host="127.0.0.1", port=args.port,
                print=None, access_log=None, shutdown_timeout=0.5)  # do not wait for hung handlers
    return 0


if __name__ == "__main__":
    sys.exit(main())
