"""The central-store configuration `inferwatch generate` writes (inferwatch.central), checked by the real tools:
Prometheus in agent mode starts on edge-prometheus.yml and promtool accepts it, vmagent accepts
edge-scrape.yml, vmalert accepts every generated rule file (with and without the cluster label) — the same
files promtool accepts for a plain Prometheus (tests/test_rules.py) — and the spec refuses a central store
without a cluster name. The end-to-end run is tests/test_central_store.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.central import COMMANDS, EDGE_PROMETHEUS, EDGE_SCRAPE, outputs
from inferwatch.generate import render_all
from inferwatch.rules.generate import RULES_DIR
from inferwatch.spec import SpecError, spec_from_dict
from inferwatch.testing.process import ManagedProcess, free_port, http_ok

REPO = Path(__file__).resolve().parents[1]


def tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found; install it with: apt-get install -y victoria-metrics prometheus "
                    f"(or make test)", pytrace=False)
    return path


def spec(edge: str = "vmagent", **extra):
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    return spec_from_dict({**raw, "cluster": {"name": "eu-1"},
                           "central_store": {"url": "http://victoria-metrics:8428", "edge": edge}, **extra})


def write(files: dict[str, str], root: Path) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_nothing_without_a_central_store_and_a_cluster_name_is_required():
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    assert outputs(spec_from_dict(raw)) == {}
    with pytest.raises(SpecError) as exc:
        spec_from_dict({**raw, "central_store": {"url": "http://vm:8428"}})
    assert exc.value.path == "cluster.name"
    with pytest.raises(SpecError) as exc:
        spec_from_dict({**raw, "cluster": {"name": "a"}, "central_store": {"url": "http://vm:8428", "edge": "x"}})
    assert exc.value.path == "central_store.edge"


def test_vmagent_edge_config_and_command(tmp_path):
    files = outputs(spec("vmagent"))
    assert set(files) == {EDGE_SCRAPE, COMMANDS}
    commands = yaml.safe_load(files[COMMANDS])
    assert "-remoteWrite.url=http://victoria-metrics:8428/api/v1/write" in commands["edge"]
    assert "-remoteWrite.label=cluster=eu-1" in commands["edge"]
    assert commands["vmalert"][:2] == ["vmalert", "-rule=rules/generated/*.yml"]
    root = write(files, tmp_path)
    out = subprocess.run([tool("vmagent"), f"-promscrape.config={root / EDGE_SCRAPE}", "-dryRun",
                          "-loggerLevel=ERROR"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_agent_mode_prometheus_runs_the_edge_config(tmp_path):
    files = outputs(spec("prometheus-agent"))
    assert set(files) == {EDGE_PROMETHEUS, COMMANDS}
    config = yaml.safe_load(files[EDGE_PROMETHEUS])
    assert config["global"]["external_labels"] == {"cluster": "eu-1"}
    assert config["remote_write"] == [{"url": "http://victoria-metrics:8428/api/v1/write"}]
    root = write(files, tmp_path)
    check = subprocess.run([tool("promtool"), "check", "config", "--agent", str(root / EDGE_PROMETHEUS)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    argv = yaml.safe_load(files[COMMANDS])["edge"]
    argv = [tool("prometheus"), *argv[1:]]
    argv = [a.replace(EDGE_PROMETHEUS, str(root / EDGE_PROMETHEUS)).replace("/var/lib/", f"{tmp_path}/") for a in argv]
    proc = ManagedProcess("prometheus-agent", [*argv, f"--web.listen-address=127.0.0.1:{port}"],
                          tmp_path / "agent.log", ready=lambda: http_ok(f"http://127.0.0.1:{port}/-/ready"))
    with proc:
        assert proc.running


@pytest.mark.parametrize("cluster", [None, "eu-1"])
def test_vmalert_accepts_the_generated_rule_files(tmp_path, cluster):
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    if cluster:
        raw["cluster"] = {"name": cluster}
    files = {k: v for k, v in render_all(spec_from_dict(raw)).items() if k.startswith(RULES_DIR)}
    root = write(files, tmp_path)
    out = subprocess.run([tool("vmalert"), f"-rule={root / RULES_DIR}/*.yml", "-dryRun", "-loggerLevel=ERROR"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
