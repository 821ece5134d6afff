"""Bad command-line configuration ends in one `inferwatch: error: ...` line and exit 2, never a traceback.

Services run as real subprocesses (a failed fix would otherwise hang the test in serve_forever); argparse-level
checks run in-process.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from inferwatch.cli import main

UTF16 = b"\xff\xfe" + "layers: {}\n".encode("utf-16-le")


def run_cli(*argv: str, cwd, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferwatch", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("inferwatch: error: "), proc.stderr
    for needle in needles:
        assert needle in last, last
    return last


@pytest.fixture
def busy_port():
    """A port some other process (here: this one) is already listening on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def empty_spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("{}\n", encoding="utf-8")
    return str(path)


# ------------------------------------------------------------------------------------------ item 1: services
@pytest.mark.parametrize("argv", [
    ["notifier", "--spec", "{spec}", "--data-dir", "{tmp}/data", "--port", "{busy}"],
    ["exporter", "triton", "--triton-url", "http://127.0.0.1:1", "--port", "{busy}"],
    ["exporter", "gpu", "--nvml", "sim", "--port", "{busy}"],
    ["exporter", "gateway", "--upstream", "http://127.0.0.1:1", "--port", "{busy}", "--metrics-port", "{free}"],
    ["exporter", "gateway", "--upstream", "http://127.0.0.1:1", "--port", "{free}", "--metrics-port", "{busy}"],
], ids=["notifier", "triton", "gpu", "gateway-proxy", "gateway-metrics"])
def test_port_in_use_is_one_line_naming_host_and_port(argv, busy_port, empty_spec, tmp_path):
    with socket.socket() as s:  # a free port for the other listener of the gateway
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    argv = [a.format(spec=empty_spec, tmp=tmp_path, busy=busy_port, free=free) for a in argv]
    proc = run_cli(*argv, cwd=tmp_path)
    assert_one_line_error(proc, "address already in use", f"127.0.0.1:{busy_port}")


@pytest.mark.parametrize("argv", [
    ["notifier", "--spec", "{spec}", "--data-dir", "{tmp}/data"],
    ["exporter", "triton", "--triton-url", "http://127.0.0.1:1"],
    ["exporter", "gpu", "--nvml", "sim"],
], ids=["notifier", "triton", "gpu"])
def test_non_local_host_is_one_line(argv, empty_spec, tmp_path):
    argv = [a.format(spec=empty_spec, tmp=tmp_path) for a in argv] + ["--host", "10.255.255.1"]
    proc = run_cli(*argv, cwd=tmp_path)
    assert_one_line_error(proc, "cannot assign requested address", "10.255.255.1:")


def test_notifier_unusable_data_dir_is_one_line(empty_spec, tmp_path):
    proc = run_cli("notifier", "--spec", empty_spec, "--data-dir", "/proc/nope", "--port", "1", cwd=tmp_path)
    assert_one_line_error(proc, "/proc/nope")
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    proc = run_cli("notifier", "--spec", empty_spec, "--data-dir", str(a_file), "--port", "1", cwd=tmp_path)
    assert_one_line_error(proc, str(a_file))


@pytest.mark.parametrize("argv, flag", [
    (["notifier", "--port", "70000"], "--port"),
    (["exporter", "triton", "--port", "70000"], "--port"),
    (["exporter", "gpu", "--port", "70000"], "--port"),
    (["exporter", "gateway", "--upstream", "http://x:1", "--port", "70000"], "--port"),
    (["exporter", "gateway", "--upstream", "http://x:1", "--metrics-port", "70000"], "--metrics-port"),
    (["exporter", "gpu", "--port", "0"], "--port"),
    (["exporter", "gpu", "--port", "http"], "--port"),
    (["triage", "--timeout", "-1"], "--timeout"),
    (["triage", "--timeout", "0"], "--timeout"),
    (["triage", "--timeout", "nan"], "--timeout"),
])
def test_out_of_range_flags_are_usage_errors(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "Traceback" not in err


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:0", "http://127.0.0.1:port"])
def test_triton_url_with_a_bad_port_is_rejected(url, capsys):
    assert main(["exporter", "triton", "--triton-url", url, "--port", "1"]) == 2
    assert "1-65535" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ item 2: not UTF-8
@pytest.mark.parametrize("argv", [
    ["check", "--spec", "{f}"],
    ["notifier", "--spec", "{f}"],
    ["triage", "--spec", "{f}", "--prometheus", "http://127.0.0.1:1"],
    ["exporter", "triton", "--spec", "{f}"],
    ["exporter", "gateway", "--upstream", "http://127.0.0.1:1", "--spec", "{f}"],
    ["exporter", "gpu", "--nvml", "sim", "--sim-scenario", "{f}"],
], ids=["check", "notifier", "triage", "triton", "gateway", "gpu-scenario"])
def test_utf16_file_is_one_line_not_utf8(argv, tmp_path, capsys):
    f = tmp_path / "utf16.yaml"
    f.write_bytes(UTF16)
    assert main([a.format(f=f) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"inferwatch: error: {f}: not UTF-8 text (byte 0: b'\\xff'); save the file as UTF-8"


# -------------------------------------------------------------------------------------- items 5, 6: check / generate
def test_check_without_a_spec_file_says_it_checked_the_defaults(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("built-in defaults (no --spec and no ./inferwatch.yaml): OK")
    assert "inferwatch.yaml: OK" not in out


def test_generate_without_a_spec_file_refuses_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["generate"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("inferwatch: error: no spec file: no ./inferwatch.yaml here; "
                   "pass --spec or run from the repository root")
    assert list(tmp_path.iterdir()) == []


def test_generate_check_hint_quotes_the_whole_command(tmp_path, capsys):
    spec = str(REPO_ROOT / "inferwatch.yaml")
    assert main(["generate", "--spec", spec, "--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    # The whole command: following the hint must regenerate the same folder, not the repository's files.
    assert f"run `inferwatch generate --spec {spec} --out {tmp_path}`" in err


def test_each_command_module_registers_the_command_the_lazy_map_names():
    """`inferwatch <command>` imports only COMMAND_OF's module for <command>: the map must name what each
    module registers, or that command would be missing from its own command line."""
    import argparse
    import importlib

    from inferwatch.cli import COMMAND_OF, COMMANDS, EXPORTERS

    assert set(COMMAND_OF) == set(COMMANDS) | set(EXPORTERS)
    for module in COMMAND_OF:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        assert list(sub.choices) == [COMMAND_OF[module]], module


# Command lines parsed by the parser that imports only the named command and by the whole one: same result.
LAZY_ARGV = [
    ["notifier", "--port", "9410", "--data-dir", "d"],
    ["-v", "notifier", "outbox", "list"],
    ["check"],
    ["generate", "--check"],
    ["triage", "--prometheus", "http://127.0.0.1:9"],
    ["exporter", "triton", "--triton-url", "http://127.0.0.1:8000"],
    ["exporter", "gateway"],
    ["stack", "triton"],
]


@pytest.mark.parametrize("argv", LAZY_ARGV, ids=[" ".join(a) for a in LAZY_ARGV])
def test_the_parser_of_one_named_command_parses_as_the_whole_one(argv):
    from inferwatch.cli import build_parser

    def parsed(parser):
        try:
            return vars(parser.parse_args(argv))
        except SystemExit as exc:
            return {"exit": exc.code}

    whole, lazy = parsed(build_parser()), parsed(build_parser(argv))
    assert lazy == whole
    assert "exit" not in whole, whole  # every line of the table parses: the comparison is of two parses
