"""The Triton collector against the real Triton (tritonserver 2.51 from nvidia-pytriton)."""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.triton.collector import TritonCollector
from inferwatch.exporters.triton.reader import TargetConfig
from inferwatch.testing.process import ManagedProcess, free_port, http_ok
from inferwatch.testing.triton import EXAMPLE_MODEL_REPOSITORY
from inferwatch.traffic import infer_classifier

TOKEN = "s3cret-token"


@contextlib.contextmanager
def collector_for(*targets: TargetConfig, timeout: float = 5.0):
    collector = TritonCollector(targets, timeout=timeout)
    try:
        yield collector
    finally:
        collector.close()


def target(server, name="t", headers=None) -> TargetConfig:
    return TargetConfig(name, server.url, server.metrics_url, headers or {})


def samples(collector: TritonCollector) -> dict:
    """{(metric name, frozenset of label items): value} of what a scrape would serve now."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(s: dict, name: str, **labels):
    return s.get((name, frozenset(labels.items())))


def states(s: dict, model: str, version: str, triton: str = "t") -> dict:
    return {dict(k[1])["state"]: v for k, v in s.items() if k[0] == "inferwatch_triton_model_state"
            and dict(k[1]) | {"state": ""} == {"triton": triton, "model": model, "version": version, "state": ""}}


def series_of(s: dict, model: str) -> list:
    return [k for k in s if dict(k[1]).get("model") == model]


def test_example_models_ready_with_config_figures(triton):
    with collector_for(target(triton)) as c:
        c.poll_once()
        s = samples(c)
    assert value(s, "inferwatch_triton_up", triton="t") == 1
    assert value(s, "inferwatch_triton_server_live", triton="t") == 1
    assert value(s, "inferwatch_triton_server_ready", triton="t") == 1
    assert value(s, "inferwatch_triton_summaries_enabled", triton="t") == 1  # harness runs summaries on
    ready = {"READY": 1, "UNAVAILABLE": 0, "LOADING": 0, "UNLOADING": 0}
    for model, version in (("classifier", "1"), ("classifier", "2"), ("toy_llm", "1")):
        assert states(s, model, version) == ready
        assert value(s, "inferwatch_triton_model_ready", triton="t", model=model, version=version) == 1
    # examples/model_repository/classifier/config.pbtxt: max_batch_size 32, preferred [8, 16], 5000 µs, 1 CPU
    cl = {"triton": "t", "model": "classifier"}
    assert value(s, "inferwatch_triton_model_max_batch_size", **cl) == 32
    assert value(s, "inferwatch_triton_model_dynamic_batching_enabled", **cl) == 1
    assert value(s, "inferwatch_triton_model_preferred_batch_size_max", **cl) == 16
    assert value(s, "inferwatch_triton_model_max_queue_delay_seconds", **cl) == 0.005
    assert value(s, "inferwatch_triton_model_instances", kind="KIND_CPU", **cl) == 1
    llm = {"triton": "t", "model": "toy_llm"}
    assert value(s, "inferwatch_triton_model_max_batch_size", **llm) == 0
    assert value(s, "inferwatch_triton_model_dynamic_batching_enabled", **llm) == 0
    assert value(s, "inferwatch_triton_model_preferred_batch_size_max", **llm) is None
    assert not [k for k in s if k[0] == "inferwatch_triton_poll_errors_total" and s[k] > 0]


def _executions(c: TritonCollector) -> dict[int, int]:
    c.poll_once()
    s = samples(c)
    return {int(dict(k[1])["batch_size"]): v for k, v in s.items()
            if k[0] == "inferwatch_triton_model_batch_executions_total"
            and dict(k[1])["model"] == "classifier" and dict(k[1])["version"] == "2"}


def test_batch_executions_match_what_was_sent(triton):
    """Concurrent single-row requests to classifier (latest = v2) must form batches > 1, and the rows
    executed per batch size must add up to exactly the rows sent."""
    requests_sent, rows_each = 48, 1
    with collector_for(target(triton)) as c:
        before = _executions(c)
        with ThreadPoolExecutor(max_workers=24) as pool:
            results = list(pool.map(lambda _: infer_classifier(triton.url, batch=rows_each), range(requests_sent)))
        assert all(results)
        after = _executions(c)
    delta = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    assert sum(size * n for size, n in delta.items()) == requests_sent * rows_each
    assert max(size for size, n in delta.items() if n > 0) > 1, f"no batch formed: {delta}"


def _index_state(server, model: str) -> str | None:
    for entry in requests.post(server.url + "/v2/repository/index", timeout=10).json():
        if entry["name"] == model:
            return entry.get("state")
    return None


def test_load_and_unload_show_within_one_poll(triton_factory):
    server = triton_factory(extra_args=["--model-control-mode=explicit", "--load-model=classifier"])
    with collector_for(target(server)) as c:
        c.poll_once()
        assert series_of(samples(c), "toy_llm") == []  # in the repository, never loaded: no series
        requests.post(server.url + "/v2/repository/models/toy_llm/load", timeout=60).raise_for_status()
        c.poll_once()
        s = samples(c)
        assert states(s, "toy_llm", "1")["READY"] == 1
        assert value(s, "inferwatch_triton_model_max_batch_size", triton="t", model="toy_llm") == 0

        requests.post(server.url + "/v2/repository/models/toy_llm/unload", timeout=60).raise_for_status()
        c.poll_once()
        s = samples(c)
        # Right after the call Triton may still be unloading: the state set says so, or the model is gone.
        assert series_of(s, "toy_llm") == [] or states(s, "toy_llm", "1")["UNLOADING"] == 1
        for _ in range(100):  # wait for Triton itself (its index), not for the collector
            if _index_state(server, "toy_llm") != "UNLOADING":
                break
            time.sleep(0.1)
        assert _index_state(server, "toy_llm") == "UNAVAILABLE"  # Triton keeps listing it, reason "unloaded"
        c.poll_once()
        s = samples(c)
    assert series_of(s, "toy_llm") == []  # a deliberate unload is not a failed model: series are gone
    assert states(s, "classifier", "2")["READY"] == 1


BROKEN_MODEL = textwrap.dedent('''
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("weights file missing: /models/broken/weights.bin")

        def execute(self, requests):
            return []
''')
BROKEN_CONFIG = textwrap.dedent('''
    name: "broken"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
    output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
    instance_group [ { count: 1, kind: KIND_CPU } ]
''')


def test_model_that_fails_to_load_is_unavailable_with_its_reason(triton_factory, tmp_path):
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text(BROKEN_CONFIG)
    (repo / "broken" / "1" / "model.py").write_text(BROKEN_MODEL)
    shutil.copytree(EXAMPLE_MODEL_REPOSITORY / "classifier", repo / "classifier",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # --exit-on-error=false keeps the server up with a model that failed; summaries off to see the 0.
    server = triton_factory(repo, extra_args=["--exit-on-error=false"], summary_latencies=False)
    with collector_for(target(server)) as c:
        c.poll_once()
        s = samples(c)
    assert states(s, "broken", "1") == {"READY": 0, "UNAVAILABLE": 1, "LOADING": 0, "UNLOADING": 0}
    assert value(s, "inferwatch_triton_model_ready", triton="t", model="broken", version="1") == 0
    reasons = [dict(k[1])["reason"] for k in s if k[0] == "inferwatch_triton_model_state_reason_info"
               and dict(k[1])["model"] == "broken"]
    assert len(reasons) == 1 and "weights file missing" in reasons[0]
    assert value(s, "inferwatch_triton_server_ready", triton="t") == 0  # strict readiness: 400
    assert value(s, "inferwatch_triton_up", triton="t") == 1
    assert states(s, "classifier", "2")["READY"] == 1  # the healthy model next to it is unaffected
    assert value(s, "inferwatch_triton_summaries_enabled", triton="t") == 0


def test_restricted_statistics_api(triton_factory, caplog):
    server = triton_factory(extra_args=[f"--http-restricted-api=statistics:triton-access-token={TOKEN}"])
    assert infer_classifier(server.url, batch=3)
    with_header = target(server, "with", {"triton-access-token": TOKEN})
    without = target(server, "without")
    with caplog.at_level(logging.WARNING), collector_for(with_header, without) as c:
        c.poll_once()
        c.poll_once()
        s = samples(c)
    forbidden = dict(endpoint="stats", cause="forbidden")
    assert value(s, "inferwatch_triton_poll_errors_total", triton="with", **forbidden) == 0
    assert value(s, "inferwatch_triton_model_batch_executions_total", triton="with", model="classifier",
                 version="2", batch_size="3") == 1
    assert value(s, "inferwatch_triton_poll_errors_total", triton="without", **forbidden) == 2
    assert not [k for k in s if k[0] == "inferwatch_triton_model_batch_executions_total"
                and dict(k[1])["triton"] == "without"]
    assert states(s, "classifier", "2", triton="without")["READY"] == 1  # the rest still works
    logged = [r.getMessage() for r in caplog.records if "without" in r.getMessage()]
    assert len(logged) == 1 and "stats call failed (forbidden)" in logged[0]  # once, not once per poll
    assert TOKEN not in caplog.text


@pytest.fixture(scope="module")
def health_restricted_triton(tmp_path_factory):
    """One Triton with `health` behind a token, for every row of the table below: each row only reads it
    (its own collector, its own headers), so one start serves them all instead of one per row."""
    from conftest import _start
    from inferwatch.testing.triton import start_triton

    server = _start(start_triton, tmp_path_factory.mktemp("triton-health-restricted"), EXAMPLE_MODEL_REPOSITORY,
                    extra_args=[f"--http-restricted-api=health:triton-access-token={TOKEN}"],
                    ready_path="/v2/models/stats")
    yield server
    server.stop()


@pytest.mark.parametrize("headers, refused", [
    ({"triton-access-token": TOKEN}, False),  # the header configured: health read as usual
    ({}, True),  # no header: 403, "configure the header", never "server down"
    ({"triton-access-token": "wrong"}, True),
], ids=["header", "no-header", "wrong-header"])
def test_restricted_health_api_is_forbidden_not_down(health_restricted_triton, caplog, headers, refused):
    """Triton's --http-restricted-api covering `health` answers /v2/health/* with 403: the server answered,
    so it is up; whether it is live or ready is unknown (absent: TritonServerDown and TritonServerNotReady
    read `== 0`), and the refusal is counted as cause `forbidden` and logged once with what to do."""
    server = health_restricted_triton
    with caplog.at_level(logging.WARNING), collector_for(target(server, headers=headers)) as c:
        c.poll_once()
        c.poll_once()
        s = samples(c)
    assert value(s, "inferwatch_triton_up", triton="t") == 1
    for endpoint, family in (("live", "server_live"), ("ready", "server_ready")):
        assert value(s, f"inferwatch_triton_{family}", triton="t") == (None if refused else 1)
        assert value(s, "inferwatch_triton_poll_errors_total", triton="t", endpoint=endpoint,
                     cause="forbidden") == (2 if refused else 0)
    assert states(s, "classifier", "2")["READY"] == 1  # the other endpoints are still read
    logged = [r.getMessage() for r in caplog.records if "call failed (forbidden)" in r.getMessage()]
    assert len(logged) == (2 if refused else 0)  # live and ready, once each, not once per poll
    assert all("configure its header" in line for line in logged)
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert TOKEN not in caplog.text


def test_dead_triton_gives_up_zero_and_a_log_line(caplog):
    port = free_port()
    with caplog.at_level(logging.WARNING), collector_for(TargetConfig("gone", f"http://127.0.0.1:{port}"),
                                                         timeout=2) as c:
        c.poll_once()
        c.poll_once()
        s = samples(c)
    assert value(s, "inferwatch_triton_up", triton="gone") == 0
    assert value(s, "inferwatch_triton_poll_errors_total", triton="gone", endpoint="live", cause="connection") == 2
    assert [k for k in s if k[0].startswith("inferwatch_triton_model")] == []
    assert len([r for r in caplog.records if "gone" in r.getMessage() and "unreachable" in r.getMessage()]) == 1


def test_one_slow_and_one_failing_model_never_blank_the_others(tmp_path):
    """Fault injection the real Triton cannot do on demand: the replay server built from captured Triton
    answers (benchmarks/triton_replay.py) makes model_0003's config call hang and model_0007's answer 500."""
    port = free_port()
    replay = ManagedProcess(
        "triton-replay", [sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "triton_replay.py"),
                          "--models", "10", "--port", str(port), "--slow", "model_0003", "--failing", "model_0007"],
        tmp_path / "replay.log", ready=lambda: http_ok(f"http://127.0.0.1:{port}/v2/health/live"))
    replay.start(timeout=60)
    base = f"http://127.0.0.1:{port}"
    try:
        with collector_for(TargetConfig("r", base, base + "/metrics"), timeout=1.0) as c:
            c.poll_once(timeout=30)
            s = samples(c)
    finally:
        replay.stop()
    with_config = {dict(k[1])["model"] for k in s if k[0] == "inferwatch_triton_model_max_batch_size"}
    assert with_config == {f"model_{i:04d}" for i in range(10)} - {"model_0003", "model_0007"}
    ready = {dict(k[1])["model"] for k, v in s.items() if k[0] == "inferwatch_triton_model_ready" and v == 1}
    assert len(ready) == 10  # state comes from the index, untouched by the config failures
    assert value(s, "inferwatch_triton_poll_errors_total", triton="r", endpoint="config", cause="timeout") == 1
    assert value(s, "inferwatch_triton_poll_errors_total", triton="r", endpoint="config", cause="http_error") == 1
    assert len([k for k in s if k[0] == "inferwatch_triton_model_batch_executions_total"]) > 10


def stream(base_url: str, model: str, body: dict, cancel_after: int | None = None) -> tuple[int, bool]:
    """One generate_stream request, read to its end; returns (token events received, an error event seen).
    With `cancel_after`, the client goes away after that many events (the connection is closed, which makes
    Triton cancel)."""
    events, error = 0, False
    with requests.post(f"{base_url}/v2/models/{model}/generate_stream", json=body, stream=True, timeout=60) as resp:
        assert resp.status_code == 200, resp.text
        for line in resp.iter_lines():
            if not line.startswith(b"data:"):
                continue
            if b'"error"' in line:
                error = True
                continue
            events += 1
            if cancel_after is not None and events >= cancel_after:
                break
    return events, error


def _stat_counts(c: TritonCollector, models: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """{(model, stat): count} from the collector's statistics families, after a fresh poll."""
    c.poll_once()
    s = samples(c)
    return {(dict(k[1])["model"], dict(k[1])["stat"]): v for k, v in s.items()
            if k[0] == "inferwatch_triton_model_inference_stat_count_total" and dict(k[1])["model"] in models}


