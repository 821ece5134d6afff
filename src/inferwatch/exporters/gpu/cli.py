"""`inferwatch exporter gpu`: serve GPU metrics (dcgm-exporter names) from NVML or the simulator."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

import pynvml

from inferwatch.cli import UsageError, add_service_args, add_spec_arg
from inferwatch.exporters.gpu.collector import GpuCollector
from inferwatch.exporters.gpu.kubelet import DEFAULT_SOCKET
from inferwatch.exporters.gpu.nvml import error_name
from inferwatch.exporters.gpu.server import MetricsServer
from inferwatch.httpserver import add_bound_args, bounds_from_args
from inferwatch.specload import Duration, SpecError

log = logging.getLogger(__name__)
DEFAULT_PORT = 9400
SWITCH_INTERVAL_S = 0.0005   # Python's default is 0.005


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gpu", help="L1 GPU exporter: NVML readings under dcgm-exporter names (port 9400)",
        description="Serve GPU metrics on /metrics: dcgm-exporter compatible DCGM_FI_DEV_* names and labels, "
                    "plus inferwatch_gpu_up, XID counters by code and clocks-event reasons. Collection runs "
                    "in the background every --interval; scrapes serve the last collection, rendered once "
                    "per collection (OpenMetrics or text format, gzip when asked). Blank and impossible NVML "
                    "values are dropped and counted in inferwatch_gpu_nvml_errors_total. On Kubernetes, "
                    "series of GPUs a pod holds carry namespace/pod/container from the kubelet's "
                    "pod-resources socket.")
    add_service_args(p, DEFAULT_PORT)
    add_bound_args(p)
    add_spec_arg(p)
    p.add_argument("--nvml", choices=("auto", "real", "sim"), default="auto",
                   help="auto: the real NVML if present, else keep serving with inferwatch_gpu_devices 0 and "
                        "retry; real: the real NVML, exit 2 if it is missing; sim: the simulator "
                        "(default auto)")
    p.add_argument("--sim-scenario", metavar="FILE", default=None,
                   help="scenario YAML for --nvml sim (values over time, faults); default: one steady "
                        "healthy GPU. Examples in src/inferwatch/exporters/gpu/scenarios/")
    p.add_argument("--interval", default="5s", metavar="DURATION",
                   help="time between NVML collections, e.g. 5s, 500ms (default 5s)")
    p.add_argument("--hostname", default=None,
                   help="value of the Hostname label (default: $NODE_NAME, else this host's name)")
    p.add_argument("--xid-preset", default=None, metavar="CODES",
                   help="comma-separated XID codes whose counters start at 0 for every GPU, so the first "
                        "event shows as an increase (default: the spec's layers.L1.critical_xids, from --spec)")
    p.add_argument("--pod-resources-socket", default=DEFAULT_SOCKET, metavar="PATH",
                   help="the kubelet's pod-resources unix socket, asked once per collection which pod holds "
                        f"which GPU (default {DEFAULT_SOCKET}); without it the exporter runs without "
                        "namespace/pod/container labels and says so once")
    p.add_argument("--no-pod-labels", action="store_true",
                   help="do not ask the kubelet; no namespace/pod/container labels")
    p.add_argument("--sim-events-from-any-host", action="store_true",
                   help="with --nvml sim: accept POST /sim/events (test-only fault injection) from any host, "
                        "not only loopback")
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


def preset_xids(args: argparse.Namespace) -> tuple[int, ...]:
    """--xid-preset, else the spec's layers.L1.critical_xids (--spec, ./inferwatch.yaml, or the defaults).
    Raises UsageError or SpecError."""
    if args.xid_preset is not None:
        return _parse_xids(args.xid_preset)
    from inferwatch.spec import load_spec

    return tuple(load_spec(args.spec).layers.L1.critical_xids)


def run(args: argparse.Namespace) -> int:
    interval = Duration.parse(args.interval, "--interval")
    if interval.ms <= 0:
        raise SpecError("--interval", f"expected a positive duration, got {args.interval!r}")
    if args.sim_events_from_any_host and args.nvml != "sim":
        raise UsageError("--sim-events-from-any-host only applies with --nvml sim")
    bounds = bounds_from_args(args)
    xids = preset_xids(args)
    host = args.hostname or os.environ.get("NODE_NAME") or socket.gethostname()
    nvml = build_nvml(args.nvml, args.sim_scenario)

    from inferwatch.exporters.gpu.kubelet import PodAttribution
    from inferwatch.exporters.gpu.sim import SimNvml
    from inferwatch.exporters.gpu.xid import XidWatcher

    pods = None if args.no_pod_labels else PodAttribution(args.pod_resources_socket)
    # The collection thread (NVML reads, rendering the next body) holds the GIL for tens of ms on a big node;
    # a short switch interval hands it to the HTTP thread within 0.5 ms, so a scrape that lands meanwhile
    # is served in about the time a plain server takes (benchmarks/gpu_exporter.py) instead of waiting it out.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    collector = GpuCollector(nvml, host, interval_s=interval.seconds, preset_xids=xids, pods=pods)
    sim = nvml if isinstance(nvml, SimNvml) else None
    server = MetricsServer.for_collector(collector, args.host, args.port, sim, args.sim_events_from_any_host, bounds)
    server.start()  # OSError (port in use, not a local address): one line, exit 2 (inferwatch.cli)
    collector.start()
    watcher = XidWatcher(nvml, collector)
    watcher.start()
    # SIGTERM (docker stop, the test harness) stops like Ctrl-C, so NVML is shut down cleanly.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log.info("GPU exporter (nvml=%s, interval %s, XID counters preset for %s) on http://%s:%d/metrics "
             "(at most %d connections, header timeout %gs, idle timeout %gs)", args.nvml, interval,
             ",".join(map(str, xids)) or "none", server.host, server.port, server.max_connections,
             bounds.header_timeout_s, bounds.idle_timeout_s)
    try:
        stop.wait()
    finally:
        server.stop()
        watcher.stop()
        collector.stop()
    return 0
