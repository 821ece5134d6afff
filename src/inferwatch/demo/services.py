"""Start every part of the demo as a real process on loopback, wait for each to be ready, stop them all.

Triton, Prometheus and Alertmanager come from inferwatch.testing; the gateway, the Triton collector, the GPU
exporter and the notifier are `python -m inferwatch ...` processes started the way a user would start them.
Only the channel providers (PagerDuty, Slack, WeCom) are simulated, in-process (inferwatch/testing/channels.py).
Every process runs on a lifeline (inferwatch.lifetime): a demo killed with SIGKILL leaves none behind.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Callable

from inferwatch.demo.config import HOST, SIM_GPU_NODE, DemoConfig
from inferwatch.testing.alertmanager import start_alertmanager
from inferwatch.testing.process import ManagedProcess, StackError, http_ok
from inferwatch.testing.prometheus import start_prometheus
from inferwatch.testing.triton import EXAMPLE_MODEL_REPOSITORY, start_triton

log = logging.getLogger(__name__)

# The simulated GPUs: two steady, healthy H100s (the GPU exporter's own baseline scenario).
GPU_SIM_SCENARIO = Path(__file__).resolve().parents[1] / "exporters" / "gpu" / "scenarios" / "healthy.yaml"
START_TIMEOUT_S = 120.0
STOP_ORDER = ("prometheus", "alertmanager", "notifier", "gateway", "triton-collector", "gpu-exporter",
              "gpu-exporter-sim", "triton")


def nvml_available() -> tuple[bool, str]:
    """(True, 'N GPU(s): name') when the real NVML answers on this host, else (False, why not)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if count else ""
        finally:
            pynvml.nvmlShutdown()
        if not count:
            return False, "NVML reports no GPU"
        return True, f"{count} GPU(s): {name.decode() if isinstance(name, bytes) else name}"
    except Exception as exc:  # noqa: BLE001 - NVMLError or a missing library: either way no real GPU
        return False, f"{type(exc).__name__}: {exc}".strip()


@dataclasses.dataclass
class Service:
    """A started service as the demo shows it: name, what it is, its URL(s)."""

    name: str
    what: str
    urls: dict[str, str]
    stop: Callable[[], None]
    running: Callable[[], bool]
    log_path: Path | None = None


