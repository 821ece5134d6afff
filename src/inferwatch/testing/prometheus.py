"""Real Prometheus (Debian package `prometheus`) on loopback, for tests, benchmarks and the demo: one, or the
replicas of the spec's `ha.prometheus`, each with its own generated configuration and TSDB."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import requests
import yaml

from inferwatch.testing.process import ManagedProcess, StackError, free_port, http_ok, require_binary

INSTALL_HINT = "apt-get update && apt-get install -y prometheus  (or: make test, which installs it)"


@dataclasses.dataclass
class PrometheusServer:
    process: ManagedProcess
    port: int
    config_path: Path
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def query(self, expr: str) -> list[dict]:
        """Instant query; returns the `result` vector. Raises StackError on a query error."""
        resp = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        if body.get("status") != "success":
            raise StackError(f"query {expr!r} failed: {body.get('error')}")
        return body["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 60.0, predicate=None) -> list[dict]:
        """Poll `expr` until it returns a non-empty result (and `predicate(result)` holds)."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result and (predicate is None or predicate(result)):
                return result
            time.sleep(0.5)
        raise StackError(f"{expr!r} gave no matching result within {timeout:.0f}s (last: {result})")

    def reload(self) -> None:
        requests.post(f"{self.url}/-/reload", timeout=10).raise_for_status()

    def stop(self) -> None:
        self.process.stop()


def write_config(path: Path, scrape_configs: list[dict], *, rule_files: list[str] | None = None,
                 alertmanagers: list[str] | None = None, scrape_interval: str = "1s",
                 evaluation_interval: str = "1s") -> Path:
    """Write a minimal prometheus.yml for a test or demo (generated configs come from `inferwatch generate`)."""
    config: dict = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": scrape_configs,
    }
    if rule_files:
        config["rule_files"] = [str(r) for r in rule_files]
    if alertmanagers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": alertmanagers}]}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_prometheus(workdir: Path, config_path: Path, *, port: int | None = None,
                     extra_args: list[str] | None = None, timeout: float = 60.0,
                     storage_path: Path | None = None, name: str = "prometheus",
                     lifeline: bool = False) -> PrometheusServer:
    """Start Prometheus with `config_path` on a free loopback port; ready when /-/ready answers 200.

    `storage_path`: an existing TSDB directory to serve (e.g. blocks written by
    `promtool tsdb create-blocks-from openmetrics`); default a fresh `<name>-data` under `workdir`.
    """
    binary = require_binary("prometheus", INSTALL_HINT)
    workdir = Path(workdir)
    port = port or free_port()
    storage = Path(storage_path) if storage_path else workdir / f"{name}-data"
    argv = [binary, f"--config.file={config_path}", f"--storage.tsdb.path={storage}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
            "--web.enable-admin-api", "--log.level=warn"] + list(extra_args or [])
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess(name, argv, workdir / f"{name}.log", ready=lambda: http_ok(url + "/-/ready"),
                             lifeline=lifeline)
    process.start(timeout=timeout)
    return PrometheusServer(process, port, Path(config_path))


def start_prometheus_replicas(workdir: Path, config_dir: Path, spec, *, timeout: float = 60.0,
                              extra_args: list[str] | None = None) -> dict[str, PrometheusServer]:
    """Start every replica of `spec.ha.prometheus` (loopback addresses) with its generated configuration
    `<config_dir>/prometheus-<name>.yml`, each with its own TSDB; {replica name: server}."""
    from inferwatch.deploy.prometheus import config_path

    servers: dict[str, PrometheusServer] = {}
    try:
        for r in spec.ha.prometheus_replicas():
            servers[r.name] = start_prometheus(
                workdir, Path(config_path(str(config_dir), r.name)), port=int(r.address.rsplit(":", 1)[1]),
                name=f"prometheus-{r.name}", timeout=timeout,
                extra_args=[f"--web.external-url=http://{r.address}", *(extra_args or [])])
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers
