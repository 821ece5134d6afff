"""`--workers N`: proxy processes sharing the port, one /metrics summed over them (exporters/gateway/workers.py).

The real CLI process with two workers in front of a scripted upstream: every metered request is counted
once whichever worker took it (new connection each, so the kernel spreads them), in-flight returns to 0,
the usage log has one line per request; a worker that dies stops the gateway with exit code 1 and a log
line; SIGTERM stops it cleanly and removes its metric files; after a SIGKILL (no cleanup) the next gateway
counts from zero and removes the dead run's files (a table of what the sweep keeps and removes)."""

from __future__ import annotations

import concurrent.futures
import fcntl
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from gateway_support import GatewayProcess, Script, ScriptedUpstream, wait_until
from inferwatch.exporters.gateway.workers import LOCK, PREFIX, sweep_stale_directories

CHAT = "/v1/chat/completions"
EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'] * 5 + [
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"]


def workers_of(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def start(tmp_path, up) -> GatewayProcess:
    (tmp_path / "tmp").mkdir(exist_ok=True)
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


def _request(gw: GatewayProcess) -> int:
    with requests.post(gw.url + CHAT, json={"model": "gpt-test", "stream": True}, timeout=30,
                       headers={"X-Tenant-ID": "acme", "X-Script": "acme", "Connection": "close"}) as r:
        assert r.content is not None  # read the whole answer
        return r.status_code


def test_a_restart_after_sigkill_counts_from_zero_and_removes_the_dead_runs_files(tmp_path):
    up = ScriptedUpstream()
    up.scripts["acme"] = Script(EVENTS)
    labels = {"tenant": "acme", "model": "gpt-test", "tier": "other", "code": "200", "outcome": "ok"}
    gw = start(tmp_path, up)
    again = None
    try:
        assert [_request(gw) for _ in range(3)] == [200] * 3
        wait_until(lambda: gw.value("gateway_requests_total", **labels) == 3, what="3 requests counted")
        [dead] = list((tmp_path / "tmp").iterdir())
        workers = workers_of(gw.pid)
        os.kill(gw.pid, signal.SIGKILL)  # no cleanup runs: its directory stays
        assert gw.process.proc.wait(timeout=20) == -signal.SIGKILL
        wait_until(lambda: not any(Path(f"/proc/{w}").exists() for w in workers), what="its workers gone")
        assert dead.exists() and any(dead.glob("*.db"))
        again = start(tmp_path, up)
        assert _request(again) == 200
        wait_until(lambda: again.value("gateway_requests_total", **labels) == 1, what="the new run's request")
        assert again.snapshot().value("gateway_requests_total", **labels) == 1  # not 4: no dead run's counts
        assert not dead.exists()
        assert len(list((tmp_path / "tmp").iterdir())) == 1  # the new run's own, nothing growing
        assert f"removed the metric files a killed gateway left in {dead}" in again.output()
    finally:
        gw.stop()
        if again is not None:
            again.stop()
        up.stop()


def _locked(d: Path, held: list) -> None:
    (d / LOCK).touch()
    fd = os.open(d / LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: conflicts like another process's
    held.append(fd)


def _lock_free(d: Path, held: list) -> None:
    (d / LOCK).touch()
    (d / "counter_123.db").write_bytes(b"x" * 4096)


def _unlocked_old(d: Path, held: list) -> None:
    (d / "counter_123.db").write_bytes(b"x")
    old = time.time() - 120
    os.utime(d, (old, old))


def _unlocked_new(d: Path, held: list) -> None:
    pass


# (entry name, how it is made, removed). The case: a directory whose gateway was SIGKILLed.
SWEEP_ROWS = [
    (PREFIX + "live", _locked, False),             # a running gateway holds its lock
    (PREFIX + "killed", _lock_free, True),         # its gateway gone: the kernel released the lock
    (PREFIX + "old", _unlocked_old, True),         # killed between creating and locking, or an older gateway
    (PREFIX + "starting", _unlocked_new, False),   # another gateway creating its directory now
    ("something-else", _lock_free, False),         # not a gateway's
]


@pytest.mark.parametrize("name, make, removed", SWEEP_ROWS, ids=[r[0] for r in SWEEP_ROWS])
def test_the_sweep_removes_only_directories_of_gone_gateways(tmp_path, name, make, removed):
    held: list = []
    d = tmp_path / name
    d.mkdir()
    try:
        make(d, held)
        assert sweep_stale_directories(str(tmp_path)) == ([str(d)] if removed else [])
        assert d.exists() is not removed
    finally:
        for fd in held:
            os.close(fd)


def test_the_sweep_follows_no_link_and_skips_files(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / LOCK).touch()
    base = tmp_path / "base"
    base.mkdir()
    (base / (PREFIX + "link")).symlink_to(outside, target_is_directory=True)
    (base / (PREFIX + "file")).write_text("x")
    assert sweep_stale_directories(str(base)) == []
    assert (outside / LOCK).exists() and (base / (PREFIX + "file")).exists()
