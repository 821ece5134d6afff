"""One gateway (the real CLI process) in front of a mixed fleet (spec `upstreams`): the real Triton, an
OpenAI-compatible server (the OpenAI SSE upstream of gateway_support, standing in for vLLM, which needs a GPU)
and an upstream that refuses connections. Each request goes to the upstream its path prefix or model names,
metered as that upstream's protocol, and each upstream's failures are counted under its own name."""

from __future__ import annotations

import json

import pytest
import requests

from gateway_support import (
    DONE,
    TEST_SPEC,
    GatewayProcess,
    OpenAIUpstream,
    chat_chunk,
    refused_port,
    usage_chunk,
    wait_until,
)
from inferwatch.exporters.gateway.router import request_model

TENANT = {"X-Tenant-ID": "acme", "X-Service-Name": "chat-web"}


@pytest.fixture
def fleet(triton, tmp_path):
    vllm = OpenAIUpstream()
    vllm.script = [chat_chunk("Hel", role="assistant"), chat_chunk("lo", finish="stop"), usage_chunk(3, 2), DONE]
    with refused_port() as dead:
        spec = {**TEST_SPEC,
                "upstreams": {
                    "triton": {"kind": "triton", "url": "http://placeholder:1", "default": True},
                    "vllm": {"kind": "openai", "url": vllm.url, "models": ["llama3"], "path_prefix": "/vllm/"},
                    "down": {"kind": "openai", "url": f"http://127.0.0.1:{dead}", "models": ["gone"]}}}
        # NAME=URL replaces the spec's URL: here the Triton port the fixture picked.
        gw = GatewayProcess(f"triton={triton.url}", spec, tmp_path)
        try:
            yield gw, vllm
        finally:
            gw.stop()
            vllm.stop()


def _chat(gw, path: str, model: str):
    return requests.post(gw.url + path, json={"model": model, "stream": True,
                                              "messages": [{"role": "user", "content": "hi"}]},
                         headers=TENANT, timeout=30)


def test_each_request_goes_to_its_upstream_and_failures_are_labelled(fleet):
    gw, vllm = fleet
    # By model name: llama3 is vLLM's.
    resp = _chat(gw, "/v1/chat/completions", "llama3")
    assert resp.status_code == 200 and b"Hel" in resp.content
    assert vllm.bodies[-1]["model"] == "llama3"
    assert gw.wait_usage(model="llama3")["output_tokens"] == 2
    # By path prefix (cut off before forwarding): the OpenAI server has only /v1/... routes.
    resp = _chat(gw, "/vllm/v1/chat/completions", "gpt-test")  # by its model, Triton's (the default)
    assert resp.status_code == 200 and len(vllm.bodies) == 2
    assert gw.wait_usage(model="gpt-test")["output_tokens"] == 2
    # The default upstream: the real Triton, metered as Triton's protocol.
    body = {"text_input": "hello", "max_tokens": 4, "first_token_delay_ms": 1, "token_delay_ms": 1}
    with requests.post(gw.url + "/v2/models/toy_llm/generate_stream", json=body, headers=TENANT, stream=True,
                       timeout=30) as resp:
        events = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith(b"data:")]
    assert resp.status_code == 200 and len(events) == 4 and not any("error" in e for e in events)
    assert gw.wait_usage(model="toy_llm")["output_tokens"] == 4
    assert len(vllm.bodies) == 2  # Triton's request did not reach the OpenAI server
    # Every upstream's counters exist from the start (0: a count, known), so rate() sees the first failure.
    assert gw.value("gateway_upstream_failures_total", upstream="down", outcome="error") == 0
    # The upstream that refuses connections: 502, counted under its name only.
    resp = _chat(gw, "/v1/chat/completions", "gone")
    assert resp.status_code == 502 and resp.json() == {"error": "upstream unavailable"}
    wait_until(lambda: gw.value("gateway_upstream_failures_total", upstream="down", outcome="error") == 1,
               what="the down upstream's failure counted")
    for name in ("triton", "vllm"):
        assert gw.value("gateway_upstream_failures_total", upstream=name, outcome="error") == 0, name
    assert "placeholder" not in gw.output()