class DemoStack:
    """All demo processes. `start(progress)` starts them (in parallel where independent) and calls
    `progress(service)` as each becomes ready; `stop()` stops every one it started, in reverse order, and
    is safe to call twice or after a failed start."""

    def __init__(self, config: DemoConfig, sims, real_gpu: bool):
        self.config = config
        self.sims = sims
        self.real_gpu = real_gpu
        self.services: list[Service] = []  # running, in start order
        self.started: list[Service] = []   # every service ever started (stays after stop(), for checks)

    # ---------------------------------------------------------------------------------- URLs
    @property
    def triton_url(self) -> str:
        return f"http://{HOST}:{self.config.ports.triton_http}"

    @property
    def gateway_url(self) -> str:
        return f"http://{HOST}:{self.config.ports.gateway}"

    @property
    def prometheus_url(self) -> str:
        return self.config.spec.targets.prometheus

    @property
    def alertmanager_url(self) -> str:
        return self.config.spec.targets.alertmanager

    @property
    def fault_gpu_url(self) -> str:
        """The GPU exporter whose simulated GPUs take the overheat fault (POST /sim/events)."""
        port = self.config.ports.gpu_sim if self.real_gpu else self.config.ports.gpu
        return f"http://{HOST}:{port}"

    @property
    def fault_gpu_node(self) -> str:
        return SIM_GPU_NODE if self.real_gpu else self.config.spec.targets.exporter_targets("gpu_exporters")[0].node

    # ---------------------------------------------------------------------------------- start
    def _cli(self, name: str, what: str, args: list[str], ready_url: str, urls: dict[str, str],
             env: dict | None = None) -> Service:
        process = ManagedProcess(name, [sys.executable, "-m", "inferwatch", *args],
                                 self.config.workdir / "logs" / f"{name}.log",
                                 ready=lambda: http_ok(ready_url), env={**os.environ, **(env or {})},
                                 cwd=str(self.config.workdir), lifeline=True)
        process.start(timeout=START_TIMEOUT_S)
        return Service(name, what, urls, process.stop, lambda: process.running, process.log_path)

    def _starters(self) -> list[Callable[[], Service]]:
        c, p, spec = self.config, self.config.ports, self.config.spec_path
        interval = str(c.spec.prometheus.scrape_interval)
        w = c.workdir

        def triton() -> Service:
            server = start_triton(w / "triton", EXAMPLE_MODEL_REPOSITORY, http_port=p.triton_http,
                                  metrics_port=p.triton_metrics, ready_path="/v2/health/ready",
                                  metrics_interval_ms=c.spec.targets.triton[0].metrics_interval_ms,
                                  timeout=START_TIMEOUT_S, lifeline=True)
            return Service("triton", "Triton 2.51 (real tritonserver, CPU): classifier, toy_llm",
                           {"HTTP": server.url, "metrics": server.metrics_url}, server.stop,
                           lambda: server.process.running, server.process.log_path)

        def gateway() -> Service:
            return self._cli("gateway", "gateway exporter (L3): streaming proxy in front of Triton",
                             ["exporter", "gateway", "--upstream", self.triton_url, "--host", HOST,
                              "--port", str(p.gateway), "--metrics-port", str(p.gateway_metrics), "--spec", str(spec)],
                             f"http://{HOST}:{p.gateway_metrics}/metrics",
                             {"proxy": self.gateway_url, "metrics": f"http://{HOST}:{p.gateway_metrics}/metrics"})

        def collector() -> Service:
            return self._cli("triton-collector", "Triton collector (L2)",
                             ["exporter", "triton", "--spec", str(spec), "--host", HOST, "--port", str(p.collector),
                              "--interval", interval],
                             f"http://{HOST}:{p.collector}/metrics", {"metrics": f"http://{HOST}:{p.collector}/metrics"})

        def gpu(port: int, nvml: str, hostname: str, what: str) -> Callable[[], Service]:
            args = ["exporter", "gpu", "--host", HOST, "--port", str(port), "--nvml", nvml,
                    "--interval", interval, "--hostname", hostname]
            if nvml == "sim":
                args += ["--sim-scenario", str(GPU_SIM_SCENARIO)]
            name = "gpu-exporter" if port == p.gpu else "gpu-exporter-sim"
            return lambda: self._cli(name, what, args, f"http://{HOST}:{port}/metrics",
                                     {"metrics": f"http://{HOST}:{port}/metrics"})

        def notifier() -> Service:
            env = {**c.env, "INFERWATCH_PROMETHEUS_URL": self.prometheus_url, "INFERWATCH_SPEC": str(spec)}
            what = "notifier: L1 critical -> phone (PagerDuty), L1 warning and L2 -> Slack, L3 -> WeCom"
            return self._cli("notifier", what,
                             ["notifier", "--spec", str(spec), "--host", HOST, "--port", str(p.notifier),
                              "--data-dir", str(w / "notifier")],
                             f"http://{HOST}:{p.notifier}/-/ready", {"webhook": f"{c.spec.targets.notifier}/alerts"},
                             env=env)

        def alertmanager() -> Service:
            server = start_alertmanager(w, c.alertmanager_config, port=p.alertmanager, timeout=START_TIMEOUT_S,
                                        lifeline=True)
            return Service("alertmanager", "Alertmanager (real)", {"UI": server.url}, server.stop,
                           lambda: server.process.running, server.process.log_path)

        def prometheus() -> Service:
            server = start_prometheus(w, c.prometheus_config, port=p.prometheus, timeout=START_TIMEOUT_S,
                                      lifeline=True)
            return Service("prometheus", "Prometheus (real) with the generated rules", {"UI": server.url},
                           server.stop, lambda: server.process.running, server.process.log_path)

        node = c.spec.targets.exporter_targets("gpu_exporters")[0].node
        starters = [triton, gateway, collector]
        if self.real_gpu and p.gpu_sim is not None:  # a real GPU: the simulated exporter runs beside it
            starters.append(gpu(p.gpu, "real", node, "GPU exporter (L1): REAL NVML"))
            starters.append(gpu(p.gpu_sim, "sim", SIM_GPU_NODE,
                                "GPU exporter (L1): SIMULATED GPUs that take the overheat fault"))
        else:
            starters.append(gpu(p.gpu, "sim", node, "GPU exporter (L1): SIMULATED NVML, 2 simulated H100s"))
        return starters + [notifier, alertmanager, prometheus]

    def start(self, progress: Callable[[Service], None] = lambda s: None) -> "DemoStack":
        """Start everything; on any failure (or Ctrl-C) stop what started and raise (StackError with the log
        tail for a service that failed)."""
        # Three at a time: Triton's start-up is long and mostly waiting, the others start beside it; more
        # parallel Python start-ups would only compete for the two cores.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=3, thread_name_prefix="demo-start")
        futures = [pool.submit(s) for s in self._starters()]
        error: BaseException | None = None
        try:
            for future in concurrent.futures.as_completed(futures):
                if future.exception() is not None:
                    error = error or future.exception()
                    continue
                self._add(future.result())
                progress(future.result())
        except BaseException as exc:  # noqa: BLE001 - Ctrl-C while waiting: still collect and stop whatever started
            error = exc
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for future in futures:
                if future.done() and not future.cancelled() and future.exception() is None:
                    self._add(future.result())
        if error is not None:
            self.stop()
            if isinstance(error, (StackError, KeyboardInterrupt)):
                raise error
            raise StackError(f"demo start-up failed: {type(error).__name__}: {error}") from error
        return self

    def _add(self, service: Service) -> None:
        if service not in self.services:
            self.services.append(service)
            self.started.append(service)

    def dead(self) -> list[Service]:
        """Services whose process has exited."""
        return [s for s in self.services if not s.running()]

    def stop(self) -> None:
        # Clients before servers: Triton waits (up to its exit timeout) for open HTTP connections, and the
        # gateway and collector hold keep-alive connections to it.
        self.services.sort(key=lambda s: STOP_ORDER.index(s.name) if s.name in STOP_ORDER else 0)
        while self.services:
            service = self.services.pop(0)
            try:
                service.stop()
            except Exception:  # noqa: BLE001 - one stuck service must not keep the others running
                log.exception("stopping %s failed", service.name)
