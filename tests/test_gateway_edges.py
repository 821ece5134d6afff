"""Gateway edges that need no Triton: the /metrics server's log of malformed HTTP, a dead upstream, a port
already taken (malformed requests to the proxy port: test_gateway_server.py)."""

from __future__ import annotations

import errno
import json
import logging
import socket

import pytest
import requests
from aiohttp.http_exceptions import BadHttpMessage

from gateway_support import RunningProxy, Script, ScriptedUpstream, answers, raw_post, refused_port, wait_until
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


STREAM = [b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n',
          b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}\n\n', b"data: [DONE]\n\n"]
WHOLE = b'{"choices":[{"index":0,"message":{"content":"Hi"}}],"usage":{"prompt_tokens":2,"completion_tokens":1}}'


def _boom(*_args, **_kw):
    raise RuntimeError("injected metering bug")


# (where the bug is injected, its log line)
FAULTS = [
    ("event", "metering failed in chunk"),       # reading a stream's event
    ("body", "metering failed in parse_body"),   # reading a whole answer
    ("finish", "metering failed in finish"),     # recording the request's end
    ("sink", "usage record not written"),        # writing the usage log (a full disk)
]


@pytest.mark.parametrize("where, line", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_metering_failure_never_costs_an_answer_or_the_next_request(monkeypatch, caplog, where, line):
    """A bug in metering (injected: any exception) leaves the relay alone: the client gets both pipelined
    answers whole, the request is recorded as unmetered (reason meter_error, counts unknown), and the log
    gets one line with the traceback, not one per request."""
    from inferwatch.exporters.gateway import exchange
    from inferwatch.exporters.gateway.meter import RequestMeter
    from inferwatch.exporters.gateway.protocols import OpenAIEvents

    up = ScriptedUpstream()
    up.scripts["stream"] = Script(STREAM)
    up.scripts["whole"] = Script([WHOLE], content_type="application/json")
    proxy = RunningProxy(up.url)
    try:
        if where == "event":
            monkeypatch.setattr(OpenAIEvents, "event", _boom)
        elif where == "body":
            monkeypatch.setattr(OpenAIEvents, "body", _boom)
        elif where == "finish":
            monkeypatch.setattr(RequestMeter, "finish", _boom)
        else:
            proxy.gateway.usage_sink = _boom
        for key in list(exchange._bugs._last):
            exchange._bugs.clear(key)  # a line logged by an earlier test must not hide this one's
        caplog.set_level(logging.ERROR, logger=exchange.__name__)
        script = "whole" if where == "body" else "stream"
        body = {"model": "gpt-test", "stream": script == "stream"}
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as s:
            s.sendall(raw_post("/v1/chat/completions", script, body) + raw_post("/v1/chat/completions", script, body)
                      + raw_post("/v1/chat/completions", "whole", {"model": "gpt-test"}, close=True))
            got = answers(s, ["POST"] * 3)
        sent = up.scripts[script].body()
        assert [(g[0], g[2]) for g in got] == [(200, sent), (200, sent), (200, WHOLE)]
        if where in ("event", "body", "finish"):
            assert not [h for h in got[0][1] if h.startswith("x-token-used")]  # unknown, not a guess
            wait_until(lambda: len(proxy.usages) >= 2, what="two usage records")
            first = proxy.usages[0]
            assert (first.outcome, first.input_tokens, first.output_tokens, first.unmetered) == (
                "ok", None, None, "meter_error")
            assert proxy.value("gateway_unmetered_responses_total", model="gpt-test", reason="meter_error") >= 2
        else:
            proxy.wait_requests(3)
            assert proxy.usages == []
        lines = [r for r in caplog.records if line in r.getMessage()]
        assert len(lines) == 1  # three failures, one line
        assert (lines[0].exc_info is not None) == (where != "sink")  # a bug comes with its traceback
    finally:
        proxy.stop()
        up.stop()


# JSON nested deeper than the interpreter's recursion limit: json.loads raises RecursionError, not ValueError.
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_REQUEST = b'{"model":"gpt-test","messages":' + DEEP + b"}"
NORMAL_REQUEST = json.dumps({"model": "gpt-test", "stream": True}).encode()

# (case, request body, upstream answer, what the usage record says: (outcome, output tokens))
NESTING = [
    ("request body", DEEP_REQUEST, Script(STREAM), ("ok", 1)),
    ("stream event", NORMAL_REQUEST, Script([STREAM[0], b'data: {"choices":' + DEEP + b"}\n\n", STREAM[2]]),
     ("ok", 1)),  # the readable event's token; the unreadable one is not guessed at
    ("whole answer", NORMAL_REQUEST, Script([b'{"choices":' + DEEP + b"}"], content_type="application/json"),
     ("ok", None)),
]


@pytest.mark.parametrize("case, body, script, usage", NESTING, ids=[n[0] for n in NESTING])
def test_deeply_nested_json_is_forwarded_not_a_500(caplog, case, body, script, usage):
    """A request body, stream event or answer nested 100,000 levels deep (200 KB) is relayed byte for byte:
    no 500, no traceback; the request body is forwarded as sent, and counts the gateway cannot read are
    unknown (None), never 0."""
    from inferwatch.exporters.gateway import exchange, httpserver

    up = ScriptedUpstream()
    up.scripts["deep"] = script
    proxy = RunningProxy(up.url)
    caplog.set_level(logging.ERROR)
    try:
        resp = requests.post(proxy.url + "/v1/chat/completions", data=body, timeout=30,
                             headers={"Content-Type": "application/json", "X-Script": "deep"})
        assert (resp.status_code, resp.content) == (200, script.body())
        wait_until(lambda: len(proxy.usages) >= 1, what="the usage record")
        assert (proxy.usages[0].outcome, proxy.usages[0].output_tokens) == usage
        assert up.received[0]["headers"].get("Content-Length") == str(len(body))  # forwarded whole
        errors = [r for r in caplog.records if r.name in (exchange.__name__, httpserver.__name__)]
        assert errors == []
    finally:
        proxy.stop()
        up.stop()


def test_a_deeply_nested_body_names_no_model_for_upstream_routing():
    """The several-upstreams router reads the body's model the same way: too deep to read is no model."""
    from inferwatch.exporters.gateway.router import request_model

    assert request_model("/v1/chat/completions", DEEP_REQUEST) is None
    assert request_model("/v1/chat/completions", NORMAL_REQUEST) == "gpt-test"  # the control row
