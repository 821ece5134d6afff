"""A mixed fleet (spec `upstreams`): Triton next to an OpenAI-compatible server behind one gateway.

- the spec says which upstream serves each model; its checks name the field (table of bad specs);
- the gateway's choice per request (path prefix, model, default) as a table;
- TritonModelNotLoaded, in promtool, never fires for a model of the OpenAI-compatible upstream (it is in no
  Triton's repository: the false critical page that escalated to the phone) and still fires for an unloaded
  Triton model;
- triage does not run Triton evidence for a model Triton does not serve, and says why."""

from __future__ import annotations

import pytest
import yaml

from inferwatch.rules.generate import RULES_DIR, outputs
from inferwatch.spec import SpecError, spec_from_dict
from inferwatch.triage.engine import triage_alert
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.sources import PrometheusSource
from inferwatch.upstreams import choose, kind_of, triton_models, upstream_of
from selector_support import REPO
from test_rules_selectors import expected, run_promtool

MIXED = {
    "triton": {"url": "http://triton:8000", "kind": "triton", "default": True},
    "vllm": {"url": "http://vllm:8000", "kind": "openai", "models": ["llama3"],
             "path_prefix": "/vllm/"},
}


def repo_spec(**changes):
    data = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    data.update(changes)
    return spec_from_dict(data)


def test_models_get_their_upstream_and_kind():
    spec = repo_spec(upstreams=MIXED)
    assert "llama3" in spec.models  # an upstream's models are declared models (gateway labels)
    assert [(m, upstream_of(spec, m), kind_of(spec, m)) for m in spec.models] == [
        ("toy_llm", "triton", "triton"), ("classifier", "triton", "triton"), ("chat_ens", "triton", "triton"),
        ("llama3", "vllm", "openai")]
    assert triton_models(spec) == ["toy_llm", "classifier", "chat_ens"]
    # Without the section every model is Triton's, as before.
    plain = repo_spec()
    assert triton_models(plain) == plain.models and upstream_of(plain, "toy_llm") is None


@pytest.mark.parametrize("path, model, want", [
    ("/v1/chat/completions", "llama3", "vllm"),                       # by model name
    ("/v1/chat/completions", "toy_llm", "triton"),                    # a listed-nowhere model: the default
    ("/v1/chat/completions", None, "triton"),                         # no model read: the default
    ("/v2/models/toy_llm/generate_stream", "toy_llm", "triton"),
    ("/vllm/v1/completions", "anything", "vllm"),                     # the path prefix wins over the model
    ("/vllmx/v1/completions", "toy_llm", "triton"),                   # a prefix is a prefix of the path
])
def test_gateway_chooses_one_upstream_per_request(path, model, want):
    assert choose(repo_spec(upstreams=MIXED), path, model) == want


def test_first_upstream_is_the_default_unless_one_is_marked():
    ups = {"vllm": {"url": "http://vllm:8000", "kind": "openai"}, "triton": {"url": "http://t:8000",
                                                                           "models": ["toy_llm", "classifier"]}}
    spec = repo_spec(upstreams=ups)
    assert choose(spec, "/v1/completions", "chat_ens") == "vllm"
    # The default upstream is OpenAI-compatible here: models not listed by the Triton upstream are not Triton's.
    assert triton_models(spec) == ["toy_llm", "classifier"]


@pytest.mark.parametrize("upstreams, l2_models, field, words", [
    ({"a": {"url": "http://a:1", "default": True}, "b": {"url": "http://b:1", "default": True}}, None,
     "upstreams.b.default", "a is the default upstream already"),
    ({"a": {"url": "http://a:1", "models": ["m"]}, "b": {"url": "http://b:1", "models": ["m"]}}, None,
     "upstreams.b.models", "'m' is served by upstream 'a' already"),
    ({"a": {"url": "http://a:1", "kind": "tgi"}}, None, "upstreams.a.kind", "expected one of triton, openai, other"),
    ({"a": {"url": "ftp://user:s3cret@a:1"}}, None, "upstreams.a.url", "expected an http(s) URL"),
    ({"a": {"url": "http://user:s3cret@a:1"}}, None, "upstreams.a.url", "expected no user:password@"),
    ({"a": {"url": "http://a:1", "path_prefix": "v1"}}, None, "upstreams.a.path_prefix", "starting with '/'"),
    ({"a": {"url": "http://a:1", "path_prefix": "/x/"}, "b": {"url": "http://b:1", "path_prefix": "/x/"}}, None,
     "upstreams.b.path_prefix", "upstream 'a''s already"),
    ({"Vllm Pool": {"url": "http://a:1"}}, None, "upstreams.Vllm Pool", "becomes the `upstream` label"),
    (MIXED, {"llama3": {"queue_p95_seconds": 1}}, "layers.L2.models.llama3",
     "served by upstream 'vllm' (openai), not Triton"),
])
def test_bad_upstreams_name_the_field(upstreams, l2_models, field, words):
    data = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    data["upstreams"] = upstreams
    if l2_models is not None:
        data["layers"]["L2"]["models"] = l2_models
    with pytest.raises(SpecError) as err:
        spec_from_dict(data, "mixed.yaml")
    message = str(err.value)
    assert f"mixed.yaml: {field}:" in message and words in message, message
    assert "s3cret" not in message


