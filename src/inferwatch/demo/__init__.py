"""`inferwatch demo`: the whole inferwatch chain on this machine, without Docker, in about four minutes.

Starts on free loopback ports: the real Triton (tritonserver 2.51 from nvidia-pytriton) with the example
models, the gateway exporter in front of it, the Triton collector, the GPU exporter (real NVML when a GPU
is present, else the simulated NVML, and it says so), Prometheus with the rules generated from the demo
spec (examples/demo/inferwatch.demo.yaml), Alertmanager with the generated config, and the notifier
delivering to local servers that answer as PagerDuty, Slack and WeCom do.

Then: a clean stretch of traffic from several tenants and tiers (no message may be sent), three faults —
a GPU overheating (L1 → phone), the classifier failing 30 % of its requests (L2 → Slack), slow first
tokens for the realtime tier (L3 → WeCom) — each shown from injection to alert to the message its channel
received (with runbook link and triage finding), then the faults removed and the resolution messages,
and a summary table. Every process the demo started is stopped at the end, on Ctrl-C and on errors.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import threading
import time
from pathlib import Path

from inferwatch.errors import UsageError

log = logging.getLogger(__name__)

DEFAULT_DURATION_S = 240.0
MIN_DURATION_S = 150.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole stack locally, inject three faults, show each alert reach "
                                    "its channel", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, metavar="SECONDS",
                   help=f"length of the whole demo in seconds, start-up included (default {DEFAULT_DURATION_S:.0f}, "
                        f"at least {MIN_DURATION_S:.0f}); a longer one holds the faults longer")
    p.add_argument("--keep-running", action="store_true",
                   help="after the scenario keep every service up with clean traffic until Ctrl-C, to explore "
                        "the Prometheus and Alertmanager UIs")
    p.add_argument("--workdir", default=".demo", metavar="DIR",
                   help="folder for the generated config, logs and data (default .demo; wiped first)")
    p.add_argument("--nvml", choices=("auto", "sim"), default="auto",
                   help="auto: the real NVML when a GPU is present (the overheat fault then goes to an extra "
                        "simulated GPU), else the simulated NVML; sim: always simulated (default auto)")
    p.add_argument("--spec", default=None, metavar="FILE",
                   help="demo spec (default examples/demo/inferwatch.demo.yaml)")
    p.set_defaults(func=run)


class Demo:
    """One demo run. `run()` returns the ScenarioResult; `stack` keeps the services (stopped after run)."""

    def __init__(self, workdir: Path, duration: float = DEFAULT_DURATION_S, *, nvml: str = "auto",
                 reporter=None, spec_path: Path | None = None, until_settled: bool = False):
        from inferwatch.demo.config import DEMO_SPEC
        from inferwatch.demo.report import Reporter

        self.workdir = Path(workdir).resolve()
        self.duration = duration
        self.nvml = nvml
        self.reporter = reporter or Reporter()
        self.spec_path = Path(spec_path) if spec_path else DEMO_SPEC
        # Remove the faults once every alert they raised was delivered (ScenarioRunner.run), not at the hold's end.
        self.until_settled = until_settled
        self.stack = None
        self.config = None
        self.result = None

    def _gpu_mode(self) -> bool:
        from inferwatch.demo.services import nvml_available

        r = self.reporter
        if self.nvml == "sim":
            r.line("GPU layer: SIMULATED (--nvml sim): the GPU exporter runs on the simulated NVML with 2 simulated "
                   "H100s; every L1 figure and the overheat fault are simulated.", "bold yellow")
            return False
        real, why = nvml_available()
        if real:
            r.line(f"GPU layer: REAL NVML ({why}). The overheat fault goes to a second, SIMULATED GPU exporter "
                   f"(node sim-gpu): a real GPU is not overheated on purpose.", "bold yellow")
        else:
            r.line(f"GPU layer: SIMULATED. No usable NVIDIA driver here ({why}), so the GPU exporter runs on the "
                   f"simulated NVML with 2 simulated H100s; every L1 figure and the overheat fault are simulated.",
                   "bold yellow")
        return real

    def run(self, keep_running: bool = False):
        from inferwatch.demo.config import prepare
        from inferwatch.demo.faults import demo_faults
        from inferwatch.demo.scenario import ScenarioRunner
        from inferwatch.demo.services import DemoStack
        from inferwatch.demo.workload import Workload
        from inferwatch.testing.channels import ProviderSimulators

        started = time.time()
        deadline = started + self.duration
        r = self.reporter
        if self.workdir.exists() and {p.name for p in self.workdir.iterdir()} - {"logs", "inferwatch.yaml"} \
                and not (self.workdir / "inferwatch.yaml").exists():
            raise UsageError(f"--workdir {self.workdir} is not empty and not a previous demo's folder; "
                             f"the demo wipes it first, so give it an empty or new folder")
        shutil.rmtree(self.workdir, ignore_errors=True)
        (self.workdir / "logs").mkdir(parents=True)
        r.line(f"inferwatch demo: {self.duration:.0f} s; config, logs and data in {self.workdir}", "bold")
        real_gpu = self._gpu_mode()
        sims = ProviderSimulators().start()
        workload = None
        try:
            r.line(f"channel simulators (PagerDuty, Slack, WeCom; record what they receive): {sims.url}")
            self.config = prepare(self.workdir, sims, real_gpu=real_gpu, spec_path=self.spec_path)
            r.line(f"spec {self.spec_path} → {self.config.spec_path.relative_to(self.workdir)} (ports filled in); "
                   f"rules and configs generated into {self.workdir}")
            r.line("starting services (Triton takes the longest) ...", "bold")
            self.stack = DemoStack(self.config, sims, real_gpu).start(progress=r.service)
            r.line(f"all services up after {time.time() - started:.0f} s", "bold")
            workload = Workload(self.stack.gateway_url, self.stack.triton_url, self.config.spec)
            note = "" if real_gpu else " (simulated GPU)"
            faults = demo_faults(workload.knobs, self.stack.fault_gpu_url, self.stack.fault_gpu_node, note)
            runner = ScenarioRunner(self.stack, workload, faults, on_event=r.event, on_status=r.status)
            clean = runner.clean_stretch(deadline)
            r.begin(time.time())
            self.result = runner.run(deadline, clean, until_settled=self.until_settled)
            r.end()
            r.summary(self.result)
            if keep_running:
                r.line(f"keeping everything up with clean traffic: Prometheus {self.stack.prometheus_url}, "
                       f"Alertmanager {self.stack.alertmanager_url}, gateway {self.stack.gateway_url}, Triton "
                       f"{self.stack.triton_url}. Ctrl-C to stop.", "bold")
                r.begin(time.time())
                runner.keep_running()
            return self.result
        finally:
            r.end()
            if workload is not None:
                workload.stop()
            if self.stack is not None:
                self.stack.stop()
            sims.stop()
            r.line(f"demo stopped after {time.time() - started:.0f} s: every process it started is gone.", "bold")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    if args.duration < MIN_DURATION_S:
        raise UsageError(f"--duration: expected at least {MIN_DURATION_S:.0f} s (start-up, a clean stretch, three "
                         f"alerts and their resolutions), got {args.duration:g}")
    if threading.current_thread() is threading.main_thread():
        # `kill`, `timeout` and CI cancel with SIGTERM: stop every process as Ctrl-C would.
        signal.signal(signal.SIGTERM, _interrupt)
    if not getattr(args, "verbose", False):
        # The demo prints its own progress; per-process start/stop log lines would only interleave with it.
        logging.getLogger("inferwatch.testing").setLevel(logging.WARNING)
    demo = Demo(Path(args.workdir), args.duration, nvml=args.nvml,
                spec_path=Path(args.spec) if args.spec else None)
    result = demo.run(keep_running=args.keep_running)
    delivered = all(o.delivered is not None and o.delivered.channel in o.expected_channels for o in result.outcomes)
    return 0 if delivered else 1
