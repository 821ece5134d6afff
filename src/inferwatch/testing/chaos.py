"""The HA chaos scenario: the whole alerting path replicated on loopback, a storm of about 500 alerts across
the three layers, and at seeded moments during it: one SIGKILL each of an Alertmanager peer, a notifier
replica (its local data folder deleted while it is down) and a Prometheus replica, each restarted after a
seeded downtime; a SIGSTOP of the other notifier replica for longer than Alertmanager's webhook timeout
(STOP_S), then SIGCONT; and one fast restart of the notifiers' shared PostgreSQL outbox.

Stack (examples/ha/inferwatch.ha.yaml, addresses filled in with free ports, every file generated from it):
the real Triton with the gateway and the Triton collector in front, four simulated GPU nodes of
GPUS_PER_NODE GPUs each, two Prometheus replicas evaluating the generated rules, three Alertmanager peers
clustered on loopback with the same generated configuration, two notifier replicas sharing one webhook port
(--shared-port) and one PostgreSQL outbox (Debian's postgresql in a temporary folder,
inferwatch/testing/postgres.py), and the provider simulators recording what each channel received.

Storm: every GPU overheats at its own seeded moment within STORM_SPREAD_S (GpuTemperatureCritical to the
phone, GpuThrottling to Slack: one group each per GPU), the classifier fails 30 % of its requests
(TritonModelErrorRatioHigh to Slack) and six tenants' first tokens slow down (LlmTtftP95High to WeCom).
Then everything cools down and every page must be resolved. Figures: inferwatch/testing/chaos_figures.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import random
import secrets
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import requests
import yaml

from inferwatch.demo.workload import Flow, Workload
from inferwatch.generate import render_all
from inferwatch.spec import Spec, load_spec
from inferwatch.testing.alertmanager import AlertmanagerServer, start_alertmanager_cluster
from inferwatch.testing.channels import ProviderSimulators
from inferwatch.testing.chaos_figures import Figures, figures, fired_from_ranges, received_titles
from inferwatch.testing.postgres import PostgresServer, start_postgres
from inferwatch.testing.process import ManagedProcess, StackError, free_port, http_ok
from inferwatch.testing.prometheus import PrometheusServer, start_prometheus_replicas
from inferwatch.testing.triton import EXAMPLE_MODEL_REPOSITORY, REPO_ROOT, start_triton

HA_SPEC = REPO_ROOT / "examples" / "ha" / "inferwatch.ha.yaml"
HOST = "127.0.0.1"
NODES = 4
GPUS_PER_NODE = 60
STORM_SPREAD_S = 60.0         # the GPUs overheat at seeded moments over this long
KILL_WINDOW_S = (8.0, 60.0)   # each kill at a seeded moment this far into the storm
DOWNTIME_S = (3.0, 10.0)      # ... and a restart after a seeded downtime
STOP_S = (21.0, 28.0)         # a notifier SIGSTOPped this long: past the webhook timeout, within its outbox lease
HOLD_S = 150.0                # the storm lasts at most this long (less once every alert is accounted for)
RESOLVE_S = 120.0             # time for every page to be resolved after the storm
START_TIMEOUT_S = 150.0
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark")  # the HA spec's, all realtime
CHANNEL_OF_PROVIDER = {"pagerduty": "phone", "slack": "oncall-slack", "wecom": "llm-owners-wecom"}
ENV = {"pagerduty_key": "INFERWATCH_DEMO_PAGERDUTY_KEY", "pagerduty_url": "INFERWATCH_DEMO_PAGERDUTY_URL",
       "slack_url": "INFERWATCH_DEMO_SLACK_URL", "wecom_url": "INFERWATCH_DEMO_WECOM_URL",
       "token": "INFERWATCH_DEMO_NOTIFIER_TOKEN", "outbox_password": "INFERWATCH_DEMO_OUTBOX_PASSWORD"}


# ------------------------------------------------------------------------------------------------ the plan
@dataclasses.dataclass(frozen=True)
class Kill:
    kind: str          # alertmanager | notifier | prometheus: SIGKILL; notifier-stop: SIGSTOP; postgres: restart
    at: float          # seconds into the storm
    downtime: float    # seconds before the restart (SIGCONT for a stop; for postgres, its own restart time)
    index: int = -1    # which replica (-1: the Alertmanager peer sending at that moment, position 0)

    @property
    def verb(self) -> str:
        return {"notifier-stop": "SIGSTOP", "postgres": "fast restart of"}.get(self.kind, "SIGKILL")


@dataclasses.dataclass(frozen=True)
class Plan:
    seed: int
    overheat_at: dict[tuple[int, int], float]  # (node, gpu) -> seconds into the storm
    kills: tuple[Kill, ...]

    @classmethod
    def from_seed(cls, seed: int) -> "Plan":
        rng = random.Random(seed)
        overheat = {(n, g): round(rng.uniform(0, STORM_SPREAD_S), 1)
                    for n in range(NODES) for g in range(GPUS_PER_NODE)}
        killed = Kill("notifier", round(rng.uniform(*KILL_WINDOW_S), 1), round(rng.uniform(*DOWNTIME_S), 1),
                      rng.randrange(2))
        # The other replica stops at a moment its peer is up (one replica always answers): not from 2 s
        # before the kill until 5 s after the restart.
        stop_for = round(rng.uniform(*STOP_S), 1)
        busy = (killed.at - stop_for - 2.0, killed.at + killed.downtime + 5.0)
        choices = [t / 10 for t in range(int(KILL_WINDOW_S[0] * 10), int(KILL_WINDOW_S[1] * 10) + 1)
                   if not busy[0] < t / 10 < busy[1]]
        stop_at = rng.choice(choices) if choices else KILL_WINDOW_S[1] + killed.downtime + 5.0
        kills = (Kill("alertmanager", round(rng.uniform(*KILL_WINDOW_S), 1), round(rng.uniform(*DOWNTIME_S), 1)),
                 killed,
                 Kill("notifier-stop", stop_at, stop_for, 1 - killed.index),
                 Kill("postgres", round(rng.uniform(*KILL_WINDOW_S), 1), 0.0),
                 Kill("prometheus", round(rng.uniform(*KILL_WINDOW_S), 1), round(rng.uniform(*DOWNTIME_S), 1),
                      rng.randrange(2)))
        return cls(seed, overheat, kills)

    def describe(self) -> str:
        parts = [f"{k.verb} {k.kind.split('-')[0]}{'' if k.index < 0 else f' #{k.index}'} at +{k.at:.1f}s"
                 + (f" for {k.downtime:.1f}s" if k.kind != "postgres" else "") for k in self.kills]
        return f"seed {self.seed}: " + "; ".join(parts) + " (the killed notifier's data folder deleted while down)"


# --------------------------------------------------------------------------------------------- the config
@dataclasses.dataclass
class ChaosConfig:
    workdir: Path
    spec: Spec
    spec_path: Path
    env: dict[str, str]
    ports: dict[str, int]


def _ports(names: list[str]) -> dict[str, int]:
    chosen: dict[str, int] = {}
    for name in names:
        port = free_port(HOST)
        while port in chosen.values():
            port = free_port(HOST)
        chosen[name] = port
    return chosen


def prepare(workdir: Path, sims: ProviderSimulators, postgres: PostgresServer,
            spec_path: Path = HA_SPEC) -> ChaosConfig:
    """Write `workdir/inferwatch.yaml` (the HA spec with free loopback ports and a fresh database on `postgres`
    as the notifiers' outbox) and every generated file."""
    workdir = Path(workdir)
    names = (["triton_http", "triton_metrics", "gateway", "gateway_metrics", "collector", "notifier_shared",
              "notifier_0", "notifier_1", "prometheus_a", "prometheus_b"]
             + [f"gpu_{n}" for n in range(NODES)] + [f"am_{i}" for i in range(3)]
             + [f"am_cluster_{i}" for i in range(3)])
    p = _ports(names)
    data = yaml.safe_load(Path(spec_path).read_text(encoding="utf-8"))
    t = data["targets"]
    t["prometheus"] = f"http://{HOST}:{p['prometheus_a']}"
    t["alertmanager"] = f"http://{HOST}:{p['am_0']}"
    t["notifier"] = f"http://{HOST}:{p['notifier_shared']}"
    t["notifiers"] = [f"{HOST}:{p['notifier_0']}", f"{HOST}:{p['notifier_1']}"]
    t["triton"][0].update(url=f"http://{HOST}:{p['triton_http']}",
                          metrics_url=f"http://{HOST}:{p['triton_metrics']}/metrics")
    t["gpu_exporters"] = [{"address": f"{HOST}:{p[f'gpu_{n}']}", "node": f"chaos-node-{n}"} for n in range(NODES)]
    t["triton_collectors"] = [f"{HOST}:{p['collector']}"]
    t["gateways"] = [{"address": f"{HOST}:{p['gateway_metrics']}", "node": "chaos-node-0"}]
    ha = data["ha"]
    ha["prometheus"] = [{"name": "a", "address": f"{HOST}:{p['prometheus_a']}"},
                        {"name": "b", "address": f"{HOST}:{p['prometheus_b']}"}]
    ha["alertmanager"] = [{"address": f"{HOST}:{p[f'am_{i}']}", "cluster_address": f"{HOST}:{p[f'am_cluster_{i}']}"}
                          for i in range(3)]
    n = data["notifier"]
    n["token_file"] = str(workdir / "secrets" / "notifier-token")
    n["fallback_routing_key_file"] = str(workdir / "secrets" / "pagerduty-fallback-key")
    n["fallback_pagerduty_url"] = sims.pagerduty_url
    n["outbox"]["url"] = postgres.create_database("chaos")
    path = workdir / "inferwatch.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text("# examples/ha/inferwatch.ha.yaml with this run's ports filled in.\n"
                    + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    token = secrets.token_hex(16)
    env = {ENV["pagerduty_key"]: sims.pagerduty.routing_key, ENV["pagerduty_url"]: sims.pagerduty_url,
           ENV["slack_url"]: sims.slack_url, ENV["wecom_url"]: sims.wecom_url(0), ENV["token"]: token,
           ENV["outbox_password"]: postgres.password}
    os.environ.update(env)  # the spec's ${...} secrets, resolved when it is loaded
    spec = load_spec(path)
    for rel, text in render_all(spec).items():
        out = workdir / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    secret_dir = workdir / "secrets"
    secret_dir.mkdir(exist_ok=True)
    for name, value in (("notifier-token", token), ("pagerduty-fallback-key", sims.pagerduty.routing_key)):
        (secret_dir / name).write_text(value + "\n", encoding="utf-8")
    scenario = {"gpus": GPUS_PER_NODE, "model": "NVIDIA H100 80GB HBM3", "driver_version": "550.54.15",
                "values": {"temperature_c": 44, "power_w": 210, "utilization_gpu_pct": 40, "memory_used_mib": 24576}}
    (workdir / "gpu-scenario.yaml").write_text(yaml.safe_dump(scenario), encoding="utf-8")
    return ChaosConfig(workdir, spec, path, env, p)


# ---------------------------------------------------------------------------------------------- the stack
class ChaosStack:
    """Every process of the scenario. The victims (Alertmanager peers, notifier replicas, Prometheus
    replicas) can be SIGKILLed and started again on the same ports and data; `postgres` (started by the
    caller) restarted."""

    def __init__(self, config: ChaosConfig, postgres: PostgresServer):
        self.c = config
        self.postgres = postgres
        self.processes: list[ManagedProcess] = []
        self.triton = None
        self.alertmanagers: list[AlertmanagerServer] = []
        self.prometheus: dict[str, PrometheusServer] = {}
        self.notifiers: list[ManagedProcess] = []
        self.gpu_urls = [f"http://{HOST}:{config.ports[f'gpu_{n}']}" for n in range(NODES)]

    def _cli(self, name: str, args: list[str], ready_url: str, env: dict | None = None) -> ManagedProcess:
        process = ManagedProcess(name, [sys.executable, "-m", "inferwatch", *args],
                                 self.c.workdir / "logs" / f"{name}.log",
                                 ready=lambda: http_ok(ready_url), env={**os.environ, **(env or {})},
                                 cwd=str(self.c.workdir))
        process.start(timeout=START_TIMEOUT_S)
        self.processes.append(process)
        return process

    def start(self) -> "ChaosStack":
        c, p, spec = self.c, self.c.ports, str(self.c.spec_path)
        interval = str(c.spec.prometheus.scrape_interval)

        def triton():
            self.triton = start_triton(c.workdir / "triton", EXAMPLE_MODEL_REPOSITORY, http_port=p["triton_http"],
                                       metrics_port=p["triton_metrics"], ready_path="/v2/health/ready",
                                       timeout=START_TIMEOUT_S)

        def gateway():
            self._cli("gateway", ["exporter", "gateway", "--upstream", f"http://{HOST}:{p['triton_http']}",
                                  "--host", HOST, "--port", str(p["gateway"]),
                                  "--metrics-port", str(p["gateway_metrics"]), "--spec", spec],
                      f"http://{HOST}:{p['gateway_metrics']}/metrics")

        def collector():
            self._cli("triton-collector", ["exporter", "triton", "--spec", spec, "--host", HOST, "--port",
                                           str(p["collector"]), "--interval", interval],
                      f"http://{HOST}:{p['collector']}/metrics")

        def gpu(n: int):
            return lambda: self._cli(f"gpu-{n}", ["exporter", "gpu", "--host", HOST, "--port", str(p[f"gpu_{n}"]),
                                                  "--nvml", "sim",
                                                  "--sim-scenario", str(c.workdir / "gpu-scenario.yaml"),
                                                  "--interval", interval, "--hostname", f"chaos-node-{n}"],
                                     f"http://{HOST}:{p[f'gpu_{n}']}/metrics")

        def notifier(i: int):
            def start():
                self.notifiers.append(self._cli(
                    f"notifier-{i}", ["notifier", "--spec", spec, "--host", HOST, "--port", str(p[f"notifier_{i}"]),
                                      "--shared-port", str(p["notifier_shared"]),
                                      "--data-dir", str(c.workdir / f"notifier-{i}")],
                    f"http://{HOST}:{p[f'notifier_{i}']}/-/ready", env=c.env))
            return start

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=3, thread_name_prefix="chaos-start")
        futures = [pool.submit(f) for f in [triton, gateway, collector, *[gpu(n) for n in range(NODES)]]]
        try:
            for f in futures:
                f.result()
            for i in range(2):  # in order: notifier-0 is self.notifiers[0]
                notifier(i)()
            self.alertmanagers = start_alertmanager_cluster(
                c.workdir, c.workdir / "deploy/alertmanager/alertmanager.yml", c.spec, timeout=START_TIMEOUT_S)
            self.prometheus = start_prometheus_replicas(c.workdir, c.workdir / "deploy/prometheus", c.spec,
                                                        timeout=START_TIMEOUT_S)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            self.stop()
            raise
        pool.shutdown(wait=True)
        return self

    def victims(self, kind: str) -> list[ManagedProcess]:
        if kind == "alertmanager":
            return [a.process for a in self.alertmanagers]
        if kind in ("notifier", "notifier-stop"):
            return list(self.notifiers)
        if kind == "postgres":
            return [self.postgres.process]
        return [self.prometheus[name].process for name in sorted(self.prometheus)]

    def sending_peer(self) -> int:
        """Index of the Alertmanager peer at cluster position 0 (the one that sends first)."""
        for i, am in enumerate(self.alertmanagers):
            try:
                text = requests.get(f"{am.url}/metrics", timeout=5).text
            except requests.RequestException:
                continue
            for line in text.splitlines():
                if line.startswith("alertmanager_peer_position ") and float(line.split()[1]) == 0:
                    return i
        return 0

    def stop(self) -> None:
        for server in self.prometheus.values():
            server.stop()
        for am in self.alertmanagers:
            am.stop()
        for process in reversed(self.processes):
            process.stop()
        if self.triton is not None:
            self.triton.stop()


