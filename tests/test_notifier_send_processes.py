"""`notifier.send_processes`: channel sends run in a pool of processes; every layer still reaches its
channel, a send process that dies costs one retry, not the channel, and the pool leaves with a notifier
killed by SIGKILL (20 kills in a row, at every moment of the pool's start: tests/test_process_lifetimes.py)."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import requests
import yaml

from inferwatch.notifier.senders import ProcessSender
from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, make_spec, notifier_process, spec_data, wait_for, webhook


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


def test_sends_in_processes_reach_every_channel_and_survive_a_killed_process(sims, tmp_path):
    sims.set_mode("ok")
    svc = NotifierService(make_spec(sims, send_processes=2, retry_initial="100ms", retry_max="200ms"),
                          tmp_path / "data", port=0).start()
    try:
        sender = svc.worker.sender
        assert isinstance(sender, ProcessSender)
        for name, layer in (("ProcL1", "L1"), ("ProcL2", "L2"), ("ProcL3", "L3")):
            assert requests.post(svc.url + "/alerts", json=webhook(name, layer, group=name), headers=AUTH,
                                 timeout=10).ok
        wait_for(lambda: any("ProcL1" in t for t in sims.pagerduty.texts())
                 and any("ProcL2" in t for t in sims.slack.texts())
                 and any("ProcL3" in t for t in sims.wecom.texts()), timeout=60, what="every layer delivered")
        pids = [p.pid for p in sender._pool._processes.values()]
        assert pids and os.getpid() not in pids
        os.kill(pids[0], signal.SIGKILL)  # e.g. the OOM killer
        assert requests.post(svc.url + "/alerts", json=webhook("AfterKill", "L2", group="after"), headers=AUTH,
                             timeout=10).ok
        wait_for(lambda: any("AfterKill" in t for t in sims.slack.texts()), timeout=60,
                 what="delivery through a new pool")
        assert svc.outbox.counts()["dead"] == 0
    finally:
        svc.stop()


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (send processes and multiprocessing's resource tracker)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _send_processes(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children() if "spawn_main" in " ".join(c.cmdline())]
    except psutil.Error:
        return []


def test_send_processes_leave_with_a_sigkilled_notifier(sims, tmp_path):
    sims.set_mode("ok")
    data = spec_data(sims, send_processes=2)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    with notifier_process(spec_file, tmp_path / "data", tmp_path / "stderr") as (proc, url):
        assert requests.post(url + "/alerts", json=webhook("KillParent", "L2", group="kp"), headers=AUTH,
                             timeout=10).ok
        wait_for(lambda: any("KillParent" in t for t in sims.slack.texts()), timeout=60, what="the delivery")
        # Both send processes, not any two children (the resource tracker is one): a second send process
        # missed here went unwatched.
        wait_for(lambda: len(_send_processes(proc.pid)) == 2, what="the pool's two send processes")
        children = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not [c for c in children if _running(c)], timeout=15,
                 what=f"the notifier's children {children} to exit with it")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child waits for its new parent to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