@pytest.mark.parametrize("path, body, want", [
    ("/v2/models/toy_llm/generate_stream", b"", "toy_llm"),           # Triton names it in the path
    ("/v2/models/toy_llm", b"", "toy_llm"),
    ("/v1/chat/completions", b' {"model": "llama3", "stream": true}', "llama3"),
    ("/v1/chat/completions", b'{"model": 3}', None),                   # not a string: unknown
    ("/v1/chat/completions", b'[{"model": "llama3"}]', None),          # not an object
    ("/v1/chat/completions", b'{"model": "llama3"', None),             # not JSON (cut)
    ("/v1/chat/completions", b"\xff\xfe{", None),                      # not text
    ("/v1/models", b"", None),
])
def test_request_model(path, body, want):
    assert request_model(path, body) == want


@pytest.mark.parametrize("upstreams, given, want", [
    (None, ["http://triton:8000"], "http://triton:8000"),
    (None, [], "expected one URL"),
    (None, ["http://a:1", "http://b:1"], "expected one URL"),
    ({"vllm": {"url": "http://vllm:8000"}}, [], {"vllm": "http://vllm:8000"}),
    ({"vllm": {"url": "http://vllm:8000"}}, ["vllm=http://k:s3cret@vllm:8000"], {"vllm": "http://k:s3cret@vllm:8000"}),
    ({"vllm": {"url": "http://vllm:8000"}}, ["http://k:s3cret@vllm:8000"], "expected NAME=URL"),
    ({"vllm": {"url": "http://vllm:8000"}}, ["tgi=http://tgi:80"], "'tgi' is not in the spec's upstreams (vllm)"),
    ({"vllm": {"url": "http://vllm:8000"}}, ["vllm=ftp://k:s3cret@x"], "expected an http(s) URL"),
])
def test_upstream_flags(upstreams, given, want):
    from inferwatch.cli import UsageError
    from inferwatch.exporters.gateway.cli import upstream_urls
    from inferwatch.spec import spec_from_dict

    spec = spec_from_dict({**TEST_SPEC, **({"upstreams": upstreams} if upstreams else {})})
    if isinstance(want, str) and "://" not in want:
        with pytest.raises(UsageError) as err:
            upstream_urls(spec, given)
        assert want in str(err.value) and "s3cret" not in str(err.value)
    else:
        assert upstream_urls(spec, given) == want


@pytest.mark.parametrize("upstreams, refused", [
    (None, None),  # no upstreams: every model is Triton's
    ({"triton": {"url": "http://triton:8000"}, "vllm": {"url": "http://vllm:8000", "kind": "openai"}}, None),
    ({"a": {"url": "http://a:8000"}, "b": {"url": "http://b:8000", "models": ["classifier"]}},
     "list 2 Triton servers (a, b)"),
    ({"vllm": {"url": "http://vllm:8000", "kind": "openai"}}, "list no Triton server"),
])
def test_grpc_upstream_with_the_specs_upstreams(upstreams, refused):
    """The gRPC listener forwards to one address: it combines with at most one Triton in `upstreams`."""
    from inferwatch.cli import UsageError
    from inferwatch.exporters.gateway.cli import check_grpc_fleet
    from inferwatch.spec import spec_from_dict

    spec = spec_from_dict({**TEST_SPEC, **({"upstreams": upstreams} if upstreams else {})})
    if refused is None:
        check_grpc_fleet(spec)
    else:
        with pytest.raises(UsageError) as err:
            check_grpc_fleet(spec)
        assert refused in str(err.value) and "--grpc-upstream" in str(err.value)


def test_gateway_refuses_grpc_upstream_with_two_tritons_at_start(tmp_path):
    import subprocess
    import sys

    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({**TEST_SPEC, "upstreams": {"a": {"url": "http://127.0.0.1:9"},
                                                            "b": {"url": "http://127.0.0.1:10"}}}))
    done = subprocess.run([sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--spec", str(spec),
                           "--grpc-upstream", "127.0.0.1:8001"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "2 Triton servers (a, b)" in done.stderr and "Traceback" not in done.stderr
