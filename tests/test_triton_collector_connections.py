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

from connection_attack import FD_LIMIT, SLOW_LORIS, scrape_under_attack, service_process, summary
from inferwatch.connections import FD_RESERVE, connection_cap
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
        assert figures["ok"] == figures["scrapes"], figures["failures"]   # every scrape: 200, Triton up
        assert figures["reopened"] > 0  # the attack really was over the cap: the collector closed idle ones
        lifetimes = figures["slow_loris_lifetimes"]
        assert all(t is not None for t in lifetimes), lifetimes  # every slow-loris connection was closed...
        assert min(lifetimes) >= HEADER_TIMEOUT_S - 1             # ...after the header timeout, not at once
        # Bounded: no thread per connection (the render pool's 2 threads may start); descriptors within the
        # cap plus its reserve, so accept() never meets the fd limit.
        assert figures["max_threads"] <= figures["threads_before"] + 2, figures
        assert figures["max_fds"] < min(FD_LIMIT, figures["fds_before"] + cap + FD_RESERVE), figures
        closed = _series(_metrics(port), "inferwatch_triton_collector_http_connections_closed_total")
        assert closed[(("reason", "connection_cap"),)] > 0
        assert closed[(("reason", "header_timeout"),)] >= SLOW_LORIS
        # The collector kept polling Triton through the attack.
        assert _last_poll(port) > polled_before
    log = stderr_path.read_text()
    assert "Traceback" not in log and "out of system resource" not in log, log[-3000:]
    cap_lines = [ln for ln in log.splitlines() if "connection cap reached" in ln]
    assert 1 <= len(cap_lines) <= 2 and "--max-connections" in cap_lines[0], cap_lines  # once a minute
    header_lines = [ln for ln in log.splitlines() if "sent no complete request" in ln]
    assert 1 <= len(header_lines) <= 2 and "--header-timeout" in header_lines[0], header_lines


@pytest.mark.parametrize("argv, flag", [
    (["--max-connections", "0"], "--max-connections"),
    (["--header-timeout", "0s"], "--header-timeout"),
    (["--idle-timeout", "0"], "--idle-timeout"),
])
def test_bad_bounds_exit_2_naming_the_flag(argv, flag):
    proc = subprocess.run([sys.executable, "-m", "inferwatch.cli", "exporter", "triton", "--triton-url",
                           "http://127.0.0.1:1", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(f"inferwatch: error: {flag}"), proc.stderr
