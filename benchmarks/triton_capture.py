"""Capture real Triton answers for the replay server: `python benchmarks/triton_capture.py`.

Starts the real tritonserver (examples/model_repository), sends a few classifier requests so batch_stats
are filled, and writes benchmarks/data/triton_capture.json with the answers the collector reads:
repository index, classifier config, classifier v2 statistics and classifier's lines of /metrics.
"""

from __future__ import annotations

import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from inferwatch.testing.triton import start_triton
from inferwatch.traffic import infer_classifier

OUT = Path(__file__).parent / "data" / "triton_capture.json"


def capture(url: str, metrics_url: str) -> dict:
    stats = requests.get(url + "/v2/models/classifier/versions/2/stats", timeout=10).json()
    metrics = requests.get(metrics_url, timeout=10).text
    return {
        "source": "tritonserver 2.51 (nvidia-pytriton 0.7.0), examples/model_repository",
        "index_entry": {"name": "classifier", "version": "2", "state": "READY"},
        "config": requests.get(url + "/v2/models/classifier/config", timeout=10).json(),
        "model_stat": stats["model_stats"][0],
        # HELP/TYPE lines once, then the per-model lines the replay copies per model.
        "metrics_header": [line for line in metrics.splitlines() if line.startswith("#")],
        "metrics_model_lines": [line for line in metrics.splitlines()
                                if 'model="classifier"' in line and 'version="2"' in line],
    }


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_triton(Path(tmp), ready_path="/v2/health/ready")
        try:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda _: infer_classifier(server.url, version="2"), range(64)))
            data = capture(server.url, server.metrics_url)
        finally:
            server.stop()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
