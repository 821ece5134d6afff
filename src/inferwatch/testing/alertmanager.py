"""Real Alertmanager (Debian package `prometheus-alertmanager`) on loopback: one, or a cluster of peers
gossiping on loopback ports (the spec's `ha.alertmanager`, flags from alertmanager_config.peer_flags)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import requests

from inferwatch.testing.process import ManagedProcess, StackError, free_port, http_ok, require_binary

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

    def status(self) -> dict:
        resp = requests.get(f"{self.url}/api/v2/status", timeout=5)
        resp.raise_for_status()
        return resp.json()

    def cluster_members(self) -> int:
        """Peers this one sees in its cluster (itself included); 0 when it cannot be asked."""
        try:
            return len(self.status().get("cluster", {}).get("peers") or [])
        except (requests.RequestException, ValueError):
            return 0


def start_alertmanager(workdir: Path, config_path: Path, *, port: int | None = None,
                       extra_args: list[str] | None = None, timeout: float = 60.0,
                       cluster: list[str] | None = None, name: str = "alertmanager",
                       lifeline: bool = False) -> AlertmanagerServer:
    """Start Alertmanager with `config_path`; ready when /-/ready answers 200. `cluster`: its clustering flags
    (alertmanager_config.peer_flags); default clustering off. `name` names its data folder and log."""
    binary = require_binary("prometheus-alertmanager", INSTALL_HINT)
    workdir = Path(workdir)
    port = port or free_port()
    argv = [binary, f"--config.file={config_path}", f"--storage.path={workdir / f'{name}-data'}",
            f"--web.listen-address=127.0.0.1:{port}", *(cluster or ["--cluster.listen-address="]),
            "--log.level=warn"] + list(extra_args or [])
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess(name, argv, workdir / f"{name}.log", ready=lambda: http_ok(url + "/-/ready"),
                             lifeline=lifeline)
    process.start(timeout=timeout)
    return AlertmanagerServer(process, port, Path(config_path))


def start_alertmanager_cluster(workdir: Path, config_path: Path, spec, *, timeout: float = 60.0
                               ) -> list[AlertmanagerServer]:
    """Start every peer of `spec.ha.alertmanager` (loopback addresses) with the same configuration and wait
    until each sees all of them. Raises StackError (stopping what started) when the cluster does not form."""
    from inferwatch.deploy.alertmanager import peer_flags

    peers = spec.ha.alertmanager_peers()
    servers: list[AlertmanagerServer] = []
    try:
        for i, peer in enumerate(peers):
            port = int(peer.address.rsplit(":", 1)[1])
            servers.append(start_alertmanager(workdir, config_path, port=port, cluster=peer_flags(spec, i),
                                              name=f"alertmanager-{i}", timeout=timeout))
        deadline = time.monotonic() + timeout
        while min(s.cluster_members() for s in servers) < len(peers):
            if time.monotonic() > deadline:
                seen = [s.cluster_members() for s in servers]
                raise StackError(f"the Alertmanager cluster did not form within {timeout:.0f}s: members seen {seen}")
            time.sleep(0.5)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers
