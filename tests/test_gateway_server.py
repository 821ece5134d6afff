"""The gateway's HTTP/1.1 server (exporters/gateway/httpserver.py) as clients see it: framing, keep-alive,
pipelining, 100-continue, HEAD and bodiless statuses, body limits, and refusals of what cannot be read (a
table of malformed and oversized requests: each gets its status, the connection is closed, and the log gets
one line per kind, without a traceback)."""

from __future__ import annotations

import logging
import socket

import pytest

from gateway_support import RunningProxy, Script, ScriptedUpstream, answers, make_spec

LIMIT = 4096  # gateway.max_body_bytes of these tests
SERVER_LOG = "inferwatch.exporters.gateway.httpserver"


@pytest.fixture(scope="module")
def stack():
    up = ScriptedUpstream()
    up.scripts["hello"] = Script([b"hello"], content_type="text/plain", length=5)
    up.scripts["chunks"] = Script([b"one ", b"two ", b"three"], content_type="text/plain")
    up.scripts["empty"] = Script([], status=204, content_type="text/plain")
    up.scripts["echo"] = Script([b"ok"], content_type="text/plain", length=2)
    proxy = RunningProxy(up.url, spec=make_spec(max_body_bytes=LIMIT))
    yield proxy, up
    proxy.stop()
    up.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def get(script: str, method: str = "GET", version: str = "1.1", extra: bytes = b"") -> bytes:
    return (b"%s /v2/x HTTP/%s\r\nHost: x\r\nX-Script: %s\r\n%s\r\n"
            % (method.encode(), version.encode(), script.encode(), extra))


def test_keep_alive_answers_in_turn_on_one_connection(stack):
    proxy, _ = stack
    with connect(proxy.port) as s:
        for script, body in (("hello", b"hello"), ("chunks", b"one two three"), ("hello", b"hello")):
            s.sendall(get(script))
            [(status, headers, got)] = answers(s, ["GET"])
            assert (status, got) == (200, body) and "connection" not in headers


def test_pipelined_requests_are_answered_in_order(stack):
    proxy, _ = stack
    with connect(proxy.port) as s:
        s.sendall(get("hello") + get("chunks") + get("empty") + get("hello", extra=b"Connection: close\r\n"))
        got = answers(s, ["GET"] * 4)
        assert [(a[0], a[2]) for a in got] == [(200, b"hello"), (200, b"one two three"), (204, b""), (200, b"hello")]
        assert got[3][1]["connection"] == "close" and closed_by_server(s)


def test_head_and_204_carry_no_body_and_keep_the_connection(stack):
    proxy, _ = stack
    with connect(proxy.port) as s:
        s.sendall(get("hello", "HEAD") + get("empty") + get("chunks", "HEAD") + get("hello"))
        got = answers(s, ["HEAD", "GET", "HEAD", "GET"])
    assert got[0][0] == 200 and got[0][1]["content-length"] == "5" and got[0][2] == b""
    assert got[1][0] == 204 and "transfer-encoding" not in got[1][1] and "content-length" not in got[1][1]
    assert got[2][0] == 200 and "transfer-encoding" not in got[2][1]
    assert got[3][2] == b"hello"  # the bodiless answers left nothing on the connection


@pytest.mark.parametrize("version, request_fields, keeps", [
    ("1.0", b"", False),
    ("1.0", b"Connection: keep-alive\r\n", True),
    ("1.1", b"", True),
    ("1.1", b"Connection: close\r\n", False),
])
def test_connection_kept_as_the_request_asks(stack, version, request_fields, keeps):
    proxy, _ = stack
    with connect(proxy.port) as s:
        s.sendall(get("hello", version=version, extra=request_fields))
        [(status, headers, body)] = answers(s, ["GET"])
        assert (status, body) == (200, b"hello")
        if keeps:
            s.sendall(get("hello", version=version, extra=request_fields))
            assert answers(s, ["GET"])[0][2] == b"hello"
        else:
            assert headers["connection"] == "close" and closed_by_server(s)


