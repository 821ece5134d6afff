"""What the gateway proxy adds to a stream, next to nginx (proxy_buffering off) in the same run.

One fast local SSE upstream (Triton generate_stream format with `output_token_count`, in its own process)
isolates proxy cost. Streams arrive at a steady rate (open loop, not one burst) and each arrival goes, in
turn, direct / through the gateway (real `inferwatch exporter gateway` process) / through nginx, so all
three see the same machine conditions. TTFT is measured by the client: request sent → first event read.

Phases: (1) latency — steady arrivals sized for about --streams concurrent streams per path; added TTFT =
percentile(via) − percentile(direct); throughput ratio = tokens/s delivered through the gateway ÷ direct
at that load. (2) saturation (--saturate seconds, 0 to skip) — --streams closed-loop streams with no token
delay, direct then gateway: tokens/s ratio when the upstream runs flat out on the same cores.
Gateway CPU = its process CPU time (/proc) ÷ events it forwarded.

The latency phase runs twice: quiet, then with the gateway's /metrics scraped every --scrape-interval
seconds (as Prometheus would), to show whether rendering /metrics moves TTFT. The gateway declares
--tenants tenants and a warm-up sends one stream per tenant first, so /metrics holds that many series sets
(a production-sized page, not a one-series toy). A last, in-process phase serves a registry of the same
size and measures, per scrape, the CPU time the serving loop's thread spends and the longest stall of that
loop (a 1 ms sleeper's lateness), with /metrics rendered in a forked child (what the gateway does) against
rendered in place: figures that the machine's other load disturbs far less than end-to-end TTFT (the CPU
figure least). Prints a final JSON line.

    .venv/bin/python benchmarks/gateway_overhead.py [--streams 64] [--duration 20] [--tokens 32] [--tenants 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inferwatch.testing.process import ManagedProcess, free_port, http_ok  # noqa: E402

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  upstream up {{ server 127.0.0.1:{up}; keepalive 512; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
    location = /nginx-ready {{ return 200 "ok"; }}
  }}
}}
"""


# ------------------------------------------------------------------------------------------- upstream
async def _upstream_handler(request: web.Request) -> web.StreamResponse:
    knobs = await request.json()
    n, first, gap = int(knobs["max_tokens"]), knobs["first_token_delay_ms"] / 1000, knobs["token_delay_ms"] / 1000
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    await asyncio.sleep(first)
    for i in range(n):
        if i and gap:
            await asyncio.sleep(gap)
        await resp.write(b'data: {"model_name":"toy_llm","model_version":"1","output_token_count":%d,'
                         b'"text_output":"tok "}\n\n' % (i + 1))
    await resp.write_eof()
    return resp


def serve_upstream(port: int) -> None:
    _use_uvloop()
    app = web.Application()
    app.router.add_post("/v2/models/{model}/generate_stream", _upstream_handler)
    app.router.add_get("/ready", lambda _r: web.Response(text="ok"))
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def _use_uvloop() -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass


