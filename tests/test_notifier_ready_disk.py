"""`/-/ready` says whether a webhook would be stored now, on a disk full enough that small writes still fit.

The outbox lives on a small tmpfs (skipped without mount rights); the disk is filled until ENOSPC and then
some bytes are freed again, so a token write fits where a webhook does not. In every state the readiness
answer must agree with what a webhook gets (200 stored / 503 not), read repeatedly over a few probe
intervals, not once.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time

import pytest
import requests

from inferwatch.notifier.service import PROBE_MIN_BYTES, READY_PROBE_INTERVAL_S, NotifierService
from notifier_support import AUTH, make_spec, simulators, wait_for, webhook

sims = pytest.fixture(scope="module")(simulators)
BIG = dict(n=40, description="d" * 4000)  # a webhook of about 200 KB


@pytest.fixture
def disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("no mount rights for a small tmpfs")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path) -> None:
    with open(path / "filler", "wb", buffering=0) as f:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc


def readiness_over(url: str, seconds: float) -> set[int]:
    """Every /-/ready status seen while polling for `seconds` (spanning several probe intervals)."""
    seen, deadline = set(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.add(requests.get(url + "/-/ready", timeout=10).status_code)
        time.sleep(0.1)
    return seen


# (row, bytes freed after filling the disk)
# The case frees room for a small write but less than PROBE_MIN_BYTES, so no probe write fits.
FULL = [("full", 0), ("small_writes_fit", 48 * 1024)]


assert all(freed < PROBE_MIN_BYTES for _, freed in FULL)


@pytest.mark.parametrize("row, freed", FULL, ids=[r[0] for r in FULL])
def test_ready_agrees_with_the_intake_on_a_full_disk(disk, sims, row, freed):
    service = NotifierService(make_spec(sims, send_processes=0), disk / "data", port=0).start()
    try:
        url = service.url
        r = requests.post(url + "/alerts", json=webhook("Before", **BIG), headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
        # The worker records the delivery of "Before" in the outbox; once that write is done nothing but the
        # readiness probe writes, so the room freed below is the witness's alone.
        wait_for(lambda: service.outbox.counts()["pending"] == 0, timeout=30, what="'Before' delivered")
        fill(disk)
        if freed:
            os.truncate(disk / "filler", (disk / "filler").stat().st_size - freed)
            # The witness that this row is the issue's: a token write still fits.
            with sqlite3.connect(disk / "data" / "outbox.sqlite3", timeout=10) as db:
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('witness', 'x')")
        r = requests.post(url + "/alerts", json=webhook("During", **BIG), headers=AUTH, timeout=30)
        assert r.status_code == 503, r.text
        assert readiness_over(url, 4 * READY_PROBE_INTERVAL_S) == {503}
        (disk / "filler").unlink()
        wait_for(lambda: requests.get(url + "/-/ready", timeout=10).status_code == 200, timeout=30,
                 what="ready once space is back")
        r = requests.post(url + "/alerts", json=webhook("After", **BIG), headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        service.stop()


def test_a_refused_large_body_does_not_grow_the_readiness_probe(disk, sims, monkeypatch):
    """The probe is as large as the largest webhook *accepted for parsing*: a malformed body (400, never
    retried by Alertmanager) of 1.5 MB on a 2 MiB disk must not make every later probe write 1.5 MB, which
    fills the disk with the probe's own rows and answers /-/ready 503 while webhooks are still stored."""
    from inferwatch.notifier import service as service_module

    monkeypatch.setattr(service_module, "READY_WRITABLE_PROBE_S", 0.5)  # several probes within the window
    service = NotifierService(make_spec(sims, send_processes=0), disk / "data", port=0).start()
    try:
        url = service.url
        junk = b'{"version": "4", "alerts": [], "pad": "' + b"x" * 1_500_000 + b'"}'
        r = requests.post(url + "/alerts", data=junk, headers={**AUTH, "Content-Type": "application/json"},
                          timeout=30)
        assert r.status_code == 400, r.text
        assert readiness_over(url, 4.0) == {200}
        r = requests.post(url + "/alerts", json=webhook("After", **BIG), headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        service.stop()
