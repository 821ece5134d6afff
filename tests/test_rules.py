"""The rules generator: committed output up to date, promtool check + unit tests, the alert contract (lint),
the registry, spec validation and the generated Prometheus configuration."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.cli import main as cli_main
from inferwatch.generate import stale_files
from inferwatch.rules.generate import PROMETHEUS_CONFIG, PROMETHEUS_RULE, RULES_DIR, outputs, rule_groups
from inferwatch.rules.model import Alert, Recording
from inferwatch.rules.names import ALERTS, RECORDING_RULES
from inferwatch.spec import SpecError, load_spec, spec_from_dict
from promtool_support import promtool_test_files

REPO = Path(__file__).resolve().parents[1]
TESTS_DIR = REPO / "rules" / "tests"
CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
RECORD_NAME = re.compile(r"^[a-z_]+:[A-Za-z0-9_]+:[a-z0-9_]+$")


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found; install it with: apt-get install -y prometheus (or make test)", pytrace=False)
    return path


@pytest.fixture(scope="module")
def spec():
    return load_spec(REPO / "inferwatch.yaml")


@pytest.fixture(scope="module")
def files(spec):
    return outputs(spec)


def generated_rules(files) -> list[dict]:
    rules = []
    for rel, text in files.items():
        if rel.startswith(RULES_DIR):
            for group in yaml.safe_load(text)["groups"]:
                rules += group["rules"]
    return rules


def test_committed_output_is_what_the_repository_spec_generates(files):
    assert stale_files(files, REPO) == []


def test_promtool_check_rules_is_clean(files, tmp_path):
    paths = []
    for rel, text in files.items():
        if rel.startswith(RULES_DIR):
            (tmp_path / Path(rel).name).write_text(text)
            paths.append(str(tmp_path / Path(rel).name))
    out = subprocess.run([promtool(), "check", "rules", *paths], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAILED" not in out.stdout + out.stderr


def test_promtool_unit_tests_pass():
    tests = sorted(str(p) for p in TESTS_DIR.glob("*.yml"))
    passed, failed = promtool_test_files(promtool(), tests, TESTS_DIR)
    assert passed == len(tests) and not failed, failed


def test_every_alert_has_a_firing_and_a_non_firing_unit_test():
    firing: set[str] = set()
    silent: set[str] = set()
    for path in TESTS_DIR.glob("*.yml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
            for check in case.get("alert_rule_test", []):
                for alert in check.get("exp_alerts") or []:
                    # exact rendered annotations, runbook included, in every firing case
                    assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}, check
    assert set(ALERTS) - firing == set(), "alerts without a firing test"
    # The heartbeat fires always (a dead man's switch reads its silence): it has no case where it must not.
    assert set(ALERTS) - silent == {"InferwatchHeartbeat"}, "alerts without a must-not-fire test"


def test_alert_contract_lint(spec, files):
    alerts = [r for r in generated_rules(files) if "alert" in r]
    assert alerts
    for rule in alerts:
        name, labels, ann = rule["alert"], rule["labels"], rule["annotations"]
        assert CAMEL.match(name), name
        assert labels["severity"] in ("critical", "warning", "info"), name
        assert labels["layer"] in ("L1", "L2", "L3"), name
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert "{{" not in ann["summary"] and ann["summary"][0].isupper() and ann["summary"].endswith("."), name
        assert "{{" in ann["description"], f"{name}: description must be templated"
        assert ann["runbook_url"] == f"{spec.runbook_base_url.rstrip('/')}/{name}.md"
        if name.startswith("Notifier"):
            assert labels["component"] == "notifier" and labels["layer"] == "L1", name
        if name in ("LlmAvailabilityBurnRate", "LlmTtftBurnRate"):
            assert labels["window"] in ("fast-1h", "slow-6h", "fast-1d", "slow-3d")


def test_lint_catches_a_templated_summary(spec):
    groups = rule_groups(spec)
    rule = next(r for g in groups["gpu"] for r in g.rules if isinstance(r, Alert))
    rule.annotations["summary"] = "GPU {{ $labels.gpu }} is hot"
    text = yaml.safe_dump({"groups": [g.to_dict() for g in groups["gpu"]]})
    broken = {f"{RULES_DIR}/gpu.yml": text}
    with pytest.raises(AssertionError):
        test_alert_contract_lint(spec, broken)


def test_registry_lists_exactly_the_generated_names(spec):
    alerts, records = set(), set()
    for groups in rule_groups(spec).values():
        for group in groups:
            for rule in group.rules:
                (alerts.add(rule.alert) if isinstance(rule, Alert) else records.add(rule.record))
    assert alerts == set(ALERTS)
    assert records == set(RECORDING_RULES)
    assert all(RECORD_NAME.match(r) for r in records), sorted(r for r in records if not RECORD_NAME.match(r))


def test_prometheusrule_manifest_holds_the_same_groups(files):
    manifest = yaml.safe_load(files[PROMETHEUS_RULE])
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
    from_files = [g for rel, t in sorted(files.items()) if rel.startswith(RULES_DIR)
                  for g in yaml.safe_load(t)["groups"]]
    assert sorted(manifest["spec"]["groups"], key=lambda g: g["name"]) == sorted(from_files, key=lambda g: g["name"])


def test_prometheus_config_jobs_and_node_labels(files, tmp_path):
    config = yaml.safe_load(files[PROMETHEUS_CONFIG])
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"triton", "inferwatch-triton", "inferwatch-gpu", "inferwatch-gateway", "inferwatch-notifier",
                         "inferwatch-alertmanager", "inferwatch-prometheus"}
    for job in jobs.values():
        for static in job["static_configs"]:
            assert static["labels"]["node"], job["job_name"]
    assert jobs["triton"]["static_configs"][0]["labels"]["triton"] == "triton-0"
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    # promtool resolves rule_files relative to the config file: check it in place in a copy of the layout
    root = tmp_path / "repo"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    out = subprocess.run([promtool(), "check", "config", str(root / PROMETHEUS_CONFIG)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_exporter_targets_take_address_and_node_or_a_plain_string():
    spec = spec_from_dict({"targets": {"gpu_exporters": ["10.0.0.5:9400",
                                                         {"address": "10.0.0.6:9400", "node": "gpu-b"}]}})
    config = yaml.safe_load(outputs(spec)[PROMETHEUS_CONFIG])
    gpu = next(j for j in config["scrape_configs"] if j["job_name"] == "inferwatch-gpu")
    assert gpu["static_configs"] == [{"targets": ["10.0.0.5:9400"], "labels": {"node": "10.0.0.5"}},
                                     {"targets": ["10.0.0.6:9400"], "labels": {"node": "gpu-b"}}]


# ------------------------------------------------------------------------------------------ spec validation
def _generate_with(tmp_path, text: str) -> tuple[int, str]:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli_main(["generate", "--spec", str(path), "--out", str(tmp_path / "out")])
    return code, err.getvalue()


@pytest.mark.parametrize("text, field, words", [
    ("targets: {triton: [{name: t, url: 'http://h:8000', metrics_interval_ms: 30000}]}\n",
     "prometheus.scrape_interval", "metrics_interval_ms = 30000"),
    ("prometheus: {scrape_interval: 30s, rate_window: 1m}\n", "prometheus.rate_window", "at least 4 scrape intervals"),
    ("prometheus: {scrape_interval: 30s}\n"
     "layers: {L3: {burn_rate_windows: [{name: x, long: 1h, short: 1m, factor: 14.4}]}}\n",
     "layers.L3.burn_rate_windows[0].short", "got 1m"),
    ("tiers: {realtime: {ttft_slo_seconds: 0.45}}\n", "tiers.realtime.ttft_slo_seconds", "bucket edge"),
])
def test_generate_refuses_windows_and_thresholds_it_cannot_honour(tmp_path, text, field, words):
    code, err = _generate_with(tmp_path, text)
    assert code == 2
    assert f"{field}: " in err and words in err, err
    assert not (tmp_path / "out").exists(), "nothing written for a refused spec"


def test_validation_raises_spec_error_with_the_field_path():
    spec = spec_from_dict({"prometheus": {"scrape_interval": "15s", "rate_window": "30s"}})
    with pytest.raises(SpecError) as exc:
        outputs(spec)
    assert exc.value.path == "prometheus.rate_window"


def test_a_demo_spec_with_short_windows_generates_rules_promtool_accepts(tmp_path):
    spec = spec_from_dict({
        "prometheus": {"scrape_interval": "2s", "evaluation_interval": "2s", "rate_window": "20s"},
        "targets": {"triton": [{"name": "t", "url": "http://127.0.0.1:8000", "metrics_interval_ms": 1000}]},
        "layers": {"L1": {"for": "10s", "vanished_gpu_lookback": "2m"}, "L2": {"for": "10s"}, "L3": {
            "for": "10s", "throughput_baseline_offset": "5m",
            "burn_rate_windows": [{"name": "fast-1h", "long": "2m", "short": "10s", "factor": 14.4, "for": "4s"},
                                  {"name": "slow-3d", "long": "10m", "short": "1m", "factor": 1,
                                   "severity": "warning"}]}},
    })
    files = outputs(spec)
    text = "".join(t for rel, t in files.items() if rel.startswith(RULES_DIR))
    assert "[20s]" in text and "[5m]" not in text and "offset 5m" in text and "for: 10s" in text
    assert 'slo_window="10s"' in text and "[1h]" not in text
    for rel, body in files.items():
        if rel.startswith(RULES_DIR):
            (tmp_path / Path(rel).name).write_text(body)
    out = subprocess.run([promtool(), "check", "rules", *map(str, tmp_path.glob("*.yml"))],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_per_model_overrides_reach_the_rules():
    spec = spec_from_dict({"layers": {"L2": {"models": {"resnet": {"error_ratio": 0.05, "pending_requests": 7}}}}})
    triton = {r.alert: r.expr for g in rule_groups(spec)["triton"] for r in g.rules if isinstance(r, Alert)}
    assert '{model="resnet"} > 0.05' in triton["TritonModelErrorRatioHigh"]
    assert '{model!~"resnet"} > 0.01' in triton["TritonModelErrorRatioHigh"]
    pending = 'nv_inference_pending_request_count{job="triton", model="resnet"}) > 7'
    assert pending in triton["TritonPendingRequestsHigh"]


def test_recording_rules_come_before_their_use_in_each_group(spec):
    for groups in rule_groups(spec).values():
        for group in groups:
            recorded: set[str] = set()
            names = {r.record for r in group.rules if isinstance(r, Recording)}
            for rule in group.rules:
                for name in names - recorded:
                    if isinstance(rule, Recording) and rule.record == name:
                        continue
                    assert not re.search(rf"\b{re.escape(name)}\b", rule.expr), (group.name, name)
                if isinstance(rule, Recording):
                    recorded.add(rule.record)
