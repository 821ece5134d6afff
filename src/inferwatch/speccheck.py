"""Thresholds of one spec that contradict each other: `inferwatch check` refuses the contradictions and warns,
with the exact figures, where the combination is a choice.

Each check is one kind of contradiction, judged on the values the generated rules and routes really use
(defaults included), never on what the file happens to spell out:

- a tier's TTFT SLO threshold (`ttft_slo_seconds`) below its own P95 target (`ttft_p95_seconds`): a tier
  whose every request meets the P95 target can have every request over the SLO threshold, so the budget burns
  at 1 / (1 − ttft_objective) (100x at 99 %) and every burn-rate window, the critical ones included, fires
  while `LlmTtftP95High` is silent. Refused. Equal thresholds are a choice: the 5 % of requests the P95 target
  allows above it burn the budget at 0.05 / (1 − objective); a warning names the windows that would fire;
- a burn-rate window whose `for` is longer than its short window: the short window exists so the alert
  resolves soon after the burn stops (Google SRE Workbook ch. 5, "multiwindow, multi-burn-rate alerts"); an
  alert that must stay true longer than that window has stopped measuring what its window says. Refused;
- an alert `for` above zero but shorter than two evaluation intervals: Prometheus fires after the first
  evaluation that finds the condition pending again, so such a `for` waits one evaluation, whatever it says
  (one noisy sample pages). Refused; `for: 0s` (fire on the first evaluation) is a choice and not checked;
- an alert and severity that reaches no channel at all (no route and no catch-all) in a spec that declares
  channels: the alert would end as an `unrouted` dead letter. Refused;
- a critical alert that reaches no channel that pages (PagerDuty, voice), neither at once nor by escalation,
  while the spec declares one: `critical` means pages (docs/conventions.md, "The alert contract"). Warned,
  naming the alert and where it goes instead;
- several notifier replicas (`ha.notifier_replicas`) without a shared outbox (`notifier.outbox.url`): each
  replica then keeps its own SQLite outbox, so a copy of a webhook that Alertmanager sends to another
  replica (a retry, a peer taking over) is delivered again, and a lost node loses its backlog. Replicas
  coordinate only through one PostgreSQL outbox (docs/ha.md). Warned (`check`, `generate`, the notifier's
  start).
"""

from __future__ import annotations

import dataclasses

from inferwatch.spec import Duration, Spec

PAGING_KINDS = ("pagerduty", "voice")
# The share of requests a P95 target lets through above it.
P95_ALLOWED_ABOVE = 0.05


@dataclasses.dataclass(frozen=True)
class Finding:
    """One contradiction: `path` is the spec field to change, `message` says what contradicts what, with the
    figures. `refuse` is true for a contradiction, false for a combination that is a choice (a warning)."""

    path: str
    message: str
    refuse: bool

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _s(seconds: float) -> str:
    return f"{seconds:g} s"


def _pct(ratio: float) -> str:
    return f"{ratio * 100:g} %"


def tier_findings(spec: Spec) -> list[Finding]:
    """Every tier whose TTFT SLO threshold is tighter than (refused) or equal to (warned) its P95 target."""
    from inferwatch.rules.validate import ttft_bucket_edges

    out = []
    windows = spec.layers.L3.burn_rate_windows
    for name, tier in spec.tiers.items():
        slo, p95, objective = tier.ttft_slo_seconds, tier.ttft_p95_seconds, tier.ttft_objective
        if slo > p95:
            continue
        budget = 1.0 - objective
        if slo < p95:
            burn = 1.0 / budget
            firing = [w for w in windows if w.factor <= burn]
            edge = min((e for e in ttft_bucket_edges() if e >= p95 * 2), default=p95)
            out.append(Finding(
                f"tiers.{name}.ttft_slo_seconds",
                f"{_s(slo)} ({_pct(objective)} of first tokens within it) is tighter than the tier's own P95 "
                f"target ttft_p95_seconds {_s(p95)}: with every request at the P95 target (say "
                f"{_s((slo + p95) / 2)}) LlmTtftP95High is silent while the TTFT budget of {_pct(budget)} burns "
                f"at {burn:g}x, firing {_windows(firing)}; set ttft_slo_seconds to at least {_s(p95)} (a TTFT "
                f"bucket edge, e.g. {edge:g})", refuse=True))
            continue
        burn = P95_ALLOWED_ABOVE / budget
        firing = [w for w in windows if w.factor <= burn]
        if firing:
            out.append(Finding(
                f"tiers.{name}.ttft_slo_seconds",
                f"equals the P95 target ({_s(p95)}): the {_pct(P95_ALLOWED_ABOVE)} of first tokens the P95 "
                f"target allows above it burn the {_pct(budget)} budget of ttft_objective {objective:g} at "
                f"{burn:g}x, firing {_windows(firing)} on a tier that meets its target", refuse=False))
    return out


