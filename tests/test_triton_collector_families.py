"""Pure parts of the Triton collector, with literal data: parsers, the families builder, the golden text."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

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
    parse_config,
    parse_index,
)
from inferwatch.exporters.triton.stats import parse_stats

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
        {"name": "", "version": "1", "state": "READY"},  # no Triton model has an empty name: left out, reported
    ]
    assert parse_index(answer) == ([
        ModelVersionState("classifier", "1", "READY"),
        ModelVersionState("broken", "1", "UNAVAILABLE", "ValueError: boom"),
        ModelVersionState("going", "3", "UNLOADING"),
    ], [("", "repository index: entry with an empty model name left out")])


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


# trimmed from the real 2.51 answers for examples/model_repository/chat_ens and generate
CHAT_ENS_CONFIG = {
    "name": "chat_ens", "platform": "ensemble", "max_batch_size": 0,
    "model_transaction_policy": {"decoupled": True},
    "ensemble_scheduling": {"step": [
        {"model_name": "tokenize", "model_version": -1, "input_map": {"text_input": "text_input"}},
        {"model_name": "generate", "model_version": -1, "input_map": {"input_ids": "_input_ids"}},
        {"model_name": "detokenize", "model_version": -1, "input_map": {"token_id": "_token_id"}}]},
}
GENERATE_CONFIG = {"name": "generate", "backend": "python", "max_batch_size": 0,
                   "model_transaction_policy": {"decoupled": True},
                   "instance_group": [{"kind": "KIND_CPU", "count": 1}]}


@pytest.mark.parametrize("answer, decoupled, steps", [
    (CHAT_ENS_CONFIG, True, ("tokenize", "generate", "detokenize")),
    (GENERATE_CONFIG, True, ()),
    (CLASSIFIER_CONFIG, False, ()),
    # protobuf JSON names; the same step twice is one step (at its first position)
    ({"modelTransactionPolicy": {"decoupled": True},
      "ensembleScheduling": {"step": [{"modelName": "a"}, {"modelName": "b"}, {"modelName": "a"}]}}, True, ("a", "b")),
    # decoupled false is left out of protobuf JSON
    ({"model_transaction_policy": {}}, False, ()),
])
def test_config_decoupled_and_ensemble_steps(answer, decoupled, steps):
    cfg = parse_config(answer)
    assert (cfg.decoupled, cfg.ensemble_steps) == (decoupled, steps)


def test_ensemble_step_without_a_name_is_malformed():
    with pytest.raises(ValueError, match="ensemble step"):
        parse_config({"ensemble_scheduling": {"step": [{"model_version": -1}]}})


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
        stats=parse_stats({"model_stats": [
            {"name": "classifier", "version": "2", "inference_count": 28, "execution_count": 7,
             "inference_stats": {"success": {"count": "28", "ns": "9007199254740993"}, "fail": {},
                                 "queue": {"count": "28", "ns": "2800000"}},
             "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 4, "ns": 4000000}},
                             {"batch_size": 8, "compute_infer": {"count": 3, "ns": 9000000}}]}]})[0],
        errors=[PollError("config", "timeout", "model broken")], duration_seconds=0.25, timestamp=1700000000.0)
    llm = TritonSnapshot(
        "triton-2", up=True, live=True, ready=True, summaries_enabled=False,
        models=[ModelVersionState(m, "1", "READY") for m in ("chat_ens", "tokenize", "generate", "detokenize")],
        configs={"chat_ens": parse_config(CHAT_ENS_CONFIG), "generate": parse_config(GENERATE_CONFIG)},
        duration_seconds=0.5, timestamp=1700000000.0)
    down = TritonSnapshot("triton-1", up=False, duration_seconds=0.01, timestamp=1700000000.0)
    return [ok, down, llm], {("triton-0", "config", "timeout"): 3, ("triton-1", "live", "connection"): 2}


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
    assert len(errs) == 3 * 6 * 7  # full endpoint x cause set per target, zeros included
    assert s[("inferwatch_triton_poll_errors_total",
              (("cause", "timeout"), ("endpoint", "config"), ("triton", "triton-0")))] == 3


def test_stats_families_are_exact_and_leave_unknown_means_out():
    snaps, errors = _fleet()
    s = _samples(_render(snaps, errors))
    cl = (("model", "classifier"), ("triton", "triton-0"), ("version", "2"))

    def stat(name, which):
        return s.get((name, tuple(sorted(cl + (("stat", which),)))))

    assert stat("inferwatch_triton_model_inference_stat_count_total", "success") == 28
    assert stat("inferwatch_triton_model_inference_stat_count_total", "fail") == 0
    assert stat("inferwatch_triton_model_inference_stat_mean_seconds", "queue") == 100e-6
    assert stat("inferwatch_triton_model_inference_stat_mean_seconds", "fail") is None  # count 0: no sample
    assert stat("inferwatch_triton_model_inference_stat_duration_seconds_total", "success") == 9007199.254740993
    assert s[("inferwatch_triton_model_executions_total", cl)] == 7
    assert s[("inferwatch_triton_model_batch_compute_infer_duration_seconds_total",
              tuple(sorted(cl + (("batch_size", "8"),))))] == 0.009


def test_ensemble_steps_and_entry_points():
    snaps, errors = _fleet()
    s = _samples(_render(snaps, errors))

    def by_model(name):
        return {dict(k[1])["model"]: v for k, v in s.items() if k[0] == name and dict(k[1])["triton"] == "triton-2"}

    assert by_model("inferwatch_triton_model_entry_point") == {"chat_ens": 1, "generate": 0}  # configs known
    assert by_model("inferwatch_triton_model_decoupled") == {"chat_ens": 1, "generate": 1}
    steps = sorted((d["parent"], d["step"], d["model"], d["kind"]) for d in (dict(k[1]) for k in s)
                   if "parent" in d and d["triton"] == "triton-2")
    assert steps == [("chat_ens", "0", "tokenize", "ensemble"), ("chat_ens", "1", "generate", "ensemble"),
                     ("chat_ens", "2", "detokenize", "ensemble")]


def test_bls_steps_count_only_while_the_parent_is_loaded():
    snaps, _ = _fleet()

    class Fixed:
        def collect(self):
            return build_families(snaps, {}, {"router": ("classifier",), "absent": ("x",)})

    registry = CollectorRegistry()
    registry.register(Fixed())
    snaps[0].models.append(ModelVersionState("router", "1", "READY"))
    s = _samples(generate_latest(registry).decode())
    steps = [dict(k[1]) for k in s if k[0] == "inferwatch_triton_model_step_info"
             and dict(k[1])["triton"] == "triton-0"]
    assert steps == [{"triton": "triton-0", "model": "classifier", "parent": "router", "kind": "bls", "step": "0"}]
    assert s[("inferwatch_triton_model_entry_point", (("model", "classifier"), ("triton", "triton-0")))] == 0


def test_golden_metrics_text():
    snaps, errors = _fleet()
    assert_matches_golden(_render(snaps, errors), GOLDEN)


def test_golden_passes_promtool_check_metrics():
    proc = promtool_check_metrics(GOLDEN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
