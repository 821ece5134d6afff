"""GPU exporter cost: scrape latency against a plain server handing out the same bytes, and collection time.

Per size (simulated GPUs) and per encoding the client accepts (gzip as Prometheus sends it, and identity):
  exporter    a real `inferwatch exporter gpu --nvml sim` process, collecting every --interval meanwhile
  plain       a plain server in its own process (the standard library's http.server, what prometheus-client's
              own /metrics server is built on) handing out the exact bytes and headers the exporter
              answered that client, pre-rendered once: the floor any Python /metrics endpoint stands on
Both are scraped by the same client (one requests.Session, the Accept-Encoding of the variant), alternately
scrape by scrape so load from other processes falls on both alike: --warmup scrapes each, then --scrapes
measured each. Latency is the client's wall time per GET, body read.

Also per size: collect_ms, the CPU time of one collection (time.thread_time around GpuCollector.collect_once,
mean of --collections runs in this process: reading every GPU through the simulated NVML plus building the
families), and collect_wall_ms. Real NVML calls cost more than the simulator's, so on a GPU host it is a lower
bound; rendering happens after each collection, not per scrape.

Prints one JSON line per size and encoding, then a final JSON line:
  {"budget_p99_ratio": 1.5, "within_budget": true, "worst_p99_ratio": ..., "runs": {...}, "results": [...]}
where each result has exporter/plain p50/p99 (ms), p50_ratio and p99_ratio (exporter / plain).

    .venv/bin/python benchmarks/gpu_exporter.py [--sizes 8,64] [--scrapes 1000] [--warmup 20] [--collections 50]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inferwatch.exporters.gpu.collector import GpuCollector  # noqa: E402
from inferwatch.exporters.gpu.scenario import parse_scenario  # noqa: E402
from inferwatch.exporters.gpu.sim import SimNvml  # noqa: E402
from inferwatch.testing.process import ManagedProcess, free_port, http_ok  # noqa: E402

BUDGET_P99_RATIO = 1.5
ENCODINGS = {"gzip": "gzip, deflate", "identity": "identity"}


def _scenario(gpus: int) -> dict:
    # A realistic mix: every GPU readable, one not supporting memory temperature, one with MIG instances.
    return {"gpus": gpus, "model": "NVIDIA H100 80GB HBM3",
            "mig": {gpus - 1: [{"profile": "3g.40gb", "gi_id": 1, "memory_total_mib": 40192, "memory_used_mib": 9000},
                               {"profile": "1g.10gb", "gi_id": 9, "memory_total_mib": 9728, "memory_used_mib": 100}]},
            "timeline": [{"gpu": 0, "not_supported": ["memory_temperature"]}]}


def measure_collection(gpus: int, runs: int) -> tuple[float, float]:
    sim = SimNvml(parse_scenario(_scenario(gpus)))
    collector = GpuCollector(sim, "bench-host")
    collector.collect_once()   # init + discovery out of the measurement
    cpu, wall = [], []
    for _ in range(runs):
        c0, w0 = time.thread_time(), time.perf_counter()
        collector.collect_once()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.mean(cpu) * 1000, statistics.mean(wall) * 1000


def serve_static(body_path: str, port: int, content_type: str, encoding: str) -> None:
    """The plain server: hands out one file's bytes with the given headers (runs in its own process)."""
    body = Path(body_path).read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's method name
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            if encoding:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def measure_scrapes(gpus: int, args: argparse.Namespace, workdir: Path) -> list[dict]:
    scenario_path = workdir / f"bench-{gpus}.yaml"
    scenario_path.write_text(yaml.safe_dump(_scenario(gpus)))
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    exporter = ManagedProcess(f"gpu-exporter-{gpus}", [
        sys.executable, "-m", "inferwatch.cli", "exporter", "gpu", "--nvml", "sim", "--sim-scenario",
        str(scenario_path), "--port", str(port), "--interval", args.interval, "--no-pod-labels"],
        workdir / f"exporter-{gpus}.log", ready=lambda: http_ok(url))
    results = []
    with exporter:
        for name, accept_encoding in ENCODINGS.items():
            with requests.Session() as session:
                session.headers["Accept-Encoding"] = accept_encoding
                sample = session.get(url, timeout=10, stream=True)
                raw = sample.raw.read(decode_content=False)
                body_path = workdir / f"body-{gpus}-{name}"
                body_path.write_bytes(raw)
                plain_port = free_port()
                plain_url = f"http://127.0.0.1:{plain_port}/metrics"
                plain = ManagedProcess(f"plain-{gpus}-{name}", [
                    sys.executable, __file__, "--serve-static", str(body_path), "--port", str(plain_port),
                    "--content-type", sample.headers["Content-Type"],
                    "--content-encoding", sample.headers.get("Content-Encoding", "")],
                    workdir / f"plain-{gpus}-{name}.log", ready=lambda url=plain_url: http_ok(url))
                with plain:
                    times: dict[str, list[float]] = {"exporter": [], "plain": []}
                    for i in range(args.warmup + args.scrapes):
                        for who, target in (("exporter", url), ("plain", plain_url)):
                            t0 = time.perf_counter()
                            answer = session.get(target, timeout=10)
                            elapsed = (time.perf_counter() - t0) * 1000
                            assert answer.status_code == 200, (who, answer.status_code)
                            if i >= args.warmup:
                                times[who].append(elapsed)
            gzipped = sample.headers.get("Content-Encoding") == "gzip"
            row = {"gpus": gpus, "accept_encoding": name, "bytes_on_wire": len(raw),
                   "bytes": len(gzip.decompress(raw)) if gzipped else len(raw)}
            for who, values in times.items():
                row[f"{who}_p50_ms"] = round(_percentile(values, 0.5), 3)
                row[f"{who}_p99_ms"] = round(_percentile(values, 0.99), 3)
            row["p50_ratio"] = round(row["exporter_p50_ms"] / row["plain_p50_ms"], 3)
            row["p99_ratio"] = round(row["exporter_p99_ms"] / row["plain_p99_ms"], 3)
            results.append(row)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64", help="GPU counts to measure (default 8,64)")
    parser.add_argument("--scrapes", type=int, default=1000,
                        help="measured scrapes per server and variant (default 1000)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured scrapes first (default 20)")
    parser.add_argument("--collections", type=int, default=50, help="measured collections per size (default 50)")
    parser.add_argument("--interval", default="1s", help="the exporter's --interval while scraped (default 1s)")
    parser.add_argument("--serve-static", metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--content-type", help=argparse.SUPPRESS)
    parser.add_argument("--content-encoding", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_static:
        serve_static(args.serve_static, args.port, args.content_type, args.content_encoding)
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        for gpus in (int(s) for s in args.sizes.split(",")):
            collect_cpu, collect_wall = measure_collection(gpus, args.collections)
            for row in measure_scrapes(gpus, args, Path(tmp)):
                row.update(collect_ms=round(collect_cpu, 3), collect_wall_ms=round(collect_wall, 3))
                print(json.dumps(row), flush=True)
                results.append(row)
    worst = max(r["p99_ratio"] for r in results)
    print(json.dumps({"budget_p99_ratio": BUDGET_P99_RATIO, "within_budget": worst <= BUDGET_P99_RATIO,
                      "worst_p99_ratio": worst,
                      "runs": {"scrapes_per_server_and_variant": args.scrapes, "warmup": args.warmup,
                               "collections": args.collections, "interval": args.interval},
                      "results": [{k: r[k] for k in ("gpus", "accept_encoding", "exporter_p50_ms", "exporter_p99_ms",
                                                     "plain_p50_ms", "plain_p99_ms", "p50_ratio", "p99_ratio")}
                                  for r in results]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
