"""Pure parts of the Triton collector, with literal data: parsers, the families builder, the golden text."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden import assert_matches_golden, promtool_check_metrics
from inferwatch.exporters.triton.families import (
    REASON_MAX_CHARS,
    build_families,
    cap_reason,
)
from inferwatch.exporters.triton.snapshot import (
    ModelConfigFigures,
    ModelVersionState,
    PollError,
    TritonSnapshot,
    parse_batch_stats,
    parse_config,
    parse_index,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

GOLDEN = Path(__file__).parent / "golden" / "triton_collector.metrics"

CLASSIFIER_CONFIG = {  # trimmed from a real 2.51 answer (examples/model_repository/classifier)
    "name": "classifier", "max_batch_size": 32,
    "dynamic_batching": {"preferred_batch_size": [8, 16], "max_queue_delay_microseconds": 5000},
    "instance_group": [{"name": "classifier_0", "kind": "KIND_CPU", "count": 1, "gpus": []}],
}


def _render(snaps, errors=None) -> str:
    class Fixed:
        def collect(self):
            return build_families(snaps, errors or {})

    registry = CollectorRegistry()
    registry.register(Fixed())
    return generate_latest(registry).decode()


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_index_leaves_out_unloaded_and_never_loaded_models():
    answer = [
        {"name": "classifier", "version": "1", "state": "READY"},
        {"name": "toy_llm", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "never_loaded"},
        {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "ValueError: boom"},
        {"name": "going", "version": "3", "state": "UNLOADING"},
    ]
    assert parse_index(answer) == [
        ModelVersionState("classifier", "1", "READY"),
        ModelVersionState("broken", "1", "UNAVAILABLE", "ValueError: boom"),
        ModelVersionState("going", "3", "UNLOADING"),
    ]


@pytest.mark.parametrize("answer", [{"name": "x"}, [{"version": "1"}], [17]])
def test_index_rejects_wrong_shapes(answer):
    with pytest.raises(ValueError):
        parse_index(answer)


def test_config_figures():
    assert parse_config(CLASSIFIER_CONFIG) == ModelConfigFigures(32, True, 16, 0.005, {"KIND_CPU": 1})
    no_batching = {"max_batch_size": 0, "instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1, 2]},
                                                           {"kind": "KIND_CPU", "count": 1}]}
    assert parse_config(no_batching) == ModelConfigFigures(0, False, None, None, {"KIND_GPU": 6, "KIND_CPU": 1})
    # dynamic batching without preferred sizes: batches form up to max_batch_size
    assert parse_config({"max_batch_size": 8, "dynamic_batching": {}}).preferred_batch_size_max == 8


def test_batch_stats():
    answer = {"model_stats": [
        {"name": "classifier", "version": "2", "batch_stats": [
            {"batch_size": 1, "compute_infer": {"count": 5, "ns": 10}},
            {"batch_size": 8, "compute_infer": {"count": 2, "ns": 10}}]},
        {"name": "toy_llm", "version": "1", "batch_stats": []},
    ]}
    assert parse_batch_stats(answer) == {("classifier", "2"): {1: 5, 8: 2}, ("toy_llm", "1"): {}}
    with pytest.raises(ValueError):
        parse_batch_stats({"model_stats": [{"name": "x", "batch_stats": [{"batch_size": 1}]}]})


def test_reason_is_capped_and_single_line():
    long = "Traceback (most recent call last):\n" + "x" * 1000
    capped = cap_reason(long)
    assert len(capped) == REASON_MAX_CHARS and capped.endswith("[truncated]") and "\n" not in capped
    assert cap_reason("short\nreason") == "short reason"


def _fleet():
    ok = TritonSnapshot(
        "triton-0", up=True, live=True, ready=False, summaries_enabled=True,
        models=[ModelVersionState("classifier", "2", "READY"),
                ModelVersionState("broken", "1", "UNAVAILABLE", "RuntimeError: init failed\nline 2")],
        configs={"classifier": parse_config(CLASSIFIER_CONFIG)},
        batch_executions={("classifier", "2"): {1: 4, 8: 3}},
        errors=[PollError("config", "timeout", "model broken")], duration_seconds=0.25, timestamp=1700000000.0)
    down = TritonSnapshot("triton-1", up=False, duration_seconds=0.01, timestamp=1700000000.0)
    return [ok, down], {("triton-0", "config", "timeout"): 3, ("triton-1", "live", "connection"): 2}


def test_families_from_literal_snapshots():
    snaps, errors = _fleet()
    s = _samples(_render(snaps, errors))
    t0 = (("triton", "triton-0"),)
    assert s[("inferwatch_triton_up", t0)] == 1 and s[("inferwatch_triton_up", (("triton", "triton-1"),))] == 0
    assert s[("inferwatch_triton_server_ready", t0)] == 0
    # a down Triton gives up 0 only: no live/ready/model series that would alert twice
    assert not [k for k in s if dict(k[1]).get("triton") == "triton-1" and k[0].startswith(
        ("inferwatch_triton_server", "inferwatch_triton_model"))]
    state = {dict(k[1])["state"]: v for k, v in s.items()
             if k[0] == "inferwatch_triton_model_state" and dict(k[1])["model"] == "broken"}
    assert state == {"READY": 0, "UNAVAILABLE": 1, "LOADING": 0, "UNLOADING": 0}
    reason = [dict(k[1])["reason"] for k in s if k[0] == "inferwatch_triton_model_state_reason_info"]
    assert reason == ["RuntimeError: init failed line 2"]
    b = {dict(k[1])["batch_size"]: v for k, v in s.items() if k[0] == "inferwatch_triton_model_batch_executions_total"}
    assert b == {"1": 4, "8": 3}
    errs = {k: v for k, v in s.items() if k[0] == "inferwatch_triton_poll_errors_total"}
    assert len(errs) == 2 * 6 * 6  # full endpoint x cause set per target, zeros included
    assert s[("inferwatch_triton_poll_errors_total",
              (("cause", "timeout"), ("endpoint", "config"), ("triton", "triton-0")))] == 3


def test_golden_metrics_text():
    snaps, errors = _fleet()
    assert_matches_golden(_render(snaps, errors), GOLDEN)


def test_golden_passes_promtool_check_metrics():
    proc = promtool_check_metrics(GOLDEN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
