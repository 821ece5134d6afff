"""Connection bounds of the gateway's proxy port (exporters/gateway/bounds.py): idle or slow sockets cannot
take the descriptors that streams need.

The attack: the real gateway process with 1,024 file descriptors, 1,100 idle TCP connections held open
(reopened as soon as the gateway closes one) and a few slow-loris connections trickling a request head; metered
streams, each on a new connection, must still go through during the attack, whole and metered, and the log gets
one line per condition, not a traceback per accept. Also, in process: the header timeout (408 for a head half
sent), the idle timeout, the body timeout (408), the send timeout (a client that reads nothing of its answer,
metered or not) and the cap (the connection idle longest closed first) each close what they should, and none
of them cuts a request in progress.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest
import requests

from connection_attack import IdleAttack, closed_within
from gateway_support import GatewayProcess, RunningProxy, Script, ScriptedUpstream, make_spec, wait_until
from inferwatch.exporters.gateway.bounds import FD_RESERVE, connection_cap

FD_LIMIT = 1024
IDLE_CONNECTIONS = 1100
SLOW_LORIS = 8
STREAMS = 30
CHAT = "/v1/chat/completions"
EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n'] * 8 + [
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":8,"total_tokens":11}}\n\n', b"data: [DONE]\n\n"]


class SlowLoris:
    """`n` connections that send a request head one byte at a time, every `gap_s`, reopening each one the
    gateway closes; counts how often it was closed."""

    HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Tenant-ID: acme\r\nContent-Length: 2\r\n"

    def __init__(self, port: int, n: int, gap_s: float = 0.5):
        self.port, self.n, self.gap_s = port, n, gap_s
        self.closed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        conns: list[list] = []  # [socket, bytes sent]
        while not self._stop.is_set():
            while len(conns) < self.n:
                try:
                    conns.append([socket.create_connection(("127.0.0.1", self.port), timeout=2), 0])
                except OSError:
                    break
            for c in list(conns):
                s, sent = c
                try:
                    s.send(self.HEAD[sent % len(self.HEAD):][:1])
                    c[1] += 1
                    gone = _answered(s)
                except OSError:
                    gone = True
                if gone:
                    self.closed += 1
                    s.close()
                    conns.remove(c)
            self._stop.wait(self.gap_s)
        for s, _ in conns:
            s.close()


def _answered(s: socket.socket) -> bool:
    """The gateway answered (408) or closed the connection: anything to read means the end."""
    s.setblocking(False)
    try:
        s.recv(4096, socket.MSG_PEEK)
        return True
    except BlockingIOError:
        return False
    finally:
        s.setblocking(True)


def _fd_limited_gateway(up: ScriptedUpstream, workdir, spec: dict) -> GatewayProcess:
    # The gateway process itself gets the low limit (soft and hard, so it cannot raise it back).
    launcher = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT})); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
    return GatewayProcess(up.url, spec, workdir, verbose=False, launcher=[sys.executable, "-c", launcher])


def _stream(url: str, i: int) -> tuple[int, bytes]:
    # A new connection per stream, as a client does after its idle connection was closed.
    with requests.post(url + CHAT, json={"model": "gpt-test", "stream": True},
                       headers={"X-Tenant-ID": f"s{i}", "X-Script": "chat", "Connection": "close"},
                       stream=True, timeout=20) as resp:
        return resp.status_code, resp.raw.read(decode_content=False)


def test_streams_go_through_while_1100_idle_and_slow_connections_hold_a_1024_fd_gateway(tmp_path):
    up = ScriptedUpstream()
    up.scripts["chat"] = Script(EVENTS)
    spec = {"tenants": [f"s{i}" for i in range(STREAMS)], "models": ["gpt-test"],
            "gateway": {"header_timeout": "2s"}}
    gw = _fd_limited_gateway(up, tmp_path, spec)
    try:
        host, port = "127.0.0.1", gw.port
        results = []
        with IdleAttack(host, port, IDLE_CONNECTIONS) as attack, SlowLoris(port, SLOW_LORIS) as loris:
            attack.wait_shedding()  # the gateway is at its cap, closing the connections idle longest
            for i in range(STREAMS):
                try:
                    results.append(_stream(gw.url, i))
                except requests.RequestException as exc:
                    results.append((type(exc).__name__, b""))
                time.sleep(0.1)
            # Past the header timeout, or by the cap: every slow-loris connection closed at least once.
            wait_until(lambda: loris.closed >= SLOW_LORIS, timeout=30,
                       what=f"the gateway to close each of the {SLOW_LORIS} slow-loris connections")
            held, reopened, loris_closed = len(attack.socks), attack.reopened, loris.closed
        whole = sum(1 for status, body in results if status == 200 and body == b"".join(EVENTS))
        metered = [u for i in range(STREAMS) for u in gw.usages(tenant=f"s{i}", outcome="ok", output_tokens=8)]
        cap = connection_cap(4096, FD_LIMIT)
        print(f"\nmetered streams through under attack: {whole}/{STREAMS} whole, {len(metered)} metered "
              f"({IDLE_CONNECTIONS} idle connections, {held} held at the end, {reopened} reopened after the gateway "
              f"closed them; {SLOW_LORIS} slow-loris connections closed {loris_closed} times; fd limit {FD_LIMIT}, "
              f"connection cap {cap})")
        assert whole == STREAMS, [r[0] for r in results]
        assert len(metered) == STREAMS
        assert reopened > 0  # the attack really was over the cap: the gateway closed idle ones
        # Each slow-loris connection was closed at least once: by the cap (a head in progress counts as idle, and
        # theirs are the oldest) or by the header timeout.
        assert loris_closed >= SLOW_LORIS
        assert gw.value("gateway_client_connections_closed_total", reason="connection_cap") > 0
        assert gw.value("gateway_client_connections") <= cap
        log = gw.output()
        assert "Traceback" not in log and "out of system resource" not in log, log[-3000:]
        cap_lines = [ln for ln in log.splitlines() if "connection cap reached" in ln]
        assert 1 <= len(cap_lines) <= 2, cap_lines  # once a minute (the attack lasts less than two)
        assert len([ln for ln in log.splitlines() if "no complete request head" in ln]) <= 2
    finally:
        gw.stop()
        up.stop()


def test_cap_stays_below_the_fd_limit_with_two_descriptors_per_connection():
    assert connection_cap(4096, 1024) == (1024 - FD_RESERVE) // 2
    assert connection_cap(4096, 1 << 20) == 4096
    assert connection_cap(64, 300) == 16  # never below 16


# ------------------------------------------------------------------------------------- in process
@pytest.fixture(scope="module")
def upstream():
    up = ScriptedUpstream()
    up.scripts["chat"] = Script(EVENTS)
    up.scripts["long"] = Script([EVENTS[0], ("at", 3.5), *EVENTS[1:]])
    # Far more than the client's and the gateway's buffers hold: a client that reads nothing stalls it.
    up.scripts["flood-stream"] = Script([("bulk", 256 * 2**20, EVENTS[0] * 100)])
    up.scripts["flood-plain"] = Script([("bulk", 256 * 2**20, b"x" * 8192)], content_type="text/plain")
    yield up
    up.stop()


@pytest.fixture
def proxy(upstream):
    p = RunningProxy(upstream.url, make_spec(header_timeout="1s", idle_timeout="2s", body_timeout="1s",
                                             send_timeout="1s", max_connections=16))
    yield p
    p.stop()


def closed(p: RunningProxy, reason: str) -> float:
    return p.value("gateway_client_connections_closed_total", reason=reason)


def test_header_timeout_answers_408_to_a_head_half_sent(proxy):
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and nothing more: slow loris
        s.settimeout(10)
        assert s.recv(4096).startswith(b"HTTP/1.1 408")
        assert closed_within(s, 10) is not None
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:  # a connection that sends nothing at all
        waited = closed_within(s, 10)
    assert waited is not None and waited >= 0.5
    assert closed(proxy, "header_timeout") == 2


def test_idle_timeout_closes_a_kept_alive_connection_after_its_answer(proxy):
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(b"GET /v2/health HTTP/1.1\r\nHost: x\r\nX-Script: none\r\n\r\n")
        s.settimeout(10)
        assert s.recv(4096).startswith(b"HTTP/1.1 404")  # answered (the upstream has no such script), kept open
        waited = closed_within(s, 10)
    assert waited is not None and waited >= 1.0  # not at once: after the 2 s idle timeout
    assert closed(proxy, "idle_timeout") == 1


def test_body_timeout_answers_408(proxy):
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        s.settimeout(10)
        assert s.recv(4096).startswith(b"HTTP/1.1 408")
    assert closed(proxy, "body_timeout") == 1


@pytest.mark.parametrize("row, request_line", [
    ("flood-stream", b"POST /v1/chat/completions HTTP/1.1"),  # metered: the relay pauses, then cuts
    ("flood-plain", b"GET /v2/repository/index HTTP/1.1"),   # unmetered: the pass-through's drain cuts
])
def test_send_timeout_cuts_off_a_client_that_reads_nothing(proxy, upstream, row, request_line):
    body = b'{"model": "gpt-test", "stream": true}'
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # takes little before it stalls
    s.connect(("127.0.0.1", proxy.port))
    with s:
        s.sendall(request_line + b"\r\nHost: x\r\nX-Tenant-ID: acme\r\nX-Script: %s\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (row.encode(), len(body), body))
        wait_until(lambda: closed(proxy, "send_timeout") == 1, timeout=20, what="the client cut off")
        assert closed_within(s, 10) is not None  # whatever it had buffered, then the end
    if row == "flood-stream":
        proxy.wait_requests(1, tenant="acme", outcome="cancelled")
        assert proxy.usages[-1].outcome == "cancelled"
    assert closed(proxy, "header_timeout") == closed(proxy, "idle_timeout") == 0


def test_a_stream_longer_than_every_timeout_is_not_cut(proxy):
    status, body = _stream_named(proxy.url, "long")
    assert status == 200 and body == b"".join(EVENTS)
    assert closed(proxy, "idle_timeout") == closed(proxy, "header_timeout") == closed(proxy, "body_timeout") == 0


def _stream_named(url: str, script: str) -> tuple[int, bytes]:
    with requests.post(url + CHAT, json={"model": "gpt-test", "stream": True},
                       headers={"X-Tenant-ID": "acme", "X-Script": script}, stream=True, timeout=20) as resp:
        return resp.status_code, resp.raw.read(decode_content=False)


@pytest.fixture
def capped(upstream):
    p = RunningProxy(upstream.url, make_spec(max_connections=16))  # default timeouts: only the cap closes
    yield p
    p.stop()


def test_cap_closes_the_connection_idle_longest_first_and_never_a_request_in_progress(capped):
    proxy = capped
    result = {}
    streaming = threading.Thread(target=lambda: result.update(long=_stream_named(proxy.url, "long")))
    streaming.start()
    wait_until(lambda: proxy.value("gateway_requests_in_flight", tenant="acme", model="gpt-test", tier="other") == 1,
               what="the long stream in flight")
    idle = []
    for _ in range(15):  # with the stream: the cap (16)
        idle.append(socket.create_connection(("127.0.0.1", proxy.port)))
        time.sleep(0.01)
    newer = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(3)]
    try:
        wait_until(lambda: len([s for s in idle + newer if _answered(s)]) >= 3,
                   what="the gateway to close three connections (the three above the cap)")
        gone = [i for i, s in enumerate(idle + newer) if _answered(s)]
        assert gone == [0, 1, 2]  # the three idle longest, for the three above the cap
        streaming.join(20)
        assert result["long"] == (200, b"".join(EVENTS))
        assert closed(proxy, "connection_cap") == 3
    finally:
        for s in idle + newer:
            s.close()


def test_bounds_are_in_the_spec_with_their_defaults():
    gateway = make_spec().gateway
    assert (gateway.max_connections, gateway.header_timeout.seconds, gateway.body_timeout.seconds,
            gateway.idle_timeout.seconds, gateway.send_timeout.seconds) == (4096, 10, 60, 75, 60)
    with pytest.raises(Exception, match="max_connections"):
        make_spec(max_connections=1)
