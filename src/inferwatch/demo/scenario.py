"""The demo scenario, shared by `inferwatch demo` and tests/test_demo_scenario.py:

    clean stretch (traffic, no fault: nothing may be sent)
    → GPU overheat, classifier failures, slow first tokens for one tier (a few seconds apart)
    → faults held until each alert reached its channel (or the time left only suffices for the resolution)
    → faults removed → resolution messages
    → (optionally) keep running with clean traffic until Ctrl-C.

`run_scenario` drives it against a started DemoStack and returns a ScenarioResult with every fault's
timings; the reporter shows it as it happens. `Bounds` says how long each step may take given the demo
spec's intervals, windows, `for`s and Alertmanager waits.
"""

from __future__ import annotations

import dataclasses
import time

from inferwatch.demo.faults import Fault
from inferwatch.demo.observe import AlertState, AlertWatch, Delivery, DeliveryLog
from inferwatch.errors import StackError
from inferwatch.notifier.routing import Router
from inferwatch.rules.names import ALERTS
from inferwatch.spec import Spec

FAULT_GAP_S = 8.0          # between two fault injections, so the timeline reads one fault at a time
SETTLE_S = 4.0             # after the last resolution: anything still on its way shows up
POLL_S = 1.0
# Events are printed this long after they happened, in time order: a poll of Prometheus and one of the
# providers can report things out of order (an alert seen firing at this poll, a message accepted before it).
REORDER_S = 2.5
# Margin on top of the pipeline's own delays: Python start-up of a request, a busy 2-core machine.
MARGIN_S = 20.0


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Latest expected times (seconds) from fault to message and from removal to resolution message, per
    layer, from the spec: scrape + evaluation + `for` + rate window + Alertmanager wait + enrichment."""

    fire: dict[str, float]
    resolve: dict[str, float]

    @classmethod
    def from_spec(cls, spec: Spec, ramp_s: float = 6.0) -> "Bounds":
        p = spec.prometheus
        pipeline = p.scrape_interval.seconds * 2 + p.evaluation_interval.seconds * 2
        window = p.rate_window.seconds
        fors = {"L1": spec.layers.L1.for_.seconds, "L2": spec.layers.L2.for_.seconds,
                "L3": spec.layers.L3.for_.seconds}
        enrich = max((r.enrich_timeout.seconds for r in spec.routes if r.enrich), default=0.0)
        fire, resolve = {}, {}
        for layer, for_s in fors.items():
            g = spec.notifier.grouping.get(layer)
            wait = g.group_wait.seconds if g else 30.0
            interval = g.group_interval.seconds if g else 300.0
            lead = ramp_s if layer == "L1" else window  # a gauge crosses after the ramp; a ratio needs the window
            fire[layer] = lead + for_s + pipeline + wait + enrich + MARGIN_S
            resolve[layer] = window + pipeline + interval + MARGIN_S
        return cls(fire, resolve)


@dataclasses.dataclass
class Event:
    at: float
    kind: str   # fault | removed | firing | cleared | delivered | resolved | phase
    text: str
    fault: Fault | None = None
    delivery: Delivery | None = None
    alert: AlertState | None = None
    after_s: float | None = None  # since the fault was injected (firing, delivered) or removed (cleared, resolved)


@dataclasses.dataclass
class FaultOutcome:
    fault: Fault
    expected_channels: list[str]
    injected_at: float | None = None
    removed_at: float | None = None
    fired_at: float | None = None
    delivered: Delivery | None = None   # the first message about the fault's alert
    resolved: Delivery | None = None    # the first resolution of it
    # Per alert group (e.g. one per tenant for an L3 alert): its first message and its resolution.
    groups: dict[str, Delivery] = dataclasses.field(default_factory=dict)
    group_resolutions: dict[str, Delivery] = dataclasses.field(default_factory=dict)
    companions: dict[str, Delivery] = dataclasses.field(default_factory=dict)  # other alerts of the layer
    # Per companion, its first message per severity it was sent with (read from the group in the title, which
    # holds the severity: every route groups by it); "" when the title names none.
    companion_severities: dict[str, dict[str, Delivery]] = dataclasses.field(default_factory=dict)

    def note_companion(self, name: str, d: Delivery) -> None:
        """Records a message about another alert of the fault's layer."""
        self.companions.setdefault(name, d)
        info = ALERTS.get(name)
        severity = next((w for w in d.group.split() if info and w in info.severities), "")
        self.companion_severities.setdefault(name, {}).setdefault(severity, d)

    def after(self, t: float | None, since: float | None) -> float | None:
        return None if t is None or since is None else t - since


@dataclasses.dataclass
class ScenarioResult:
    traffic_started_at: float
    first_fault_at: float | None
    faults_removed_at: float | None
    ended_at: float
    deliveries: list[Delivery]
    outcomes: list[FaultOutcome]
    events: list[Event]
    bounds: Bounds
    attempts_before_faults: int  # provider requests (accepted or not) during the clean stretch

    def clean_deliveries(self) -> list[Delivery]:
        return [d for d in self.deliveries if self.first_fault_at is None or d.at < self.first_fault_at]

    def misrouted(self, router: Router) -> list[tuple[Delivery, list[str]]]:
        """Deliveries on a channel the spec's routes do not send their alerts to (by layer and severity):
        (delivery, expected channels)."""
        wrong = []
        for d in self.deliveries:
            for name in d.alerts or ("?",):
                expected = expected_channels(router, name)
                if d.channel not in expected:
                    wrong.append((d, expected))
        return wrong


