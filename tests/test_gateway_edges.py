"""Gateway edges that need no Triton: the /metrics server's log of malformed HTTP, a dead upstream, a port
already taken (malformed requests to the proxy port: test_gateway_server.py)."""

from __future__ import annotations

import errno
import logging
import socket

import pytest
import requests
from aiohttp.http_exceptions import BadHttpMessage

from gateway_support import RunningProxy, refused_port
from inferwatch.exporters.gateway.serverlog import ServerLog


@pytest.fixture
def dead():
    """(proxy, upstream port) for a proxy whose upstream refuses connections."""
    with refused_port() as port:
        p = RunningProxy(f"http://127.0.0.1:{port}")
        yield p, port
        p.stop()


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        return s.recv(65536)


def test_server_log_keeps_real_errors_as_tracebacks(caplog):
    logger = logging.getLogger("test.serverlog")
    caplog.set_level(logging.DEBUG, logger="test.serverlog")
    log = ServerLog(logger)
    try:
        {}["missing"]
    except KeyError:
        log.exception("Unhandled exception")  # what aiohttp logs for a handler bug
    log.exception("Error handling request from %s", "1.2.3.4", exc_info=BadHttpMessage("bad\n  line"))
    bug, bad = caplog.records
    assert bug.levelno == logging.ERROR and bug.exc_info[0] is KeyError
    assert (bad.levelno, bad.exc_info) == (logging.INFO, None)
    assert bad.getMessage() == "Error handling request from 1.2.3.4: 400 BadHttpMessage: bad line"


def test_dead_upstream_502_names_no_address_but_the_log_does(dead, caplog):
    proxy, port = dead
    caplog.set_level(logging.WARNING, logger="inferwatch.exporters.gateway.proxy")
    resp = requests.get(proxy.url + "/v2/health/ready", timeout=10)
    assert resp.status_code == 502 and resp.json() == {"error": "upstream unavailable"}
    assert str(port) not in resp.text and "127.0.0.1" not in resp.text
    assert any(f"127.0.0.1:{port}" in r.getMessage() for r in caplog.records)


def test_bind_failure_surfaces_at_once_with_its_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as info:
            RunningProxy("http://127.0.0.1:1", ports=(taken.getsockname()[1], 0))
    assert info.value.errno == errno.EADDRINUSE


def test_repeated_request_headers_reach_the_upstream_repeated():
    """Pass-through keeps a header the client sends twice as two fields (a dict would collapse them)."""
    import threading

    received = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def upstream():
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            received.append(data)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()
    proxy = RunningProxy(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        answer = _raw(proxy.port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Trace: a\r\nX-Trace: b\r\n"
                                  b"X-Forwarded-For: 10.0.0.1\r\nConnection: close\r\n\r\n")
        thread.join(timeout=10)
    finally:
        proxy.stop()
        listener.close()
    assert answer.startswith(b"HTTP/1.1 200")
    head = received[0].decode("latin-1").lower()
    assert head.count("\r\nx-trace: ") == 2
    assert "\r\nx-forwarded-for: 10.0.0.1, 127.0.0.1\r\n" in head