# ---------------------------------------------------------------------------------------------- client
async def one_stream(session, url, body, out, tenant="t0"):
    t0 = time.perf_counter()
    first = None
    events = 0
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json",
                                                         "X-Tenant-ID": tenant}) as resp:
            async for chunk in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter()
                events += chunk.count(b"data:")
            ok = resp.status == 200
    except aiohttp.ClientError:
        ok = False
    end = time.perf_counter()
    out.append((ok, (first - t0) if first else None, events, t0, end))


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scraper(url, interval, out, stop):
    """GET /metrics every `interval` seconds until `stop` is set; (seconds, bytes) per scrape into `out`."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with session.get(url, headers={"Accept-Encoding": "gzip"}) as resp:
                size = len(await resp.read())
            out.append((time.perf_counter() - t0, size))
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass


async def warm_up(url, tenants):
    """One short stream per tenant, so the gateway's /metrics holds every tenant's series."""
    body = json.dumps({"text_input": "x", "max_tokens": 2, "first_token_delay_ms": 0, "token_delay_ms": 0}).encode()
    async with aiohttp.ClientSession() as session:
        out = []
        await asyncio.gather(*(one_stream(session, url, body, out, f"t{i}") for i in range(tenants)))


async def latency_phase(urls, args, metrics_url=None):
    body = json.dumps({"text_input": "x", "max_tokens": args.tokens, "first_token_delay_ms": args.first_ms,
                       "token_delay_ms": args.gap_ms}).encode()
    stream_s = (args.first_ms + args.gap_ms * (args.tokens - 1)) / 1000
    rate = args.streams / stream_s  # arrivals per second per path → about --streams concurrent per path
    results = {name: [] for name in urls}
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) for name in urls}
    names = list(urls)
    interval = 1.0 / (rate * len(names))
    tasks = []
    scrapes: list = []
    stop = asyncio.Event()
    scraping = asyncio.create_task(scraper(metrics_url, args.scrape_interval, scrapes, stop)) if metrics_url else None
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < args.duration:
        name = names[i % len(names)]
        tenant = f"t{(i // len(names)) % args.tenants}"
        tasks.append(asyncio.create_task(one_stream(sessions[name], urls[name], body, results[name], tenant)))
        i += 1
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.gather(*tasks)
    stop.set()
    if scraping is not None:
        await scraping
    for s in sessions.values():
        await s.close()
    return results, rate, scrapes


async def saturation_phase(url, args):
    body = json.dumps({"text_input": "x", "max_tokens": 256, "first_token_delay_ms": 0,
                       "token_delay_ms": 0}).encode()
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        stop = time.perf_counter() + args.saturate

        async def worker():
            while time.perf_counter() < stop:
                await one_stream(session, url, body, out)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.streams)))
        elapsed = time.perf_counter() - t0
    return sum(r[2] for r in out) / elapsed


async def _render_cost(registry, forked: bool, scrapes: int = 8) -> tuple[float, float]:
    """(longest lateness of a 1 ms sleeper on the serving loop, CPU time of the loop's thread per scrape), in
    ms, while /metrics is scraped `scrapes` times from another thread. The CPU figure is what the serving
    loop itself spends per scrape, which other load on the machine barely changes; the lateness also
    holds the machine's scheduling delays."""
    import requests

    from inferwatch.exporters.gateway.exposition import metrics_handler

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(registry, forked=forked))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    loop = asyncio.get_running_loop()

    def scrape():
        requests.get(url, headers={"Accept-Encoding": "gzip"}, timeout=30).content

    await loop.run_in_executor(None, scrape)  # warm-up (first fork, first render)
    cpu0 = time.thread_time()
    for _ in range(scrapes):
        await loop.run_in_executor(None, scrape)
    cpu = (time.thread_time() - cpu0) / scrapes
    worst = 0.0
    stop = asyncio.Event()

    async def sleeper():
        nonlocal worst
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - t0 - 0.001)

    probe = asyncio.create_task(sleeper())
    for _ in range(scrapes):
        await loop.run_in_executor(None, scrape)
        await asyncio.sleep(0.1)
    stop.set()
    await probe
    await runner.cleanup()
    return round(worst * 1000, 1), round(cpu * 1000, 1)


def render_costs(tenants: int) -> dict:
    """Per way of rendering (in_place, forked): (worst loop stall ms, loop CPU ms per scrape) for a registry
    with `tenants` series sets."""
    from inferwatch.exporters.gateway import Gateway
    from inferwatch.spec import spec_from_dict

    gateway = Gateway(spec_from_dict({"tenants": [f"t{i}" for i in range(tenants)], "models": ["toy_llm"]}))
    for i in range(tenants):
        with gateway.request(tenant=f"t{i}", model="toy_llm") as req:
            req.tokens(1)
            req.tokens(2)
            req.usage(output_tokens=3, input_tokens=2)
    return {("forked" if forked else "in_place"): asyncio.run(_render_cost(gateway.metrics.registry, forked))
            for forked in (False, True)}


def summarise(results, phase: str) -> dict:
    summary = {}
    for name, rows in results.items():
        ttfts = [r[1] * 1000 for r in rows if r[0] and r[1] is not None]
        tokens = sum(r[2] for r in rows)
        span = max(r[4] for r in rows) - min(r[3] for r in rows)
        summary[name] = {"streams": len(rows), "failed": sum(1 for r in rows if not r[0]),
                         "ttft_p50_ms": pct(ttfts, 0.5), "ttft_p99_ms": pct(ttfts, 0.99),
                         "tokens": tokens, "tokens_per_s": tokens / span}
        print(f"{phase:8s} {name:8s} streams={len(rows)} failed={summary[name]['failed']} "
              f"ttft p50={summary[name]['ttft_p50_ms']:.2f} ms p99={summary[name]['ttft_p99_ms']:.2f} ms "
              f"tokens/s={summary[name]['tokens_per_s']:.0f}", file=sys.stderr)
    return summary


