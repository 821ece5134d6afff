"""Cost per tenant from the spec's price table (inferwatch/billing.py): a known mix of requests of every API
through the real gateway process, and `gateway_cost_total` per tenant and the usage log's `cost` per request
equal to the sums computed by hand, to the cent; the price table's validation."""

from __future__ import annotations

import pytest

from dialect_fixtures import CHAT, COMPLETIONS, DONE, MESSAGES, RESPONSES, data, named
from gateway_support import GatewayProcess, Script, ScriptedUpstream, through
from inferwatch.spec import SpecError, spec_from_dict

PRICES = {
    # USD per million tokens; gpt-test's reasoning is priced as output (unset), claude-test's cache read and
    # write as Anthropic publishes them relative to its input price (0.1x, 1.25x).
    "gpt-test": {"input": 2.50, "cached_input": 1.25, "output": 10.00},
    "claude-test": {"input": 3.00, "cached_input": 0.30, "cache_creation_input": 3.75, "output": 15.00},
    "toy_llm": {"free": True},
}
SPEC = {"tenants": ["acme", "beta"], "models": ["gpt-test", "claude-test", "toy_llm"],
        "billing": {"currency": "USD", "prices": PRICES}}


def chat_body(usage: dict | None) -> Script:
    doc = {"id": "x", "object": "chat.completion", "model": "gpt-test",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]}
    return Script([data(doc | ({"usage": usage} if usage else {}))[6:-2]], content_type="application/json")


def completions_stream(usage: dict) -> Script:
    return Script([data({"id": "x", "choices": [{"index": 0, "text": "Hi", "finish_reason": "stop"}]}),
                   data({"id": "x", "choices": [], "usage": usage}), DONE])


def responses_stream(usage: dict) -> Script:
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": [], "usage": usage}
    return Script([named("response.output_text.delta", {"sequence_number": 0, "delta": "Hi"}),
                   named("response.completed", {"sequence_number": 1, "response": response})])


def messages_stream(usage: dict) -> Script:
    start = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
    return Script([named("message_start", {"message": {"id": "m", "type": "message", "role": "assistant",
                                                       "content": [], "usage": start}}),
                   named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
                   named("message_delta", {"delta": {"stop_reason": "end_turn"},
                                           "usage": {"output_tokens": usage["output_tokens"]}}),
                   named("message_stop", {})])


# (script/row, tenant, path, request model, script, the request's cost by hand in USD or None when unknown)
MIX = [
    # (800,000 uncached × 2.50 + 400,000 cached × 1.25 + 300,000 output (120,000 reasoning, at the output
    # price) × 10.00) / 1e6 = 2.00 + 0.50 + 3.00
    ("chat_cached_reasoning", "acme", CHAT, "gpt-test", chat_body({
        "prompt_tokens": 1_200_000, "completion_tokens": 300_000,
        "prompt_tokens_details": {"cached_tokens": 400_000},
        "completion_tokens_details": {"reasoning_tokens": 120_000}}), 5.50),
    # no cached detail: all 2,000,000 input at 2.50; 500,000 output at 10.00 → 5.00 + 5.00
    ("responses_plain", "acme", RESPONSES, "gpt-test", responses_stream({
        "input_tokens": 2_000_000, "output_tokens": 500_000,
        "output_tokens_details": {"reasoning_tokens": 100_000}}), 10.00),
    # 1,000,000 input × 3.00 + 2,000,000 cache read × 0.30 + 400,000 cache write × 3.75 + 200,000 × 15.00
    # = 3.00 + 0.60 + 1.50 + 3.00
    ("messages_cache", "acme", MESSAGES, "claude-test", messages_stream({
        "input_tokens": 1_000_000, "cache_read_input_tokens": 2_000_000, "cache_creation_input_tokens": 400_000,
        "output_tokens": 200_000}), 8.10),
    # (333,333 × 2.50 + 77,777 × 10.00) / 1e6 = 0.8333325 + 0.77777
    ("completions_odd", "beta", COMPLETIONS, "gpt-test", completions_stream({
        "prompt_tokens": 333_333, "completion_tokens": 77_777}), 1.6111025),
    # a free model costs exactly 0, through Triton's generate and its count fields
    ("triton_free", "beta", "/v2/models/toy_llm/generate", None, Script(
        [b'{"text_output":"Hi","input_token_count":5000,"output_token_count":7000}'],
        content_type="application/json"), 0.0),
    # no usage in a non-streamed answer: its counts are unknown, so is its cost (no sample, not 0)
    ("chat_no_usage", "beta", CHAT, "gpt-test", chat_body(None), None),
    # an undeclared model folds into `other`, which has no price: cost unknown
    ("chat_unpriced", "beta", CHAT, "mystery", chat_body({"prompt_tokens": 10, "completion_tokens": 10}), None),
]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    up = ScriptedUpstream()
    for row, _, _, _, script, _ in MIX:
        up.scripts[row] = script
    gw = GatewayProcess(up.url, SPEC, tmp_path_factory.mktemp("gateway"))
    try:
        records, seen = {}, {"acme": 0, "beta": 0}
        for row, tenant, path, model, _, _ in MIX:
            body = {"text_input": "hi"} if model is None else {"model": model, "prompt": "hi", "input": "hi",
                                                                "messages": [{"role": "user", "content": "hi"}]}
            status, _, raw = through(gw, row, path, body, headers={"X-Tenant-ID": tenant})
            assert status == 200 and raw, (row, status, raw)
            # One request at a time: its record is its tenant's next one.
            seen[tenant] += 1
            records[row] = _wait_record(gw, tenant, seen[tenant])
        yield gw, records, gw.snapshot()
    finally:
        gw.stop()
        up.stop()