# ------------------------------------------------------------------------------------------------ the storm
def _overheat_events(plan: Plan, node: int) -> list[dict]:
    events = []
    for gpu in range(GPUS_PER_NODE):
        at = plan.overheat_at[(node, gpu)]
        events += [{"at": f"{round(at * 1000)}ms", "gpu": gpu, "ramp": {"temperature_c": 92, "power_w": 320},
                    "over": "6s"},
                   {"at": f"{round(at * 1000) + 5000}ms", "gpu": gpu,
                    "set": {"clocks_event_reasons": ["sw_thermal_slowdown"], "sm_clock_mhz": 1410}}]
    return events


COOL = [{"ramp": {"temperature_c": 44, "power_w": 210}, "over": "4s"},
        {"set": {"clocks_event_reasons": [], "sm_clock_mhz": 1755}}]


def _post_events(url: str, events: list[dict]) -> None:
    requests.post(f"{url}/sim/events", json=events, timeout=30).raise_for_status()


@dataclasses.dataclass
class KillRecord:
    kill: Kill
    index: int
    killed_at: float
    restarted_at: float
    detail: str = ""


def _run_kills(stack: ChaosStack, plan: Plan, storm_start: float, records: list[KillRecord],
               errors: list[BaseException]) -> list[threading.Thread]:
    def one(kill: Kill):
        try:
            time.sleep(max(0.0, storm_start + kill.at - time.time()))
            index = stack.sending_peer() if kill.kind == "alertmanager" else max(0, kill.index)
            victim = stack.victims(kill.kind)[index]
            killed = time.time()
            if kill.kind == "postgres":
                stack.postgres.restart_fast(timeout=START_TIMEOUT_S)
            elif kill.kind == "notifier-stop":
                victim.signal(signal.SIGSTOP)
                time.sleep(kill.downtime)
                victim.signal(signal.SIGCONT)
            else:
                victim.kill()
                if kill.kind == "notifier":  # a lost node: its local folder goes with it
                    shutil.rmtree(stack.c.workdir / f"notifier-{index}", ignore_errors=True)
                time.sleep(kill.downtime)
                victim.start(timeout=START_TIMEOUT_S)
            records.append(KillRecord(kill, index, killed, time.time(), f"{kill.verb} {victim.name}"))
        except BaseException as exc:  # noqa: BLE001 - reported by the scenario
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,), name=f"kill-{k.kind}", daemon=True) for k in plan.kills]
    for t in threads:
        t.start()
    return threads


