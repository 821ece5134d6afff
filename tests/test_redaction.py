"""inferwatch.redaction for server addresses: what a URL with credentials may show (a label, a scrape target,
a log line) and which of its parts are registered as secrets. The issue's example is the first row."""

from __future__ import annotations

import base64

import pytest

from inferwatch import redaction


@pytest.mark.parametrize("url, address", [
    ("http://user:pass@triton:8000", "triton:8000"),
    ("http://triton:8000", "triton:8000"),
    ("https://TOKENtoken1234@triton.example.com:8443/v2", "triton.example.com:8443"),
    ("http://u%40corp:p%3Ass@10.0.0.5:8000", "10.0.0.5:8000"),            # percent-encoded user-info
    ("http://admin:s3cret@[fd00::1]:8000/", "[fd00::1]:8000"),             # IPv6 keeps its brackets
    ("http://a:b@triton", "triton"),                                       # no port: the host alone
    ("http://user:p@ss@triton:8000", "triton:8000"),                       # '@' in the password
])
def test_address_is_host_port_without_user_info(url, address):
    assert redaction.address(url) == address


@pytest.mark.parametrize("url, secret, kept", [
    ("http://tw-admin:Pa55-Triton-1@triton-a:8000", "Pa55-Triton-1", "triton-a:8000"),
    ("http://TOKEN-a1b2c3d4e5@triton-b:8000", "TOKEN-a1b2c3d4e5", "triton-b:8000"),
    ("http://metrics-user:Pa55-Metrics-2@triton-c:8002/metrics", "Pa55-Metrics-2", "triton-c:8002/metrics"),
])
def test_url_credentials_are_registered_but_not_the_server(url, secret, kept):
    redaction.register_url_credentials(url)
    userinfo = url.split("//", 1)[1].rsplit("@", 1)[0]
    basic = base64.b64encode(userinfo.encode()).decode() if ":" in userinfo else None
    # As libraries and servers print them: the URL, the bare user-info and password, the Basic credential.
    text = redaction.redact(f"GET {url} failed; credential {basic} for {userinfo} rejected; password {secret}")
    assert secret not in text and userinfo not in text and (basic is None or basic not in text), text
    assert kept in text                       # the server stays named, so the line says what it is about
    assert "triton" in redaction.redact(f"polling {url.split('@')[1]}")   # the bare address is no secret


def test_percent_encoded_credentials_are_registered_as_clients_decode_and_send_them():
    redaction.register_url_credentials("http://svc%40corp:Pa%3Ass-Enc0ded@triton-d:8000")
    sent = base64.b64encode(b"svc@corp:Pa:ss-Enc0ded").decode()   # the Basic credential aiohttp sends
    text = redaction.redact(f"Authorization {sent}; password Pa:ss-Enc0ded")
    assert sent not in text and "Pa:ss-Enc0ded" not in text


def test_a_url_without_credentials_registers_nothing():
    redaction.register_url_credentials("http://plain-triton-host:8000")
    assert redaction.redact("triton plain-triton-host:8000 unreachable") == "triton plain-triton-host:8000 unreachable"


@pytest.mark.parametrize("text, shown", [
    ("{'Authorization': 'Basic QWxhZGRpbjpvcGVu'}", "{'Authorization': 'Basic <redacted>'}"),
    ("authorization=xyz123abc", "authorization=<redacted>"),
    ('"authorization": "tok-abcdef"', '"authorization": "<redacted>"'),
    ("upstream_authorization: Bearer sk-live-1234", "upstream_authorization: Bearer <redacted>"),
    # A spec error names the field, then prose: the prose stays (it said `<redacted> variable` before).
    ("gateway.upstream_authorization: environment variable TOKEN is not set",
     "gateway.upstream_authorization: environment variable TOKEN is not set"),
    ("field upstream_authorization: expected a string", "field upstream_authorization: expected a string"),
])
def test_authorization_values_are_redacted_and_field_names_with_prose_are_not(text, shown):
    assert redaction.redact(text) == shown
