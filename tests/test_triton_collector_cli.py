"""`inferwatch exporter triton` as a process, scraped by a real Prometheus through scrape_configs(spec)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from inferwatch.cli import UsageError, build_parser
from inferwatch.exporters.triton.cli import build_targets, parse_bls_steps
from inferwatch.exporters.triton.scrape import scrape_configs
from inferwatch.spec import load_spec
from inferwatch.specload import SpecError
from inferwatch.testing.process import ManagedProcess, free_port, http_ok
from inferwatch.testing.prometheus import write_config

# The console script, not `python -m inferwatch.cli` (that would load cli.py twice: as __main__ and as
# inferwatch.cli, so UsageError raised by a subcommand would not be the class main() catches).
INFERWATCH = str(Path(sys.executable).parent / "inferwatch")


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["exporter", "triton", *argv])


def _spec_file(tmp_path, triton, collector_port=9401, headers=None):
    target = {"name": "triton-0", "url": triton.url, "metrics_url": triton.metrics_url, "node": "node-a"}
    if headers:
        target["headers"] = headers
    path = tmp_path / "inferwatch.yaml"
    path.write_text(yaml.safe_dump({"targets": {"triton": [target],
                                                "triton_collectors": [f"127.0.0.1:{collector_port}"]}}))
    return path


def test_targets_from_flags_and_spec_with_secret_headers(tmp_path, triton, monkeypatch):
    spec = _spec_file(tmp_path, triton, headers={"triton-access-token": "${TW_TEST_TOKEN}", "x-team": "ml"})
    monkeypatch.setenv("TW_TEST_TOKEN", "from-env")
    targets = build_targets(_args("--spec", str(spec), "--triton-url", "http://127.0.0.1:8000",
                                  "--header", "x-team=sre"))
    assert [(t.name, t.url) for t in targets] == [("127.0.0.1:8000", "http://127.0.0.1:8000"),
                                                   ("triton-0", triton.url)]
    assert targets[1].headers == {"triton-access-token": "from-env", "x-team": "sre"}  # CLI overrides spec
    assert targets[1].metrics_url == triton.metrics_url
    assert targets[0].resolved_metrics_url() == "http://127.0.0.1:8002/metrics"
    monkeypatch.delenv("TW_TEST_TOKEN")
    with pytest.raises(SpecError, match="TW_TEST_TOKEN"):
        build_targets(_args("--spec", str(spec)))


@pytest.mark.parametrize("argv, message", [
    (["--triton-url", "127.0.0.1:8000"], "--triton-url"),
    (["--triton-url", "http://a:1", "--header", "novalue"], "--header"),
    (["--triton-url", "http://a:1", "--triton-url", "http://a:1"], "duplicate"),
    (["--metrics-url", "http://a:2/metrics", "--no-spec-targets"], "--metrics-url"),
    (["--no-spec-targets"], "no Triton"),
    (["--triton-url", "http://a:1", "--max-answer-bytes", "100"], "--max-answer-bytes"),
])
def test_bad_usage_is_a_clear_error(argv, message):
    with pytest.raises(UsageError, match=message):
        build_targets(_args(*argv))


def test_answer_limit_from_the_spec_and_the_flag(tmp_path):
    spec = tmp_path / "inferwatch.yaml"
    spec.write_text(yaml.safe_dump({"targets": {"triton": [
        {"name": "big", "url": "http://127.0.0.1:8000", "max_answer_bytes": 64 * 2 ** 20},
        {"name": "default", "url": "http://127.0.0.1:8001"}]}}))
    by_name = {t.name: t.max_answer_bytes for t in build_targets(_args("--spec", str(spec)))}
    assert by_name == {"big": 64 * 2 ** 20, "default": 16 * 2 ** 20}
    flagged = build_targets(_args("--spec", str(spec), "--max-answer-bytes", "2048"))
    assert {t.max_answer_bytes for t in flagged} == {2048}
    spec.write_text(yaml.safe_dump({"targets": {"triton": [{"name": "x", "url": "http://a:1",
                                                            "max_answer_bytes": 5}]}}))
    with pytest.raises(SpecError, match="max_answer_bytes"):
        build_targets(_args("--spec", str(spec)))


@pytest.mark.parametrize("argv, expected", [
    (["--bls-step", "router=classifier,ranker"], {"router": ("classifier", "ranker")}),
    (["--bls-step", "a=x", "--bls-step", "a=y"], {"a": ("x", "y")}),
])
def test_bls_steps(argv, expected):
    assert parse_bls_steps(_args("--triton-url", "http://a:1", *argv).bls_step) == expected


@pytest.mark.parametrize("value", ["router", "=x", "router="])
def test_bad_bls_step_is_a_usage_error(value):
    with pytest.raises(UsageError, match="--bls-step"):
        parse_bls_steps([value])


@pytest.mark.parametrize("flag", ["--interval", "--config-max-age"])
def test_bad_duration_exits_2(flag):
    proc = subprocess.run([INFERWATCH, "exporter", "triton", "--triton-url",
                           "http://127.0.0.1:1", flag, "soon"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(f"inferwatch: error: {flag}")


def test_prometheus_scrapes_triton_and_collector_with_node_labels(tmp_path, triton, prometheus_factory):
    port = free_port()
    spec_path = _spec_file(tmp_path, triton, collector_port=port)
    collector = ManagedProcess(
        "triton-collector",
        [INFERWATCH, "exporter", "triton", "--spec", str(spec_path),
         "--port", str(port), "--interval", "1s"],
        tmp_path / "collector.log", ready=lambda: http_ok(f"http://127.0.0.1:{port}/metrics"))
    collector.start(timeout=60)
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "inferwatch_triton_up" in text
        config = write_config(tmp_path / "prometheus.yml", scrape_configs(load_spec(spec_path)))
        prom = prometheus_factory(config)
        got = prom.wait_for('inferwatch_triton_model_ready{job="inferwatch-triton",model="classifier",version="2"}')
        assert got[0]["metric"]["node"] == "node-a" and got[0]["metric"]["triton"] == "triton-0"
        assert got[0]["value"][1] == "1"
        native = prom.wait_for('nv_inference_request_success{job="triton",model="classifier"}')
        assert {(r["metric"]["node"], r["metric"]["triton"]) for r in native} == {("node-a", "triton-0")}
    finally:
        collector.stop()
