"""A full disk must not turn the notifier into a duplicate storm.

Alerts are stored while the channels are down; the outbox's filesystem fills up (a real one: a small tmpfs
mounted for the test when the test runs as root with mount rights; otherwise the notifier's file-size limit
is lowered to the outbox's current size, RLIMIT_FSIZE, which fails the same writes with EFBIG); the channels
come back. Each notification must reach its channel exactly once while the disk stays full (its "delivered"
cannot be written), with one log line, not a traceback per second; /-/ready answers 503 and the metrics say
why; once space is back, the held outcomes are written and nothing is sent again.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import signal
import subprocess
import time
from collections import Counter

import pytest
import requests
import yaml

from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, metric, notifier_process, spec_data, wait_for, webhook

FULL_FOR_S = 5.0  # how long the channels are up while the disk stays full


class TmpfsDisk:
    """A 4 MiB tmpfs at `path`; fill() writes a filler file until ENOSPC, free() deletes it."""

    kind = "tmpfs (4 MiB, filled until ENOSPC)"

    def __init__(self, path):
        self.path = path
        self.filler = path / "filler"

    def mount(self) -> bool:
        self.path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(self.path)],
                           capture_output=True, text=True)
        return r.returncode == 0

    def umount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)

    def fill(self, pid: int) -> None:
        with open(self.filler, "wb", buffering=0) as f:
            for chunk in (65536, 4096, 1):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc

    def free(self, pid: int) -> None:
        self.filler.unlink()

    def full_from_start(self):
        """A preexec_fn for a process started on this disk once fill() has filled it (nothing to do)."""
        return _ignore_sigxfsz


class FileSizeLimit:
    """Fallback without mount rights: the notifier's RLIMIT_FSIZE set to the outbox files' current size, so
    every write that grows them fails (EFBIG; SIGXFSZ is ignored in the child, as SQLite expects)."""

    kind = "RLIMIT_FSIZE at the outbox's current size (no mount rights)"

    def __init__(self, path):
        self.path = path

    def mount(self) -> bool:
        self.path.mkdir(parents=True, exist_ok=True)
        return True

    def umount(self) -> None:
        pass

    def fill(self, pid: int | None) -> None:
        if pid is None:  # a process started later: full_from_start() sets its limit
            return
        size = max(f.stat().st_size for f in self.path.iterdir() if f.is_file())
        # Soft limit only: a lowered hard limit could not be raised again without privileges.
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))

    def free(self, pid: int) -> None:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    def full_from_start(self):
        """A preexec_fn that starts a process with the limit at the outbox files' current size."""
        size = max(f.stat().st_size for f in self.path.iterdir() if f.is_file())

        def limit():
            _ignore_sigxfsz()
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
        return limit


@pytest.fixture
def disk(tmp_path):
    d = TmpfsDisk(tmp_path / "disk") if os.geteuid() == 0 else None
    if d is None or not d.mount():
        d = FileSizeLimit(tmp_path / "disk")
        d.mount()
    try:
        yield d
    finally:
        d.umount()


def _ignore_sigxfsz():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def sent_per_alert(sims) -> Counter:
    """Messages each test alert produced at its channel (names are unique per delivery)."""
    counts: Counter = Counter()
    for text in sims.pagerduty.texts() + sims.slack.texts() + sims.wecom.texts():
        for name in set(re.findall(r"DiskFull(?:L[123])No\d+", text)):
            counts[name] += 1
    return counts


@pytest.fixture
def sims():
    with ProviderSimulators() as s:
        yield s