def settled(c: TritonCollector, models: tuple[str, ...], done, timeout: float = 10.0) -> dict:
    """_stat_counts once `done(counts)` holds (Triton records a stream's statistics as it completes)."""
    deadline = time.monotonic() + timeout
    while True:
        counts = _stat_counts(c, models)
        if done(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


ENSEMBLE = ("chat_ens", "tokenize", "generate", "detokenize")


def test_ensemble_entry_point_steps_and_work_per_request(triton):
    """examples/model_repository/chat_ens on the real Triton: the collector reads ensemble_scheduling (steps of
    chat_ens, in order), which models clients call, which are decoupled; and 3 requests streamed as 40 responses
    each show as 3 chat_ens requests and 120 detokenize executions (40 per request)."""
    with collector_for(target(triton)) as c:
        first = c.poll_once()[0]
        s = samples(c)
        steps = sorted((dict(k[1])["step"], dict(k[1])["model"], dict(k[1])["kind"]) for k in s
                       if k[0] == "inferwatch_triton_model_step_info" and dict(k[1])["parent"] == "chat_ens")
        assert steps == [("0", "tokenize", "ensemble"), ("1", "generate", "ensemble"), ("2", "detokenize", "ensemble")]
        entry = {dict(k[1])["model"]: v for k, v in s.items() if k[0] == "inferwatch_triton_model_entry_point"}
        assert entry == {"chat_ens": 1, "classifier": 1, "toy_llm": 1, "tokenize": 0, "generate": 0, "detokenize": 0}
        decoupled = {dict(k[1])["model"]: v for k, v in s.items() if k[0] == "inferwatch_triton_model_decoupled"}
        assert decoupled == {"chat_ens": 1, "classifier": 0, "toy_llm": 1, "tokenize": 0, "generate": 1,
                             "detokenize": 0}
        # Configurations are read once, then only when a version or state changes.
        assert first.config_fetches == 6
        assert c.poll_once()[0].config_fetches == 0

        before = _stat_counts(c, ENSEMBLE)
        for _ in range(3):
            assert stream(triton.url, "chat_ens", {"text_input": "hello", "max_tokens": 40,
                                                   "parameters": {"token_delay_ms": 0}}) == (40, False)
        # Every count the assertions read, not only the ensemble's: a step's count may land after the ensemble's.
        # Past the deadline `settled` returns what it has, and the assertions below show the exact values.
        after = settled(c, ENSEMBLE, lambda counts: all(
            counts[(m, "success")] - before[(m, "success")] >= n for m, n in (("chat_ens", 3), ("tokenize", 3),
                                                                              ("detokenize", 120))))
    delta = {k: after[k] - before[k] for k in after}
    assert delta[("chat_ens", "success")] == 3 and delta[("chat_ens", "fail")] == 0
    assert delta[("tokenize", "success")] == 3
    assert delta[("detokenize", "success")] == 120  # one execution per streamed response
    assert delta[("detokenize", "success")] / delta[("chat_ens", "success")] == 40