def test_expect_100_continue_gets_its_interim_answer_before_the_body_is_sent(stack):
    proxy, up = stack
    body = b'{"x": 1}'
    with connect(proxy.port) as s:
        s.sendall(b"POST /v2/echo HTTP/1.1\r\nHost: x\r\nX-Script: echo\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        [(status, _h, got)] = answers(s, ["POST"])
    assert (status, got) == (200, b"ok")
    assert up.received[-1]["raw_path"] == "/v2/echo"


def test_chunked_request_body_is_forwarded_whole(stack):
    proxy, up = stack
    with connect(proxy.port) as s:
        parts = (b'{"mod', b'el": "gpt-test", "a": 1}')
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Script: echo\r\nX-Tenant-ID: acme\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
                  + b"0\r\n\r\n")
        [(status, _h, got)] = answers(s, ["POST"])
    assert (status, got) == (200, b"ok")
    assert up.received[-1]["headers"]["Content-Length"] == str(len(b"".join(parts)))


@pytest.mark.parametrize("row, request_bytes", [
    ("content-length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (LIMIT + 1)),
    ("chunked", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"400\r\n" + b"x" * 0x400 + b"\r\n" + b"400\r\n" + b"x" * 0x400 + b"\r\n" + b"400\r\n" + b"x" * 0x400
                + b"\r\n" + b"400\r\n" + b"x" * 0x400 + b"\r\n" + b"1\r\nx\r\n"),
])
def test_body_above_the_limit_is_413_and_metered_as_such(stack, row, request_bytes):
    proxy, _ = stack
    before = proxy.requests_total(code="413", outcome="error")
    with connect(proxy.port) as s:
        s.sendall(request_bytes)
        [(status, headers, body)] = answers(s, ["POST"])
        assert status == 413 and b"gateway.max_body_bytes" in body and headers["connection"] == "close"
        assert closed_by_server(s)
    proxy.wait_requests(before + 1, code="413", outcome="error")


# (row, request bytes, status) — each refused request closes its connection (it cannot be read on).
REFUSED = [
    ("not http", b"GARBAGE\r\n\r\n", 400),
    ("bad version", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 400),
    ("space in field name", b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400),
    ("length and chunked", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
     400),
    ("bad chunk size", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    ("target above 8190 bytes", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ("field above 8190 bytes", b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n", 431),
    ("head above 64 KiB", b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 4000)
                                                                       for i in range(20)) + b"\r\n", 431),
    ("unended field above 64 KiB", b"GET / HTTP/1.1\r\nHost: x\r\nX-Endless: " + b"v" * 70000, 431),
]


@pytest.mark.parametrize("row, request_bytes, status", REFUSED, ids=[r[0] for r in REFUSED])
def test_unreadable_requests_are_refused_and_the_connection_closed(stack, row, request_bytes, status):
    proxy, _ = stack
    with connect(proxy.port) as s:
        s.sendall(request_bytes)
        [(got, headers, body)] = answers(s, ["GET"])
        assert got == status and headers["connection"] == "close" and body.startswith(b'{"error": ')
        assert closed_by_server(s)


def test_refusals_are_logged_once_per_kind_without_traceback(caplog):
    caplog.set_level(logging.INFO, logger=SERVER_LOG)
    up = ScriptedUpstream()
    proxy = RunningProxy(up.url)
    try:
        for _ in range(5):
            with connect(proxy.port) as s:
                s.sendall(b"GARBAGE\r\n\r\n")
                assert answers(s, ["GET"])[0][0] == 400
        with connect(proxy.port) as s:
            s.sendall(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n")
            assert answers(s, ["GET"])[0][0] == 414
    finally:
        proxy.stop()
        up.stop()
    records = [r for r in caplog.records if r.name == SERVER_LOG]
    print(f"\n6 refused requests of 2 kinds: {len(records)} log lines")
    assert len(records) == 2
    for r in records:
        assert r.levelno == logging.INFO and r.exc_info is None and "\n" not in r.getMessage()
        assert len(r.getMessage()) < 300
    assert "400" in records[0].getMessage() and "414" in records[1].getMessage()


def test_upgrade_request_is_answered_plainly_and_the_connection_closed(stack):
    proxy, _ = stack
    with connect(proxy.port) as s:
        s.sendall(get("hello", extra=b"Connection: Upgrade\r\nUpgrade: websocket\r\n") + b"\x81\x05hello")
        [(status, headers, body)] = answers(s, ["GET"])
        assert (status, body, headers["connection"]) == (200, b"hello", "close")
        assert closed_by_server(s)


# --------------------------------------------------------------------- the TTFT path, without sockets
class _Transport:
    """A transport that keeps what is written to it (client side or upstream side of the proxy)."""

    def __init__(self):
        self.written = b""
        self.closing = False

    def write(self, data):
        self.written += data

    def writelines(self, parts):
        self.written += b"".join(parts)

    def is_closing(self):
        return self.closing

    def get_write_buffer_size(self):
        return 0

    def close(self):
        self.closing = True

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def get_extra_info(self, _name):
        return ("127.0.0.1", 40000)


def test_request_and_first_event_each_cross_the_proxy_within_the_read_that_brought_them():
    """A metered request is written upstream from the server's data_received, and a first event that arrives
    in the same read as the answer's head (as Triton sends them) is written to the client from the upstream's
    data_received: neither waits for a loop iteration (a task's turn), which under load is where time goes."""
    import asyncio

    from inferwatch.exporters.gateway import Gateway
    from inferwatch.exporters.gateway.bounds import ConnectionBounds
    from inferwatch.exporters.gateway.httpserver import HttpServer, ServerConnection
    from inferwatch.exporters.gateway.proxy import Proxy
    from inferwatch.exporters.gateway.upstream import Connection

    event = b'data: {"text_output":"a","output_token_count":1}\n\n'

    async def scenario():
        gateway = Gateway(make_spec())
        proxy = Proxy(gateway, "http://127.0.0.1:9")
        await proxy.open()
        try:
            upstream = Connection(proxy.pool)
            upstream.connection_made(_Transport())
            upstream.reusable = True
            proxy.pool.release(upstream)  # an idle upstream connection, as after an earlier request
            server = HttpServer(proxy.handle, max_body_bytes=LIMIT, bounds=ConnectionBounds(
                max_connections=64, header_timeout_s=10, body_timeout_s=10, idle_timeout_s=10, fd_limit=1024))
            client = ServerConnection(server)
            client.connection_made(_Transport())
            body = b'{"text_input": "x"}'
            client.data_received(b"POST /v2/models/toy_llm/generate_stream HTTP/1.1\r\nHost: x\r\nX-Tenant-ID: acme\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            sent_upstream = upstream.transport.written
            upstream.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(event), event))
            to_client = client.transport.written
            upstream.data_received(b"0\r\n\r\n")
            task = client._task  # the rest of the request: it ends with the upstream's answer
            if task is not None:
                await asyncio.wait_for(task, 5)
            return sent_upstream, to_client, client.transport.written
        finally:
            await proxy.close()

    sent_upstream, to_client, whole = asyncio.run(scenario())
    assert sent_upstream.startswith(b"POST /v2/models/toy_llm/generate_stream HTTP/1.1\r\n")
    assert sent_upstream.endswith(b'{"text_input": "x"}')
    assert to_client.startswith(b"HTTP/1.1 200 OK\r\n") and b"Transfer-Encoding: chunked" in to_client
    assert to_client.endswith(b"%x\r\n%s\r\n" % (len(event), event))
    assert whole == to_client + b"0\r\n\r\n"


NOT_ASCII = b"caf\xc3\xa9 \xff\xfe"  # UTF-8 and bytes that are not UTF-8 (obs-text, RFC 9110 §5.5)
REPLY = "café – ünï".encode()  # what the upstream here can send (aiohttp writes fields as UTF-8)


@pytest.mark.parametrize("row, request_line, note", [
    ("metered", b"POST /v1/chat/completions HTTP/1.1", NOT_ASCII),
    # Unmetered requests go upstream through aiohttp's client, which writes fields as UTF-8: bytes that are
    # not UTF-8 do not survive it, so this row sends UTF-8 only.
    ("unmetered", b"POST /v2/other HTTP/1.1", REPLY),
])
def test_header_bytes_beyond_ascii_cross_unchanged_both_ways(stack, row, request_line, note):
    proxy, up = stack
    up.scripts[f"bytes-{row}"] = Script([b"ok"], content_type="text/plain", length=2,
                                        headers={"X-Reply": REPLY.decode()})
    body = b'{"model": "gpt-test"}'
    with connect(proxy.port) as s:
        s.sendall(request_line + b"\r\nHost: x\r\nX-Script: bytes-%s\r\nX-Note: %s\r\nContent-Length: %d\r\n\r\n%s"
                  % (row.encode(), note, len(body), body))
        head = b""
        while b"\r\n\r\nok" not in head:
            head += s.recv(65536)
    assert head.startswith(b"HTTP/1.1 200") and b"\r\nX-Reply: " + REPLY + b"\r\n" in head
    # aiohttp (the upstream here) decodes fields as UTF-8 with surrogateescape: equal text means equal bytes.
    assert up.received[-1]["headers"]["X-Note"].encode("utf-8", "surrogateescape") == note
