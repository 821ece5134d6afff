"""What the gateway proxy adds to a stream, next to nginx (proxy_buffering off) in the same run, against the
budget: added TTFT ≤ 2× nginx's at p50 and p99 at 16 and 64 streams per path (floors 0.5 ms at p50, 2 ms at
p99); saturated throughput ≥ 0.9× direct; proxy CPU ≤ 50 ms per 1,000 events.

One fast local SSE upstream (Triton generate_stream format with `output_token_count`, and an OpenAI chat
completions stream, in its own process) isolates proxy cost. Streams arrive at a steady rate (open loop, not
one burst) and each arrival goes, in turn, direct / through the gateway (the real `inferwatch exporter
gateway` process, `--workers` of them) / through nginx (as many worker processes), so all three see the
same machine conditions. TTFT is measured by the client: request sent → first event read.

Phases of one run:
1. latency at 16 and at 64 streams per path (steady arrivals sized for that many concurrent streams): added
   TTFT = percentile(via) − percentile(direct); the gateway's CPU time per 1,000 forwarded events (its
   processes' CPU from /proc ÷ events) and nginx's in the same phase;
2. the 64-stream phase again with the gateway's /metrics scraped every --scrape-interval seconds (as
   Prometheus would), with --tenants tenants' series warmed up (a production-sized page);
3. references at 64 streams, one path at a time next to direct (CPU per event and added TTFT): the same
   gateway process forwarding an unmetered path (its own server and aiohttp's client, which the gateway keeps for
   unmetered requests, without metering) and a byte pipe on uvloop's protocols (no HTTP, no metering: the
   floor of a Python hop on this machine);
4. saturation (--saturate seconds, 0 to skip): --streams closed-loop streams with no token delay, direct,
   then through the gateway, then nginx: tokens/s ratios when the upstream runs flat out on the same cores;
5. LiteLLM's proxy (`litellm[proxy]`, from .venv-litellm when it exists) in front of the same upstream's
   OpenAI stream at 8 streams per path, next to direct, the gateway and nginx (skipped, with the reason in
   the JSON, when it is not installed);
6. in-process: per /metrics scrape, the serving loop's CPU and longest stall, rendered in a forked child (what
   a single-process gateway does) against in place.
The load average is read before and after each run: other processes on the machine move end-to-end
latency, much less the CPU figures. --repeat N runs it all N times; the final JSON line holds every run,
the median of each figure and the budget verdict on the medians.

    .venv/bin/python benchmarks/gateway_overhead.py [--workers 1] [--repeat 1] [--duration 15] [--tenants 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inferwatch.testing.process import ManagedProcess, free_port, http_ok  # noqa: E402

LITELLM_VENV = REPO / ".venv-litellm"
LOADS = (16, 64)  # streams per path of the budget's two latency phases
TRITON_PATH = "/v2/models/{model}/generate_stream"
CHAT_PATH = "/v1/chat/completions"

NGINX_CONF = """
worker_processes {workers};
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

LITELLM_CONF = """
model_list:
  - model_name: toy_llm
    litellm_params:
      model: openai/toy_llm
      api_base: http://127.0.0.1:{up}/v1
      api_key: unused
litellm_settings:
  telemetry: false
  drop_params: true
"""


# ------------------------------------------------------------------------------------------- upstream
async def _triton_handler(request: web.Request) -> web.StreamResponse:
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


