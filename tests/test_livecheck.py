"""`inferwatch check --prometheus URL --alertmanager URL` against real Prometheus servers scraping the real
Triton, the GPU exporter (simulated NVML), the Triton collector and the gateway, next to a real Alertmanager:

- the good setup (the generated scrape jobs and rules, alerts sent to the Alertmanager): exit 0, no problem;
- the bad setup plants one problem of each kind the check knows, each a row asserted on its line: a gateway
  scraped under another job, Triton's series without `node`/`triton`, the ECC field dcgm-exporter's default CSV
  leaves out, Triton scraped faster than it refreshes, the GPU exporter scraped by two jobs, a rule that fails
  to evaluate, and no alerts sent to the Alertmanager: exit 1, one line per problem."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from inferwatch.deploy.prometheus import scrape_jobs
from inferwatch.livecheck import live_problems
from inferwatch.rules.generate import RULES_DIR
from inferwatch.rules.generate import outputs as rule_outputs
from inferwatch.spec import spec_from_dict
from inferwatch.testing.alertmanager import start_alertmanager
from inferwatch.testing.process import ManagedProcess, free_port, http_ok
from inferwatch.testing.prometheus import start_prometheus

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("gpu", "triton", "triton_collector", "gateway")


def _exporter(tmp: Path, name: str, args: list[str], port: int) -> ManagedProcess:
    url = f"http://127.0.0.1:{port}/metrics"
    return ManagedProcess(name, [sys.executable, "-m", "inferwatch", "exporter", *args], tmp / f"{name}.log",
                          ready=lambda: http_ok(url)).start(timeout=60)


def _bad_jobs(jobs: dict[str, dict], ports: dict[str, int]) -> list[dict]:
    gpu, triton = dict(jobs["gpu"]), dict(jobs["triton"])
    # dcgm-exporter with its default CSV: no ECC fields.
    gpu["metric_relabel_configs"] = [{"source_labels": ["__name__"], "regex": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                                      "action": "drop"}]
    # The user's own Triton job: no node/triton labels, scraped faster than Triton refreshes (1000 ms).
    triton["static_configs"] = [{"targets": sc["targets"]} for sc in triton["static_configs"]]
    triton["scrape_interval"] = "500ms"
    again = {"job_name": "gpu-again", "static_configs": [{"targets": [f"127.0.0.1:{ports['gpu']}"]}]}
    gateway = {"job_name": "gw", "static_configs": [{"targets": [f"127.0.0.1:{ports['gateway_metrics']}"]}]}
    return [gpu, triton, jobs["triton_collector"], again, gateway]


@pytest.fixture(scope="module")
def stack(triton, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("livecheck")
    ports = {k: free_port() for k in ("gpu", "collector", "gateway", "gateway_metrics")}
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    raw["targets"] = {
        **raw["targets"],
        "triton": [{"name": "triton-0", "url": triton.url, "metrics_url": triton.metrics_url, "node": "node-t",
                    "metrics_interval_ms": 1000}],
        "gpu_exporters": [{"address": f"127.0.0.1:{ports['gpu']}", "node": "gpu-a"}],
        "triton_collectors": [f"127.0.0.1:{ports['collector']}"],
        "gateways": [{"address": f"127.0.0.1:{ports['gateway_metrics']}", "node": "gw-a"}]}
    # 2s: what `check` accepts for every generated output (compose assumes Triton's default 2000 ms); the
    # Prometheus servers below scrape every second.
    raw["prometheus"] = {**raw["prometheus"], "scrape_interval": "2s", "evaluation_interval": "5s"}
    spec_path = tmp / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    spec = spec_from_dict(raw)
    rules = tmp / "rules"
    rules.mkdir()
    for rel, text in rule_outputs(spec).items():
        if rel.startswith(RULES_DIR):
            (rules / Path(rel).name).write_text(text)
    (tmp / "broken.yml").write_text(yaml.safe_dump({"groups": [{"name": "broken", "rules": [
        # Parses, fails at every evaluation: several `up` series on the one-element side.
        {"record": "broken:up:product", "expr": "vector(1) * on () group_left () up"}]}]}))
    jobs = {source: job for source, job in scrape_jobs(spec) if source in SOURCES}
    with contextlib.ExitStack() as stack:
        (tmp / "am.yml").write_text(yaml.safe_dump({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}))
        am = start_alertmanager(tmp / "am", tmp / "am.yml")
        stack.callback(am.stop)
        for name, args, port in (
                ("gpu", ["gpu", "--nvml", "sim", "--interval", "1s", "--hostname", "gpu-a", "--port",
                         str(ports["gpu"])], ports["gpu"]),
                ("collector", ["triton", "--spec", str(spec_path), "--interval", "1s", "--port",
                               str(ports["collector"])], ports["collector"]),
                ("gateway", ["gateway", "--upstream", triton.url, "--spec", str(spec_path), "--port",
                             str(ports["gateway"]), "--metrics-port", str(ports["gateway_metrics"])],
                 ports["gateway_metrics"])):
            stack.callback(_exporter(tmp, name, args, port).stop)
        good = {"global": {"scrape_interval": "1s", "evaluation_interval": "5s"},
                "rule_files": [str(rules / "*.yml")], "scrape_configs": list(jobs.values()),
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.url.split("://")[1]]}]}]}}
        bad = {"global": {"scrape_interval": "1s", "evaluation_interval": "5s"},
               "rule_files": [str(rules / "*.yml"), str(tmp / "broken.yml")],
               "scrape_configs": _bad_jobs(jobs, ports)}
        proms = {}
        for name, config in (("good", good), ("bad", bad)):
            (tmp / f"{name}.yml").write_text(yaml.safe_dump(config))
            proms[name] = start_prometheus(tmp / name, tmp / f"{name}.yml")
            stack.callback(proms[name].stop)
        yield spec, spec_path, proms, am


def _settled(spec, url: str, am_url: str, done, timeout: float = 90.0) -> list[str]:
    """The problem lines once `done(lines)` holds (every target scraped, every rule evaluated), polled until
    then or the deadline (then the last lines, for the assertion to show)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [str(p) for p in live_problems(spec, url, am_url)]
        if done(lines) or time.monotonic() > deadline:
            return lines
        time.sleep(1.0)