def added(summary: dict, name: str, key: str) -> float:
    return round(summary[name][key] - summary["direct"][key], 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64, help="concurrent streams per path (default 64)")
    ap.add_argument("--duration", type=float, default=20.0, help="latency phase seconds (default 20)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per stream (default 32)")
    ap.add_argument("--first-ms", type=float, default=20.0, help="upstream first-token delay (default 20)")
    ap.add_argument("--gap-ms", type=float, default=20.0, help="upstream inter-token delay (default 20)")
    ap.add_argument("--saturate", type=float, default=5.0, help="saturation phase seconds per path (0: skip)")
    ap.add_argument("--tenants", type=int, default=50, help="tenants the gateway declares and the load rotates "
                                                             "through: /metrics size (default 50)")
    ap.add_argument("--scrape-interval", type=float, default=1.0,
                    help="seconds between /metrics scrapes in the scraped latency phase (default 1)")
    ap.add_argument("--gateway-loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="event loop of the gateway process (default uvloop when installed)")
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        print("nginx not found: apt-get install nginx", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    up_port, gw_port, gw_metrics, ng_port = free_port(), free_port(), free_port(), free_port()
    for sub in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
        (work / sub).mkdir()
    (work / "nginx.conf").write_text(NGINX_CONF.format(d=work, up=up_port, port=ng_port))
    (work / "gateway.yaml").write_text(json.dumps({"tenants": [f"t{i}" for i in range(args.tenants)],
                                                   "models": ["toy_llm"]}))
    env = dict(os.environ, INFERWATCH_GATEWAY_LOOP=args.gateway_loop)
    procs = [
        ManagedProcess("upstream", [sys.executable, __file__, "--serve-upstream", str(up_port)], work / "up.log",
                       ready=lambda: http_ok(f"http://127.0.0.1:{up_port}/ready")),
        ManagedProcess("gateway", [sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--upstream",
                                   f"http://127.0.0.1:{up_port}", "--port", str(gw_port), "--metrics-port",
                                   str(gw_metrics), "--spec", str(work / "gateway.yaml")], work / "gw.log", env=env,
                       cwd=str(REPO),
                       ready=lambda: http_ok(f"http://127.0.0.1:{gw_metrics}/metrics")),
        ManagedProcess("nginx", [nginx, "-p", str(work), "-c", str(work / "nginx.conf"), "-e", str(work / "error.log")],
                       work / "nginx.log", ready=lambda: http_ok(f"http://127.0.0.1:{ng_port}/nginx-ready")),
    ]
    try:
        for p in procs:
            p.start(timeout=30)
        gw_pid = procs[1].proc.pid
        path = "/v2/models/toy_llm/generate_stream"
        urls = {"direct": f"http://127.0.0.1:{up_port}{path}", "gateway": f"http://127.0.0.1:{gw_port}{path}",
                "nginx": f"http://127.0.0.1:{ng_port}{path}"}
        _use_uvloop()
        asyncio.run(warm_up(urls["gateway"], args.tenants))
        metrics_url = f"http://127.0.0.1:{gw_metrics}/metrics"
        cpu0 = cpu_seconds(gw_pid)
        results, rate, _ = asyncio.run(latency_phase(urls, args))
        cpu_latency = cpu_seconds(gw_pid) - cpu0
        summary = summarise(results, "quiet")
        scraped_results, _, scrapes = asyncio.run(latency_phase(urls, args, metrics_url))
        scraped = summarise(scraped_results, "scraped")
        gw_events = summary["gateway"]["tokens"]
        figures = {
            "added_ttft_p50_ms": added(summary, "gateway", "ttft_p50_ms"),
            "added_ttft_p99_ms": added(summary, "gateway", "ttft_p99_ms"),
            "scraped_added_ttft_p50_ms": added(scraped, "gateway", "ttft_p50_ms"),
            "scraped_added_ttft_p99_ms": added(scraped, "gateway", "ttft_p99_ms"),
            "nginx_added_ttft_p50_ms": added(summary, "nginx", "ttft_p50_ms"),
            "nginx_added_ttft_p99_ms": added(summary, "nginx", "ttft_p99_ms"),
            "scraped_nginx_added_ttft_p99_ms": added(scraped, "nginx", "ttft_p99_ms"),
            "throughput_ratio": round(summary["gateway"]["tokens_per_s"] / summary["direct"]["tokens_per_s"], 3),
            "proxy_cpu_ms_per_1k_events": round(cpu_latency * 1000 / max(gw_events, 1) * 1000, 1),
            "scrapes": len(scrapes),
            "scrape_p50_ms": round(pct([s[0] * 1000 for s in scrapes], 0.5), 2),
            "scrape_max_ms": round(max((s[0] * 1000 for s in scrapes), default=float("nan")), 2),
            "metrics_bytes": scrapes[-1][1] if scrapes else None,
        }
        extra = {"arrivals_per_s_per_path": round(rate, 1), "streams_per_path": args.streams,
                 "tenants": args.tenants, "gateway_loop": args.gateway_loop, "cpus": os.cpu_count()}
        costs = render_costs(args.tenants)
        print(f"/metrics per scrape, serving loop: in place stall {costs['in_place'][0]} ms, CPU "
              f"{costs['in_place'][1]} ms; forked stall {costs['forked'][0]} ms, CPU {costs['forked'][1]} ms",
              file=sys.stderr)
        figures["metrics_loop_stall_in_place_ms"], figures["metrics_loop_cpu_in_place_ms"] = costs["in_place"]
        figures["metrics_loop_stall_forked_ms"], figures["metrics_loop_cpu_forked_ms"] = costs["forked"]
        if args.saturate > 0:
            direct = asyncio.run(saturation_phase(urls["direct"], args))
            via = asyncio.run(saturation_phase(urls["gateway"], args))
            print(f"saturation tokens/s direct={direct:.0f} gateway={via:.0f}", file=sys.stderr)
            extra["saturated_throughput_ratio"] = round(via / direct, 3)
        print(json.dumps({**figures, **extra}))
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