def test_full_disk_sends_each_message_once_with_one_log_line_and_not_ready(disk, sims, tmp_path):
    data = spec_data(sims, retry_initial="300ms", retry_max="1s")
    for channel in data["channels"].values():  # the provider quotas are not what is tested here
        channel.update(rate_limit=6000, rate_window="1m")
    sims.wecom.LIMIT_PER_MINUTE = 6000
    data["routes"] = [{"match": {"layer": "L1"}, "receivers": ["phone"]},
                      {"match": {"layer": "L2"}, "receivers": ["oncall-slack"]},
                      {"match": {"layer": "L3"}, "receivers": ["llm-wecom"]}]
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    stderr_path = tmp_path / "notifier.stderr"
    with notifier_process(spec_file, disk.path, stderr_path, preexec_fn=_ignore_sigxfsz) as (proc, url):
        sims.set_mode("down")
        names = []
        for i in range(4):
            for layer in ("L1", "L2", "L3"):
                name = f"DiskFull{layer}No{i}"
                r = requests.post(url + "/alerts", json=webhook(name, layer, group=name), headers=AUTH, timeout=10)
                assert r.status_code == 200, r.text
                names.append(name)
        wait_for(lambda: sims.pagerduty.attempts >= 4 and sims.slack.attempts >= 4 and sims.wecom.attempts >= 4,
                 what="failed attempts while the channels are down")

        disk.fill(proc.pid)
        wait_for(lambda: metric(url, "inferwatch_notifier_outbox_writable") == 0, what="a failed outbox write")
        sims.set_mode("ok")
        wait_for(lambda: set(sent_per_alert(sims)) == set(names), timeout=30, what="every message sent once")
        time.sleep(FULL_FOR_S)  # the disk stays full; the old notifier re-sent every message each second here

        sent = sent_per_alert(sims)
        per_delivery = [sent[n] for n in names]
        print(f"\nfull disk ({disk.kind}): {sum(per_delivery)} messages for {len(names)} deliveries over "
              f"{FULL_FOR_S:.0f}s with the disk full: messages sent per delivery max {max(per_delivery)}, "
              f"mean {sum(per_delivery) / len(per_delivery):.2f}")
        assert per_delivery == [1] * len(names)
        # Sent although the outcomes are not on disk: not backlog (the outbox still says pending).
        assert metric(url, "inferwatch_notifier_outbox_due") == 0
        assert metric(url, "inferwatch_notifier_outbox_depth") == 0
        ready = requests.get(url + "/-/ready", timeout=10)
        assert ready.status_code == 503 and "outbox cannot be written" in ready.text
        assert metric(url, "inferwatch_notifier_unrecorded_outcomes") >= len(names)
        assert metric(url, 'inferwatch_notifier_outbox_write_errors_total{operation="record"}') >= 1
        refused = requests.post(url + "/alerts", json=webhook("DiskFullL2No99", "L2"), headers=AUTH, timeout=10)
        assert refused.status_code == 503  # not kept: Alertmanager must retry it
        log = stderr_path.read_text()
        assert "Traceback" not in log, log
        assert len([ln for ln in log.splitlines() if "cannot be written" in ln]) == 1, log

        disk.free(proc.pid)
        wait_for(lambda: requests.get(url + "/-/ready", timeout=10).status_code == 200, what="ready again")
        wait_for(lambda: metric(url, "inferwatch_notifier_unrecorded_outcomes") == 0, what="held outcomes written")
        # Nothing is left pending to (re)send once the outbox is empty and nothing due: the state in which a
        # second message would already have gone (in place of a fixed 1.5 s).
        wait_for(lambda: metric(url, "inferwatch_notifier_outbox_depth") == 0
                 and metric(url, "inferwatch_notifier_outbox_due") == 0, what="an empty outbox after the disk freed")
        assert [sent_per_alert(sims)[n] for n in names] == [1] * len(names)
        log = stderr_path.read_text()
        assert len([ln for ln in log.splitlines() if "can be written again" in ln]) == 1, log


def test_a_restart_on_a_full_disk_is_not_ready_before_the_first_webhook(disk, sims, tmp_path):
    """Webhooks delivered, SIGKILL, the disk fills, restart with nothing to send: /-/ready and outbox_writable
    say so at once (a start-up write probes the outbox), not only after the first webhook got 503."""
    data = spec_data(sims)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    with notifier_process(spec_file, disk.path, tmp_path / "first.stderr", preexec_fn=_ignore_sigxfsz) as (proc, url):
        for i in range(3):
            r = requests.post(url + "/alerts", json=webhook(f"RestartFullL2No{i}", "L2", group=f"r{i}"), headers=AUTH,
                              timeout=10)
            assert r.status_code == 200
        wait_for(lambda: metric(url, "inferwatch_notifier_outbox_depth") == 0, what="every delivery recorded")
        assert metric(url, "inferwatch_notifier_outbox_writable") == 1
        proc.kill()
        proc.wait(10)
    disk.fill(None)
    stderr_path = tmp_path / "second.stderr"
    with notifier_process(spec_file, disk.path, stderr_path, preexec_fn=disk.full_from_start()) as (proc, url):
        ready = requests.get(url + "/-/ready", timeout=10)
        assert ready.status_code == 503 and "outbox cannot be written" in ready.text, ready.text
        assert metric(url, "inferwatch_notifier_outbox_writable") == 0
        assert metric(url, 'inferwatch_notifier_outbox_write_errors_total{operation="probe"}') >= 1
        assert len([ln for ln in stderr_path.read_text().splitlines() if "cannot be written" in ln]) == 1
        disk.free(proc.pid)
        wait_for(lambda: requests.get(url + "/-/ready", timeout=10).status_code == 200, what="ready again")
        assert metric(url, "inferwatch_notifier_outbox_writable") == 1
