"""Benchmark: Triton collector poll time and memory for 1, 100 and 500 models.

1 model: the real tritonserver serving only `classifier` (explicit model control; its two versions).
100 / 500 models: the replay server (triton_replay.py) built from answers captured from the real Triton.
Each size runs in a fresh child process so RSS is that size's alone. Prints one JSON line per size:
{"models": N, "poll_ms": median of 10 polls, "poll_ms_max": ..., "rss_mb": RSS after the polls,
 "series": samples served}. Run: `python benchmarks/triton_collector.py [--sizes 1,100,500]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLLS = 10


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(url: str, metrics_url: str, models: int) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest

    from inferwatch.exporters.triton.collector import TritonCollector
    from inferwatch.exporters.triton.reader import TargetConfig

    collector = TritonCollector([TargetConfig("bench", url, metrics_url)], timeout=10, concurrency=16)
    try:
        collector.poll_once()  # warm: connections, imports
        times = []
        for _ in range(POLLS):
            started = time.perf_counter()
            snap = collector.poll_once()[0]
            times.append((time.perf_counter() - started) * 1000)
            assert snap.up and not snap.errors, snap.errors
        registry = CollectorRegistry()
        registry.register(collector)
        started = time.perf_counter()
        text = generate_latest(registry)
        scrape_ms = (time.perf_counter() - started) * 1000
        series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
        return {"models": models, "poll_ms": round(statistics.median(times), 1), "poll_ms_max": round(max(times), 1),
                "scrape_ms": round(scrape_ms, 1), "series": series, "rss_mb": round(_rss_mb(), 1)}
    finally:
        collector.close()


def run_one(models: int) -> dict:
    from inferwatch.testing.process import free_port, http_ok

    if models == 1:
        from inferwatch.testing.triton import start_triton

        with tempfile.TemporaryDirectory() as tmp:
            server = start_triton(Path(tmp), extra_args=["--model-control-mode=explicit", "--load-model=classifier"],
                                  ready_path="/v2/health/ready")
            try:
                return measure(server.url, server.metrics_url, 1)
            finally:
                server.stop()
    port = free_port()
    replay = subprocess.Popen([sys.executable, str(HERE / "triton_replay.py"), "--models", str(models),
                               "--port", str(port)])
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            if http_ok(base + "/v2/health/live"):
                break
            time.sleep(0.1)
        return measure(base, base + "/metrics", models)
    finally:
        replay.terminate()
        replay.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description="Triton collector poll time and memory per model count")
    p.add_argument("--sizes", default="1,100,500")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.one)), flush=True)
        return 0
    for size in (int(s) for s in args.sizes.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(size)], capture_output=True, text=True,
                             check=True)
        print(out.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
