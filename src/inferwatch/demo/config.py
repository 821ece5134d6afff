"""The demo's configuration: the committed demo spec with only addresses and secrets filled in at run time,
and every generated file (rules, Prometheus and Alertmanager config) rendered from it into the work folder.

Everything time-related (scrape and evaluation intervals, rate windows, `for`s, burn-rate windows,
Alertmanager group waits) comes from `examples/demo/inferwatch.demo.yaml`; this module never sets one.
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

import yaml

from inferwatch.generate import render_all
from inferwatch.spec import Spec, load_spec
from inferwatch.testing.process import free_port
from inferwatch.testing.triton import REPO_ROOT

DEMO_SPEC = REPO_ROOT / "examples" / "demo" / "inferwatch.demo.yaml"
HOST = "127.0.0.1"
# Environment variables the demo spec's channel secrets reference (see the spec's header).
ENV_PAGERDUTY_KEY = "INFERWATCH_DEMO_PAGERDUTY_KEY"
ENV_PAGERDUTY_URL = "INFERWATCH_DEMO_PAGERDUTY_URL"
ENV_SLACK_URL = "INFERWATCH_DEMO_SLACK_URL"
ENV_WECOM_URL = "INFERWATCH_DEMO_WECOM_URL"
ENV_NOTIFIER_TOKEN = "INFERWATCH_DEMO_NOTIFIER_TOKEN"  # noqa: S105 - the variable's name
# Node label of the simulated GPU that takes the overheat fault when a real GPU serves the L1 layer.
SIM_GPU_NODE = "sim-gpu"


@dataclasses.dataclass
class Ports:
    """Free loopback ports, one per listening service, chosen at start."""

    triton_http: int
    triton_metrics: int
    gateway: int
    gateway_metrics: int
    collector: int
    gpu: int
    gpu_sim: int | None  # the simulated exporter beside a real-NVML one (None: the only exporter is simulated)
    notifier: int
    alertmanager: int
    prometheus: int

    @classmethod
    def pick(cls, real_gpu: bool) -> "Ports":
        chosen: set[int] = set()

        def one() -> int:
            while True:  # free_port may hand out the same port twice before anyone binds it
                port = free_port(HOST)
                if port not in chosen:
                    chosen.add(port)
                    return port

        return cls(one(), one(), one(), one(), one(), one(), one() if real_gpu else None, one(), one(), one())


@dataclasses.dataclass
class DemoConfig:
    """What the running demo needs: the filled-in spec (object and file), generated files, env for services."""

    workdir: Path
    spec: Spec
    spec_path: Path
    ports: Ports
    env: dict[str, str]  # secrets for the notifier's channels and its bearer token

    @property
    def prometheus_config(self) -> Path:
        return self.workdir / "deploy" / "prometheus" / "prometheus.yml"

    @property
    def alertmanager_config(self) -> Path:
        return self.workdir / "deploy" / "alertmanager" / "alertmanager.yml"

    @property
    def node(self) -> str:
        return self.spec.targets.triton[0].node


def fill_in(data: dict, ports: Ports, workdir: Path, fallback_pagerduty_url: str) -> dict:
    """The demo spec `data` with addresses replaced by `ports` and secret files placed in `workdir`.

    Keeps every other value (node names, thresholds, windows) as written. Raises KeyError when the spec has no
    `targets.triton` entry (the demo serves one Triton).
    """
    data = yaml.safe_load(yaml.safe_dump(data))  # deep copy
    t = data.setdefault("targets", {})
    t["prometheus"] = f"http://{HOST}:{ports.prometheus}"
    t["alertmanager"] = f"http://{HOST}:{ports.alertmanager}"
    t["notifier"] = f"http://{HOST}:{ports.notifier}"
    triton = t["triton"][0]
    triton["url"] = f"http://{HOST}:{ports.triton_http}"
    triton["metrics_url"] = f"http://{HOST}:{ports.triton_metrics}/metrics"
    node = triton.get("node") or triton["name"]
    gpu_node = _node_of(t.get("gpu_exporters"), node)
    t["gpu_exporters"] = [{"address": f"{HOST}:{ports.gpu}", "node": gpu_node}]
    if ports.gpu_sim is not None:
        t["gpu_exporters"].append({"address": f"{HOST}:{ports.gpu_sim}", "node": SIM_GPU_NODE})
    t["triton_collectors"] = [f"{HOST}:{ports.collector}"]
    t["gateways"] = [{"address": f"{HOST}:{ports.gateway_metrics}", "node": _node_of(t.get("gateways"), node)}]
    t.pop("notifiers", None)  # default: the notifier URL's host:port
    n = data.setdefault("notifier", {})
    n["token_file"] = str(workdir / "secrets" / "notifier-token")
    n["fallback_routing_key_file"] = str(workdir / "secrets" / "pagerduty-fallback-key")
    n["fallback_pagerduty_url"] = fallback_pagerduty_url
    n["data_dir"] = str(workdir / "notifier")
    return data


def _node_of(entries, default: str) -> str:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("node"):
            return entry["node"]
    return default


def prepare(workdir: Path, sims, *, real_gpu: bool, spec_path: Path = DEMO_SPEC) -> DemoConfig:
    """Write `workdir/inferwatch.yaml` (the demo spec, filled in) and every generated file under `workdir`
    (rules/generated/*.yml, deploy/prometheus/prometheus.yml, deploy/alertmanager/alertmanager.yml, ...).

    `sims` is the running ProviderSimulators the channels point at. Raises SpecError for a bad demo spec.
    """
    workdir = Path(workdir)
    ports = Ports.pick(real_gpu)
    raw = yaml.safe_load(Path(spec_path).read_text(encoding="utf-8")) or {}
    data = fill_in(raw, ports, workdir, sims.pagerduty_url)
    path = workdir / "inferwatch.yaml"
    path.write_text("# The demo spec (examples/demo/inferwatch.demo.yaml) with this run's ports filled in.\n"
                    + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    spec = load_spec(path)
    for rel, text in render_all(spec).items():
        out = workdir / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    token = secrets.token_hex(16)
    secret_dir = workdir / "secrets"
    secret_dir.mkdir(parents=True, exist_ok=True)
    for name, value in (("notifier-token", token), ("pagerduty-fallback-key", sims.pagerduty.routing_key)):
        (secret_dir / name).write_text(value + "\n", encoding="utf-8")
        (secret_dir / name).chmod(0o600)
    env = {ENV_PAGERDUTY_KEY: sims.pagerduty.routing_key, ENV_PAGERDUTY_URL: sims.pagerduty_url,
           ENV_SLACK_URL: sims.slack_url, ENV_WECOM_URL: sims.wecom_url(0), ENV_NOTIFIER_TOKEN: token}
    return DemoConfig(workdir, spec, path, ports, env)
