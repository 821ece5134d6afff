"""The lean upstream client of metered requests (exporters/gateway/upstream.py) against an upstream that
writes raw bytes: the HTTP/1.1 response forms a server may send (RFC 9112 §6.3 body length: chunked,
Content-Length, until close; an interim 1xx first; a cut or unreadable answer), connection reuse, and the
client side (HTTP/1.0 clients get the body unframed)."""

from __future__ import annotations

import socket
import threading

import pytest

from gateway_support import RunningProxy, make_spec

TRITON = "/v2/models/toy_llm/generate_stream"
EVENTS = [b'data: {"text_output":"a","output_token_count":1}\n\n',
          b'data: {"text_output":"b","output_token_count":2}\n\n',
          b'data: {"text_output":"c","output_token_count":3}\n\n']
BODY = b"".join(EVENTS)
SSE = b"Content-Type: text/event-stream\r\n"


def chunked(parts) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


class RawUpstream:
    """Answers each request with the next of `answers` (raw bytes; `close` after it when the answer ends in
    the marker CLOSE). Counts accepted connections and keeps each request's head."""

    CLOSE = b"<close>"

    def __init__(self, answers: list[bytes]):
        self.answers = list(answers)
        self.connections = 0
        self.heads: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket):
        buf = b""
        with conn:
            while self.answers:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.heads.append(head)
                answer = self.answers.pop(0)
                conn.sendall(answer.replace(self.CLOSE, b""))
                if answer.endswith(self.CLOSE):
                    return

    def close(self):
        self.sock.close()


def ask(port: int, version: str = "1.1") -> bytes:
    """One metered request through the proxy on a fresh connection; the raw answer until the proxy closes
    it or the chunked body ends."""
    body = b'{"text_input":"x"}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST %s HTTP/%s\r\nHost: x\r\nX-Tenant-ID: acme\r\nConnection: close\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (TRITON.encode(), version.encode(),
                                                                          len(body), body))
        out = b""
        while True:
            data = s.recv(65536)
            if not data:
                return out
            out += data


def split(answer: bytes) -> tuple[bytes, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


# (row, upstream answer, body the client must get (chunked framing removed), outcome, tokens metered)
ROWS = [
    ("chunked", b"HTTP/1.1 200 OK\r\n" + SSE + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(EVENTS),
     BODY, "ok", 3),
    ("content-length", b"HTTP/1.1 200 OK\r\n" + SSE + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY,
     BODY, "ok", 3),
    ("until-close", b"HTTP/1.1 200 OK\r\n" + SSE + b"Connection: close\r\n\r\n" + BODY + RawUpstream.CLOSE,
     BODY, "ok", 3),
    ("interim-100-first", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n" + SSE +
     b"Transfer-Encoding: chunked\r\n\r\n" + chunked(EVENTS), BODY, "ok", 3),
    ("cut-mid-stream", b"HTTP/1.1 200 OK\r\n" + SSE + b"Transfer-Encoding: chunked\r\n\r\n" +
     chunked(EVENTS[:2])[:-5] + RawUpstream.CLOSE, None, "error", 2),
]


@pytest.mark.parametrize("row,answer,body,outcome,tokens", ROWS, ids=[r[0] for r in ROWS])
def test_response_forms_are_relayed_and_metered(row, answer, body, outcome, tokens):
    up = RawUpstream([answer])
    proxy = RunningProxy(up.url, spec=make_spec())
    try:
        head, got = split(ask(proxy.port))
        assert head.startswith(b"HTTP/1.1 200")
        if body is not None:
            # The upstream's length is kept; otherwise the answer goes out chunked.
            framed = b"content-length:" not in head.lower()
            assert framed == (b"transfer-encoding: chunked" in head.lower())
            assert (dechunk(got) if framed else got) == body
        else:
            assert not got.endswith(b"0\r\n\r\n")  # a cut stream is cut for the client too, never ended cleanly
        proxy.wait_requests(1, tenant="acme", model="toy_llm", tier="other", outcome=outcome)
        assert proxy.value("gateway_tokens_total", tenant="acme", model="toy_llm", tier="other",
                           type="output") == tokens
    finally:
        proxy.stop()
        up.close()


def dechunk(body: bytes) -> bytes:
    out = b""
    while True:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out += rest[:n]
        body = rest[n + 2:]


def test_unreadable_answer_is_502_and_an_error():
    up = RawUpstream([b"NOT HTTP AT ALL\r\n\r\n" + RawUpstream.CLOSE])
    proxy = RunningProxy(up.url, spec=make_spec())
    try:
        head, body = split(ask(proxy.port))
        assert head.startswith(b"HTTP/1.1 502") and b"upstream unavailable" in body
        proxy.wait_requests(1, tenant="acme", model="toy_llm", tier="other", outcome="error", code="502")
    finally:
        proxy.stop()
        up.close()


def test_connections_are_reused_unless_the_upstream_closes_them():
    keep = b"HTTP/1.1 200 OK\r\n" + SSE + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(EVENTS)
    close = b"HTTP/1.1 200 OK\r\n" + SSE + b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(EVENTS)
    up = RawUpstream([keep, keep, close, keep])
    proxy = RunningProxy(up.url, spec=make_spec())
    try:
        for expected_connections in (1, 1, 1, 2):
            assert dechunk(split(ask(proxy.port))[1]) == BODY
            assert up.connections == expected_connections
        # The request head the upstream got: the canonical target, Host of the upstream, the body's length.
        first = up.heads[0].split(b"\r\n")
        assert first[0] == b"POST %s HTTP/1.1" % TRITON.encode()
        assert b"Host: " + up.url.split("//")[1].encode() in first
        assert b"Content-Length: 18" in first and not any(h.lower().startswith(b"connection") for h in first)
    finally:
        proxy.stop()
        up.close()


def test_http10_client_gets_the_body_unframed():
    up = RawUpstream([b"HTTP/1.1 200 OK\r\n" + SSE + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(EVENTS)])
    proxy = RunningProxy(up.url, spec=make_spec())
    try:
        head, body = split(ask(proxy.port, version="1.0"))
        # RFC 9110 §6.2: the server answers with its own version (1.1, as nginx does); without chunked framing
        # the body ends with the connection (RFC 9112 §6.3), so the server says it closes.
        assert head.startswith(b"HTTP/1.1 200") and b"chunked" not in head.lower()
        assert b"\r\nconnection: close" in head.lower()
        assert body == BODY
    finally:
        proxy.stop()
        up.close()


@pytest.mark.parametrize("base,host", [("http://127.0.0.1:8000", "127.0.0.1:8000"), ("http://[::1]:8000", "[::1]:8000"),
                                       ("http://triton:8000", "triton:8000"), ("http://triton:80", "triton"),
                                       ("https://llm.example", "llm.example")])
def test_host_header_of_the_upstream(base, host):
    import asyncio

    from inferwatch.exporters.gateway.upstream import Pool

    async def header():
        return Pool(base, 1.0).host_header

    assert asyncio.run(header()) == host
