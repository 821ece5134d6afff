"""No metering bypass through path spellings: the real gateway process forwards exactly the canonical path it
classified (dot-segments resolved, `//` merged), refuses encoded slashes and backslashes (400), and meters
every spelling the upstream may serve as an LLM route (mixed case, percent-encoded letters, trailing slash)."""

from __future__ import annotations

import socket

import pytest

from gateway_support import GatewayProcess, Script, ScriptedUpstream
from inferwatch.exporters.gateway.routes import BadTarget, canonical_target

CANONICAL = "/v2/models/toy_llm/generate_stream"
EVENTS = [b'data: {"text_output":"t","output_token_count":%d}\n\n' % (i + 1) for i in range(50)]

# (target as sent, path the upstream must receive (None: refused with 400), metered model or None)
ROWS = [
    ("/x/../v2/models/toy_llm/generate_stream", CANONICAL, "toy_llm"),  # the input
    ("/v2/models/./toy_llm/generate_stream", CANONICAL, "toy_llm"),
    ("/v2/models/toy_llm/%2e%2E/toy_llm/generate_stream", CANONICAL, "toy_llm"),
    ("/../../v2/models/toy_llm/generate_stream", CANONICAL, "toy_llm"),
    ("//v2//models/toy_llm//generate_stream", CANONICAL, "toy_llm"),
    ("/v2/models/toy_llm/generate_stream?x=1&y=/../", CANONICAL + "?x=1&y=/../", "toy_llm"),
    ("/V2/Models/toy_llm/Generate_Stream", "/V2/Models/toy_llm/Generate_Stream", "toy_llm"),
    ("/v2/models/toy%5Fllm/generate%5Fstream", "/v2/models/toy%5Fllm/generate%5Fstream", "toy_llm"),
    ("/v2/models/toy_llm/generate_stream/", CANONICAL + "/", "toy_llm"),
    ("/v2/models/toy_llm/versions/1/generate_stream", "/v2/models/toy_llm/versions/1/generate_stream", "toy_llm"),
    ("/v1/chat/completions/../completions", "/v1/chat/completions", "gpt-test"),
    ("/v2/models/toy_llm%2Fgenerate_stream", None, None),
    ("/v2/models/x%2f..%2ftoy_llm/generate_stream", None, None),
    ("/v2/models/toy_llm%5cgenerate_stream", None, None),
    ("/v2/models\\toy_llm/generate_stream", None, None),
    ("/v2/health/ready/.", "/v2/health/ready/", None),  # pass-through paths are made canonical too
]


def raw_request(port: int, target: str, tenant: str) -> tuple[int, bytes]:
    """POST `target` byte-for-byte (an HTTP library would normalise it first); (status, body)."""
    body = b'{"model":"gpt-test","stream":true}'
    head = (f"POST {target} HTTP/1.1\r\nHost: gw\r\nX-Tenant-ID: {tenant}\r\nX-Script: stream\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head.encode("latin-1") + body)
        data = b""
        while True:
            part = s.recv(65536)
            if not part:
                break
            data += part
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    up = ScriptedUpstream()
    up.scripts["stream"] = Script(EVENTS)
    tenants = [f"row{i}" for i in range(len(ROWS))]
    gw = GatewayProcess(up.url, {"tenants": tenants, "models": ["toy_llm", "gpt-test"]},
                        tmp_path_factory.mktemp("gateway"))
    yield gw, up
    gw.stop()
    up.stop()


@pytest.mark.parametrize("i", range(len(ROWS)), ids=[r[0] for r in ROWS])
def test_forwarded_path_is_the_classified_one(stack, i):
    gw, up = stack
    target, forwarded, model = ROWS[i]
    tenant = f"row{i}"
    before = len(up.received)
    status, body = raw_request(gw.port, target, tenant)
    if forwarded is None:
        assert status == 400 and b"bad request target" in body
        assert len(up.received) == before  # never reached the upstream
        assert gw.usages(tenant=tenant) == []
        return
    assert status == 200 and up.received[-1]["raw_path"] == forwarded
    if model is None:
        assert gw.usages(tenant=tenant) == []
        return
    usage = gw.wait_usage(tenant=tenant)  # metered: a usage record names the model
    assert usage["model"] == model
    if model == "toy_llm":
        assert usage["outcome"] == "ok" and body.count(b"data: ") == 50 and usage["output_tokens"] == 50


@pytest.mark.parametrize("raw, canonical", [
    ("/a/b/../c", "/a/c"), ("/a/./b/.", "/a/b/"), ("/a/..", "/"), ("/..", "/"), ("", "/"),
    ("http://evil.example/v2/x?q=1", "/v2/x?q=1"), ("/a//b///c", "/a/b/c"), ("/a/.%2e/b", "/b"),
])
def test_canonical_target_follows_rfc3986_remove_dot_segments(raw, canonical):
    assert canonical_target(raw or "/") == canonical


@pytest.mark.parametrize("raw", ["/a%2Fb", "/a%2fb", "/a%5Cb", "/a\\b", "not a path"])
def test_canonical_target_refuses_what_it_cannot_resolve(raw):
    with pytest.raises(BadTarget):
        canonical_target(raw)
