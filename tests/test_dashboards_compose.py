"""docker-compose.yml: valid for Docker Compose (`docker compose config`, or Debian's `docker-compose config`
where the compose plugin is missing; no engine needed), wired to the generated files, and agreeing with the
service names and ports deploy/compose.py writes into deploy/compose/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.deploy.compose import OUT_DIR, SERVICES, outputs
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


SECRETS = ("notifier-token", "pagerduty-fallback-key", "grafana-admin-password")


def _config(compose, files, tmp_path, **env) -> dict:
    """`compose config` with the secrets in a folder outside the repository (as a user keeps them)."""
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    for name in SECRETS:
        (secrets / name).write_text(f"test-{name}\n")
    result = subprocess.run(compose + files + ["config"], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin:/usr/local/bin", "INFERWATCH_SECRETS": str(secrets), **env})
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def _published(service: dict) -> list[tuple[str, str]]:
    """(host address, published port) per port: docker-compose 1.x prints 'ip:port:port/tcp', Compose v2 a map."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip", "0.0.0.0"), str(port["published"])))
        else:
            parts = str(port).split("/")[0].split(":")
            out.append((parts[0] if len(parts) == 3 else "0.0.0.0", parts[-2] if len(parts) > 1 else parts[0]))
    return out


@pytest.mark.parametrize("files", FILES, ids=["base", "gpu-override"])
def test_compose_config_is_valid(compose, files, tmp_path):
    config = _config(compose, files, tmp_path)
    assert set(SERVICES) <= set(config["services"])
    secrets = {name: Path(entry["file"]) for name, entry in config["secrets"].items()}
    assert set(secrets) == set(SECRETS)
    assert all(path.parent == tmp_path / "secrets" for path in secrets.values())


@pytest.mark.parametrize("bind,expected", [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0"), ("10.1.2.3", "10.1.2.3")],
                         ids=["default-loopback", "all-interfaces", "one-address"])
def test_compose_publishes_on_loopback_unless_told(compose, tmp_path, bind, expected):
    config = _config(compose, FILES[0], tmp_path, **({"INFERWATCH_BIND": bind} if bind else {}))
    seen = {}
    for name, service in config["services"].items():
        for host, port in _published(service):
            seen[(name, port)] = host
    assert ("gpu-exporter", "9400") in seen and len(seen) >= len(SERVICES)
    for (name, port), host in seen.items():
        # The GPU exporter also serves the simulator's unauthenticated POST /sim/events: loopback always.
        assert host == ("127.0.0.1" if name == "gpu-exporter" else expected), (name, port, host)


def test_no_secret_is_committed():
    tracked = subprocess.run(["git", "ls-files", "deploy/compose"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    assert not [f for f in tracked.stdout.split() if "/secrets/" in f]
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/compose/secrets/notifier-token"], cwd=ROOT)
    assert ignored.returncode == 0, "deploy/compose/secrets/ must be git-ignored"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, entry in compose["secrets"].items():
        assert entry["file"].startswith("${INFERWATCH_SECRETS:-./deploy/compose/secrets}/"), name
    grafana = compose["services"]["grafana"]["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana and grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"]


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


@pytest.mark.parametrize("files", [["docker-compose.yml"], ["docker-compose.yml", "docker-compose.gpu.yml"]],
                         ids=["base", "gpu-override"])
def test_compose_commands_parse_as_inferwatch_commands(files):
    """Each inferwatch service's command is a valid `inferwatch` command line (the image's entrypoint), reads
    the mounted spec, and the simulated GPU exporter takes /sim/events from the host (which reaches it through
    the bridge, not loopback) while the real one has no simulator to post to."""
    from inferwatch.cli import build_parser

    services: dict = {}
    for name in files:
        for service, body in yaml.safe_load((ROOT / name).read_text())["services"].items():
            services.setdefault(service, {}).update(body)
    parser = build_parser()
    commands = {name: s["command"] for name, s in services.items()
                if s.get("image") == "inferwatch:local" and "command" in s}
    assert {"gateway", "triton-collector", "gpu-exporter"} <= set(commands)
    for name, command in commands.items():
        args = parser.parse_args([str(a) for a in command])
        assert getattr(args, "func", None) and args.host == "0.0.0.0", name
        assert args.spec and args.spec.startswith("/etc/inferwatch/"), name
    gpu = parser.parse_args([str(a) for a in commands["gpu-exporter"]])
    assert gpu.sim_events_from_any_host == (gpu.nvml == "sim"), files
    assert services["gpu-exporter"]["ports"] == ["127.0.0.1:9400:9400"]
