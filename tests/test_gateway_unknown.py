"""Unknown is not zero, and only declared LLM traffic is metered: the real gateway process in front of the
real Triton (toy_llm reports output_token_count but no input count; classifier is not an LLM)."""

from __future__ import annotations

import pytest
import requests

from gateway_support import GatewayProcess
from inferwatch.traffic import classifier_body

GEN = {"text_input": "hi", "max_tokens": 1, "first_token_delay_ms": 1}
STREAM = {"text_input": "hi", "max_tokens": 3, "first_token_delay_ms": 1, "token_delay_ms": 1}


def headers(tenant: str) -> dict:
    return {"X-Tenant-ID": tenant}


@pytest.fixture(scope="module")
def default_gw(triton, tmp_path_factory):
    """gateway.llm_models unset: generate/generate_stream of every model metered, infer of none."""
    gw = GatewayProcess(triton.url, {"tenants": ["stream", "whole", "infer"], "models": ["toy_llm", "classifier"]},
                        tmp_path_factory.mktemp("gateway"))
    yield gw
    gw.stop()


def test_stream_without_input_count_has_no_input_sample_and_null_in_usage(default_gw):
    gw = default_gw
    resp = requests.post(gw.url + "/v2/models/toy_llm/generate_stream", json=STREAM, headers=headers("stream"),
                         timeout=30)
    assert resp.status_code == 200
    usage = gw.wait_usage(tenant="stream")
    assert (usage["input_tokens"], usage["output_tokens"], usage["method"]) == (None, 3, "count_field")
    labels = {"tenant": "stream", "model": "toy_llm", "tier": "other"}
    assert gw.value("gateway_tokens_total", **labels, type="output") == 3
    assert gw.value("gateway_tokens_total", **labels, type="input") is None  # no sample, not 0


def test_whole_answer_without_input_count_gets_no_input_or_total_header(default_gw):
    gw = default_gw
    resp = requests.post(gw.url + "/v2/models/toy_llm/generate", json=GEN, headers=headers("whole"), timeout=30)
    assert resp.status_code == 200
    assert resp.headers["X-Token-Used-Output"] == "1"
    # The total needs the input count, which Triton did not report: absent, not output + 0.
    assert "X-Token-Used-Input" not in resp.headers and "X-Token-Used" not in resp.headers
    usage = gw.wait_usage(tenant="whole")
    assert (usage["input_tokens"], usage["output_tokens"]) == (None, 1)


def test_non_llm_infer_is_not_metered(default_gw):
    """The issue's input: /v2/models/classifier/infer is not LLM traffic, so no X-Token-Used: 0."""
    gw = default_gw
    resp = requests.post(gw.url + "/v2/models/classifier/infer", json=classifier_body(), headers=headers("infer"),
                         timeout=30)
    assert resp.status_code == 200 and "outputs" in resp.json()
    assert not [h for h in resp.headers if h.lower().startswith("x-token-used")]
    assert gw.usages(tenant="infer") == []
    assert not [s for s in gw.samples() if s.labels.get("model") == "classifier"]


def test_declared_llm_models_decide_what_is_metered(triton, tmp_path_factory):
    """gateway.llm_models: [classifier] meters classifier's infer (its tokens unknown: no header, null) and
    not toy_llm, which the list leaves out."""
    spec = {"tenants": ["t"], "models": ["toy_llm", "classifier"], "gateway": {"llm_models": ["classifier"]}}
    gw = GatewayProcess(triton.url, spec, tmp_path_factory.mktemp("gateway"))
    try:
        resp = requests.post(gw.url + "/v2/models/classifier/infer", json=classifier_body(), headers=headers("t"),
                             timeout=30)
        assert resp.status_code == 200
        assert not [h for h in resp.headers if h.lower().startswith("x-token-used")]
        usage = gw.wait_usage(tenant="t", model="classifier")
        assert (usage["outcome"], usage["output_tokens"], usage["method"]) == ("ok", None, "none")
        stream = requests.post(gw.url + "/v2/models/toy_llm/generate_stream", json=STREAM, headers=headers("t"),
                               timeout=30)
        assert stream.status_code == 200 and stream.text.count("data: ") == 3
        assert gw.usages(model="toy_llm") == []
        assert gw.value("gateway_requests_total", tenant="t", model="classifier", tier="other", code="200",
                        outcome="ok") == 1
    finally:
        gw.stop()
