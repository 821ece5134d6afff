"""A damaged or incomplete outbox must never lose acknowledged notifications quietly.

The real `inferwatch notifier` acknowledges N webhooks while its channels are down (so every one is pending
in the outbox), then is killed (SIGKILL: the newest commits live in `outbox.sqlite3-wal`) or stopped cleanly.
The outbox files are then damaged as a backup, a volume move or a failing disk would: the `-wal` deleted or
cut in half, the main file truncated or deleted, random bytes written inside it. A restart must refuse with
one line naming what is missing and how to recover (exit 2, no traceback), or, with
`--move-damaged-outbox`, move the files aside, start empty and expose the loss; an undamaged outbox (the
control rows) starts and delivers all N.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import requests
import yaml

from inferwatch.testing.channels import ProviderSimulators
from inferwatch.testing.process import free_port
from notifier_support import AUTH, metric, notifier_process, spec_data, wait_for, webhook

N = 20
DB = "outbox.sqlite3"


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


def _spec_file(tmp_path, sims):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_data(sims)))
    return path


def _acknowledge(tmp_path, sims, data_dir, stop: str) -> None:
    """N L1 webhooks acknowledged (200) while PagerDuty and the voice provider are down; then `stop` the
    notifier: "kill" (SIGKILL) or "clean" (SIGTERM)."""
    sims.pagerduty.set_mode("down")
    sims.voice.set_mode("down")
    with notifier_process(_spec_file(tmp_path, sims), data_dir, tmp_path / "first.log") as (proc, url):
        for i in range(N):
            r = requests.post(url + "/alerts", json=webhook(f"Lost{i}", "L1"), headers=AUTH, timeout=10)
            assert r.status_code == 200, r.text
        if stop == "kill":
            proc.kill()
            proc.wait(10)
    assert (data_dir / DB).exists()
    if stop == "kill":
        assert (data_dir / (DB + "-wal")).stat().st_size > 0  # what the damage below acts on
    sims.pagerduty.set_mode("ok")
    sims.voice.set_mode("ok")


def _delete_wal(d):
    (d / (DB + "-wal")).unlink()


def _random_bytes(d):
    path = d / DB
    with open(path, "r+b") as f:
        f.seek(1024)
        f.write(os.urandom(min(8192, path.stat().st_size - 1024)))


# What happens to each outbox file: kept as the notifier left it, deleted (a backup or move that did not take
# it), cut to half its size, emptied, or replaced by 64 random bytes (a ledger's size).
KEEP, GONE, HALF, EMPTY, RANDOM = "keep", "gone", "half", "empty", "random"
FILES = ("", "-wal", "-shm", ".acked")  # suffixes of outbox.sqlite3


def _alter(d, files: dict) -> None:
    """Apply `files` ({suffix: what happens}; unnamed files are kept) to the outbox in `d`."""
    for suffix, what in files.items():
        path = d / (DB + suffix)
        if what == GONE:
            path.unlink(missing_ok=True)
        elif what == HALF:
            os.truncate(path, path.stat().st_size // 2)
        elif what == EMPTY:
            os.truncate(path, 0)
        elif what == RANDOM:
            path.write_bytes(os.urandom(64))
        elif what == "bytes inside":
            _random_bytes(d)


SOME = "some"  # a count above 0 whose exact value depends on where the cut fell
NO_LEDGER = r"has no ledger outbox.sqlite3.acked beside it"
BAD_LEDGER = r"ledger outbox.sqlite3.acked is not a ledger line"
NO_WAL = rf"lacks {N} acknowledged webhook\(s\).*-wal is missing"
STATES = [
    # (name, how the notifier stopped, what happened to its files, None (it starts: a fresh or whole outbox, no
    #  acknowledged row lost) or what the refusal line says, inferwatch_notifier_outbox_lost_webhooks after
    #  --move-damaged-outbox: a count, SOME, or None for no sample (unknown))
    ("whole after SIGKILL", "kill", {}, None, None),
    ("-shm gone after SIGKILL", "kill", {"-shm": GONE}, None, None),  # a cache SQLite rebuilds from the -wal
    ("whole after a clean stop", "clean", {}, None, None),
    ("fresh data dir", "clean", {"": GONE, "-wal": GONE, "-shm": GONE, ".acked": GONE}, None, None),
    ("-wal gone", "kill", {"-wal": GONE}, NO_WAL, N),
    ("main file and ledger, no -wal or -shm", "kill", {"-wal": GONE, "-shm": GONE}, NO_WAL, N),
    ("main file alone after SIGKILL", "kill", {"-wal": GONE, "-shm": GONE, ".acked": GONE}, NO_LEDGER, None),
    ("main file and -shm after SIGKILL", "kill", {"-wal": GONE, ".acked": GONE}, NO_LEDGER, None),
    ("ledger gone after SIGKILL", "kill", {".acked": GONE}, NO_LEDGER, None),
    ("main file alone after a clean stop", "clean", {".acked": GONE}, NO_LEDGER, None),
    ("random ledger, main file alone", "kill", {"-wal": GONE, "-shm": GONE, ".acked": RANDOM}, BAD_LEDGER, None),
    ("random ledger after SIGKILL", "kill", {".acked": RANDOM}, BAD_LEDGER, None),
    ("random ledger after a clean stop", "clean", {".acked": RANDOM}, BAD_LEDGER, None),
    ("ledger cut in half", "kill", {".acked": HALF}, BAD_LEDGER, None),
    ("ledger emptied", "kill", {".acked": EMPTY}, BAD_LEDGER, None),
    ("-wal cut in half", "kill", {"-wal": HALF}, r"lacks [1-9]\d* acknowledged webhook\(s\).*-wal or the database "
                                                 r"was cut short", SOME),
    ("main file emptied", "kill", {"": EMPTY}, rf"lacks {N} acknowledged webhook\(s\)", N),
    ("main file gone after SIGKILL", "kill", {"": GONE}, rf"is missing while its ledger outbox.sqlite3.acked "
                                                         rf"records {N}", N),
    ("ledger alone after SIGKILL", "kill", {"": GONE, "-wal": GONE, "-shm": GONE}, rf"records {N} acknowledged", N),
    ("ledger alone after a clean stop", "clean", {"": GONE, "-wal": GONE, "-shm": GONE}, rf"records {N} acknowledged",
     N),
    ("-wal alone", "kill", {"": GONE, ".acked": GONE}, r"missing while its write-ahead log outbox.sqlite3-wal", None),
    ("random bytes inside after a clean stop", "clean", {"": "bytes inside"}, r"integrity check|cannot be read", N),
]


def _files(d) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def _start(spec_file, data_dir, *args):
    argv = [sys.executable, "-m", "inferwatch.cli", "notifier", "--spec", str(spec_file), "--port", str(free_port()),
            "--data-dir", str(data_dir), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def acknowledged(tmp_path_factory, sims):
    """{stop: a data dir holding N acknowledged, undelivered webhooks}, filled once per way of stopping; each
    test damages its own copy."""
    out = {}
    for stop in ("kill", "clean"):
        base = tmp_path_factory.mktemp(f"acknowledged-{stop}")
        _acknowledge(base, sims, base / "data", stop)
        out[stop] = base / "data"
    return out


def _lost_samples(url) -> dict:
    return {line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
            for line in requests.get(url + "/metrics", timeout=10).text.splitlines()
            if line.startswith(("inferwatch_notifier_outbox_lost_webhooks ",
                                "inferwatch_notifier_outbox_damaged_timestamp_seconds "))}


@pytest.mark.parametrize("name,stop,files,says,lost", STATES, ids=[s[0] for s in STATES])
def test_outbox_files_start_or_refuse(tmp_path, sims, acknowledged, name, stop, files, says, lost):
    """Each combination of outbox files a SIGKILL or clean stop, a partial backup or a bad disk leaves: a whole
    or fresh outbox starts with no loss recorded; any other refuses with one line, twice the same (the check
    changes no file), and with --move-damaged-outbox starts empty exposing the loss (no sample: unknown)."""
    data_dir = tmp_path / "data"
    shutil.copytree(acknowledged[stop], data_dir)
    _alter(data_dir, files)
    spec_file = _spec_file(tmp_path, sims)
    if says is None:
        with notifier_process(spec_file, data_dir, tmp_path / "start.log") as (_proc, url):
            assert requests.get(url + "/-/ready", timeout=10).status_code == 200
            assert _lost_samples(url) == {}  # nothing lost: no sample (not 0, which would claim a count)
        return
    before = _files(data_dir)
    lines = []
    for _ in range(2):
        r = _start(spec_file, data_dir)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        lines.append(r.stderr.strip())
    assert lines[0] == lines[1]
    assert _files(data_dir) == before  # read-only: no -wal or -shm created, nothing checkpointed
    assert lines[0].startswith("inferwatch: error: "), lines
    assert re.search(says, lines[0]), lines[0]
    assert "--move-damaged-outbox" in lines[0] and "restore" in lines[0]
    with notifier_process(spec_file, data_dir, tmp_path / "moved.log", args=("--move-damaged-outbox",)) as (_p, url):
        samples = _lost_samples(url)
    assert samples.get("inferwatch_notifier_outbox_damaged_timestamp_seconds", 0) > 0, samples
    got = samples.get("inferwatch_notifier_outbox_lost_webhooks")
    if lost == SOME:
        assert got is not None and got > 0, samples
    else:
        assert got == lost, samples


@pytest.mark.parametrize("files,says", [({}, None), ({"-wal": HALF}, "cut short"), ({".acked": GONE}, "no ledger")],
                         ids=["whole", "-wal cut in half", "ledger gone"])
def test_check_reads_in_place_when_no_temporary_copy_can_be_made(tmp_path, acknowledged, monkeypatch, files,
                                                                  says):
    """With a -wal the check reads a temporary copy; without room for one it reads the files in place and
    reaches the same verdict."""
    from inferwatch.notifier import integrity

    data_dir = tmp_path / "data"
    shutil.copytree(acknowledged["kill"], data_dir)
    _alter(data_dir, files)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    damage = integrity.check(data_dir / DB)
    if says is None:
        assert damage is None
    else:
        assert damage is not None and says in damage.what, damage


@pytest.mark.parametrize("stop", ["kill", "clean"])
def test_undamaged_outbox_starts_and_delivers_every_acknowledged_notification(tmp_path, sims, acknowledged, stop):
    """The control rows: no false alarm after a SIGKILL or a clean stop, and all N reach PagerDuty."""
    data_dir = tmp_path / "data"
    shutil.copytree(acknowledged[stop], data_dir)
    before = len(sims.pagerduty.received)
    with notifier_process(_spec_file(tmp_path, sims), data_dir, tmp_path / "second.log") as (_proc, url):
        def delivered():
            return {m for r in sims.pagerduty.received[before:] for m in re.findall(r"Lost\d+", r.text)}
        wait_for(lambda: len(delivered()) == N, timeout=60, what=f"{N} notifications delivered")
        assert requests.get(url + "/-/ready", timeout=10).status_code == 200
        samples = [line for line in requests.get(url + "/metrics", timeout=10).text.splitlines()
                   if line.startswith(("inferwatch_notifier_outbox_lost_webhooks",
                                       "inferwatch_notifier_outbox_damaged_timestamp_seconds"))]
        assert samples == []  # nothing lost: no sample (not 0, which would claim a count)


def test_move_damaged_outbox_starts_empty_and_records_the_loss(tmp_path, sims, acknowledged):
    data_dir = tmp_path / "data"
    shutil.copytree(acknowledged["kill"], data_dir)
    _delete_wal(data_dir)
    spec_file = _spec_file(tmp_path, sims)
    log = tmp_path / "moved.log"
    with notifier_process(spec_file, data_dir, log, args=("--move-damaged-outbox",)) as (_proc, url):
        assert metric(url, "inferwatch_notifier_outbox_lost_webhooks") == N
        assert metric(url, "inferwatch_notifier_outbox_damaged_timestamp_seconds") > 0
        assert requests.get(url + "/-/ready", timeout=10).status_code == 200
        r = requests.post(url + "/alerts", json=webhook("AfterMove", "L1"), headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
    moved = sorted(p.name for p in data_dir.iterdir() if ".damaged-" in p.name)
    assert any(n.startswith(DB + ".damaged-") for n in moved), moved
    assert any(n.startswith(DB + ".acked.damaged-") for n in moved), moved
    assert f"acknowledged webhooks lost: {N}" in log.read_text()
    # The recorded loss survives a restart (the alert keeps firing for its window) and the new outbox is whole.
    with notifier_process(spec_file, data_dir, tmp_path / "again.log") as (_proc, url):
        assert metric(url, "inferwatch_notifier_outbox_lost_webhooks") == N


def _read_only_mount(d):
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("no mount rights for a read-only file system")
    return lambda: subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _a_file(d):
    d.write_text("not a directory")
    return None


def _under_a_file(d):
    d.parent.write_text("x")  # `file/data`: its parent is a file
    return None


UNUSABLE = [
    # (name, how the data dir is made unusable, its path under tmp_path, what the line says)
    ("read-only file system", _read_only_mount, "ro", "not writable"),
    ("a file, not a directory", _a_file, "file-dir", "cannot use --data-dir"),
    ("below a file", _under_a_file, "file/data", "cannot use --data-dir"),
]


@pytest.mark.parametrize("name,make,where,says", UNUSABLE, ids=[u[0] for u in UNUSABLE])
def test_unusable_data_dir_is_one_line(tmp_path, sims, name, make, where, says):
    data_dir = tmp_path / where
    undo = make(data_dir)
    try:
        r = _start(_spec_file(tmp_path, sims), data_dir)
    finally:
        if undo:
            undo()
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("inferwatch: error: ") and says in lines[0], lines
