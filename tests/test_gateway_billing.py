"""Billing that cannot be forged: the token headers are the gateway's alone, and the tenant billed is the one
a trusted source names (exporters/gateway/tenancy.py), forwarded to the upstream exactly as billed.

The real proxy in front of a scripted upstream; requests come from 127.0.0.1, a trusted proxy address by
default (`gateway.tenant_trusted_proxies`), and from an untrusted one when the spec lists another network.
"""

from __future__ import annotations

import http.client

import pytest

from gateway_support import RunningProxy, Script, ScriptedUpstream, make_spec, wait_until

CHAT = "/v1/chat/completions"
GENERATE = "/v2/models/toy_llm/generate"
OPENAI_BODY = (b'{"choices":[{"index":0,"message":{"content":"Hi"}}],'
               b'"usage":{"prompt_tokens":10,"completion_tokens":20}}')
STREAM = [b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n',
          b'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}\n\n', b"data: [DONE]\n\n"]
# The forged fields an upstream may add, in the spellings and casings HTTP allows (field names are
# case-insensitive), and a suffix the gateway never sets.
FORGED = {"X-Token-Used": "999999", "x-token-used-output": "999999", "X-TOKEN-USED-INPUT": "999999",
          "X-Token-Used-Reasoning": "999999"}


def post(port: int, path: str, body: bytes, headers: list[tuple[str, str]]) -> tuple[int, list[tuple[str, str]],
                                                                                     bytes]:
    """POST with `headers` exactly as listed (repeats kept): (status, answer fields, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        for k, v in [*headers, ("Content-Type", "application/json"), ("Content-Length", str(len(body)))]:
            conn.putheader(k, v)
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, r.getheaders(), r.read()
    finally:
        conn.close()


def token_fields(fields) -> dict[str, str]:
    return {k.lower(): v for k, v in fields if k.lower().startswith("x-token-used")}


@pytest.fixture(scope="module")
def upstream():
    up = ScriptedUpstream()
    up.scripts["openai"] = Script([OPENAI_BODY], content_type="application/json", headers=FORGED)
    up.scripts["stream"] = Script(STREAM, headers=FORGED)
    # Triton's generate without any count: the gateway knows none, so it sends no header at all.
    up.scripts["nocount"] = Script([b'{"model_name":"toy_llm","text_output":"Hi"}'], content_type="application/json",
                                   headers=FORGED)
    up.scripts["plain"] = Script([b"{}"], content_type="application/json", headers=FORGED)
    yield up
    up.stop()


@pytest.fixture(scope="module")
def gw(upstream):
    proxy = RunningProxy(upstream.url)
    yield proxy
    proxy.stop()


# (row, script, path, request body, the X-Token-Used* fields the client must get: the gateway's own only)
TOKEN_ROWS = [
    ("openai_whole", "openai", CHAT, b'{"model":"gpt-test"}',
     {"x-token-used": "30", "x-token-used-input": "10", "x-token-used-output": "20"}),
    ("triton_generate_no_count", "nocount", GENERATE, b'{"text_input":"hi"}', {}),  # the example
    ("openai_stream", "stream", CHAT, b'{"model":"gpt-test","stream":true}', {}),  # headers precede the counts
    ("unmetered_path", "plain", "/v2/repository/index", b"{}", {}),
]


@pytest.mark.parametrize("row, script, path, body, want", TOKEN_ROWS, ids=[r[0] for r in TOKEN_ROWS])
def test_upstream_token_headers_never_reach_the_client(gw, row, script, path, body, want):
    status, fields, _ = post(gw.port, path, body, [("X-Script", script), ("X-Tenant-ID", "acme")])
    assert status == 200
    assert token_fields(fields) == want


# (row, tenant headers as sent, the tenant billed, the tenant header values the upstream receives)
TENANT_ROWS = [
    ("plain", [("X-Tenant-ID", "globex")], "globex", ["globex"]),
    ("lower_case_name", [("x-tenant-id", "globex")], "globex", ["globex"]),
    ("upper_case_name", [("X-TENANT-ID", "acme")], "acme", ["acme"]),
    ("surrounding_whitespace", [("X-Tenant-ID", " globex\t")], "globex", ["globex"]),  # the example
    ("blank", [("X-Tenant-ID", " ")], "other", []),
    ("absent", [], "other", []),
]


@pytest.mark.parametrize("row, sent, billed, forwarded", TENANT_ROWS, ids=[r[0] for r in TENANT_ROWS])
def test_trusted_tenant_is_normalised_once_billed_and_forwarded_the_same(gw, upstream, row, sent, billed, forwarded):
    before = len(gw.usages)
    status, _, _ = post(gw.port, CHAT, b'{"model":"gpt-test"}', [("X-Script", "openai"), *sent])
    assert status == 200
    got = upstream.received[-1]["header_list"]
    assert [v for k, v in got if k.lower() == "x-tenant-id"] == forwarded
    wait_until(lambda: len(gw.usages) > before, what="the request's usage record")
    assert [u.tenant for u in gw.usages[before:]] == [billed]


SEVERAL = [
    ("two_headers", [("X-Tenant-ID", "acme"), ("X-Tenant-ID", "globex")]),  # the example
    ("two_casings", [("X-Tenant-ID", "acme"), ("x-tenant-id", "acme")]),
    ("a_list", [("X-Tenant-ID", "acme, globex")]),
    ("control_character", [("X-Tenant-ID", "acme\x01")]),
]


@pytest.mark.parametrize("row, sent", SEVERAL, ids=[r[0] for r in SEVERAL])
def test_several_or_malformed_tenant_headers_are_refused(gw, upstream, row, sent):
    before, seen = len(gw.usages), len(upstream.received)
    status, _, body = post(gw.port, CHAT, b'{"model":"gpt-test"}', [("X-Script", "openai"), *sent])
    assert status == 400, body
    # The HTTP parser refuses a control character itself; the rest are the tenant check's refusals.
    assert b"X-Tenant-ID" in body or row == "control_character", body
    assert len(upstream.received) == seen  # nothing forwarded
    assert len(gw.usages) == before  # nothing billed


def test_untrusted_peer_cannot_choose_its_tenant(upstream, tmp_path):
    """From outside tenant_trusted_proxies the header is removed (billed `other`, the upstream sees none);
    an API key listed in tenant_api_keys names the tenant whatever header was sent."""
    keys = tmp_path / "keys"
    keys.write_text("# key tenant\nk-acme-123 acme\n")
    spec = make_spec(tenant_trusted_proxies=["10.0.0.0/8"], tenant_api_keys_file=str(keys))
    proxy = RunningProxy(upstream.url, spec)
    try:
        cases = [  # (headers, billed, forwarded)
            ([("X-Tenant-ID", "globex")], "other", []),  # the spoofed globex
            ([("X-Tenant-ID", "globex"), ("Authorization", "Bearer k-acme-123")], "acme", ["acme"]),
            ([("Authorization", "Bearer k-acme-123")], "acme", ["acme"]),
            ([("X-Tenant-ID", "globex"), ("Authorization", "Bearer wrong-key")], "other", []),
        ]
        for sent, billed, forwarded in cases:
            before = len(proxy.usages)
            status, _, _ = post(proxy.port, CHAT, b'{"model":"gpt-test"}', [("X-Script", "openai"), *sent])
            assert status == 200
            assert [v for k, v in upstream.received[-1]["header_list"] if k.lower() == "x-tenant-id"] == forwarded
            wait_until(lambda n=before: len(proxy.usages) > n, what="the request's usage record")
            assert [u.tenant for u in proxy.usages[before:]] == [billed], sent
    finally:
        proxy.stop()


# (row, request target as sent, the path the upstream must receive under --upstream .../base)
BASE_ROWS = [
    ("dot_dot", "/../x", "/base/x"),  # the example
    ("encoded_dot_dot", "/%2e%2e/x", "/base/x"),
    ("mixed_dots", "/.%2E/./x", "/base/x"),
    ("inside_then_out", "/a/../../../x", "/base/x"),
    ("metered_openai", "/v1/chat/completions", "/base/v1/chat/completions"),
    ("metered_triton", "/v2/models/toy_llm/generate", "/base/v2/models/toy_llm/generate"),
    ("metered_with_dots", "/../v1/chat/completions", "/base/v1/chat/completions"),
]


@pytest.fixture(scope="module")
def based(upstream):
    proxy = RunningProxy(upstream.url + "/base")
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("row, target, reached", BASE_ROWS, ids=[r[0] for r in BASE_ROWS])
def test_requests_cannot_leave_the_upstream_base_path(based, upstream, row, target, reached):
    seen = len(upstream.received)
    post(based.port, target, b'{"model":"gpt-test"}', [("X-Script", "plain")])
    assert len(upstream.received) == seen + 1
    assert upstream.received[-1]["raw_path"] == reached
