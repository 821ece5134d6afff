"""Aborted webhook bodies are counted and logged once a minute per kind, never a traceback each.

Alertmanager closes a connection mid-body when a notifier replica stalls; a scanner does it on purpose.
Each row sends one kind of aborted request many times to the real in-process service; the log must hold
no traceback and at most one line per kind, the counter must count every one, and the service must still
take a webhook.
"""

from __future__ import annotations

import logging
import socket
import tempfile

import pytest
import requests

from inferwatch.notifier.service import NotifierService
from notifier_support import AUTH, make_spec, metric, simulators, wait_for, webhook

sims = pytest.fixture(scope="module")(simulators)
REPEAT = 50
HEAD = ("POST {path} HTTP/1.1\r\nHost: notifier\r\nAuthorization: " + AUTH["Authorization"]
        + "\r\nContent-Type: application/json\r\n")


def _short_body(path):
    return (HEAD + "Content-Length: 1000\r\n\r\n").format(path=path).encode() + b'{"version":"4"'


def _cut_chunk(path):
    return (HEAD + "Transfer-Encoding: chunked\r\n\r\n").format(path=path).encode() + b"40\r\n{\"version\""


def _no_last_chunk(path):
    return (HEAD + "Transfer-Encoding: chunked\r\n\r\n").format(path=path).encode() + b"2\r\n{}\r\n"


ROWS = [  # (row, the bytes sent before the connection is closed, path)
    ("content_length_short", _short_body, "/alerts"),  # the case (a stalled replica)
    ("chunk_cut", _cut_chunk, "/alerts"),
    ("no_last_chunk", _no_last_chunk, "/alerts"),
]


@pytest.fixture(scope="module")
def service(sims):
    with tempfile.TemporaryDirectory() as tmp:
        s = NotifierService(make_spec(sims), tmp, port=0).start()
        yield s
        s.stop()


def abort(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        try:
            c.recv(1024)  # the server's answer or close: the request was seen before the next one starts
        except OSError:
            pass


@pytest.mark.parametrize("row, make, path", ROWS, ids=[r[0] for r in ROWS])
def test_aborted_bodies_are_counted_not_logged_each(service, caplog, row, make, path):
    before = metric(service.url, 'inferwatch_notifier_webhooks_total{outcome="aborted"}')
    with caplog.at_level(logging.INFO):
        for _ in range(REPEAT):
            abort(service.port, make(path))
        wait_for(lambda: metric(service.url, 'inferwatch_notifier_webhooks_total{outcome="aborted"}')
                 - before >= REPEAT, timeout=30, what=f"{REPEAT} aborted requests counted")
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    lines = [r for r in caplog.records if "aborted" in r.getMessage()]
    assert len(lines) <= 1, [r.getMessage() for r in lines]  # one per kind a minute (the first row logs it)
    r = requests.post(service.url + "/alerts", json=webhook(f"After{row}"), headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