BAD_ROWS = [
    ("gateway under another job", "selectors.gateway: {job=\"inferwatch-gateway\"} matches no series"),
    ("Triton without node", "selectors.triton: "),
    ("ECC field not in dcgm-exporter's CSV", "metric DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: no gpu series"),
    ("Triton scraped faster than it refreshes", "Triton scraped every 500ms, more often than it refreshes"),
    ("one exporter scraped twice", "scraped 2 times (scrape pools gpu-again, inferwatch-gpu)"),
    ("a rule failing to evaluate", "rule broken:up:product (group broken): fails to evaluate"),
    ("no alerts to the Alertmanager", "Prometheus does not send alerts to it (it sends to: none)"),
]


@pytest.fixture(scope="module")
def bad_lines(stack):
    spec, _path, proms, am = stack
    # 8 lines: the rows above, Triton lacking both `node` and `triton` being two of them.
    return _settled(spec, proms["bad"].url, am.url,
                    lambda lines: all(any(text in line for line in lines) for _row, text in BAD_ROWS)
                    and len(lines) >= len(BAD_ROWS) + 1)


@pytest.mark.slow
@pytest.mark.parametrize("row, text", BAD_ROWS, ids=[r for r, _ in BAD_ROWS])
def test_each_planted_problem_is_one_line(bad_lines, row, text):
    assert sum(text in line for line in bad_lines) >= 1, f"{row}: not found in\n" + "\n".join(bad_lines)


@pytest.mark.slow
def test_triton_identity_labels_named(bad_lines):
    triton = [line for line in bad_lines if line.startswith("selectors.triton: ")]
    assert len(triton) == 2 and "label node," in triton[0] and "label triton," in triton[1], triton
    assert len(bad_lines) == len(BAD_ROWS) + 1, "\n".join(bad_lines)


@pytest.mark.slow
def test_cli_exit_codes(stack, bad_lines):
    spec, path, proms, am = stack
    assert _settled(spec, proms["good"].url, am.url, lambda lines: not lines) == []
    for name, code in (("good", 0), ("bad", 1)):
        out = subprocess.run([sys.executable, "-m", "inferwatch", "check", "--spec", str(path), "--prometheus",
                              proms[name].url, "--alertmanager", am.url], capture_output=True, text=True, timeout=120)
        assert out.returncode == code, out.stdout + out.stderr
        lines = out.stdout.strip().splitlines()
        if code == 0:
            assert lines[-1].endswith(": OK, the spec fits"), lines
        else:
            assert lines[-1].endswith(f": {len(bad_lines)} problem(s)") and len(lines) == len(bad_lines) + 2, lines


def test_unreachable_prometheus_is_one_error_line(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text((REPO / "inferwatch.yaml").read_text())
    out = subprocess.run([sys.executable, "-m", "inferwatch", "check", "--spec", str(path), "--prometheus",
                          "http://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last == "error: cannot reach Prometheus at http://127.0.0.1:1: ConnectionError"
