"""Connection exhaustion: idle and slow-loris sockets cannot keep Prometheus from scraping the GPU exporter.

The attack: the real `inferwatch exporter gpu --nvml sim` process with 1,024 file descriptors, 1,100 idle TCP
connections held open (reopened as soon as the exporter closes one) and 5 slow-loris connections sending a
request head a line a second. Scrapes during the attack must all succeed; the exporter's threads and
descriptors stay bounded (printed); the slow-loris connections are closed after the header timeout; the log
gets one line per condition, no traceback. Also: the idle timeout closes a kept-alive connection, the flags
are checked.
"""

from __future__ import annotations

import socket
import sys

import pytest
import requests

from connection_attack import (
    FD_LIMIT,
    SLOW_LORIS,
    assert_held,
    assert_logged_once_per_condition,
    closed_within,
    scrape_under_attack,
    service_process,
    summary,
)
from gpu_support import FakeClock, samples, wait_until
from inferwatch.cli import UsageError, build_parser
from inferwatch.connections import connection_cap
from inferwatch.exporters.gpu.collector import GpuCollector
from inferwatch.exporters.gpu.scenario import parse_scenario
from inferwatch.exporters.gpu.server import MetricsServer
from inferwatch.exporters.gpu.sim import SimNvml
from inferwatch.httpserver import Bounds, bounds_from_args
from inferwatch.testing.process import free_port, http_ok

HEADER_TIMEOUT_S = 2


def _exporter_process(stderr_path, port: int):
    argv = [sys.executable, "-m", "inferwatch.cli", "exporter", "gpu", "--nvml", "sim", "--port", str(port),
            "--interval", "1s", "--header-timeout", f"{HEADER_TIMEOUT_S}s"]
    return service_process(argv, stderr_path, lambda: http_ok(f"http://127.0.0.1:{port}/"))


def _counter(text: str, name: str, reason: str) -> float:
    return sum(s.value for s in samples(text, name) if s.labels.get("reason") == reason)


def test_scrapes_succeed_while_1100_idle_and_slow_loris_connections_hold_a_1024_fd_exporter(tmp_path):
    stderr_path = tmp_path / "exporter.stderr"
    port = free_port()
    with _exporter_process(stderr_path, port) as proc:
        figures = scrape_under_attack(proc.pid, "127.0.0.1", port, "/metrics", "inferwatch_gpu_up")
        cap = connection_cap(Bounds().max_connections, FD_LIMIT)
        print(summary("GPU exporter", figures, cap))
        assert_held(figures, cap, HEADER_TIMEOUT_S)
        # The connection counters are rendered with the next collection (1s): wait for it, not for a second.
        name = "inferwatch_gpu_exporter_http_connections_closed_total"

        def counted() -> bool:
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            return _counter(text, name, "connection_cap") > 0 and _counter(text, name, "header_timeout") >= SLOW_LORIS

        wait_until(counted, f"{name} to count the cap's closes and {SLOW_LORIS} header timeouts", limit_s=30)
    assert_logged_once_per_condition(stderr_path.read_text())


@pytest.fixture
def served():
    clock = FakeClock()
    sim = SimNvml(parse_scenario({"gpus": 1}), clock=clock)
    collector = GpuCollector(sim, "node-a", wall=clock, monotonic=clock)
    collector.collect_once()
    server = MetricsServer.for_collector(collector, "127.0.0.1", 0, sim,
                                         bounds=Bounds(header_timeout_s=1, idle_timeout_s=1.5)).start()
    yield collector, server
    server.stop()


def test_kept_alive_scrape_connection_is_closed_after_the_idle_timeout_not_before(served):
    collector, server = served
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(10)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")   # answered; kept alive (HTTP/1.1)
        waited = closed_within(s, 10)
    assert waited is not None and waited >= 0.5  # closed by the 1.5 s idle timeout, not at once
    collector.collect_once()
    text = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    assert _counter(text, "inferwatch_gpu_exporter_http_connections_closed_total", "idle_timeout") == 1


def test_a_request_head_that_never_ends_is_closed_after_the_header_timeout(served):
    collector, server = served
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")   # and nothing more
        assert closed_within(s, 10) is not None
    collector.collect_once()
    text = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    assert _counter(text, "inferwatch_gpu_exporter_http_connections_closed_total", "header_timeout") == 1


@pytest.mark.parametrize("argv, flag", [
    (["--max-connections", "8"], "--max-connections"),
    (["--header-timeout", "0s"], "--header-timeout"),
    (["--idle-timeout", "soon"], "--idle-timeout"),
])
def test_bad_bounds_are_usage_errors_naming_the_flag(argv, flag):
    args = build_parser().parse_args(["exporter", "gpu", *argv])
    with pytest.raises(UsageError, match=flag):
        bounds_from_args(args)


def test_bounds_from_flags_and_defaults():
    assert bounds_from_args(build_parser().parse_args(["exporter", "gpu"])) == Bounds(512, 10.0, 120.0)
    args = build_parser().parse_args(["exporter", "gpu", "--max-connections", "64", "--header-timeout", "3s",
                                      "--idle-timeout", "2m"])
    assert bounds_from_args(args) == Bounds(64, 3.0, 120.0) and bounds_from_args(args).max_connections == 64


@pytest.mark.parametrize("request_bytes", [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,            # a TLS hello on the plain port
    b"GET /metrics HTTP/1.1\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",          # a header line over 8190 bytes
    b"GARBAGE\r\n\r\n",
])
def test_malformed_requests_get_400_and_one_log_line_without_traceback(served, caplog, request_bytes):
    _, server = served
    caplog.set_level("DEBUG")
    answers = []
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(request_bytes)
            s.settimeout(10)
            answers.append(s.recv(4096).split(b"\r\n", 1)[0].split(b" ", 1)[1])   # status, any HTTP version
    assert answers == [b"400 Bad Request"] * 5
    refused = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(refused) == 1 and refused[0].exc_info is None, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.exc_info or r.levelname == "ERROR"]
    assert requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).status_code == 200