@dataclasses.dataclass
class Outcome:
    plan: Plan
    figures: Figures
    kills: list[KillRecord]
    storm_start: float
    alerts_fired: int
    open_incidents: list[str]
    errors: list[str]
    alertmanager_alerts: int = 0    # alerts the peers held at the end of the storm, all peers together
    replica_labelled: int = 0       # of them, carrying a Prometheus replica label (must be 0)

    def failover_windows(self) -> list[tuple[float, float]]:
        """From a little before each kill to some time after its restart: alerts firing then may wait for
        the failover (a peer's position × peer timeout, Alertmanager's retry, the restart itself)."""
        return [(k.killed_at - 10.0, k.restarted_at + 30.0) for k in self.kills]

    def report(self) -> str:
        f = self.figures
        lines = [self.plan.describe()]
        for k in self.kills:
            lines.append(f"  {k.detail}: killed at +{k.killed_at - self.storm_start:.1f}s, back at "
                         f"+{k.restarted_at - self.storm_start:.1f}s")
        lines.append(f"storm: {self.alerts_fired} alerts fired ({f.not_notified} short-lived or notifier self-alerts "
                     f"not counted); should reach a channel {f.should}, did {f.did}, lost {f.should - f.did}")
        for c in f.channels.values():
            lines.append(f"  {c.channel:<18} should {c.should:>4}  did {c.did:>4}  messages {c.messages:>4}  "
                         f"duplicates {c.duplicates} ({100 * c.duplicate_ratio:.2f} %)  max delay {c.max_delay_s:.1f}s")
        lines.append(f"longest delay firing -> message: {f.max_delay():.1f}s overall, "
                     f"{f.max_delay(self.failover_windows()):.1f}s for alerts firing during a failover")
        lines.append(f"Alertmanager peers held {self.alertmanager_alerts} alerts, {self.replica_labelled} with a "
                     f"replica label")
        lines.append(f"PagerDuty incidents left open after the storm: {len(self.open_incidents)}")
        lines += [f"  open: {o}" for o in self.open_incidents[:10]]
        if f.uncovered:
            lines.append(f"not accounted for: {sorted(set(f.uncovered))[:10]}")
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)


