"""Servers started in the background and stopped hold no open file afterwards, without the garbage collector.

A loop stopped but not closed keeps an epoll descriptor and a socket pair until the collector happens to break
its reference cycles; a channel's kept-alive connection stays open as long as its session. Over a test session
(or a long-running service) such leftovers piled up past 1,024 open files, where select() fails. Each row starts
and stops one kind of background server ROUNDS times with the collector off and asserts the process holds no
more descriptors than before. Breaking it once: without `close_stopped_loop` in RoundRobinProxy.close the
"tcp proxy" row fails with 11 more open files (per round an epoll and its self-pipe pair, and sockets the
unclosed loop still held); before Outbox.close_all the "notifier after a delivery" row failed with 36 more (the
outbox database, -wal, -shm of each thread and the ledger).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time

import pytest
import requests
from aiohttp import web

from gateway_support import OpenAIUpstream, RunningProxy
from inferwatch.exporters.triton.collector import TritonCollector
from inferwatch.exporters.triton.reader import TargetConfig
from inferwatch.httpserver import BoundedServer
from inferwatch.loops import close_stopped_loop
from inferwatch.notifier.service import NotifierService
from inferwatch.spec import spec_from_dict
from inferwatch.testing.channels import ProviderSimulators
from inferwatch.testing.tcpproxy import RoundRobinProxy
from notifier_support import AUTH, spec_data, wait_for, webhook

ROUNDS = 3


def _fds() -> dict[int, str]:
    """{descriptor: what it is} of this process (a path, socket:[inode], pipe:[inode], anon_inode:[eventpoll])."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return out


@contextlib.contextmanager
def _collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _bounded_server(sims, tmp_path, i):
    server = BoundedServer(web.Application(), "127.0.0.1", 0, name=f"open-files-{i}").start()
    assert requests.get(f"http://127.0.0.1:{server.port}/", timeout=10).status_code == 404
    server.stop()


def _tcp_proxy(sims, tmp_path, i):
    with RoundRobinProxy([("127.0.0.1", sims.port)]) as proxy:
        assert requests.get(f"http://127.0.0.1:{proxy.port}/", timeout=10).status_code == 404


def _provider_simulators(sims, tmp_path, i):
    with ProviderSimulators() as other:
        assert requests.get(other.slack_url, timeout=10).status_code in (404, 405)


def _triton_collector(sims, tmp_path, i):
    base = f"http://127.0.0.1:{sims.port}"
    TritonCollector([TargetConfig("t", base, base + "/metrics")], timeout=2).close()


def _gateway_proxy(sims, tmp_path, i):
    upstream = OpenAIUpstream()
    try:
        proxy = RunningProxy(upstream.url)
        proxy.stop()
    finally:
        upstream.stop()


def _notifier_delivering(sims, tmp_path, i):
    """A notifier that delivered through a kept-alive connection to Slack: it closes that connection too."""
    svc = NotifierService(spec_from_dict(spec_data(sims)), tmp_path / f"data-{i}", port=0).start()
    try:
        before = len(sims.slack.received)
        r = requests.post(svc.url + "/alerts", json=webhook(f"OpenFiles{i}", "L2"), headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
        wait_for(lambda: len(sims.slack.received) > before, what="the Slack message")
    finally:
        svc.stop()


def _notifier_failing_to_start(sims, tmp_path, i):
    """A notifier whose port is taken: start() raises, and holds no file afterwards (its outbox neither)."""
    taken = BoundedServer(web.Application(), "127.0.0.1", 0, name=f"taken-{i}").start()
    try:
        svc = NotifierService(spec_from_dict(spec_data(sims)), tmp_path / f"data-failed-{i}", port=taken.port)
        with pytest.raises(OSError):
            svc.start()
    finally:
        taken.stop()


SERVERS = [
    ("bounded http server", _bounded_server),
    ("tcp proxy", _tcp_proxy),
    ("provider simulators", _provider_simulators),
    ("triton collector", _triton_collector),
    ("gateway proxy and its upstream", _gateway_proxy),
    ("notifier after a delivery", _notifier_delivering),
    ("notifier whose port is taken", _notifier_failing_to_start),
]


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


@pytest.mark.parametrize("start_and_stop", [s[1] for s in SERVERS], ids=[s[0] for s in SERVERS])
def test_a_stopped_background_server_leaves_no_open_file(sims, tmp_path, start_and_stop):
    start_and_stop(sims, tmp_path, 0)  # first use: imports, lazily built pools and caches stay for the process
    with _collector_off():
        before = _fds()
        for i in range(1, ROUNDS + 1):
            start_and_stop(sims, tmp_path, i)
        # A connection the other side closes leaves a moment later: wait for the count, not for a moment.
        deadline = time.monotonic() + 10
        while len(now := _fds()) > len(before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(now) <= len(before), (f"{len(now) - len(before)} more open files after {ROUNDS} rounds: "
                                         f"{ {fd: what for fd, what in now.items() if before.get(fd) != what} }")


def test_closing_a_loop_whose_thread_still_runs_is_refused_without_raising():
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    wait_for(loop.is_running, timeout=10, what="the loop running")
    assert close_stopped_loop(loop, thread) is False and not loop.is_closed()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    assert close_stopped_loop(loop, thread) is True and loop.is_closed()
    assert close_stopped_loop(None, None) is False
