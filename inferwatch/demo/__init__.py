"""`inferwatch demo`: start the real stack on loopback, drive traffic, show live figures from Prometheus.

Starts the real Triton (from nvidia-pytriton) with the example model repository and a real Prometheus
scraping it, sends batched `classifier` and streamed `toy_llm` traffic, and prints request rate and average
queue time per model as Prometheus computes them, so every figure shown went through the real chain.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

from inferwatch.stack.prometheus import start_prometheus, write_config
from inferwatch.stack.triton import start_triton
from inferwatch.traffic import TrafficLoop, infer_classifier, stream_toy_llm

log = logging.getLogger(__name__)

RATE_EXPR = 'sum by (model) (rate(nv_inference_request_success[10s]))'
QUEUE_EXPR = ('sum by (model) (rate(nv_inference_queue_duration_us[10s])) / 1e6 '
              '/ sum by (model) (rate(nv_inference_request_success[10s]))')


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run Triton + Prometheus on loopback with traffic and show live figures",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of traffic (default 60)")
    p.add_argument("--keep-running", action="store_true",
                   help="after the traffic, keep the services up until Ctrl-C (to open the Prometheus UI)")
    p.add_argument("--workdir", default=".demo", help="folder for logs and data (default .demo, wiped first)")
    p.set_defaults(func=run)


def _fmt(result: list[dict], scale: float = 1.0, unit: str = "") -> str:
    parts = []
    for sample in sorted(result, key=lambda s: s["metric"].get("model", "")):
        value = float(sample["value"][1])
        shown = "n/a" if value != value else f"{value * scale:.2f}{unit}"
        parts.append(f"{sample['metric'].get('model', '?')}={shown}")
    return ", ".join(parts) or "(no data yet)"


def run(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    print(f"inferwatch demo: logs and data in {workdir}", flush=True)
    print("starting Triton (real tritonserver 2.51 from nvidia-pytriton, CPU) ...", flush=True)
    triton = start_triton(workdir)
    prometheus = None
    loops: list[TrafficLoop] = []
    try:
        print(f"  Triton HTTP {triton.url}, metrics {triton.metrics_url}", flush=True)
        config = write_config(workdir / "prometheus.yml", [
            {"job_name": "triton", "static_configs": [{"targets": [triton.metrics_address]}]},
        ], scrape_interval="2s", evaluation_interval="2s")
        print("starting Prometheus ...", flush=True)
        prometheus = start_prometheus(workdir, config)
        print(f"  Prometheus {prometheus.url}", flush=True)
        loops = [
            TrafficLoop("classifier", lambda: infer_classifier(triton.url, batch=2), rate_per_s=20).start(),
            TrafficLoop("toy_llm", lambda: stream_toy_llm(triton.url, max_tokens=12), rate_per_s=4).start(),
        ]
        print(f"sending traffic for {args.duration:.0f}s: classifier 20 req/s (batch 2), toy_llm 4 streams/s",
              flush=True)
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            rate = prometheus.query(RATE_EXPR)
            queue = prometheus.query(QUEUE_EXPR)
            sent = ", ".join(f"{loop.name} sent={loop.stats.sent} failed={loop.stats.failed}" for loop in loops)
            print(f"[{time.strftime('%H:%M:%S')}] Prometheus: requests/s {_fmt(rate)} | "
                  f"avg queue {_fmt(queue, 1000, ' ms')} | client: {sent}", flush=True)
        for loop in loops:
            loop.stop()
        loops = []
        if args.keep_running:
            print(f"services keep running: Prometheus {prometheus.url}, Triton {triton.url}. Ctrl-C to stop.",
                  flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        for loop in loops:
            loop.stop()
        if prometheus:
            prometheus.stop()
        triton.stop()
        print("demo stopped: every process it started is gone.", flush=True)
    return 0
