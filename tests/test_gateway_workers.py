"""`--workers N`: proxy processes sharing the port, one /metrics summed over them (exporters/gateway/workers.py).

The real CLI process with two workers in front of a scripted upstream: every metered request is counted
once whichever worker took it (new connection each, so the kernel spreads them), in-flight returns to 0,
the usage log has one line per request; a worker that dies stops the gateway with exit code 1 and a log
line; SIGTERM stops it cleanly and removes its metric files."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from pathlib import Path

import requests

from gateway_support import GatewayProcess, Script, ScriptedUpstream, wait_until

CHAT = "/v1/chat/completions"
EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'] * 5 + [
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"]


def workers_of(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def start(tmp_path, up) -> GatewayProcess:
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))  # where the gateway keeps its metric files
    return GatewayProcess(up.url, {"tenants": ["acme"], "models": ["gpt-test"]}, tmp_path,
                          extra_args=("--workers", "2"), env=env)


def test_two_workers_count_every_request_once_and_stop_cleanly(tmp_path):
    up = ScriptedUpstream()
    up.scripts["acme"] = Script(EVENTS)
    gw = start(tmp_path, up)
    try:
        assert len(workers_of(gw.pid)) == 2
        n = 24

        def one(_):
            with requests.post(gw.url + CHAT, json={"model": "gpt-test", "stream": True}, timeout=30,
                               headers={"X-Tenant-ID": "acme", "X-Script": "acme", "Connection": "close"}) as r:
                return r.status_code, r.content

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(one, range(n)))
        assert answers == [(200, b"".join(EVENTS))] * n
        labels = {"tenant": "acme", "model": "gpt-test", "tier": "other"}
        wait_until(lambda: gw.value("gateway_requests_total", **labels, code="200", outcome="ok") == n,
                   what=f"{n} requests summed over the workers")
        assert gw.value("gateway_tokens_total", **labels, type="output") == 5 * n
        assert gw.value("gateway_time_to_first_token_seconds_count", **labels) == n
        assert gw.value("gateway_time_per_output_chunk_seconds_count", **labels) == 4 * n
        assert gw.value("gateway_requests_in_flight", **labels) == 0
        assert gw.value("gateway_workers") == 2
        assert gw.value("process_cpu_seconds_total") > 0
        assert len(gw.usages(tenant="acme", outcome="ok")) == n
        assert len(list((tmp_path / "tmp").iterdir())) == 1  # the metric files' directory
        os.kill(gw.pid, signal.SIGTERM)
        assert gw.process.proc.wait(timeout=20) == 0
        assert list((tmp_path / "tmp").iterdir()) == []
    finally:
        gw.stop()
        up.stop()


def test_a_dead_worker_stops_the_gateway_with_exit_code_1(tmp_path):
    up = ScriptedUpstream()
    gw = start(tmp_path, up)
    try:
        victim = workers_of(gw.pid)[0]
        os.kill(victim, signal.SIGKILL)
        assert gw.process.proc.wait(timeout=20) == 1
        out = gw.output()
        assert f"gateway worker (pid {victim}) exited (signal SIGKILL)" in out
        assert list((tmp_path / "tmp").iterdir()) == []  # its metric files went with it
    finally:
        gw.stop()
        up.stop()