def _windows(windows) -> str:
    if not windows:
        return "no burn-rate window"
    return ", ".join(f"{w.name} ({w.severity}, {w.factor:g}x)" for w in windows)


def window_findings(spec: Spec) -> list[Finding]:
    """Every burn-rate window whose `for` is longer than its short window."""
    out = []
    for i, w in enumerate(spec.layers.L3.burn_rate_windows):
        if w.for_.ms > w.short.ms:
            out.append(Finding(
                f"layers.L3.burn_rate_windows[{i}].for",
                f"{w.for_} is longer than the window's short window ({w.short}) of {w.name}: the alert would "
                f"stay pending after the short window has stopped seeing the burn; expected at most {w.short}",
                refuse=True))
    return out


def for_findings(spec: Spec) -> list[Finding]:
    """Every generated alert whose `for` is above zero and below two evaluation intervals of its group."""
    from inferwatch.rules.generate import rule_groups
    from inferwatch.rules.model import Alert

    out: dict[tuple[str, int], Finding] = {}
    for groups in rule_groups(spec).values():
        for group in groups:
            interval = group.interval or spec.prometheus.evaluation_interval
            for rule in group.rules:
                if not isinstance(rule, Alert) or not 0 < rule.for_.ms < 2 * interval.ms:
                    continue
                out.setdefault((rule.alert, rule.for_.ms), Finding(
                    f"alert {rule.alert}",
                    f"for {rule.for_} is shorter than two evaluation intervals (2 x {interval} = "
                    f"{Duration(2 * interval.ms)}): it waits one evaluation whatever it says, so one sample pages; "
                    f"raise the `for` that sets it or lower prometheus.evaluation_interval", refuse=True))
    return list(out.values())


def route_findings(spec: Spec) -> list[Finding]:
    """Every alert × severity that reaches no channel (refused) and every critical one that reaches no paging
    channel while the spec declares one (warned)."""
    from inferwatch.deploy.routetable import effective_table

    if not spec.channels:
        return []  # a spec that declares no channel (rules and dashboards only) routes nothing on purpose
    pagers = {n for n, c in spec.channels.items() if c.type in PAGING_KINDS}
    out = []
    seen: set[tuple[str, str, str]] = set()
    for row in effective_table(spec):
        key = (row.alert, row.severity, row.window)
        if key in seen:
            continue
        seen.add(key)
        what = f"{row.alert} {row.severity}" + (f" (window {row.window})" if row.window else "")
        if not row.channels:
            out.append(Finding("routes", f"{what} reaches no channel: no route matches it and "
                                         "notifier.unrouted_receivers is empty, so it would be kept as an "
                                         "`unrouted` dead letter", refuse=True))
        elif row.severity == "critical" and pagers and not row.external and \
                not set(row.channels + row.escalate_to) & pagers:
            out.append(Finding("routes", f"{what} pages nobody: it goes to {', '.join(row.channels)} only, never "
                                         f"to a paging channel ({', '.join(sorted(pagers))}), neither at once "
                                         f"nor by escalation", refuse=False))
    return out


def replica_findings(spec: Spec) -> list[Finding]:
    """A warning when `ha.notifier_replicas` is above 1 and the outbox is SQLite (no notifier.outbox.url)."""
    n = spec.ha.notifier_replicas
    if n < 2 or spec.notifier.outbox.url:
        return []
    return [Finding("notifier.outbox.url", f"ha.notifier_replicas is {n} but each replica would keep its own SQLite "
                                           f"outbox: a webhook copy reaching another replica is delivered twice and "
                                           f"a lost node loses its backlog; replicas need one shared outbox, "
                                           f"notifier.outbox.url: postgresql://user@host:port/database "
                                           f"(docs/ha.md)", refuse=False)]


def findings(spec: Spec) -> list[Finding]:
    """Every contradiction and warning of `spec`, in the order of the module docstring. Raises SpecError only
    where the rules themselves cannot be generated (as `inferwatch generate` would)."""
    return (tier_findings(spec) + window_findings(spec) + for_findings(spec) + route_findings(spec)
            + replica_findings(spec))
