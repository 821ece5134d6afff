"""Notifier intake throughput and intake → channel latency, against the disk's own commit rate measured in
the same run.

Three processes, so no two share a GIL: the notifier (the real CLI, `inferwatch notifier`, with
`send_processes` = the CPU count unless --send-processes says otherwise), the provider simulators
(PagerDuty, Slack, WeCom; their rate limits and the notifier's per-channel limits lifted, so the notifier's
pipeline is measured, not the providers' quotas) and this client (aiohttp, asyncio).

0. Reference — the disk: single-row SQLite transactions in WAL mode with synchronous=FULL (what the outbox
   does per commit), one after another for 2 s in the data directory the notifier then uses:
   disk_commits_per_s. Without group commit, intake cannot beat it (one fsync per webhook).
1. Ingest: `--clients` concurrent clients POST `--ingest` Alertmanager webhooks (one alert each, L1/L2/L3
   round robin) as fast as they are answered; every 200 means the alert is on disk. ingest_per_s.
2. Sustained: webhooks at a fixed `--rate` (open loop, default 500/s) for `--duration` s, each its own
   group; latency = the provider's 2xx (the delivery's finished_at in the outbox) − client sent, per
   notification, so a notification carried in a digest counts when the digest is accepted; deliver_p99_ms.
   Deliveries of phase 1 are drained first. Also printed: messages the simulators accepted (fewer than
   notifications when the notifier coalesced under load).

Prints figures, then a final JSON line with the budget (ingest ≥ 500/s, p99 ≤ 1 s at 500/s) and the ratios
ingest_per_s / disk_commits_per_s and webhooks per intake commit (from the notifier's own metrics).

With `--outbox postgresql` the same two phases run again, in the same run, against `--replicas` notifiers
(default 2) sharing one PostgreSQL outbox (Debian's PostgreSQL started for the run, inferwatch/testing/
postgres.py), the clients spread over them: a 200 then means committed in the shared database. Its figures
are the JSON line's `postgresql` object, beside the SQLite ones.

Run: .venv/bin/python benchmarks/notifier.py [--ingest 4000] [--clients 16] [--rate 500] [--duration 20]
     [--send-processes N] [--outbox postgresql [--replicas 2]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
import requests
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from notifier_support import AUTH, spec_data, wait_for, webhook  # noqa: E402

INGEST_BUDGET_PER_S = 500.0
P99_BUDGET_MS = 1000.0
LAYERS = ("L1", "L2", "L3")


# ------------------------------------------------------------------------------------------- the disk
def disk_commits_per_s(directory: Path, seconds: float = 2.0) -> float:
    db = sqlite3.connect(directory / "reference.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    body = json.dumps(webhook("Reference", "L2"))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t(body) VALUES (?)", (body,))
        db.execute("COMMIT")
        n += 1
    rate = n / (time.perf_counter() - t0)
    db.close()
    return rate


# ------------------------------------------------------------------------------- simulators (a process)
def _simulators(conn) -> None:
    from inferwatch.testing.channels import ProviderSimulators

    sims = ProviderSimulators().start()
    sims.wecom.LIMIT_PER_MINUTE = 10**9
    conn.send({"pagerduty": sims.pagerduty_url, "slack": sims.slack_url, "wecom": sims.wecom_url(0),
               "voice": sims.voice_url, "routing_key": sims.pagerduty.routing_key, "voice_token": sims.voice.token})
    while True:
        command = conn.recv()
        if command == "count":
            conn.send(sum(len(p.received) for p in (sims.pagerduty, sims.slack, sims.wecom)))
        elif command == "stop":
            sims.stop()
            conn.send("stopped")
            return


class Simulators:
    def __init__(self):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_simulators, args=(child,), daemon=True)
        self._proc.start()
        self.urls = self._conn.recv()

    def messages(self) -> int:
        self._conn.send("count")
        return self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._conn.recv()
        self._proc.join(10)


def notifier_spec(urls: dict, send_processes: int) -> dict:
    class Sims:  # what notifier_support.spec_data reads from a ProviderSimulators
        pagerduty_url, slack_url, voice_url = urls["pagerduty"], urls["slack"], urls["voice"]

        class pagerduty:  # noqa: N801
            routing_key = urls["routing_key"]

        class voice:  # noqa: N801
            token = urls["voice_token"]

        @staticmethod
        def wecom_url(index=0):
            return urls["wecom"]

    data = spec_data(Sims)
    data["channels"] = {k: v for k, v in data["channels"].items() if k in ("phone", "oncall-slack", "llm-wecom")}
    for ch in data["channels"].values():
        ch.update(rate_limit=10**6, rate_window="1m")
    data["notifier"]["send_processes"] = send_processes
    data["routes"] = [{"match": {"layer": "L1"}, "receivers": ["phone"]},
                      {"match": {"layer": "L2"}, "receivers": ["oncall-slack"]},
                      {"match": {"layer": "L3"}, "receivers": ["llm-wecom"]}]
    return data


# ------------------------------------------------------------------------------------------ clients
async def ingest(urls: list[str], bodies: list[bytes], clients: int) -> tuple[int, float]:
    """POST `bodies` from `clients` concurrent clients, client i to replica i mod len(urls)."""
    queue = list(reversed(bodies))
    ok = 0

    async def client(session, url):
        nonlocal ok
        while queue:
            body = queue.pop()
            async with session.post(url, data=body, headers=HEADERS) as r:
                await r.read()
                ok += r.status == 200

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        await asyncio.gather(*(client(session, urls[i % len(urls)]) for i in range(clients)))
    return ok, time.perf_counter() - t0


async def sustained(urls: list[str], rate: float, duration: float) -> tuple[dict[str, float], list[float], int, float]:
    """POST one webhook every 1/rate seconds (open loop), round robin over the replicas `urls`; returns (sent
    time per name, POST latencies, ok, achieved rate)."""
    n = int(rate * duration)
    sent: dict[str, float] = {}
    post_ms: list[float] = []
    ok = 0

    async def one(session, i):
        nonlocal ok
        name = f"BenchDeliver{i}"
        body = json.dumps(webhook(name, LAYERS[i % 3], group=f"d-{i}")).encode()
        t = time.perf_counter()
        sent[f"d-{i}"] = time.time()
        async with session.post(urls[i % len(urls)], data=body, headers=HEADERS) as r:
            await r.read()
            ok += r.status == 200
        post_ms.append((time.perf_counter() - t) * 1000)

    tasks = []
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, i)))
        await asyncio.gather(*tasks)
    return sent, post_ms, ok, n / (time.perf_counter() - t0)


HEADERS = {**AUTH, "Content-Type": "application/json"}


def _delivered(outbox: Path | tuple[str, str], sent: dict[str, float]) -> dict[str, float] | None:
    """group key -> when its delivery was accepted by the provider, once every sent group is delivered.
    `outbox`: the SQLite file, or (URL, password) of the PostgreSQL outbox."""
    query = "SELECT group_key, finished_at FROM deliveries WHERE state='delivered' AND group_key LIKE 'd-%'"
    if isinstance(outbox, tuple):
        import psycopg

        with psycopg.connect(outbox[0], password=outbox[1], autocommit=True) as conn:
            rows = conn.execute(query).fetchall()
    else:
        db = sqlite3.connect(f"file:{outbox}?mode=ro", uri=True, timeout=30)
        try:
            rows = db.execute(query).fetchall()
        finally:
            db.close()
    got = {g: t for g, t in rows if g in sent}
    return got if len(got) == len(sent) else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` and its live children (the send processes)."""
    total = 0.0
    try:
        parent = psutil.Process(pid)
        processes = [parent, *parent.children()]
    except psutil.Error:
        return total
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # a child that exited meanwhile
            continue
        total += times.user + times.system
    return total


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q * len(values))) - 1))]