def _words(group: str) -> set[str]:
    """The label values in a message's group text; markdown channels quote them (WeCom: `` `toy_llm` ``)."""
    return {w.strip("`") for w in group.split()}


def expected_channels(router: Router, alert: str) -> list[str]:
    """Channels the spec's routes send an alert of this name to, over every severity it can have."""
    info = ALERTS.get(alert)
    out: list[str] = []
    for severity in (info.severities if info else ("",)):
        labels = {"alertname": alert, "layer": info.layer if info else "", "severity": severity}
        out += [c for c in router.receivers(labels) if c not in out]
    return out


class ScenarioRunner:
    """Drives the scenario; `on_event(event)` and `on_status(text)` feed the reporter."""

    def __init__(self, stack, workload, faults: list[Fault], *, on_event=lambda e: None, on_status=lambda s: None):
        self.stack = stack
        self.workload = workload
        self.faults = faults
        self.spec: Spec = stack.config.spec
        self.router = Router(self.spec)
        self.on_event = on_event
        self.on_status = on_status
        channel_of = {c.type: name for name, c in self.spec.channels.items()}
        self.deliveries = DeliveryLog(stack.sims, channel_of)
        self.alerts = AlertWatch(stack.prometheus_url)
        self.events: list[Event] = []
        self.bounds = Bounds.from_spec(self.spec)
        self.outcomes = [FaultOutcome(f, expected_channels(self.router, f.alert)) for f in faults]
        self._pending: list[Event] = []
        self._before_faults: list[dict[str, str]] = []
        self.phase = "starting"
        self.t0 = time.time()

    # ------------------------------------------------------------------------------------------ events
    def _emit(self, event: Event) -> None:
        self._pending.append(event)

    def _flush(self, until: float | None = None) -> None:
        """Hand events that happened before `until` (all when None) to the reporter, in time order."""
        self._pending.sort(key=lambda e: e.at)
        while self._pending and (until is None or self._pending[0].at <= until):
            event = self._pending.pop(0)
            self.events.append(event)
            self.on_event(event)

    def _outcome(self, layer: str) -> FaultOutcome | None:
        return next((o for o in self.outcomes if o.fault.layer == layer), None)

    def _observe(self) -> None:
        started, cleared = self.alerts.poll()
        for a in started:
            if a.first_firing is None:  # poll() returns only alerts seen firing
                continue
            o = self._outcome(a.layer)
            after = o.after(a.first_firing, o.injected_at) if o else None
            if o and o.fault.alert == a.name and o.fired_at is None and o.injected_at is not None:
                o.fired_at = a.first_firing
            self._emit(Event(a.first_firing, "firing", a.name, alert=a, after_s=after))
        for a in cleared:
            if a.cleared is None:  # poll() returns only alerts seen cleared
                continue
            o = self._outcome(a.layer)
            self._emit(Event(a.cleared, "cleared", a.name, alert=a,
                             after_s=o.after(a.cleared, o.removed_at) if o else None))
        for d in self.deliveries.poll():
            for o in self.outcomes:
                if o.fault.layer not in d.layers:
                    continue
                if d.status == "firing" and o.injected_at is not None:
                    if o.fault.alert in d.alerts:
                        o.delivered = o.delivered or d
                        o.groups.setdefault(d.group, d)
                    for name in d.alerts:
                        if name != o.fault.alert:
                            o.note_companion(name, d)
                if d.status == "resolved" and o.removed_at is not None and o.fault.alert in d.alerts:
                    o.resolved = o.resolved or d
                    o.group_resolutions.setdefault(d.group, d)
            o = next((o for o in self.outcomes if o.fault.layer in d.layers), None)
            since = (o.removed_at if d.status == "resolved" else o.injected_at) if o else None
            self._emit(Event(d.at, "resolved" if d.status == "resolved" else "delivered", d.title, delivery=d,
                             after_s=None if since is None else d.at - since))

    def _tick(self) -> None:
        dead = self.stack.dead()
        if dead:
            s = dead[0]
            raise StackError(f"{s.name} exited during the demo; see its log {s.log_path}")
        self._observe()
        self._flush(time.time() - REORDER_S)
        totals = self.workload.totals()
        traffic = " ".join(f"{k} {ok} ok/{failed} failed" for k, (ok, failed) in totals.items())
        per_channel: dict[str, int] = {}
        for d in self.deliveries.deliveries:
            per_channel[d.channel or d.provider] = per_channel.get(d.channel or d.provider, 0) + 1
        sent = ", ".join(f"{k} {v}" for k, v in sorted(per_channel.items())) or "none"
        firing = ", ".join(self.alerts.firing_now()) or "none"
        self.on_status(f"+{time.time() - self.t0:5.0f}s  {self.phase} | traffic: {traffic} | firing: {firing} | "
                       f"messages: {sent}")

    def _wait(self, until: float, done=lambda: False) -> None:
        while time.time() < until and not done():
            self._tick()
            time.sleep(max(0.0, min(POLL_S, until - time.time())))
        self._tick()

    def _phase(self, name: str, text: str) -> None:
        self.phase = name
        self._emit(Event(time.time(), "phase", text))

    # -------------------------------------------------------------------------------------------- run
    def resolve_reserve(self) -> float:
        """Seconds kept after removing the faults for the resolution messages (typical, not worst case)."""
        return max(self.bounds.resolve.values()) - MARGIN_S + SETTLE_S + 6

    def fault_phase(self) -> float:
        """Typical seconds from the first injection until every fault's message arrived."""
        return FAULT_GAP_S * (len(self.faults) - 1) + max(self.bounds.fire.values()) - MARGIN_S + 4

    def clean_stretch(self, deadline: float, longest: float = 60.0, shortest: float = 20.0) -> float:
        """The clean stretch for the time left: what the faults and resolutions need, between the limits."""
        left = deadline - time.time() - self.fault_phase() - self.resolve_reserve()
        return max(shortest, min(longest, left))

    def run(self, deadline: float, clean_s: float, *, until_settled: bool = False) -> ScenarioResult:
        """Run until every resolution arrived or `deadline` (time.time()); the clean stretch lasts `clean_s`.

        The faults are held until only the time the resolutions need is left; with `until_settled`, also no
        longer than until every alert they raised reached its channel (`_all_delivered`), so a run that
        only needs the outcome (tests) does not wait out the hold a viewer gets.
        """
        self.t0 = time.time()
        self.workload.start()
        self._phase("clean", f"clean stretch: {self.workload.describe()}; no fault for {clean_s:.0f} s, "
                             f"so no message may be sent")
        self._wait(self.t0 + clean_s)
        attempts_clean = self.deliveries.attempts()
        first_fault = time.time()
        # Alerts active before any fault (the heartbeat, which no channel receives) are not the faults' doing.
        self._before_faults = [dict(labels) for labels in self.alerts.active]
        self._phase("faults", "injecting faults")
        for i, o in enumerate(self.outcomes):
            if i:
                self._wait(time.time() + FAULT_GAP_S)
            o.fault.inject()
            o.injected_at = time.time()
            self._emit(Event(o.injected_at, "fault", f"{o.fault.title}: {o.fault.detail}", fault=o.fault))
        # Hold the faults until only the time the resolutions need is left: a longer --duration shows them
        # longer; a short one may remove them before a slow alert arrived (the summary then says so).
        self._wait(deadline - self.resolve_reserve(), done=self._all_delivered if until_settled else lambda: False)
        removed = time.time()
        self._phase("resolving", "removing every fault")
        for o in self.outcomes:
            o.fault.remove()
            o.removed_at = time.time()
            self._emit(Event(o.removed_at, "removed", f"{o.fault.title} removed", fault=o.fault))
        self._wait(deadline, done=self._all_resolved)
        self._wait(min(deadline, time.time() + SETTLE_S))
        self._phase("done", "scenario finished")
        self._flush()
        return ScenarioResult(self.t0, first_fault, removed, time.time(), list(self.deliveries.deliveries),
                              self.outcomes, self.events, self.bounds, attempts_clean)

    def _all_delivered(self) -> bool:
        """Every fault's alert delivered, and every alert of the faults' layers that Prometheus has pending or
        firing, and did not before the first fault, delivered to a channel in its own group (each tenant of an
        L3 alert, the warning beside a page): nothing more about the faults is on its way. An alert that stays
        pending holds the faults until the deadline, as without `until_settled`."""
        if not all(o.delivered for o in self.outcomes):
            return False
        layers = {o.fault.layer for o in self.outcomes}
        injected = min(o.injected_at for o in self.outcomes if o.injected_at is not None)
        sent = [d for d in self.deliveries.deliveries if d.status == "firing" and d.at >= injected]
        for labels in self.alerts.active:
            layer = labels.get("layer", "")
            if layer not in layers or labels in self._before_faults:
                continue
            grouping = self.spec.notifier.grouping.get(layer)
            keys = [k for k in (grouping.group_by if grouping else []) if k != "alertname" and labels.get(k)]
            name = labels.get("alertname", "")
            if not any(name in d.alerts and all(labels[k] in _words(d.group) for k in keys) for d in sent):
                return False
        return True

    def _all_resolved(self) -> bool:
        """Every fault's alert resolved, in every group it fired for (each tenant of an L3 alert)."""
        return all(o.resolved and set(o.group_resolutions) >= set(o.groups) for o in self.outcomes)

    def keep_running(self) -> None:
        """Clean traffic and live status until Ctrl-C (KeyboardInterrupt propagates)."""
        self.phase = "running (Ctrl-C to stop)"
        while True:
            self._wait(time.time() + 5)
