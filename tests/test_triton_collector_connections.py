"""Connection exhaustion: idle and slow-loris sockets cannot keep Prometheus from scraping the Triton collector.

The attack: the real `inferwatch exporter triton` process polling the real Triton, with 1,024 file
descriptors, 1,100 idle TCP connections held open (reopened as soon as the collector closes one) and 5
slow-loris connections sending a request head a line a second. Scrapes during the attack must all succeed
and show the Triton up; the collector's threads and descriptors stay bounded (printed); the slow-loris
connections are closed after the header timeout; the log gets one line per condition, no traceback.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from connection_attack import (
    FD_LIMIT,
    SLOW_LORIS,
    assert_held,
    assert_logged_once_per_condition,
    scrape_under_attack,
    service_process,
    summary,
)
from inferwatch.connections import connection_cap
from inferwatch.httpserver import Bounds
from inferwatch.testing.process import free_port

HEADER_TIMEOUT_S = 2
CONCURRENCY = 16


def _series(text: str, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def _metrics(port: int) -> str:
    with contextlib.suppress(requests.RequestException):
        return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    return ""


def _last_poll(port: int) -> float:
    return max(_series(_metrics(port), "inferwatch_triton_last_poll_timestamp_seconds").values())


def _collector_process(triton_url: str, stderr_path, port: int):
    argv = [sys.executable, "-m", "inferwatch.cli", "exporter", "triton", "--triton-url", triton_url,
            "--no-spec-targets", "--port", str(port), "--interval", "1s", "--concurrency", str(CONCURRENCY),
            "--header-timeout", f"{HEADER_TIMEOUT_S}s"]
    # Ready once the first poll is in.
    return service_process(argv, stderr_path, lambda: "inferwatch_triton_up{" in _metrics(port))


def test_scrapes_succeed_while_1100_idle_and_slow_loris_connections_hold_a_1024_fd_collector(triton, tmp_path):
    stderr_path = tmp_path / "collector.stderr"
    label = f'triton="127.0.0.1:{triton.http_port}"'
    port = free_port()
    with _collector_process(triton.url, stderr_path, port) as proc:
        polled_before = _last_poll(port)
        figures = scrape_under_attack(proc.pid, "127.0.0.1", port, "/metrics", f"inferwatch_triton_up{{{label}}} 1.0")
        cap = connection_cap(Bounds().max_connections, FD_LIMIT, CONCURRENCY)
        print(summary("Triton collector", figures, cap))
        assert_held(figures, cap, HEADER_TIMEOUT_S)
        closed = _series(_metrics(port), "inferwatch_triton_collector_http_connections_closed_total")
        assert closed[(("reason", "connection_cap"),)] > 0
        assert closed[(("reason", "header_timeout"),)] >= SLOW_LORIS
        # The collector kept polling Triton through the attack.
        assert _last_poll(port) > polled_before
    assert_logged_once_per_condition(stderr_path.read_text())


@pytest.mark.parametrize("argv, flag", [
    (["--max-connections", "0"], "--max-connections"),
    (["--header-timeout", "0s"], "--header-timeout"),
    (["--idle-timeout", "0"], "--idle-timeout"),
])
def test_bad_bounds_exit_2_naming_the_flag(argv, flag):
    proc = subprocess.run([sys.executable, "-m", "inferwatch.cli", "exporter", "triton", "--triton-url",
                           "http://127.0.0.1:1", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(f"inferwatch: error: {flag}"), proc.stderr