async def _chat_handler(request: web.Request) -> web.StreamResponse:
    """An OpenAI chat completions stream: one content chunk per token, a finish chunk, [DONE]. Delays are the
    upstream's defaults (a peer proxy may not pass unknown body fields on)."""
    body = await request.json()
    n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    first, gap = request.app["first_s"], request.app["gap_s"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    await asyncio.sleep(first)
    head = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"toy_llm","choices":[{"index":0,'
    for i in range(n):
        if i and gap:
            await asyncio.sleep(gap)
        await resp.write(head + b'"delta":{"content":"tok "},"finish_reason":null}]}\n\n')
    await resp.write(head + b'"delta":{},"finish_reason":"stop"}]}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def serve_upstream(port: int, first_ms: float, gap_ms: float) -> None:
    _use_uvloop()
    app = web.Application()
    app["first_s"], app["gap_s"] = first_ms / 1000, gap_ms / 1000
    app.router.add_post(TRITON_PATH.format(model="{model}"), _triton_handler)
    app.router.add_post(CHAT_PATH, _chat_handler)
    app.router.add_get("/ready", lambda _r: web.Response(text="ok"))
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


class _Pipe(asyncio.Protocol):
    """One side of the byte-pipe reference: what arrives is written to the peer at once."""

    def __init__(self, peer: "_Pipe | None" = None):
        self.peer = peer
        self.transport = None
        self.pending: list[bytes] = []

    def connection_made(self, transport):
        self.transport = transport
        if self.peer is None:  # the client side: open the upstream side
            asyncio.ensure_future(self._connect())

    async def _connect(self):
        loop = asyncio.get_running_loop()
        _, self.peer = await loop.create_connection(lambda: _Pipe(self), "127.0.0.1", self.upstream_port)
        for data in self.pending:
            self.peer.transport.write(data)
        self.pending = []

    def data_received(self, data):
        if self.peer is None or self.peer.transport is None:
            self.pending.append(data)
        else:
            self.peer.transport.write(data)

    def connection_lost(self, exc):
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


def serve_pipe(port: int, upstream_port: int) -> None:
    """The floor of a Python relay: a byte pipe on uvloop's protocols, one upstream connection per client
    connection; no HTTP parsing, no metering."""
    _use_uvloop()
    _Pipe.upstream_port = upstream_port

    async def main():
        server = await asyncio.get_running_loop().create_server(_Pipe, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _use_uvloop() -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass


# ---------------------------------------------------------------------------------------------- client
async def one_stream(session, url, body, out, tenant="t0", headers=None):
    t0 = time.perf_counter()
    first = None
    events = 0
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json", "X-Tenant-ID": tenant,
                                                         **(headers or {})}) as resp:
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
    """CPU time (user + system) of `pid` and all its descendants alive now, in seconds (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(int(c)) for c in children)


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


def triton_body(tokens: int, first_ms: float, gap_ms: float) -> bytes:
    return json.dumps({"text_input": "x", "max_tokens": tokens, "first_token_delay_ms": first_ms,
                       "token_delay_ms": gap_ms}).encode()


async def warm_up(url, tenants):
    """One short stream per tenant, so the gateway's /metrics holds every tenant's series."""
    body = triton_body(2, 0, 0)
    async with aiohttp.ClientSession() as session:
        out = []
        await asyncio.gather(*(one_stream(session, url, body, out, f"t{i}") for i in range(tenants)))


async def latency_phase(urls: dict, body: bytes, stream_s: float, streams: int, duration: float, tenants: int,
                        metrics_url: str | None = None, scrape_interval: float = 1.0, headers: dict | None = None):
    """Steady arrivals, round-robin over `urls`, at the rate that keeps about `streams` streams of
    `stream_s` seconds in flight per path (`headers[name]`: extra request headers of a path).
    Returns ({name: rows}, arrivals/s per path, scrapes)."""
    headers = headers or {}
    rate = streams / stream_s
    results = {name: [] for name in urls}
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) for name in urls}
    names = list(urls)
    interval = 1.0 / (rate * len(names))
    tasks = []
    scrapes: list = []
    stop = asyncio.Event()
    scraping = asyncio.create_task(scraper(metrics_url, scrape_interval, scrapes, stop)) if metrics_url else None
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < duration:
        name = names[i % len(names)]
        tenant = f"t{(i // len(names)) % tenants}"
        tasks.append(asyncio.create_task(one_stream(sessions[name], urls[name], body, results[name], tenant,
                                                    headers.get(name))))
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


async def saturation_phase(url, streams: int, seconds: float) -> float:
    """Tokens per second delivered by `streams` closed-loop streams of 256 undelayed tokens."""
    body = triton_body(256, 0, 0)
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        stop = time.perf_counter() + seconds

        async def worker():
            while time.perf_counter() < stop:
                await one_stream(session, url, body, out)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
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
        _ = requests.get(url, headers={"Accept-Encoding": "gzip"}, timeout=30).content  # read the whole body

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
        print(f"{phase:10s} {name:8s} streams={len(rows)} failed={summary[name]['failed']} "
              f"ttft p50={summary[name]['ttft_p50_ms']:.2f} ms p99={summary[name]['ttft_p99_ms']:.2f} ms "
              f"tokens/s={summary[name]['tokens_per_s']:.0f}", file=sys.stderr)
    return summary


def added(summary: dict, name: str, key: str) -> float:
    return round(summary[name][key] - summary["direct"][key], 3)


def budget(f: dict) -> dict:
    """Each budget line: {"value", "limit", "ok"} (limits from the issue; nginx measured in the same run)."""
    lines = {}
    for load in LOADS:
        for q, floor in (("p50", 0.5), ("p99", 2.0)):
            limit = round(max(2 * f[f"nginx_added_ttft_{q}_ms_{load}"], floor), 3)
            value = f[f"added_ttft_{q}_ms_{load}"]
            lines[f"added_ttft_{q}_{load}"] = {"value": value, "limit": limit, "ok": value <= limit}
    if "saturated_throughput_ratio" in f:
        value = f["saturated_throughput_ratio"]
        lines["saturated_throughput"] = {"value": value, "limit": 0.9, "ok": value >= 0.9}
    value = f["proxy_cpu_ms_per_1k_events"]
    lines["proxy_cpu_per_1k_events"] = {"value": value, "limit": 50.0, "ok": value <= 50.0}
    return lines


def cpu_per_1k(pid: int, events: int, cpu0: float) -> float:
    return round((cpu_seconds(pid) - cpu0) * 1000 / max(events, 1) * 1000, 1)


def one_run(args, urls: dict, pids: dict, metrics_url: str, litellm_url: str | None, litellm_why: str | None,
            litellm_key: str = "") -> dict:
    figures: dict = {"load_average_1m_before": round(os.getloadavg()[0], 2)}
    body = triton_body(args.tokens, args.first_ms, args.gap_ms)
    stream_s = (args.first_ms + args.gap_ms * (args.tokens - 1)) / 1000
    paths = {k: urls[k] for k in ("direct", "gateway", "nginx")}
    for load in LOADS:
        cpu0 = {name: cpu_seconds(pids[name]) for name in ("gateway", "nginx")}
        results, rate, _ = asyncio.run(latency_phase(paths, body, stream_s, load, args.duration, args.tenants))
        s = summarise(results, f"quiet/{load}")
        for q in ("p50", "p99"):
            figures[f"added_ttft_{q}_ms_{load}"] = added(s, "gateway", f"ttft_{q}_ms")
            figures[f"nginx_added_ttft_{q}_ms_{load}"] = added(s, "nginx", f"ttft_{q}_ms")
        figures[f"throughput_ratio_{load}"] = round(s["gateway"]["tokens_per_s"] / s["direct"]["tokens_per_s"], 3)
        figures[f"failed_{load}"] = sum(v["failed"] for v in s.values())
        figures[f"proxy_cpu_ms_per_1k_events_{load}"] = cpu_per_1k(pids["gateway"], s["gateway"]["tokens"],
                                                                   cpu0["gateway"])
        figures[f"nginx_cpu_ms_per_1k_events_{load}"] = cpu_per_1k(pids["nginx"], s["nginx"]["tokens"], cpu0["nginx"])
    figures["proxy_cpu_ms_per_1k_events"] = figures["proxy_cpu_ms_per_1k_events_64"]

    results, _, scrapes = asyncio.run(latency_phase(paths, body, stream_s, 64, args.duration, args.tenants,
                                                    metrics_url, args.scrape_interval))
    s = summarise(results, "scraped/64")
    figures.update({
        "scraped_added_ttft_p50_ms": added(s, "gateway", "ttft_p50_ms"),
        "scraped_added_ttft_p99_ms": added(s, "gateway", "ttft_p99_ms"),
        "scraped_nginx_added_ttft_p99_ms": added(s, "nginx", "ttft_p99_ms"),
        "scrapes": len(scrapes),
        "scrape_p50_ms": round(pct([x[0] * 1000 for x in scrapes], 0.5), 2),
        "scrape_max_ms": round(max((x[0] * 1000 for x in scrapes), default=float("nan")), 2),
        "metrics_bytes": scrapes[-1][1] if scrapes else None,
    })

    # References at 64 streams, each path next to direct: the same gateway process forwarding an unmetered
    # path (the gateway's server and aiohttp's client, no metering), and the byte pipe (the floor of a Python
    # hop).
    for name, url, pid in (("unmetered_relay", urls["relay"], pids["gateway"]),
                           ("byte_pipe", urls["pipe"], pids["pipe"])):
        cpu0 = cpu_seconds(pid)
        results, _, _ = asyncio.run(latency_phase({"direct": urls["direct"], name: url}, body, stream_s, 64,
                                                  args.reference_duration, args.tenants))
        rows = results[name]
        figures[f"{name}_cpu_ms_per_1k_events"] = cpu_per_1k(pid, sum(r[2] for r in rows), cpu0)
        s = summarise(results, "ref/64")
        for q in ("p50", "p99"):
            figures[f"{name}_added_ttft_{q}_ms"] = added(s, name, f"ttft_{q}_ms")
        print(f"reference  {name:16s} CPU per 1000 events {figures[f'{name}_cpu_ms_per_1k_events']} ms",
              file=sys.stderr)

    if args.saturate > 0:
        rates = {name: asyncio.run(saturation_phase(urls[name], args.streams, args.saturate))
                 for name in ("direct", "gateway", "nginx")}
        print("saturation tokens/s " + " ".join(f"{k}={v:.0f}" for k, v in rates.items()), file=sys.stderr)
        figures["saturated_throughput_ratio"] = round(rates["gateway"] / rates["direct"], 3)
        figures["nginx_saturated_throughput_ratio"] = round(rates["nginx"] / rates["direct"], 3)

    if litellm_url is not None:
        chat = json.dumps({"model": "toy_llm", "stream": True, "max_tokens": args.tokens,
                           "messages": [{"role": "user", "content": "x"}]}).encode()
        peers = {"direct": urls["direct_chat"], "gateway": urls["gateway_chat"], "nginx": urls["nginx_chat"],
                 "litellm": litellm_url}
        auth = {"litellm": {"Authorization": f"Bearer {litellm_key}"}}
        results, _, _ = asyncio.run(latency_phase(peers, chat, stream_s, 8, args.duration, args.tenants,
                                                  headers=auth))
        s = summarise(results, "openai/8")
        for name in ("gateway", "nginx", "litellm"):
            for q in ("p50", "p99"):
                figures[f"openai8_{name}_added_ttft_{q}_ms"] = added(s, name, f"ttft_{q}_ms")
        figures["openai8_failed"] = sum(v["failed"] for v in s.values())
    else:
        figures["litellm_skipped"] = litellm_why

    costs = render_costs(args.tenants)
    print(f"/metrics per scrape, serving loop: in place stall {costs['in_place'][0]} ms, CPU "
          f"{costs['in_place'][1]} ms; forked stall {costs['forked'][0]} ms, CPU {costs['forked'][1]} ms",
          file=sys.stderr)
    figures["metrics_loop_stall_in_place_ms"], figures["metrics_loop_cpu_in_place_ms"] = costs["in_place"]
    figures["metrics_loop_stall_forked_ms"], figures["metrics_loop_cpu_forked_ms"] = costs["forked"]
    figures["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    figures["budget"] = budget(figures)
    figures["within_budget"] = all(line["ok"] for line in figures["budget"].values())
    return figures


def litellm_process(work: Path, up_port: int, port: int, key: str) -> tuple[ManagedProcess | None, str | None]:
    """LiteLLM's proxy from .venv-litellm in front of the upstream's OpenAI stream, or (None, why not).
    `key`: its master key (it refuses to start without one), sent by the client as a bearer token."""
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        return None, f"{LITELLM_VENV.name} not found: make litellm-venv"
    (work / "litellm.yaml").write_text(LITELLM_CONF.format(up=up_port))
    # The bundled model cost map, no telemetry: nothing leaves the machine.
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False", LITELLM_LOG="ERROR",
               LITELLM_MASTER_KEY=key)
    proc = ManagedProcess("litellm", [str(binary), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1",
                                      "--port", str(port), "--num_workers", "1"], work / "litellm.log", env=env,
                          ready=lambda: http_ok(f"http://127.0.0.1:{port}/health/liveliness"))
    return proc, None


def tcp_ok(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def median_figures(runs: list[dict]) -> dict:
    """The median of every numeric figure over the runs."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {k: round(statistics.median(r[k] for r in runs if isinstance(r.get(k), (int, float))), 3) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=1, help="gateway --workers, and nginx worker_processes (default 1)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every phase; figures are their medians (default 1)")
    ap.add_argument("--streams", type=int, default=64, help="closed-loop streams of the saturation phase (default 64)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of each latency phase (default 15)")
    ap.add_argument("--reference-duration", type=float, default=6.0,
                    help="seconds of each CPU reference phase (default 6)")
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
    ap.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM phase")
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-pipe", type=int, nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, args.first_ms, args.gap_ms)
        return 0
    if args.serve_pipe:
        serve_pipe(*args.serve_pipe)
        return 0
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        print("nginx not found: apt-get install nginx", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    up_port, gw_port, gw_metrics, ng_port, pipe_port, ll_port = (free_port() for _ in range(6))
    for sub in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
        (work / sub).mkdir()
    (work / "nginx.conf").write_text(NGINX_CONF.format(d=work, up=up_port, port=ng_port, workers=args.workers))
    # llm_models names the metered model: the same upstream route under another model name is forwarded
    # unmetered (the unmetered-relay reference). The OpenAI route is always metered.
    (work / "gateway.yaml").write_text(json.dumps({"tenants": [f"t{i}" for i in range(args.tenants)],
                                                   "models": ["toy_llm"], "gateway": {"llm_models": ["toy_llm"]}}))
    env = dict(os.environ, INFERWATCH_GATEWAY_LOOP=args.gateway_loop)
    timing = ["--first-ms", str(args.first_ms), "--gap-ms", str(args.gap_ms)]
    procs = [
        ManagedProcess("upstream", [sys.executable, __file__, "--serve-upstream", str(up_port), *timing],
                       work / "up.log", ready=lambda: http_ok(f"http://127.0.0.1:{up_port}/ready")),
        ManagedProcess("gateway", [sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--upstream",
                                   f"http://127.0.0.1:{up_port}", "--port", str(gw_port), "--metrics-port",
                                   str(gw_metrics), "--spec", str(work / "gateway.yaml"),
                                   "--workers", str(args.workers)], work / "gw.log", env=env, cwd=str(REPO),
                       ready=lambda: http_ok(f"http://127.0.0.1:{gw_metrics}/metrics")),
        ManagedProcess("nginx", [nginx, "-p", str(work), "-c", str(work / "nginx.conf"), "-e", str(work / "error.log")],
                       work / "nginx.log", ready=lambda: http_ok(f"http://127.0.0.1:{ng_port}/nginx-ready")),
        ManagedProcess("pipe", [sys.executable, __file__, "--serve-pipe", str(pipe_port), str(up_port)],
                       work / "pipe.log", ready=lambda: tcp_ok(pipe_port)),
    ]
    litellm_key = "sk-" + secrets.token_hex(16)  # this run's only: LiteLLM's proxy needs a master key
    litellm, why = (None, "--no-litellm") if args.no_litellm else litellm_process(work, up_port, ll_port, litellm_key)
    if litellm is not None:
        procs.append(litellm)
    try:
        for p in procs:
            p.start(timeout=120 if p is litellm else 30)
        pids = {p.name: p.proc.pid for p in procs}
        triton = TRITON_PATH.format(model="toy_llm")
        urls = {"direct": f"http://127.0.0.1:{up_port}{triton}", "gateway": f"http://127.0.0.1:{gw_port}{triton}",
                "nginx": f"http://127.0.0.1:{ng_port}{triton}",
                "relay": f"http://127.0.0.1:{gw_port}{TRITON_PATH.format(model='relay_only')}",
                "pipe": f"http://127.0.0.1:{pipe_port}{triton}",
                "direct_chat": f"http://127.0.0.1:{up_port}{CHAT_PATH}",
                "gateway_chat": f"http://127.0.0.1:{gw_port}{CHAT_PATH}",
                "nginx_chat": f"http://127.0.0.1:{ng_port}{CHAT_PATH}"}
        litellm_url = f"http://127.0.0.1:{ll_port}{CHAT_PATH}" if litellm is not None else None
        _use_uvloop()
        asyncio.run(warm_up(urls["gateway"], args.tenants))
        metrics_url = f"http://127.0.0.1:{gw_metrics}/metrics"
        runs = []
        for i in range(args.repeat):
            print(f"== run {i + 1}/{args.repeat}, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
            runs.append(one_run(args, urls, pids, metrics_url, litellm_url, why, litellm_key))
            print(json.dumps(runs[-1]), file=sys.stderr)
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)
    medians = median_figures(runs)
    verdict = budget(medians)
    print(json.dumps({**medians, "budget": verdict, "within_budget": all(v["ok"] for v in verdict.values()),
                      "runs": len(runs), "runs_within_budget": sum(r["within_budget"] for r in runs),
                      "workers": args.workers, "tenants": args.tenants, "gateway_loop": args.gateway_loop,
                      "cpus": os.cpu_count(), "litellm_skipped": why, "per_run": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
