"""Real VictoriaMetrics, vmagent and vmalert (Debian package `victoria-metrics`) on loopback, for tests and
benchmarks of the central-store topology (inferwatch.deploy.central).

VictoriaMetrics runs with `-search.latencyOffset` shortened from its 30 s default (samples younger than it are
hidden from queries, for complete last points in production) so that a test sees a sample seconds after it was
written, and with its response cache off (the cache would keep answers from before a sample arrived). The
offset stays longer than vmalert's remote-write flush plus the store's ingestion (a few seconds): vmalert
writes its recordings back through remote write, so a recording chained on another of its group reads it an
evaluation or two late; with a shorter offset it would read it sometimes and sometimes not, and the chained
recording would flicker.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import requests

from inferwatch.deploy.central import edge_command, vmalert_command
from inferwatch.spec import Spec
from inferwatch.testing.process import ManagedProcess, StackError, free_port, http_ok, require_binary

INSTALL_HINT = "apt-get update && apt-get install -y victoria-metrics  (or: make test, which installs it)"


@dataclasses.dataclass
class VictoriaMetricsServer:
    process: ManagedProcess
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query (PromQL/MetricsQL); the `result` vector. Raises StackError on a query error."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        body = requests.get(f"{self.url}/api/v1/query", params=params, timeout=30).json()
        if body.get("status") != "success":
            raise StackError(f"query {expr!r} failed: {body.get('error')}")
        return body["data"]["result"]

    def series(self) -> int:
        """Series in the store (its TSDB status; a count() query would refuse a store this large)."""
        body = requests.get(f"{self.url}/api/v1/status/tsdb", timeout=30).json()
        return int(body["data"]["totalSeries"])

    def stop(self) -> None:
        self.process.stop()


@dataclasses.dataclass
class Managed:
    """vmagent, vmalert or an edge Prometheus: a process with an HTTP port."""

    process: ManagedProcess
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metric(self, name: str) -> float | None:
        """The first sample of `name` on its own /metrics (None when absent)."""
        text = requests.get(f"{self.url}/metrics", timeout=10).text
        m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def stop(self) -> None:
        self.process.stop()


def start_victoria_metrics(workdir: Path, *, port: int | None = None, latency_offset: str = "5s",
                           extra_args: list[str] | None = None, timeout: float = 60.0) -> VictoriaMetricsServer:
    """Single-node VictoriaMetrics on a free loopback port; ready when /health answers 200."""
    binary = require_binary("victoria-metrics", INSTALL_HINT)
    port = port or free_port()
    argv = [binary, f"-storageDataPath={Path(workdir) / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{port}",
            f"-search.latencyOffset={latency_offset}", "-search.disableCache", "-loggerLevel=WARN",
            *(extra_args or [])]
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess("victoria-metrics", argv, Path(workdir) / "victoria-metrics.log",
                             ready=lambda: http_ok(url + "/health"))
    process.start(timeout=timeout)
    return VictoriaMetricsServer(process, port)


def start_edge(workdir: Path, spec: Spec, config_path: Path, *, extra_args: list[str] | None = None,
               timeout: float = 60.0) -> Managed:
    """The cluster's edge as the spec names it (`central_store.edge`), with the generated command line
    (inferwatch.deploy.central.edge_command) on a free loopback port."""
    port = free_port()
    argv = edge_command(spec, str(config_path), str(Path(workdir) / f"{spec.central_store.edge}-data"))
    argv[0] = require_binary(argv[0], INSTALL_HINT if argv[0] == "vmagent" else "apt-get install -y prometheus")
    if spec.central_store.edge == "prometheus-agent":
        argv += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
        ready = f"http://127.0.0.1:{port}/-/ready"
    else:
        argv += [f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN",
                 "-remoteWrite.flushInterval=1s"]
        ready = f"http://127.0.0.1:{port}/health"
    argv += list(extra_args or [])
    process = ManagedProcess(f"edge-{spec.cluster.name}", argv, Path(workdir) / f"edge-{spec.cluster.name}.log",
                             ready=lambda: http_ok(ready))
    process.start(timeout=timeout)
    return Managed(process, port)


def start_vmalert(workdir: Path, spec: Spec, rule_files: str, *, extra_args: list[str] | None = None,
                  timeout: float = 60.0) -> Managed:
    """vmalert with the generated command line (inferwatch.deploy.central.vmalert_command) on a free loopback port;
    recorded series are flushed every second (default 5 s) so a test reads them soon."""
    port = free_port()
    argv = vmalert_command(spec, rule_files)
    argv[0] = require_binary("vmalert", INSTALL_HINT)
    argv += [f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN", "-remoteWrite.flushInterval=1s",
             *(extra_args or [])]
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess("vmalert", argv, Path(workdir) / "vmalert.log", ready=lambda: http_ok(url + "/health"))
    process.start(timeout=timeout)
    return Managed(process, port)