def _wait_record(gw: GatewayProcess, tenant: str, n: int) -> dict:
    from gateway_support import wait_until

    wait_until(lambda: len(gw.usages(tenant=tenant)) >= n, what=f"{n} usage records of {tenant}")
    return gw.usages(tenant=tenant)[n - 1]


@pytest.mark.parametrize("row, tenant, path, model, script, cost", MIX, ids=[m[0] for m in MIX])
def test_usage_log_cost_per_request(ran, row, tenant, path, model, script, cost):
    _, records, _ = ran
    record = records[row]
    if cost is None:
        assert record["cost"] is None, record
    else:
        assert record["cost"] == pytest.approx(cost, abs=1e-9), record


def test_cost_per_tenant_equals_the_hand_sum_to_the_cent(ran):
    _, _, metrics = ran
    cost = {t: sum(c for _, tenant, _, _, _, c in MIX if tenant == t and c is not None) for t in ("acme", "beta")}
    assert round(cost["acme"], 2) == 23.60 and round(cost["beta"], 2) == 1.61  # the hand sums above
    for tenant, want in cost.items():
        got = sum(metrics.value("gateway_cost_total", tenant=tenant, model=m, tier="other", currency="USD") or 0.0
                  for m in ("gpt-test", "claude-test", "toy_llm", "other"))
        assert round(got, 2) == round(want, 2), (tenant, got, want)
    assert metrics.value("gateway_cost_total", tenant="beta", model="toy_llm", tier="other", currency="USD") == 0.0
    # Unknown cost is no sample, and counted by why.
    assert metrics.value("gateway_cost_total", tenant="beta", model="other", tier="other", currency="USD") is None
    assert metrics.value("gateway_cost_unknown_requests_total", model="gpt-test", reason="unknown_tokens") == 1
    assert metrics.value("gateway_cost_unknown_requests_total", model="other", reason="no_price") == 1


def test_no_billing_no_cost():
    """Without prices nothing is priced: no cost sample, the usage log's cost null."""
    from inferwatch.exporters.gateway.api import Gateway

    records = []
    gw = Gateway(spec_from_dict({"tenants": ["acme"], "models": ["m"]}), usage_sink=records.append)
    with gw.request(tenant="acme", model="m") as req:
        req.usage(output_tokens=30, input_tokens=100)
    assert records[0].cost is None
    assert gw.metrics.registry.get_sample_value("gateway_cost_unknown_requests_total",
                                                {"model": "m", "reason": "no_price"}) is None


BAD = [
    ({"prices": {**PRICES, "toy_llm": {"free": True, "input": 1}}}, "billing.prices.toy_llm.input", "free model"),
    ({"prices": {**PRICES, "gpt-test": {"input": 1}}}, "billing.prices.gpt-test.output", "price per million"),
    ({"prices": {**PRICES, "gpt-test": {"input": -1, "output": 2}}}, "billing.prices.gpt-test.input", ">= 0"),
    ({"currency": "dollars", "prices": PRICES}, "billing.currency", "ISO 4217"),
    ({"budgets": [{"tenant": "acme", "amount": 10}]}, "billing.budgets", "need billing.prices"),
    ({"prices": PRICES, "budgets": [{"tenant": "acme", "amount": 0}]}, "billing.budgets[0].amount", "> 0"),
    ({"prices": PRICES, "budgets": [{"tenant": "acme", "amount": 5, "period": "week"}]},
     "billing.budgets[0].period", "month, day"),
    ({"prices": PRICES, "budgets": [{"tenant": "acme", "amount": 5}, {"tenant": "acme", "amount": 6}]},
     "billing.budgets[1]", "a second month budget"),
]


@pytest.mark.parametrize("billing, path, text", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_billing_spec_refused(billing, path, text):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({**SPEC, "billing": billing})
    assert caught.value.path == path and text in caught.value.detail, str(caught.value)


# Names that do not match the spec's models and tenants load (a spec derived from another by dropping a model
# or tenant stays valid) and are warned by `inferwatch check`; a budget naming one is left out of the rules.
WARNED = [
    ({"prices": {"gpt-test": {"input": 1, "output": 2}}}, "billing.prices: model 'claude-test' has no price", None),
    ({"prices": {**PRICES, "nope": {"free": True}}}, "billing.prices.nope: not a declared model", None),
    ({"prices": PRICES, "budgets": [{"tenant": "zed", "amount": 10}, {"tenant": "acme", "amount": 10}]},
     "billing.budgets[0].tenant: 'zed' is not a declared tenant", "acme-all-month"),
    ({"prices": PRICES, "budgets": [{"tenant": "acme", "amount": 10, "model": "x"}]},
     "billing.budgets[0].model: 'x' is not a declared model", None),
]


@pytest.mark.parametrize("billing, warning, kept", WARNED, ids=[w[1].split(":")[0] for w in WARNED])
def test_billing_names_outside_the_spec_are_warned_and_left_out(billing, warning, kept):
    from inferwatch.billing import active_budgets, findings
    from inferwatch.rules.budget import budget_id, groups

    spec = spec_from_dict({**SPEC, "billing": billing})
    assert [f for f in findings(spec) if f.startswith(warning)], findings(spec)
    assert [budget_id(b) for b in active_budgets(spec)] == ([kept] if kept else [])
    budgets_in_rules = {r.labels["budget"] for g in groups(spec) for r in g.rules if "budget" in r.labels}
    assert budgets_in_rules == ({kept} if kept else set())


def test_the_example_spec_has_no_billing_warning():
    from pathlib import Path

    from inferwatch.billing import findings
    from inferwatch.spec import load_spec

    assert findings(load_spec(Path(__file__).resolve().parents[1] / "inferwatch.yaml")) == []
