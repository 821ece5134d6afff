"""The collector never reads a whole answer without bound: a 200 MB repository index and a 200 MB statistics
answer (one streamed without Content-Length, one announced) are refused at the answer limit, counted under
their own cause, and the collector's memory grows by about the limit, not by the answer (measured and
printed)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from inferwatch.exporters.triton.answers import DEFAULT_MAX_ANSWER_BYTES
from inferwatch.testing.process import ManagedProcess, free_port, http_ok

ROOT = Path(__file__).resolve().parents[1]
HUGE = 200_000_000
# Stated bound (docs/triton-collector.md#every-answer-has-a-size-limit): one answer costs at most the limit plus
# one 64 KiB chunk, plus the interpreter's own slack; 16 MiB of slack covers allocator rounding and aiohttp's read
# buffers.
SLACK_BYTES = 16 * 1024 * 1024

CHILD = """
import json, sys
from inferwatch.exporters.triton.collector import TritonCollector
from inferwatch.exporters.triton.reader import TargetConfig

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

base = sys.argv[1]
collector = TritonCollector([TargetConfig("big", base, base + "/metrics")], timeout=30)
try:
    before = kib("VmHWM")
    snap = collector.poll_once(timeout=120)[0]
    after = kib("VmHWM")
finally:
    collector.close()
print(json.dumps({"peak_growth_bytes": (after - before) * 1024, "up": snap.up,
                  "errors": sorted({(e.endpoint, e.cause) for e in snap.errors}),
                  "details": [e.detail for e in snap.errors]}))
"""


def test_a_200_mb_index_and_stats_answer_are_refused_within_the_memory_bound(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    replay = ManagedProcess(
        "triton-replay", [sys.executable, str(ROOT / "benchmarks" / "triton_replay.py"), "--models", "10",
                          "--port", str(port), "--index-bytes", str(HUGE), "--stats-bytes", str(HUGE)],
        tmp_path / "replay.log", ready=lambda: http_ok(base + "/v2/health/live"))
    replay.start(timeout=60)
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, base], capture_output=True, text=True, timeout=180)
    finally:
        replay.stop()
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    growth = result["peak_growth_bytes"]
    print(f"\n200 MB answers, limit {DEFAULT_MAX_ANSWER_BYTES / 2**20:.0f} MiB: collector peak RSS grew "
          f"{growth / 2**20:.1f} MiB (bound {(DEFAULT_MAX_ANSWER_BYTES + SLACK_BYTES) / 2**20:.0f} MiB)")
    assert result["up"] is True
    assert result["errors"] == [["index", "too_large"], ["stats", "too_large"]]
    assert any("announced" in d for d in result["details"])  # the stats answer was refused at its headers
    assert growth <= DEFAULT_MAX_ANSWER_BYTES + SLACK_BYTES


def test_impossible_statistics_drop_only_those_models_and_are_counted(tmp_path, caplog):
    """Every model's statistics carry a negative count: their statistics are dropped (never exported), each
    counted as a bad answer, logged once; states and configurations of the same models are unaffected."""
    from inferwatch.exporters.triton.collector import TritonCollector
    from inferwatch.exporters.triton.reader import TargetConfig

    capture = json.loads((ROOT / "benchmarks" / "data" / "triton_capture.json").read_text())
    capture["model_stat"]["inference_stats"]["fail"] = {"count": "-1", "ns": "0"}
    bad = tmp_path / "capture.json"
    bad.write_text(json.dumps(capture))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    replay = ManagedProcess(
        "triton-replay", [sys.executable, str(ROOT / "benchmarks" / "triton_replay.py"), "--models", "3",
                          "--port", str(port), "--capture", str(bad)],
        tmp_path / "replay.log", ready=lambda: http_ok(base + "/v2/health/live"))
    replay.start(timeout=60)
    collector = TritonCollector([TargetConfig("r", base, base + "/metrics")], timeout=10)
    caplog.set_level(logging.WARNING)
    try:
        snap = collector.poll_once(timeout=60)[0]
        collector.poll_once(timeout=60)
    finally:
        collector.close()
        replay.stop()
    assert snap.stats == {}
    assert [(e.endpoint, e.cause, e.detail) for e in snap.errors] == [
        ("stats", "bad_response", f"'model_{i:04d}' version '2': fail.count: -1 is outside uint64") for i in range(3)]
    assert collector.poll_errors()[("r", "stats", "bad_response")] == 6  # 3 models x 2 polls
    assert len(snap.configs) == 3 and all(m.state == "READY" for m in snap.models)
    logged = [r.getMessage() for r in caplog.records if "stats call for model 'model_" in r.getMessage()
              and "failed (bad_response)" in r.getMessage()]
    assert len(logged) == 3  # one line per model when it starts failing, not one per poll
