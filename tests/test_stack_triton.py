"""`inferwatch stack triton`: the virtual environment's tritonserver serving the example repository, started the
way docs/own-stack.md#use-it-with-your-own-triton-and-prometheus tells a user to (a real Triton, on loopback ports)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from inferwatch.testing.process import free_port

INFERWATCH = [sys.executable, "-m", "inferwatch"]


def _wait_ready(process: subprocess.Popen, url: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"inferwatch stack triton exited with {process.returncode}: {process.stdout.read()[-3000:]}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} not ready within {timeout:.0f} s")


def test_stack_triton_serves_the_example_repository(tmp_path):
    http, grpc, metrics = free_port(), free_port(), free_port()
    process = subprocess.Popen(
        INFERWATCH + ["stack", "triton", "--http-port", str(http), "--grpc-port", str(grpc),
                      "--metrics-port", str(metrics), "--workdir", str(tmp_path / "work"),
                      # Passed through to tritonserver: the Python backend stubs can take Triton's whole
                      # default exit timeout (30 s) to stop.
                      "--", "--exit-timeout-secs=5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_ready(process, f"http://127.0.0.1:{http}/v2/health/ready")
        index = requests.post(f"http://127.0.0.1:{http}/v2/repository/index", timeout=10).json()
        assert {(m["name"], m["state"]) for m in index} >= {("classifier", "READY"), ("toy_llm", "READY")}
        body = requests.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        assert 'nv_inference_count{model="classifier"' in body
        # Summaries are on, as the P95 rules need (they appear with the first request).
        reply = requests.post(f"http://127.0.0.1:{http}/v2/models/toy_llm/generate",
                              json={"text_input": "hello", "max_tokens": 2}, timeout=30)
        assert reply.status_code == 200, reply.text
        body = requests.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        assert "nv_inference_queue_summary_us" in body
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        # Backend stubs left in the session must not outlive the test (they also hold the output pipe open).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output = process.stdout.read()
    # It exec'd into tritonserver: the SIGTERM reached Triton itself, which shut down on its own (exit 0, or 1
    # when a backend stub outlives --exit-timeout-secs), not killed by a signal.
    assert process.returncode in (0, 1), output[-3000:]
    assert output.startswith("inferwatch: starting tritonserver on ")
    assert "All models are stopped" in output, output[-3000:]


@pytest.mark.parametrize("argv,message", [
    (["--model-repository", "/nonexistent/models"], "--model-repository: not a directory: /nonexistent/models"),
    (["--http-port", "9000", "--grpc-port", "9000"], "ports must differ"),
    (["--metrics-interval-ms", "0"], "--metrics-interval-ms: expected at least 1"),
    (["--http-port", "70000"], "expected a port number 1-65535"),
])
def test_stack_triton_bad_arguments_exit_2_with_one_line(argv, message):
    result = subprocess.run(INFERWATCH + ["stack", "triton", *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
