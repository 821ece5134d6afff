"""docker-compose.yml: valid for Docker Compose (`docker compose config`, or Debian's `docker-compose config`
where the compose plugin is missing; no engine needed), wired to the generated files, and agreeing with the
service names and ports inferwatch/compose.py writes into deploy/compose/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.compose import OUT_DIR, SERVICES, outputs
from inferwatch.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
FILES = (["-f", "docker-compose.yml"], ["-f", "docker-compose.yml", "-f", "docker-compose.gpu.yml"])


def _compose_cli() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.fixture(scope="module")
def compose():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed (make system-deps installs "
                    "Debian's docker-compose)")
    return cli


@pytest.mark.parametrize("files", FILES, ids=["base", "gpu-override"])
def test_compose_config_is_valid(compose, files):
    result = subprocess.run(compose + files + ["config"], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin:/usr/local/bin"})
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert set(SERVICES) <= set(config["services"])


def test_compose_mounts_exist_and_ports_match_compose_generator():
    config = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = config["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
    for name, port in SERVICES.items():
        published = [p.split(":")[-1] for p in services[name].get("ports", [])]
        assert str(port) in published, f"{name} should expose {port}, has {published}"
    assert "--metrics-config=summary_latencies=true" in services["triton"]["command"]
    assert services["grafana"]["image"].split(":")[1].startswith("11.")


def test_compose_generated_files_are_fresh_and_use_service_names():
    files = outputs(load_spec(ROOT / "inferwatch.yaml"))
    for rel, text in files.items():
        assert (ROOT / rel).read_text(encoding="utf-8") == text, f"{rel} is stale: run `inferwatch generate`"
    prom = yaml.safe_load(files[f"{OUT_DIR}/prometheus.yml"])
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in prom["scrape_configs"]}
    assert targets["triton"] == ["triton:8002"]
    assert targets["inferwatch-gpu"] == ["gpu-exporter:9400"]
    assert targets["inferwatch-gateway"] == ["gateway:9402"]
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert "127.0.0.1" not in json.dumps(prom)
    am = yaml.safe_load(files[f"{OUT_DIR}/alertmanager.yml"])
    urls = {c["url"] for r in am["receivers"] for c in r.get("webhook_configs", [])}
    assert urls == {"http://notifier:9410/alerts"}


def test_compose_configs_pass_promtool_and_amtool(tmp_path):
    """The compose Prometheus config with the real rule files, and the Alertmanager config, load in the real
    tools (rules mounted where the container sees them)."""
    promtool, amtool = shutil.which("promtool"), shutil.which("amtool")
    if not promtool or not amtool:
        pytest.fail("promtool/amtool missing: make system-deps", pytrace=False)
    prom = yaml.safe_load((ROOT / OUT_DIR / "prometheus.yml").read_text())
    prom["rule_files"] = [str(ROOT / "rules/generated/*.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))
    result = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run([amtool, "check-config", str(ROOT / OUT_DIR / "alertmanager.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