def run(workdir: Path, seed: int, *, say: Callable[[str], None] = print) -> Outcome:
    """Run the whole scenario once; returns its outcome (figures and kills)."""
    plan = Plan.from_seed(seed)
    say(plan.describe())
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    postgres = start_postgres(workdir, timeout=START_TIMEOUT_S, name="chaos-postgres")
    try:
        with ProviderSimulators() as sims:
            config = prepare(workdir, sims, postgres)
            stack = ChaosStack(config, postgres)
            t0 = time.time()
            stack.start()
            say(f"stack up in {time.time() - t0:.0f}s: 2 Prometheus, 3 Alertmanager peers, 2 notifiers on one "
                f"PostgreSQL outbox, {NODES} GPU nodes x {GPUS_PER_NODE} simulated GPUs, Triton")
            flows = tuple(Flow(t, "chat-web", "realtime", 0.4, max_tokens=8) for t in TENANTS)
            workload = Workload(f"http://{HOST}:{config.ports['gateway']}", stack.triton.url, config.spec,
                                flows).start()
            try:
                return _storm(stack, workload, sims, config, plan, say)
            finally:
                workload.stop()
                stack.stop()
    finally:
        postgres.stop()


def _wait_targets_up(stack: ChaosStack, timeout: float) -> None:
    prom = next(iter(stack.prometheus.values()))
    deadline = time.time() + timeout
    while time.time() < deadline:
        down = prom.query("up == 0")
        if not down and prom.query("up"):
            return
        time.sleep(1)
    raise StackError(f"targets still down after {timeout:.0f}s: {[d['metric'] for d in prom.query('up == 0')]}")


