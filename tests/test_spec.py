"""Spec loading: the example file loads, defaults apply, and every broken input names its field."""

from __future__ import annotations

import pytest

from conftest import REPO_ROOT
from inferwatch.cli import main
from inferwatch.spec import Duration, SpecError, load_spec, spec_from_dict


def test_example_spec_loads_with_its_values():
    spec = load_spec(REPO_ROOT / "inferwatch.yaml")
    assert spec.targets.triton[0].name == "triton-0"
    assert spec.layers.L2.models["classifier"].queue_p95_seconds == 0.25
    assert spec.layers.L1.for_ == Duration.parse("2m")
    assert spec.tier_of_service("chat-web") == "realtime"
    assert spec.tier_of_service("unknown-app") == "other"
    assert spec.channels["phone"].routing_key.env == "PAGERDUTY_ROUTING_KEY"


def test_defaults_fill_an_empty_spec():
    spec = spec_from_dict({})
    assert spec.layers.L1.temperature_critical_celsius == 85.0
    assert spec.layers.L2.queue_p95_seconds == 0.5
    assert spec.tiers["realtime"].ttft_p95_seconds == 0.3


@pytest.mark.parametrize("data, path, expected", [
    ({"layers": {"L1": {"temperature_critical_celsius": "hot"}}}, "layers.L1.temperature_critical_celsius",
     "expected a number"),
    ({"layers": {"L2": {"for": "5 minutes"}}}, "layers.L2.for", "expected a duration"),
    ({"targets": {"triton": [{"name": "t", "url": "ftp://x"}]}}, "targets.triton[0].url", "http(s) URL"),
    ({"targets": {"triton": [{"url": "http://x:8000"}]}}, "targets.triton[0].name", "required"),
    ({"layerz": {}}, "layerz", "unknown field"),
    ({"tiers": {"realtime": {"availability_objective": 1.5}}}, "tiers.realtime.availability_objective",
     "between 0 and 1"),
    ({"channels": {"x": {"type": "fax", "url": "${X}"}}}, "channels.x.type", "expected one of"),
    ({"routes": [{"receivers": ["nope"]}]}, "routes[0].receivers", "unknown channel"),
    ({"channels": {"s": {"type": "slack", "url": "https://hooks/${X}"}}}, "channels.s.url", "whole value"),
])
def test_errors_name_the_field_and_what_was_expected(data, path, expected):
    with pytest.raises(SpecError) as err:
        spec_from_dict(data, "my.yaml")
    message = str(err.value)
    assert message.startswith(f"my.yaml: {path}: "), message
    assert expected in message


def test_invalid_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers:\n  L1: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml: line \d+, column \d+: not valid YAML"):
        load_spec(bad)


def test_secrets_resolve_from_env_or_file_and_never_print(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text("s3cr3t-from-file\n")
    spec = spec_from_dict({"channels": {
        "pd": {"type": "pagerduty", "routing_key_file": str(key_file)},
        "slack": {"type": "slack", "url": "${SLACK_URL_FOR_TEST}"}}})
    monkeypatch.setenv("SLACK_URL_FOR_TEST", "https://hooks.example/T000/SECRET")
    assert spec.channels["pd"].routing_key.reveal() == "s3cr3t-from-file"
    assert spec.channels["slack"].url.reveal() == "https://hooks.example/T000/SECRET"
    assert "SECRET" not in repr(spec) and "s3cr3t" not in repr(spec)
    monkeypatch.delenv("SLACK_URL_FOR_TEST")
    with pytest.raises(SpecError, match="channels.slack.url: environment variable SLACK_URL_FOR_TEST is not set"):
        spec.channels["slack"].url.reveal()


def test_duration_round_trips_to_prometheus_form():
    assert str(Duration.parse("90s")) == "1m30s"
    assert str(Duration.parse("1h30m")) == "1h30m"
    assert Duration.parse("250ms").seconds == 0.25
    assert Duration.parse(30).seconds == 30


def test_cli_check_reports_a_broken_spec_in_one_line_and_exits_2(tmp_path, capsys):
    bad = tmp_path / "inferwatch.yaml"
    bad.write_text("prometheus:\n  scrape_interval: often\n")
    assert main(["check", "--spec", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{bad}: prometheus.scrape_interval: expected a duration" in err


def test_cli_check_accepts_the_example_spec(capsys):
    assert main(["check", "--spec", str(REPO_ROOT / "inferwatch.yaml")]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_float_fields_reject_nan_and_infinity(value, tmp_path):
    # `.nan` would generate `expr: ... > nan`, an alert that never fires.
    f = tmp_path / "s.yaml"
    f.write_text(f"layers:\n  L1:\n    temperature_critical_celsius: {value}\n", encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        load_spec(f)
    assert str(exc.value).startswith(f"{f}: layers.L1.temperature_critical_celsius: expected a finite number")


def test_duplicate_yaml_keys_are_rejected_with_file_and_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("layers:\n  L1:\n    temperature_critical_celsius: 80\n    temperature_critical_celsius: 90\n",
                 encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        load_spec(f)
    assert str(exc.value) == (f"{f}: line 4, column 5: not valid YAML: duplicate key "
                              "'temperature_critical_celsius' (first at line 3)")


def test_merge_keys_and_the_same_key_in_different_mappings_still_load():
    from inferwatch.specload import load_yaml

    data = load_yaml(b"base: &b {ttft_p95_seconds: 2, x: 1}\ntiers:\n  realtime: {ttft_p95_seconds: 0.3}\n"
                     b"  batch:\n    <<: *b\n    ttft_p95_seconds: 20\n", "s.yaml")
    assert data["tiers"] == {"realtime": {"ttft_p95_seconds": 0.3}, "batch": {"ttft_p95_seconds": 20, "x": 1}}


@pytest.mark.parametrize("yaml_text, expected", [
    ("tiers:\n  realtime:\n    ttft_p95_seconds: -1\n", "tiers.realtime.ttft_p95_seconds: expected a positive number"),
    ("prometheus:\n  scrape_interval: 1m\n  rate_window: 1m\n", "prometheus.rate_window: expected at least 4"),
])
@pytest.mark.parametrize("command", [["check"], ["generate", "--check"]])
def test_check_runs_the_generators_and_names_the_file(yaml_text, expected, command, tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(yaml_text, encoding="utf-8")
    assert main([*command, "--spec", str(f), *(["--out", str(tmp_path)] if command[0] == "generate" else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"inferwatch: error: {f}: {expected}")


def test_cli_check_warns_about_secrets_that_do_not_resolve_here(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text("channels:\n  slack:\n    type: slack\n    url: ${CHECK_TEST_SLACK_URL}\n")
    monkeypatch.delenv("CHECK_TEST_SLACK_URL", raising=False)
    assert main(["check", "--spec", str(spec)]) == 0
    err = capsys.readouterr().err
    assert "warning: channels.slack.url: environment variable CHECK_TEST_SLACK_URL is not set" in err
    assert "warning: notifier.token_file: /etc/alertmanager/secrets/notifier-token is not readable here" in err
    assert "warning: notifier.fallback_routing_key_file: " in err
    monkeypatch.setenv("CHECK_TEST_SLACK_URL", "https://hooks.example/x")
    for name in ("token", "key"):
        (tmp_path / name).write_text("x\n")
    spec.write_text(spec.read_text() + f"notifier:\n  token_file: {tmp_path / 'token'}\n"
                                       f"  fallback_routing_key_file: {tmp_path / 'key'}\n")
    assert main(["check", "--spec", str(spec)]) == 0
    assert "warning" not in capsys.readouterr().err

