"""Gateway proxy in front of the real Triton serving `toy_llm`: streams metered as Triton writes them."""

from __future__ import annotations

import http.client
import json
import time

import pytest
import requests

from gateway_support import RunningProxy, make_spec, refused_port, wait_until
from inferwatch.exporters.gateway.metrics import TTFT_BUCKETS

STREAM = "/v2/models/toy_llm/generate_stream"
ACME = {"X-Tenant-ID": "acme", "X-Service-Name": "chat-web"}
ACME_LABELS = {"tenant": "acme", "model": "toy_llm", "tier": "realtime"}


@pytest.fixture
def proxy(triton):
    p = RunningProxy(triton.url)
    yield p
    p.stop()


def stream(url, headers=ACME, **knobs):
    """(status, raw bytes, number of data events) of one generate_stream call."""
    body = {"text_input": "hi", "max_tokens": 4, "first_token_delay_ms": 5, "token_delay_ms": 1, **knobs}
    with requests.post(url + STREAM, json=body, headers=headers, stream=True, timeout=30) as resp:
        raw = resp.raw.read()
    return resp.status_code, raw, raw.count(b"data: ")


def test_stream_bytes_identical_to_direct_and_tokens_exact(proxy, triton):
    status_direct, direct, _ = stream(triton.url, max_tokens=9)
    status, via, events = stream(proxy.url, max_tokens=9)
    assert (status_direct, status) == (200, 200)
    assert via == direct  # toy_llm output is deterministic: byte-for-byte pass-through
    sent = 9
    for n in (1, 3, 17):
        assert stream(proxy.url, max_tokens=n)[2] == n
        sent += n
    proxy.wait_requests(4, **ACME_LABELS, outcome="ok", code="200")
    assert proxy.value("gateway_tokens_total", **ACME_LABELS, type="output") == sent
    assert proxy.value("gateway_token_count_method_total", model="toy_llm", method="count_field") == 4
    assert proxy.value("gateway_output_tokens_count", **ACME_LABELS) == 4
    assert proxy.value("gateway_output_tokens_sum", **ACME_LABELS) == sent
    # ITL once per token after the first; TPOT once per request with >= 2 tokens.
    assert proxy.value("gateway_inter_token_latency_seconds_count", **ACME_LABELS) == sent - 4
    assert proxy.value("gateway_time_per_output_token_seconds_count", **ACME_LABELS) == 3
    assert proxy.value("gateway_requests_in_flight", **ACME_LABELS) == 0
    assert [u.output_tokens for u in proxy.usages] == [9, 1, 3, 17]


def client_ttft(url: str, **knobs) -> float:
    """Seconds from the client's sending one generate_stream call to its holding the first event's bytes
    (time.monotonic(): the proxy runs in this process, its clock is the same)."""
    body = json.dumps({"text_input": "hi", "max_tokens": 4, "first_token_delay_ms": 5, "token_delay_ms": 1,
                       **knobs}).encode()
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
    try:
        start = time.monotonic()
        conn.request("POST", STREAM, body, {"Content-Type": "application/json", **ACME})
        resp = conn.getresponse()
        assert resp.status == 200
        got = b""
        while b"\n\n" not in got.partition(b"data: ")[2]:  # the first event, whole
            part = resp.read1(65536)
            assert part, "the stream ended before its first event"
            got += part
        arrived = time.monotonic()
        resp.read()
        return arrived - start
    finally:
        conn.close()


def test_ttft_observations_sit_at_the_configured_first_token_delay(proxy):
    delay = 0.3
    # Bounds that hold under any load: the observation is at least the delay (the model sleeps that long
    # after the proxy has the request) and at most what the client saw (the proxy stamps a read before it
    # writes it on); 0.25 is a bucket edge below the delay.
    seen = [client_ttft(proxy.url, max_tokens=3, first_token_delay_ms=int(delay * 1000)) for _ in range(3)]
    proxy.wait_requests(3, **ACME_LABELS)
    count = proxy.value("gateway_time_to_first_token_seconds_count", **ACME_LABELS)
    total = proxy.value("gateway_time_to_first_token_seconds_sum", **ACME_LABELS)
    assert count == 3
    assert 3 * delay <= total <= sum(seen) + 0.002  # float sums and clock reads a few instructions apart
    below = proxy.value("gateway_time_to_first_token_seconds_bucket", **ACME_LABELS, le=str(0.25))
    upper = min(b for b in TTFT_BUCKETS if b >= max(seen))
    within = proxy.value("gateway_time_to_first_token_seconds_bucket", **ACME_LABELS, le=str(upper))
    assert (below, within) == (0, 3)


def test_mid_stream_error_counts_error_with_the_tokens_produced(proxy):
    status, raw, _ = stream(proxy.url, max_tokens=8, fail=1.0)
    assert status == 200 and b'data: {"error"' in raw  # passed through as Triton sent it
    proxy.wait_requests(1, outcome="error")
    assert proxy.requests_total(**ACME_LABELS, outcome="error", code="200") == 1
    assert proxy.value("gateway_tokens_total", **ACME_LABELS, type="output") == 4  # toy_llm fails at half
    assert proxy.value("gateway_time_per_output_token_seconds_count", **ACME_LABELS) == 0


