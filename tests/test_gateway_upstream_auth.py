"""What credential the upstream receives (exporters/gateway/credentials.py, spec
`gateway.upstream_authorization`): unset, the client's own credential headers are forwarded as sent (and the
`--upstream` URL's Basic credentials only when the client sent no Authorization); set, every client
credential header (Authorization, X-Api-Key, Api-Key) is removed, metered or not, and the spec's one value
sent instead: a tenant's billing API key then never reaches the upstream, and the value is in no output.

Each gateway configuration is the real CLI process in front of a scripted upstream that records the header
fields it received."""

from __future__ import annotations

import base64
import os

import pytest
import requests

from gateway_support import GatewayProcess, Script, ScriptedUpstream, wait_until
from inferwatch.exporters.gateway.credentials import CLIENT_CREDENTIALS, UpstreamCredential
from inferwatch.spec import SpecError, spec_from_dict

CHAT = "/v1/chat/completions"
REPLACEMENT = "Bearer upstream-9c1e-token"
TENANT_KEY = "tk-acme-7f3a"
URL_USER, URL_PASSWORD = "meter-bot", "url-pa55-41d0"
EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"]


def credentials_received(record: dict) -> list[tuple[str, str]]:
    return sorted((k.lower(), v) for k, v in record["header_list"] if k.lower() in CLIENT_CREDENTIALS)


# (client credential headers sent, received with the option unset, received with it set)
SENT = [
    ({"Authorization": "Bearer user-key-1"}, [("authorization", "Bearer user-key-1")],
     [("authorization", REPLACEMENT)]),
    ({"X-Api-Key": "anthropic-key-2"}, [("x-api-key", "anthropic-key-2")], [("authorization", REPLACEMENT)]),
    ({"Api-Key": "azure-key-3", "authorization": "Basic dTpw"},
     [("api-key", "azure-key-3"), ("authorization", "Basic dTpw")], [("authorization", REPLACEMENT)]),
    ({}, [], [("authorization", REPLACEMENT)]),
    # The case: the tenant's billing key. Billed either way; forwarded only while the option is unset.
    ({"Authorization": f"Bearer {TENANT_KEY}"}, [("authorization", f"Bearer {TENANT_KEY}")],
     [("authorization", REPLACEMENT)]),
]


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    """{"unset" | "set": (gateway, upstream)}; both also have credentials in their --upstream URL."""
    up = ScriptedUpstream()
    up.scripts["acme"] = Script(EVENTS)
    up.scripts["health"] = Script([b"{}"], content_type="application/json")
    keys = tmp_path_factory.mktemp("keys") / "tenant-keys"
    keys.write_text(f"{TENANT_KEY} acme\n")
    url = up.url.replace("http://", f"http://{URL_USER}:{URL_PASSWORD}@")
    out = {}
    try:
        for name in ("unset", "set"):
            gateway = {"tenant_api_keys_file": str(keys)}
            if name == "set":
                gateway["upstream_authorization"] = "${INFERWATCH_TEST_UPSTREAM_AUTH}"
            env = dict(os.environ, INFERWATCH_TEST_UPSTREAM_AUTH=REPLACEMENT)
            out[name] = GatewayProcess(url, {"tenants": ["acme"], "models": ["gpt-test"], "gateway": gateway},
                                       tmp_path_factory.mktemp(name), env=env)
        yield out, up
    finally:
        for gw in out.values():
            gw.stop()
        up.stop()


@pytest.mark.parametrize("option", ["unset", "set"])
@pytest.mark.parametrize("sent, unset, replaced", SENT)
def test_the_upstream_gets_the_clients_credentials_or_the_specs_alone(gateways, option, sent, unset, replaced):
    gws, up = gateways
    gw = gws[option]
    expected = replaced if option == "set" else unset
    # Unset and no client Authorization: the --upstream URL's credentials (Basic) added, as before.
    if option == "unset" and "authorization" not in {k.lower() for k in sent}:
        basic = "Basic " + base64.b64encode(f"{URL_USER}:{URL_PASSWORD}".encode()).decode()
        expected = sorted([*expected, ("authorization", basic)])
    n = len(up.received)
    with requests.post(gw.url + CHAT, json={"model": "gpt-test", "stream": True}, timeout=30,
                       headers={"X-Script": "acme", **sent}) as r:
        assert r.status_code == 200 and r.content == b"".join(EVENTS)
    health = requests.get(gw.url + "/v2/health/ready", headers={"X-Script": "health", **sent}, timeout=30)
    assert health.status_code == 200
    metered, unmetered = up.received[n:]
    assert credentials_received(metered) == expected
    assert credentials_received(unmetered) == expected
    if sent.get("Authorization") == f"Bearer {TENANT_KEY}":
        labels = {"tenant": "acme", "model": "gpt-test", "tier": "other", "code": "200", "outcome": "ok"}
        wait_until(lambda: (gw.value("gateway_requests_total", **labels) or 0) >= 1, what="billed to acme")


def test_the_replacement_is_in_no_output(gateways):
    gws, _up = gateways
    for gw in gws.values():
        text = gw.output() + requests.get(gw.metrics_url, timeout=10).text
        assert REPLACEMENT.split()[1] not in text and URL_PASSWORD not in text


@pytest.mark.parametrize("value, refused", [
    ("Bearer abc", False),
    ("  Bearer abc  ", False),          # surrounding spaces dropped, as a header field's
    ("Bearer abc\r\nX-Evil: 1", True),  # would split the request head
    ("Bearer \x07abc", True),
    ("   ", True),
])
def test_a_replacement_that_is_no_header_value_is_refused_naming_the_field(monkeypatch, value, refused):
    monkeypatch.setenv("INFERWATCH_TEST_UPSTREAM_AUTH", value)
    spec = spec_from_dict({"gateway": {"upstream_authorization": "${INFERWATCH_TEST_UPSTREAM_AUTH}"}})
    if not refused:
        assert UpstreamCredential(spec).value == value.strip()
        return
    with pytest.raises(SpecError) as exc:
        UpstreamCredential(spec)
    assert exc.value.path == "gateway.upstream_authorization" and "abc" not in str(exc.value)


def test_grpc_metadata_keys_are_replaced_in_lower_case(monkeypatch):
    monkeypatch.setenv("INFERWATCH_TEST_UPSTREAM_AUTH", REPLACEMENT)
    spec = spec_from_dict({"gateway": {"upstream_authorization": "${INFERWATCH_TEST_UPSTREAM_AUTH}"}})
    metadata = [("authorization", "Bearer user"), ("x-api-key", "k"), ("x-tenant-id", "acme")]
    assert UpstreamCredential(spec).apply(metadata, "authorization") == [
        ("x-tenant-id", "acme"), ("authorization", REPLACEMENT)]
    assert UpstreamCredential(spec_from_dict({})).apply(metadata, "authorization") == metadata