def _storm(stack: ChaosStack, workload: Workload, sims, config: ChaosConfig, plan: Plan, say) -> Outcome:
    _wait_targets_up(stack, 90)
    time.sleep(2 * config.spec.prometheus.rate_window.seconds)  # rate windows full of clean traffic
    sims.reset()
    sims.clear()
    storm_start = time.time()
    say("storm: GPUs overheating over the next minute, classifier failing 30 %, realtime first tokens 1.5 s")
    for n, url in enumerate(stack.gpu_urls):
        _post_events(url, _overheat_events(plan, n))
    workload.knobs.set_classifier_fail(0.3)
    workload.knobs.set_first_token_delay("realtime", 1500)
    kills: list[KillRecord] = []
    errors: list[BaseException] = []
    threads = _run_kills(stack, plan, storm_start, kills, errors)
    # Hold the storm until the last GPU has had time to fire and be delivered, the failovers are over, and
    # every alert fired so far is accounted for (or HOLD_S).
    settle = STORM_SPREAD_S + 40.0
    while time.time() < storm_start + HOLD_S:
        time.sleep(5)
        if time.time() < storm_start + settle or any(t.is_alive() for t in threads):
            continue
        if not _figures(stack, sims, config, storm_start).uncovered:
            break
    for t in threads:
        t.join(START_TIMEOUT_S)
    storm_end = time.time()
    fired = _fired(stack, config, storm_start, storm_end)
    label = config.spec.ha.replica_label
    in_alertmanager = [a for am in stack.alertmanagers for a in am.alerts()]
    replica_labelled = sum(label in a["labels"] for a in in_alertmanager)
    result = figures(config.spec, fired, received_titles(sims, CHANNEL_OF_PROVIDER))
    say(f"storm over after {storm_end - storm_start:.0f}s; cooling down")
    for url in stack.gpu_urls:
        _post_events(url, COOL)
    workload.knobs.set_classifier_fail(0.0)
    workload.knobs.set_first_token_delay("realtime", None)
    deadline = time.time() + RESOLVE_S
    while time.time() < deadline and sims.pagerduty.open:
        time.sleep(2)
    return Outcome(plan, result, sorted(kills, key=lambda k: k.killed_at), storm_start, len(fired),
                   _open_incidents(sims, storm_start), [f"{type(e).__name__}: {e}" for e in errors],
                   len(in_alertmanager), replica_labelled)


