"""The usage log (per-request billing records) when it cannot be written: each record written or lost is counted
(`gateway_usage_records_total{result}`), a lost one is never kept in a buffer to appear (or tear) later, and a
record cut by an error does not glue itself to the next one. Targets are real kernel objects: a file, /dev/full
(every write fails with ENOSPC, as on a full disk) and a pipe whose reader has gone (EPIPE)."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from gateway_support import GatewayProcess, Script, ScriptedUpstream, chunk, through, wait_until
from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.meter import Usage
from inferwatch.exporters.gateway.server import usage_writer

F_SETPIPE_SZ = 1031  # fcntl.h (Linux): a pipe's capacity, rounded up to a page


def records(gateway: Gateway, result: str) -> float | None:
    return gateway.metrics.registry.get_sample_value("gateway_usage_records_total", {"result": result})


def usage(tenant: str = "acme") -> Usage:
    return Usage(tenant=tenant, model="m", tier="other", outcome="ok", code=200, input_tokens=3, output_tokens=5,
                 method="usage", duration_seconds=0.5)


def regular_file(tmp_path):
    return os.open(tmp_path / "usage.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT), 1


def dev_full(_tmp_path):
    return os.open("/dev/full", os.O_WRONLY | os.O_APPEND), 0


def reader_gone(_tmp_path):
    read, write = os.pipe()
    os.close(read)
    return write, 0


@pytest.mark.parametrize("target", [regular_file, dev_full, reader_gone], ids=lambda t: t.__name__)
def test_each_record_is_counted_written_or_failed_and_the_request_goes_on(tmp_path, target):
    fd, written = target(tmp_path)
    try:
        gateway = Gateway(usage_sink=usage_writer(fd))
        assert (records(gateway, "written"), records(gateway, "failed")) == (0, 0)  # known before any request
        with gateway.request(tenant="acme", model="m") as tracked:
            tracked.usage(output_tokens=5, input_tokens=3)
        assert (records(gateway, "written"), records(gateway, "failed")) == (written, 1 - written)
    finally:
        os.close(fd)
    if target is regular_file:
        [line] = (tmp_path / "usage.jsonl").read_text().splitlines()
        assert (json.loads(line)["input_tokens"], json.loads(line)["output_tokens"]) == (3, 5)


def test_without_a_usage_log_there_is_no_record_count():
    gateway = Gateway()
    assert records(gateway, "written") is None and records(gateway, "failed") is None


def test_a_record_cut_by_an_error_does_not_glue_to_the_next():
    read, write = os.pipe()
    try:
        fcntl.fcntl(write, F_SETPIPE_SZ, 4096)
        os.set_blocking(write, False)
        sink = usage_writer(write)
        with pytest.raises(BlockingIOError):
            sink(usage("t" * 10_000))  # the pipe takes 4 KiB of it, then refuses the rest (EAGAIN)
        cut = os.read(read, 65536)
        assert 0 < len(cut) < 10_000 and not cut.endswith(b"\n")
        sink(usage("next"))
        after = os.read(read, 65536)
    finally:
        os.close(read)
        os.close(write)
    assert after.startswith(b"\n")  # the cut line is ended first
    assert json.loads(after[1:])["tenant"] == "next"


def test_the_gateway_counts_and_logs_records_a_full_disk_refuses(tmp_path):
    up = ScriptedUpstream()
    up.scripts["full"] = Script([b"data: " + chunk({"content": "Hi"}) + b"\n\n", b"data: [DONE]\n\n"])
    gw = GatewayProcess(up.url, {"tenants": ["full"], "models": ["gpt-test"]}, tmp_path,
                        extra_args=("--usage-log", "/dev/full"))
    try:
        for _ in range(3):
            status, _headers, raw = through(gw, "full", "/v1/chat/completions",
                                            {"model": "gpt-test", "messages": [], "stream": True})
            assert status == 200 and raw.endswith(b"[DONE]\n\n")  # the client is served all the same
        wait_until(lambda: gw.value("gateway_usage_records_total", result="failed") == 3,
                   what="3 usage records counted failed")
        assert gw.value("gateway_usage_records_total", result="written") == 0
        log = gw.log_path.read_text()
        assert log.count("usage record lost") == 1, log  # one line a minute per kind; the counter has the rest
        assert "Traceback" not in log
    finally:
        gw.stop()
        up.stop()