@pytest.fixture(scope="module")
def mixed_rules(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed-rules")
    for rel, text in outputs(repo_spec(upstreams=MIXED)).items():
        if rel.startswith(RULES_DIR):
            (root / rel.rsplit("/", 1)[-1]).write_text(text)
    return root


def test_not_loaded_judges_triton_models_only(mixed_rules):
    """Rows: llama3 (vLLM, served fine at 2 req/s, in no Triton) -> nothing, ever; toy_llm (Triton) unloaded
    at 2m -> TritonModelNotLoaded after `for`, as in a Triton-only fleet."""
    collector = 'job="inferwatch-triton",instance="c:9401",node="node-a",triton="triton-0"'
    gateway = 'job="inferwatch-gateway",instance="g:9402",node="node-a",tenant="acme",tier="realtime"'
    series = [
        {"series": f"inferwatch_triton_up{{{collector}}}", "values": "1x40"},
        *({"series": f'inferwatch_triton_model_ready{{{collector},model="{m}",version="1"}}', "values": "1x40"}
          for m in ("classifier", "chat_ens")),
        {"series": f'inferwatch_triton_model_ready{{{collector},model="toy_llm",version="1"}}',
         "values": "1 1 stale"},
        {"series": f'gateway_requests_total{{{gateway},model="llama3",code="200",outcome="success"}}',
         "values": "0+120x40"},
    ]
    description = ("Model toy_llm is in the spec's served models but no Triton has it loaded (unloaded, or never "
                   "loaded): every request to it fails with \"unknown model\".")
    run_promtool(mixed_rules, "mixed-not-loaded", [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "6m", "alertname": "TritonModelNotLoaded"},
            {"eval_time": "7m", "alertname": "TritonModelNotLoaded",
             "exp_alerts": [expected("TritonModelNotLoaded", {"model": "toy_llm", "layer": "L2",
                                                              "severity": "critical"}, description)]},
            {"eval_time": "40m", "alertname": "TritonModelNotLoaded",
             "exp_alerts": [expected("TritonModelNotLoaded", {"model": "toy_llm", "layer": "L2",
                                                              "severity": "critical"}, description)]},
        ]}])
    rule = next(r for f in mixed_rules.glob("triton.yml") for g in yaml.safe_load(f.read_text())["groups"]
                for r in g["rules"] if r.get("alert") == "TritonModelNotLoaded")
    assert "llama3" not in rule["expr"] and "toy_llm" in rule["expr"]


def test_no_not_loaded_rule_when_no_model_is_tritons():
    data = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    data["layers"]["L2"].pop("models")
    spec = spec_from_dict({**data, "models": ["llama3"],
                           "upstreams": {"vllm": {"url": "http://vllm:8000", "kind": "openai"}}})
    text = "".join(t for rel, t in outputs(spec).items() if rel.startswith(RULES_DIR))
    assert "TritonModelNotLoaded" not in text and "TritonModelNotReady" in text


@pytest.mark.parametrize("model, skipped", [("llama3", True), ("toy_llm", False)])
def test_triage_skips_triton_evidence_of_a_model_triton_does_not_serve(model, skipped):
    spec = repo_spec(upstreams=MIXED)
    runbook = load_runbooks()["LlmTtftP95High"]
    # Nothing answers on port 1: the queries that are run fail (kept as errors), the skipped ones are not run.
    source = PrometheusSource("http://127.0.0.1:1", timeout=0.5, retries=0)
    result = triage_alert("LlmTtftP95High", {"model": model, "tier": "realtime"}, runbook, source, "u", spec=spec)
    by_name = {e.result.name: e for e in result.evidence}
    triton_side = [n for n in ("triton_queue_p95_seconds", "triton_pending_requests", "batch_size_avg")]
    for name in triton_side:
        e = by_name[name]
        if skipped:
            assert e.skipped == "model llama3 is served by upstream vllm (openai), not Triton", name
            assert e.result.error is None
        else:
            assert e.skipped is None and e.result.error, name
    gateway_side = by_name["ttft_p95_seconds"]
    assert gateway_side.skipped is None and gateway_side.result.error
