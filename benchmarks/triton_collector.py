"""Benchmark: Triton collector poll time and memory for 1, 100 and 500 models, and requests per poll.

1 model: the real tritonserver serving only `classifier` (explicit model control; its two versions).
100 / 500 models: the replay server (triton_replay.py) built from answers captured from the real Triton.
Each size runs in a fresh child process so RSS is that size's alone. Prints one JSON line per size:
{"models": N, "poll_ms": median of 10 polls, "poll_ms_max": ..., "rss_mb": RSS after the polls,
 "series": samples served}.

Then the final line compares the API requests one poll costs Triton at the largest replay size, counted by
the replay server itself, in the same run: "before" reads every model's configuration every poll
(`config_max_age` 0, the collector's behaviour before configurations were cached), "after" the default
(a configuration read again only when the model's versions or states change, and after `--config-max-age`).
"After" runs a whole max-age cycle on a compressed clock (interval 0.2 s, max age 12 s: the same 1:60 ratio as
the defaults 10 s and 10 min), so the spread-out refreshes for age are included in its average.
Run: `python benchmarks/triton_collector.py [--sizes 1,100,500]`.
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


def requests_per_poll(base: str, models: int) -> dict:
    """Requests the replay server saw per poll: every config every poll vs the default cache (module doc)."""
    import requests

    from inferwatch.exporters.triton.collector import TritonCollector
    from inferwatch.exporters.triton.reader import TargetConfig

    def served() -> int:
        return requests.get(base + "/replay/requests", timeout=10).json()["requests"]

    def run(max_age: float, polls: int, interval: float) -> tuple[int, float]:
        collector = TritonCollector([TargetConfig("bench", base, base + "/metrics")], timeout=10,
                                    interval=interval, config_max_age=max_age)
        try:
            start = served()
            collector.poll_once()
            first = served() - start
            start = served()
            for _ in range(polls):
                begun = time.monotonic()
                snap = collector.poll_once()[0]
                assert snap.up and not snap.errors, snap.errors
                time.sleep(max(0.0, interval - (time.monotonic() - begun)))
            return first, (served() - start) / polls
        finally:
            collector.close()

    first_before, before = run(0, POLLS, 0.2)
    first_after, after = run(12.0, 70, 0.2)  # 14 s: more than one 12 s max-age cycle
    return {"models": models, "first_poll_requests": first_after, "requests_per_poll_before": round(before, 1),
            "requests_per_poll_after": round(after, 1), "requests_per_s_at_10s_before": round(before / 10, 2),
            "requests_per_s_at_10s_after": round(after / 10, 2), "after_to_before": round(after / before, 4)}


def run_one(models: int, count_requests: bool = False) -> dict:
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
        if count_requests:
            return requests_per_poll(base, models)
        return measure(base, base + "/metrics", models)
    finally:
        replay.terminate()
        replay.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description="Triton collector poll time and memory per model count")
    p.add_argument("--sizes", default="1,100,500")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--requests", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.one)), flush=True)
        return 0
    if args.requests is not None:
        print(json.dumps(run_one(args.requests, count_requests=True)), flush=True)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        out = subprocess.run([sys.executable, __file__, "--one", str(size)], capture_output=True, text=True,
                             check=True)
        print(out.stdout.strip().splitlines()[-1], flush=True)
    largest = max((s for s in sizes if s > 1), default=500)
    out = subprocess.run([sys.executable, __file__, "--requests", str(largest)], capture_output=True, text=True,
                         check=True)
    print(out.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
