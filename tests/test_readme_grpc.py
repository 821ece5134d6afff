"""The README's gRPC client block (section "gRPC clients (`--grpc-upstream`)"), run as written against the real
Triton through the gateway's gRPC listener, so the README cannot drift from what the gateway does: the
streamed text arrives, the block's `billed` is the tokens Triton produced, and both requests are metered to
the tenant and tier the block's metadata names."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gateway_support import RunningProxy

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "# README gRPC client:"
ADDRESS = '"gateway:8081"'
ACME = {"tenant": "acme", "model": "toy_llm", "tier": "realtime"}
# toy_llm's default answer: 16 tokens, one per response (examples/model_repository/toy_llm/1/model.py).
TOY_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away")
TOY_TEXT = "".join(f"{TOY_WORDS[i % len(TOY_WORDS)]} " for i in range(16)).encode()


def readme_block(marker: str) -> str:
    """The README's fenced python block whose first line starts with `marker`."""
    text = README.read_text(encoding="utf-8")
    blocks = [textwrap.dedent(part.partition("\n")[2]) for part in text.split("```")[1::2]
              if part.startswith("python")]
    (block,) = [b for b in blocks if b.startswith(marker)]
    return block


@pytest.fixture
def proxy(triton):
    p = RunningProxy(triton.url, grpc_upstream=f"127.0.0.1:{triton.grpc_port}")
    yield p
    p.stop()


def test_readme_grpc_block_runs_through_the_gateway(proxy):
    block = readme_block(MARKER)
    assert block.count(ADDRESS) == 1  # the one place the test changes: where the gateway listens here
    scope: dict = {}
    exec(compile(block.replace(ADDRESS, repr(proxy.grpc_address)), str(README), "exec"), scope)  # noqa: S102

    assert scope["text"] == TOY_TEXT
    assert [r.error_message for r in scope["responses"]] == [""] * 16
    assert scope["billed"] == "16"  # the block's comment says so, and the trailer is the tokens produced
    proxy.wait_requests(2, **ACME, outcome="ok", code="200")
    assert proxy.value("gateway_tokens_total", **ACME, type="output") == 32
    assert sorted((u.tenant, u.output_tokens, u.method) for u in proxy.usages) == [("acme", 16, "count_field")] * 2