def scrape(url: str, name: str) -> float:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def run_backend(args, sims: Simulators, tmp: Path, backend: str, disk: float, postgres=None) -> dict:
    """Both phases against `backend`: one notifier on SQLite, or `--replicas` notifiers on one PostgreSQL
    database (`postgres`, a testing.postgres server), the clients spread over them. Returns the figures."""
    from inferwatch.testing.process import free_port, http_ok

    data = notifier_spec(sims.urls, args.send_processes)
    env = dict(os.environ)
    replicas = 1
    outbox: Path | tuple[str, str] = tmp / f"data-{backend}-0" / "outbox.sqlite3"
    if backend == "postgresql":
        replicas = args.replicas
        db_url = postgres.create_database(f"bench_{int(time.time())}")
        data["notifier"]["outbox"] = {"url": db_url, "password": "${INFERWATCH_BENCH_PGPASSWORD}"}
        env["INFERWATCH_BENCH_PGPASSWORD"] = postgres.password
        outbox = (db_url, postgres.password)
    spec_file = tmp / f"spec-{backend}.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    ports = [free_port() for _ in range(replicas)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    procs = []
    for i, port in enumerate(ports):
        log = open(tmp / f"notifier-{backend}-{i}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "inferwatch.cli", "notifier", "--spec", str(spec_file),
                                       "--port", str(port), "--data-dir", str(tmp / f"data-{backend}-{i}")],
                                      stdout=subprocess.DEVNULL, stderr=log, env=env))
    try:
        for url, proc in zip(urls, procs, strict=True):
            wait_for(lambda url=url, proc=proc: http_ok(url + "/-/ready") or proc.poll() is not None,
                     what="notifier start")
        alerts = [u + "/alerts" for u in urls]

        def commits_total() -> float:
            return sum(scrape(u, "inferwatch_notifier_intake_commits_total") for u in urls)

        def cpu() -> float:
            return sum(cpu_seconds(p.pid) for p in procs)

        # ---- 1. ingest
        bodies = [json.dumps(webhook(f"BenchIngest{i}", LAYERS[i % 3], group=f"ingest-{i}")).encode()
                  for i in range(args.ingest)]
        commits0, cpu0 = commits_total(), cpu()
        ok, wall = asyncio.run(ingest(alerts, bodies, args.clients))
        ingest_cpu_ms = (cpu() - cpu0) * 1000 / max(ok, 1)
        commits = commits_total() - commits0
        ingest_per_s = ok / wall
        print(f"{backend} ingest: {ok}/{len(bodies)} accepted in {wall:.2f}s = {ingest_per_s:.0f} webhooks/s "
              f"({args.clients} clients, {replicas} notifier(s)), each committed before its 2xx; "
              f"{ok / max(commits, 1):.1f} webhooks per commit; notifier CPU {ingest_cpu_ms:.2f} ms per webhook")
        wait_for(lambda: all(scrape(u, "inferwatch_notifier_outbox_depth") == 0 for u in urls), timeout=300,
                 what="the ingest backlog to drain")
        # ---- 2. sustained
        messages0, cpu0 = sims.messages(), cpu()
        sent, post_ms, sustained_ok, achieved = asyncio.run(sustained(alerts, args.rate, args.duration))
        got = wait_for(lambda: _delivered(outbox, sent), timeout=180, what="every sustained delivery")
        sustained_cpu_ms = (cpu() - cpu0) * 1000 / len(sent)
        messages = sims.messages() - messages0
        lat_ms = sorted((got[g] - sent[g]) * 1000 for g in got)
        p50, p99 = statistics.median(lat_ms), percentile(lat_ms, 0.99)
        by_channel = {ch: percentile([(got[g] - sent[g]) * 1000 for g in got if int(g[2:]) % 3 == i], 0.99)
                      for i, ch in enumerate(("pagerduty", "slack", "wecom"))}
        print(f"{backend} sustained: {sustained_ok}/{len(sent)} accepted at {achieved:.0f} webhooks/s for "
              f"{args.duration:.0f}s (POST p50 {statistics.median(post_ms):.1f} ms, p99 "
              f"{percentile(post_ms, 0.99):.1f} ms); delivered {len(got)}/{len(sent)} in {messages} provider "
              f"messages: intake → channel p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {lat_ms[-1]:.1f} ms; "
              f"notifier CPU {sustained_cpu_ms:.2f} ms per webhook, intake and delivery; p99 by channel "
              + ", ".join(f"{ch} {v:.0f} ms" for ch, v in by_channel.items()))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    result = {
        "replicas": replicas, "ingest_per_s": round(ingest_per_s, 1),
        "ingest_vs_disk_commits": round(ingest_per_s / disk, 2),
        "webhooks_per_commit": round(ok / max(commits, 1), 1),
        "ingest_cpu_ms_per_webhook": round(ingest_cpu_ms, 2),
        "sustained_cpu_ms_per_webhook": round(sustained_cpu_ms, 2),
        "sustained_rate_per_s": round(achieved, 1), "delivered": f"{len(got)}/{len(sent)}",
        "provider_messages": messages,
        "deliver_p50_ms": round(p50, 1), "deliver_p99_ms": round(p99, 1),
        "deliver_p99_ms_by_channel": {ch: round(v, 1) for ch, v in by_channel.items()},
        "post_p99_ms": round(percentile(post_ms, 0.99), 1),
    }
    result["within_budget"] = bool(ingest_per_s >= INGEST_BUDGET_PER_S and p99 <= P99_BUDGET_MS
                                   and len(got) == len(sent) and args.rate >= 500)
    result["_complete"] = ok == len(bodies) and sustained_ok == len(sent) and len(got) == len(sent)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ingest", type=int, default=4000, help="webhooks in the ingest phase (default 4000)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients in the ingest phase (default 16)")
    ap.add_argument("--rate", type=float, default=500.0, help="webhooks/s in the sustained phase (default 500)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of the sustained phase (default 20)")
    ap.add_argument("--send-processes", type=int, default=os.cpu_count() or 1,
                    help="notifier.send_processes (default: the CPU count, the setting for storms; 0 = threads)")
    ap.add_argument("--outbox", choices=("sqlite", "postgresql"), default="sqlite",
                    help="postgresql: also measure --replicas notifiers on one PostgreSQL outbox (a local "
                         "Debian PostgreSQL started for the run), after SQLite in the same run")
    ap.add_argument("--replicas", type=int, default=2, help="notifiers on the PostgreSQL outbox (default 2)")
    args = ap.parse_args()

    sims = Simulators()
    postgres = None
    results: dict[str, dict] = {}
    try:
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp_name:
            tmp = Path(tmp_name)
            disk = disk_commits_per_s(tmp)
            print(f"disk: {disk:.0f} SQLite WAL synchronous=FULL commits/s (one row each) in {tmp}")
            results["sqlite"] = run_backend(args, sims, tmp, "sqlite", disk)
            if args.outbox == "postgresql":
                from inferwatch.testing.postgres import start_postgres

                postgres = start_postgres(tmp, fsync=True)  # a 2xx after a durable commit, as SQLite's
                results["postgresql"] = run_backend(args, sims, tmp, "postgresql", disk, postgres)
    finally:
        if postgres is not None:
            postgres.stop()
        sims.stop()
    complete = all(r.pop("_complete") for r in results.values())
    result = {"machine": f"{os.cpu_count()} CPUs", "send_processes": args.send_processes,
              "disk_commits_per_s": round(disk), **results["sqlite"],
              "budget": {"ingest_per_s": INGEST_BUDGET_PER_S, "deliver_p99_ms_at_500_per_s": P99_BUDGET_MS}}
    if "postgresql" in results:
        result["postgresql"] = results["postgresql"]
        result["within_budget"] = result["within_budget"] and results["postgresql"]["within_budget"]
    print(json.dumps(result))
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
