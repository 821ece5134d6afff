"""Real Alertmanager (Debian package `prometheus-alertmanager`) on loopback."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import requests

from inferwatch.testing.process import ManagedProcess, free_port, http_ok, require_binary

INSTALL_HINT = "apt-get update && apt-get install -y prometheus-alertmanager  (or: make test, which installs it)"


@dataclasses.dataclass
class AlertmanagerServer:
    process: ManagedProcess
    port: int
    config_path: Path
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alerts(self) -> list[dict]:
        resp = requests.get(f"{self.url}/api/v2/alerts", timeout=10)
        resp.raise_for_status()
        return resp.json()

    def post_alerts(self, alerts: list[dict]) -> None:
        """Push alerts directly (as Prometheus would), e.g. to test routing without rules."""
        requests.post(f"{self.url}/api/v2/alerts", json=alerts, timeout=10).raise_for_status()

    def stop(self) -> None:
        self.process.stop()


def start_alertmanager(workdir: Path, config_path: Path, *, port: int | None = None,
                       extra_args: list[str] | None = None, timeout: float = 60.0) -> AlertmanagerServer:
    """Start Alertmanager with `config_path`; clustering off; ready when /-/ready answers 200."""
    binary = require_binary("prometheus-alertmanager", INSTALL_HINT)
    workdir = Path(workdir)
    port = port or free_port()
    argv = [binary, f"--config.file={config_path}", f"--storage.path={workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
            "--log.level=warn"] + list(extra_args or [])
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess("alertmanager", argv, workdir / "alertmanager.log", ready=lambda: http_ok(url + "/-/ready"))
    process.start(timeout=timeout)
    return AlertmanagerServer(process, port, Path(config_path))