def _established_to(port: int) -> int:
    """ESTABLISHED TCP connections on this host whose remote end is `port` (Linux /proc/net/tcp)."""
    count = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port and fields[3] == "01":
            count += 1
    return count


def test_client_disconnect_counts_cancelled_and_closes_the_upstream(proxy, triton):
    body = {"text_input": "hi", "max_tokens": 500, "first_token_delay_ms": 5, "token_delay_ms": 20}
    resp = requests.post(proxy.url + STREAM, json=body, headers=ACME, stream=True, timeout=30)
    events = (line for line in resp.iter_lines() if line)
    assert sum(1 for _, _line in zip(range(3), events, strict=False)) == 3
    assert _established_to(triton.http_port) == 1  # the proxy's upstream connection, streaming
    resp.close()  # the client goes away mid-stream
    proxy.wait_requests(1, **ACME_LABELS, outcome="cancelled")
    produced = proxy.value("gateway_tokens_total", **ACME_LABELS, type="output")
    assert 3 <= produced < 500
    # The proxy closed its upstream connection (Triton then flags the request cancelled and toy_llm stops;
    # Triton 2.51 counts no metric for that, so the connection itself is what is checked).
    wait_until(lambda: _established_to(triton.http_port) == 0, what="upstream connection closed")


def test_upstream_down_is_502_with_json_error():
    with refused_port() as port:
        p = RunningProxy(f"http://127.0.0.1:{port}")
        try:
            resp = requests.post(p.url + STREAM, json={"text_input": "hi"}, headers=ACME, timeout=10)
            assert resp.status_code == 502
            assert resp.json() == {"error": "upstream unavailable"}  # the address stays in the log
            p.wait_requests(1)
            assert p.requests_total(**ACME_LABELS, code="502", outcome="error") == 1
        finally:
            p.stop()


def test_upstream_timeout_is_504_and_counted_timeout(triton):
    p = RunningProxy(triton.url, make_spec(upstream_timeout="300ms"))
    try:
        status, raw, _ = stream(p.url, max_tokens=2, first_token_delay_ms=1500)
        assert status == 504 and "did not answer" in json.loads(raw)["error"]
        p.wait_requests(1)
        assert p.requests_total(**ACME_LABELS, code="504", outcome="timeout") == 1
    finally:
        p.stop()


def test_undeclared_tenant_service_and_model_fold_into_other(proxy):
    headers = {"X-Tenant-ID": "user-12345", "X-Service-Name": "some-new-service"}
    assert stream(proxy.url, headers=headers, max_tokens=2)[0] == 200
    assert stream(proxy.url, headers={}, max_tokens=2)[0] == 200
    proxy.wait_requests(2)
    other = {"tenant": "other", "model": "toy_llm", "tier": "other"}
    assert proxy.requests_total(**other, outcome="ok") == 2
    assert proxy.value("gateway_tokens_total", **other, type="output") == 4
    exposed = requests.get(proxy.metrics_url, timeout=5).text
    assert "user-12345" not in exposed and "some-new-service" not in exposed


def test_non_streamed_generate_carries_x_token_used(proxy, triton):
    body = {"text_input": "hi", "max_tokens": 1, "first_token_delay_ms": 1}
    direct = requests.post(triton.url + "/v2/models/toy_llm/generate", json=body, timeout=10)
    resp = requests.post(proxy.url + "/v2/models/toy_llm/generate", json=body, headers=ACME, timeout=10)
    assert resp.status_code == 200 and resp.content == direct.content
    assert resp.headers["X-Token-Used-Output"] == "1"
    assert "X-Token-Used" not in resp.headers  # toy_llm reports no input count: the total is unknown
    # Triton answers 200 with an error body when a decoupled model sends several responses to /generate.
    bad = requests.post(proxy.url + "/v2/models/toy_llm/generate", json={**body, "max_tokens": 3},
                        headers=ACME, timeout=10)
    assert "error" in bad.json()
    proxy.wait_requests(2)
    assert proxy.requests_total(**ACME_LABELS, outcome="ok") == 1
    assert proxy.requests_total(**ACME_LABELS, outcome="error", code="200") == 1
    assert proxy.value("gateway_time_to_first_token_seconds_count", **ACME_LABELS) == 0  # not streamed


def test_body_above_limit_is_413_and_other_paths_pass_through(triton):
    p = RunningProxy(triton.url, make_spec(max_body_bytes=1024))
    try:
        resp = requests.post(p.url + STREAM, data=b"x" * 5000, headers=ACME, timeout=10)
        assert resp.status_code == 413 and "limit 1024" in resp.json()["error"]
        p.wait_requests(1)
        assert p.requests_total(**ACME_LABELS, code="413", outcome="error") == 1
        ready = requests.get(p.url + "/v2/health/ready", timeout=10)
        index = requests.post(p.url + "/v2/repository/index", timeout=10)
        assert ready.status_code == 200
        assert index.content == requests.post(triton.url + "/v2/repository/index", timeout=10).content
        assert p.requests_total() == 1  # pass-through paths are not LLM requests
    finally:
        p.stop()
