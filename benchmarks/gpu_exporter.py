"""GPU exporter cost: scrape latency and collection CPU time for 8 and 64 simulated GPUs.

Per size:
  collect_ms        CPU time of one collection (time.thread_time around GpuCollector.collect_once), mean of
                    --collections runs in this process: reading every GPU through the simulated NVML plus
                    building the metric families. The simulator is cheap Python; real NVML calls cost more
                    (driver round trips), so on a GPU host this is a lower bound.
  collect_wall_ms   wall time of the same collections.
  scrape_p50_ms / scrape_p99_ms
                    client-measured GET /metrics against a real `inferwatch exporter gpu --nvml sim`
                    process (collecting every --interval meanwhile), --scrapes sequential scrapes after 20
                    warm-up ones, over one keep-alive session.
  bytes             size of one /metrics answer.
Prints one JSON line per size: {"gpus":..., "scrape_p99_ms":..., "collect_ms":..., ...}.

    .venv/bin/python benchmarks/gpu_exporter.py [--sizes 8,64] [--scrapes 500] [--collections 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inferwatch.exporters.gpu.collector import GpuCollector  # noqa: E402
from inferwatch.exporters.gpu.scenario import parse_scenario  # noqa: E402
from inferwatch.exporters.gpu.sim import SimNvml  # noqa: E402
from inferwatch.testing.process import ManagedProcess, free_port, http_ok  # noqa: E402


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


def measure_scrapes(gpus: int, scrapes: int, interval: str, workdir: Path) -> dict:
    scenario_path = workdir / f"bench-{gpus}.yaml"
    scenario_path.write_text(yaml.safe_dump(_scenario(gpus)))
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = ManagedProcess(f"gpu-exporter-{gpus}", [
        sys.executable, "-m", "inferwatch.cli", "exporter", "gpu", "--nvml", "sim", "--sim-scenario",
        str(scenario_path), "--port", str(port), "--interval", interval], workdir / f"exporter-{gpus}.log",
        ready=lambda: http_ok(url))
    with proc, requests.Session() as session:
        for _ in range(20):
            session.get(url, timeout=10)
        latencies = []
        size = 0
        for _ in range(scrapes):
            t0 = time.perf_counter()
            answer = session.get(url, timeout=10)
            latencies.append((time.perf_counter() - t0) * 1000)
            assert answer.status_code == 200, answer.status_code
            size = len(answer.content)
    latencies.sort()
    return {"scrape_p50_ms": round(latencies[len(latencies) // 2], 3),
            "scrape_p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
            "bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64", help="GPU counts to measure (default 8,64)")
    parser.add_argument("--scrapes", type=int, default=500, help="measured scrapes per size (default 500)")
    parser.add_argument("--collections", type=int, default=50, help="measured collections per size (default 50)")
    parser.add_argument("--interval", default="1s", help="the exporter's --interval while scraped (default 1s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        for gpus in (int(s) for s in args.sizes.split(",")):
            collect_cpu, collect_wall = measure_collection(gpus, args.collections)
            result = {"gpus": gpus, **measure_scrapes(gpus, args.scrapes, args.interval, Path(tmp)),
                      "collect_ms": round(collect_cpu, 3), "collect_wall_ms": round(collect_wall, 3)}
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
