"""`notifier.send_processes`: channel sends run in a pool of processes; every layer still reaches its
channel, and a send process that dies costs one retry, not the channel."""

from __future__ import annotations

import os
import signal

import pytest
import requests

from inferwatch.notifier.senders import ProcessSender
from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators

from notifier_support import AUTH, make_spec, wait_for, webhook


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