def _open_incidents(sims, since: float) -> list[str]:
    """Each incident PagerDuty would still show open: its summary and its events (trigger/resolve, when)."""
    with sims.pagerduty.lock:
        open_keys = dict(sims.pagerduty.open)
        received = list(sims.pagerduty.received)
    out = []
    for key, event in open_keys.items():
        events = [f"{r.body.get('event_action')}@+{r.at - since:.1f}s" for r in received
                  if r.body.get("dedup_key") == key]
        out.append(f"{(event.get('payload') or {}).get('summary', key)[:100]} ({', '.join(events)})")
    return out


def _fired(stack: ChaosStack, config: ChaosConfig, start: float, end: float) -> list:
    """Alerts a replica saw starting to fire after `start` (each replica's own ALERTS, not the federated
    copies), united over the replicas. Alerts already firing before the storm are not the storm's."""
    label = config.spec.ha.replica_label
    results = []
    for server in stack.prometheus.values():
        resp = requests.get(f"{server.url}/api/v1/query_range", timeout=60, params={
            "query": f'ALERTS{{alertstate="firing", {label}=""}}', "start": start - 30, "end": end, "step": "1s"})
        resp.raise_for_status()
        results.append(resp.json()["data"]["result"])
    return [f for f in fired_from_ranges(results, label) if f.at >= start]


def _figures(stack: ChaosStack, sims, config: ChaosConfig, start: float) -> Figures:
    return figures(config.spec, _fired(stack, config, start, time.time()), received_titles(sims, CHANNEL_OF_PROVIDER))
