"""How the real Triton (2.51) counts streamed requests, read through the collector: the facts the L2 rules
and runbooks rely on.

- A decoupled model called directly (toy_llm) counts a request as a *success* when the model sends an error
  response mid-stream and when the client cancels: Triton's failure counter cannot see either, so the L2 view
  of decoupled models takes errors and cancellations from the gateway.
- An ensemble (chat_ens) counts a mid-stream error of its decoupled step as its own failure (reason OTHER),
  while the step (generate) still counts a success. How many failures one such request adds depends on how many
  step responses were still in flight: one failed stream was seen adding 1, 2 or 3 (so the count is asserted
  as "at least one"), and how many tokens reach the client before the error varies the same way. A cancelled
  ensemble stream was seen counted as a success and as a failure with reason OTHER, depending on when Triton
  noticed the client had gone; it is left out because it is not deterministic.

Runs on its own Triton: in 2.51 an ensemble whose decoupled step fails mid-stream keeps that request counted
in flight, so the server is started with a short --exit-timeout-secs instead of the shared one.
"""

from __future__ import annotations

import shutil

import pytest

from inferwatch.testing.triton import EXAMPLE_MODEL_REPOSITORY
from test_triton_collector import collector_for, settled, stream, target

MODELS = ("toy_llm", "chat_ens", "tokenize", "generate", "detokenize")


@pytest.mark.slow
def test_streamed_errors_and_cancellations_as_triton_counts_them(triton_factory, tmp_path):
    repo = tmp_path / "repo"
    for model in MODELS:
        shutil.copytree(EXAMPLE_MODEL_REPOSITORY / model, repo / model, ignore=shutil.ignore_patterns("__pycache__"))
    server = triton_factory(repo, extra_args=["--exit-timeout-secs=2"], ready_path="/v2/health/ready")
    slow = {"first_token_delay_ms": 0, "token_delay_ms": 100}
    with collector_for(target(server)) as c:
        before = settled(c, MODELS, lambda _: True)
        # toy_llm, directly: 1 clean stream, 1 error mid-stream, 1 cancelled by the client after 2 tokens.
        assert stream(server.url, "toy_llm", {"text_input": "hi", "max_tokens": 4, "token_delay_ms": 0}) == (4, False)
        assert stream(server.url, "toy_llm", {"text_input": "hi", "max_tokens": 8, "token_delay_ms": 0,
                                              "fail": 1.0}) == (4, True)
        assert stream(server.url, "toy_llm", {"text_input": "hi", "max_tokens": 40, **slow}, cancel_after=2) == (2,
                                                                                                                 False)
        # chat_ens: 1 clean stream, 1 error mid-stream in its decoupled step.
        body = {"text_input": "hi", "max_tokens": 8, "parameters": {"token_delay_ms": 0}}
        assert stream(server.url, "chat_ens", body) == (8, False)
        assert stream(server.url, "chat_ens", {**body, "parameters": {"token_delay_ms": 0, "fail": 1.0}})[1] is True

        def delta(counts):
            return {k: counts[k] - before[k] for k in counts}

        def done(counts):
            d = delta(counts)
            return (d[("toy_llm", "success")] + d[("toy_llm", "fail")] >= 3
                    and d[("chat_ens", "success")] + d[("chat_ens", "fail")] >= 2)

        d = delta(settled(c, MODELS, done, timeout=20))
    # Decoupled model: all three are successes for Triton, though one failed and one was cancelled.
    assert (d[("toy_llm", "success")], d[("toy_llm", "fail")]) == (3, 0)
    # Ensemble: the step's mid-stream error fails the ensemble request, while the step counts a success.
    assert d[("chat_ens", "success")] == 1 and d[("chat_ens", "fail")] >= 1
    assert (d[("generate", "success")], d[("generate", "fail")]) == (2, 0)
