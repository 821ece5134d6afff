"""`inferwatch exporter gpu` as a process: sim serving, --nvml real/auto without NVML, bad input exits 2."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

import pynvml
import pytest
import requests

from gpu_support import SCENARIOS, by_gpu, samples

CMD = [sys.executable, "-m", "inferwatch.cli", "exporter", "gpu"]


def _nvml_present() -> bool:
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except pynvml.NVMLError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _exporter(*args: str):
    port = _free_port()
    proc = subprocess.Popen([*CMD, "--port", str(port), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            with contextlib.suppress(requests.ConnectionError):
                requests.get(f"{base}/", timeout=2)
                break
            assert time.monotonic() < deadline, "exporter did not start listening"
            time.sleep(0.1)
        yield base, proc
    finally:
        proc.terminate()
        proc.captured_stderr = proc.communicate(timeout=20)[1]


def test_sim_serves_metrics_and_takes_events():
    with _exporter("--nvml", "sim", "--sim-scenario", str(SCENARIOS / "overheat.yaml"), "--interval", "200ms",
                   "--hostname", "node-x") as (base, proc):
        text = requests.get(f"{base}/metrics", timeout=10).text
        assert by_gpu(text, "inferwatch_gpu_up") == {"0": 1, "1": 1}
        assert {s.labels["Hostname"] for s in samples(text, "DCGM_FI_DEV_GPU_TEMP")} == {"node-x"}
        assert requests.post(f"{base}/sim/events", json=[{"gpu": 1, "set": {"temperature_c": 93}}],
                             timeout=10).status_code == 200
        deadline = time.monotonic() + 20
        while by_gpu(requests.get(f"{base}/metrics", timeout=10).text, "DCGM_FI_DEV_GPU_TEMP").get("1") != 93:
            assert time.monotonic() < deadline, "the posted temperature never showed"
            time.sleep(0.1)
    assert proc.returncode == 0   # SIGTERM is a clean stop


@pytest.mark.skipif(_nvml_present(), reason="this host has NVML; the no-NVML paths cannot be shown here")
def test_real_without_nvml_exits_2_with_a_clear_message():
    proc = subprocess.run([*CMD, "--nvml", "real", "--port", str(_free_port())], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "--nvml real: NVML is not usable" in proc.stderr and "LibraryNotFound" in proc.stderr


@pytest.mark.skipif(_nvml_present(), reason="this host has NVML; the no-NVML paths cannot be shown here")
def test_auto_without_nvml_keeps_serving_zero_devices():
    with _exporter("--nvml", "auto", "--interval", "200ms") as (base, proc):
        answer = requests.get(f"{base}/metrics", timeout=10)
        assert answer.status_code == 200
        assert samples(answer.text, "inferwatch_gpu_devices")[0].value == 0
        assert samples(answer.text, "inferwatch_gpu_nvml_up")[0].value == 0
        assert requests.post(f"{base}/sim/events", json=[], timeout=10).status_code == 404  # sim only
    assert "no NVML on this host" in proc.captured_stderr and "no GPU visible" in proc.captured_stderr


@pytest.mark.parametrize("args, message", [
    (["--nvml", "sim", "--sim-scenario", "/nonexistent/s.yaml"], "/nonexistent/s.yaml: cannot read scenario"),
    (["--nvml", "auto", "--sim-scenario", "x.yaml"], "--sim-scenario only applies with --nvml sim"),
    (["--nvml", "sim", "--interval", "fast"], "--interval"),
    (["--nvml", "sim", "--xid-preset", "48,x"], "--xid-preset"),
    (["--nvml", "auto", "--sim-events-from-any-host"], "--sim-events-from-any-host only applies with --nvml sim"),
    (["--nvml", "sim", "--spec", "/nonexistent/inferwatch.yaml"], "/nonexistent/inferwatch.yaml: cannot read spec"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    proc = subprocess.run([*CMD, "--port", str(_free_port()), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_help_explains_every_flag():
    out = subprocess.run([*CMD, "--help"], capture_output=True, text=True, timeout=60).stdout
    for flag in ("--host", "--port", "--spec", "--nvml", "--sim-scenario", "--interval", "--hostname", "--xid-preset",
                 "--pod-resources-socket", "--no-pod-labels", "--sim-events-from-any-host", "--max-connections",
                 "--header-timeout", "--idle-timeout"):
        assert flag in out
    assert "default 9400" in out
    assert "layers.L1.critical_xids" in " ".join(out.split())   # what --help promises --spec gives


def test_spec_gives_the_xid_presets_and_the_flag_overrides_it(tmp_path):
    spec = tmp_path / "inferwatch.yaml"
    spec.write_text("layers:\n  L1:\n    critical_xids: [48, 79]\n")

    def presets(*args: str) -> set[str]:
        with _exporter("--nvml", "sim", "--no-pod-labels", *args) as (base, _):
            text = requests.get(f"{base}/metrics", timeout=10).text
        return {s.labels["xid"] for s in samples(text, "inferwatch_gpu_xid_errors_total")}

    assert presets("--spec", str(spec)) == {"48", "79"}
    assert presets("--spec", str(spec), "--xid-preset", "94") == {"94"}
