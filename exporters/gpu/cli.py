"""`inferwatch exporter gpu`: serve GPU metrics (dcgm-exporter names) from NVML or the simulator."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

import pynvml
from prometheus_client import CollectorRegistry

from inferwatch.cli import UsageError, add_service_args
from inferwatch.exporters.gpu.collector import DEFAULT_PRESET_XIDS, GpuCollector
from inferwatch.exporters.gpu.nvml import error_name
from inferwatch.exporters.gpu.server import MetricsServer, make_app
from inferwatch.specload import Duration, SpecError

log = logging.getLogger(__name__)
DEFAULT_PORT = 9400


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gpu", help="L1 GPU exporter: NVML readings under dcgm-exporter names (port 9400)",
        description="Serve GPU metrics on /metrics: dcgm-exporter compatible DCGM_FI_DEV_* names and labels, "
                    "plus inferwatch_gpu_up, XID counters by code and clocks-event reasons. Collection runs "
                    "in the background every --interval; scrapes serve the last collection.")
    add_service_args(p, DEFAULT_PORT)
    p.add_argument("--nvml", choices=("auto", "real", "sim"), default="auto",
                   help="auto: the real NVML if present, else keep serving with inferwatch_gpu_devices 0 and "
                        "retry; real: the real NVML, exit 2 if it is missing; sim: the simulator "
                        "(default auto)")
    p.add_argument("--sim-scenario", metavar="FILE", default=None,
                   help="scenario YAML for --nvml sim (values over time, faults); default: one steady "
                        "healthy GPU. Examples in exporters/gpu/scenarios/")
    p.add_argument("--interval", default="5s", metavar="DURATION",
                   help="time between NVML collections, e.g. 5s, 500ms (default 5s)")
    p.add_argument("--hostname", default=None,
                   help="value of the Hostname label (default: $NODE_NAME, else this host's name)")
    p.add_argument("--xid-preset", default=",".join(map(str, DEFAULT_PRESET_XIDS)), metavar="CODES",
                   help="comma-separated XID codes whose counters start at 0 for every GPU, so the first "
                        "event shows as an increase (default: the spec's critical XIDs)")
    p.set_defaults(func=run)


def _parse_xids(text: str) -> tuple[int, ...]:
    try:
        codes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--xid-preset: expected comma-separated XID numbers, got {text!r}") from None
    if any(code <= 0 for code in codes):
        raise UsageError(f"--xid-preset: XID codes are positive, got {text!r}")
    return codes


def build_nvml(mode: str, scenario_path: str | None):
    """The NVML implementation for --nvml. Raises UsageError (real without NVML) or SpecError (scenario)."""
    if scenario_path and mode != "sim":
        raise UsageError("--sim-scenario only applies with --nvml sim")
    if mode == "sim":
        from inferwatch.exporters.gpu.scenario import Scenario, load_scenario
        from inferwatch.exporters.gpu.sim import SimNvml

        return SimNvml(load_scenario(scenario_path) if scenario_path else Scenario())
    from inferwatch.exporters.gpu.nvml_real import RealNvml

    nvml = RealNvml()
    try:
        nvml.init()
        nvml.shutdown()
    except pynvml.NVMLError as exc:
        if mode == "real":
            raise UsageError(f"--nvml real: NVML is not usable on this host ({error_name(exc)}: {exc}); "
                             "install or load the NVIDIA driver, or use --nvml auto or --nvml sim") from None
        log.warning("--nvml auto: no NVML on this host (%s: %s); no GPU visible, exporting "
                    "inferwatch_gpu_devices 0 and retrying in the background", error_name(exc), exc)
    return nvml


def run(args: argparse.Namespace) -> int:
    interval = Duration.parse(args.interval, "--interval")
    if interval.ms <= 0:
        raise SpecError("--interval", f"expected a positive duration, got {args.interval!r}")
    xids = _parse_xids(args.xid_preset)
    host = args.hostname or os.environ.get("NODE_NAME") or socket.gethostname()
    nvml = build_nvml(args.nvml, args.sim_scenario)

    from inferwatch.exporters.gpu.sim import SimNvml
    from inferwatch.exporters.gpu.xid import XidWatcher

    collector = GpuCollector(nvml, host, interval_s=interval.seconds, preset_xids=xids)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        server = MetricsServer(make_app(registry, nvml if isinstance(nvml, SimNvml) else None), args.host, args.port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    collector.start()
    watcher = XidWatcher(nvml, collector)
    watcher.start()
    # SIGTERM (docker stop, the test harness) ends serve_forever like Ctrl-C, so NVML is shut down cleanly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log.info("GPU exporter (nvml=%s, interval %s) on http://%s:%d/metrics", args.nvml, interval,
             server.host, server.port)
    try:
        server.serve_forever()
    finally:
        watcher.stop()
        collector.stop()
    return 0
