"""The alerting path watching its own replicas (spec `ha`): an Alertmanager cluster with fewer members than
configured, Prometheus replicas that disagree about what fires, a notifier replica whose backlog grows.

- AlertmanagerClusterDegraded: fewer peers answer their scrape than `ha.alertmanager` lists (none at all
  counts as 0), or a peer sees fewer cluster members than that (`alertmanager_cluster_members`, a peer that
  did not join: split brain, which Alertmanager resolves by sending duplicates). A single Alertmanager runs
  without clustering: only its scrape failing fires it (and nobody hears of it but its fallback).
- PrometheusReplicasDisagree: an alert fires on some up replica and not on another, for longer than
  `ha.disagreement_for`. Every replica reads every replica's firing alerts from /federate (job
  inferwatch-prometheus-alerts, labelled `replica`); one alert's copies differ only in `replica`, so
  `count without (replica)` is how many replicas fire it. A replica that fires an alert one evaluation
  later than its peer is not a disagreement: each copy counts while it was seen within TOLERANCE, and
  `for` outlasts a phase difference. A replica that just (re)started has lost its pending alerts: no
  verdict until it had time to fire them again (Prometheus restores `for` state, and fires an alert with
  a `for` over its --rules.alert.for-grace-period, 10m, no sooner than that after a restart).
- NotifierOutboxGrowing: a replica's due, unsent notifications (`inferwatch_notifier_outbox_due`, deferred
  escalations not counted) above `ha.outbox_due_rows` and still growing over the rate window: it receives
  faster than its channels take them. Routed around the notifier like every notifier self-alert.
"""

from __future__ import annotations

from inferwatch.rules import gpu, llm, notifier, triton
from inferwatch.rules.builders import absent_targets, num
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.spec import Duration, Spec

LABELS = {"component": "alerting"}
FOR_GRACE_PERIOD_S = 600.0  # Prometheus --rules.alert.for-grace-period default


def _longest_for(spec: Spec) -> float:
    fors = [r.for_.seconds for module in (gpu, triton, llm, notifier) for g in module.groups(spec) for r in g.rules
            if isinstance(r, Alert)]
    return max(fors, default=0.0)


def restart_settle_s(spec: Spec) -> float:
    """Seconds after a replica starts before its verdicts count: its longest `for` (at most the for grace
    period), plus two evaluations."""
    return min(_longest_for(spec), FOR_GRACE_PERIOD_S) + 2 * spec.prometheus.evaluation_interval.seconds


def tolerance(spec: Spec) -> Duration:
    """How long a replica's copy of an alert still counts after it was last seen: two scrapes and two
    evaluations (replicas evaluate out of phase, and read each other one scrape late)."""
    p = spec.prometheus
    return Duration(int(2 * (p.scrape_interval.ms + p.evaluation_interval.ms)))


def groups(spec: Spec) -> list[Group]:
    h = spec.ha
    peers = h.alertmanager_count
    label = h.replica_label
    disagreement_for = h.disagreement_for or Duration(int(5 * spec.prometheus.evaluation_interval.ms))
    window = str(spec.prometheus.rate_window)
    # Every peer down still has its `up` series (0 answering, per cluster where series carry one); no series
    # at all (targets gone) is absent_targets', so no branch loses the cluster label.
    am, prometheus, federated = (spec.selectors.of(s) for s in ("alertmanager", "prometheus", "prometheus_alerts"))
    notifier_sel = spec.selectors.of("notifier")
    am_up = am("up")
    unscraped = am_up.replace("{{", '{{ "{{" }}')
    alerts: list[Recording | Alert] = [
        Alert("AlertmanagerClusterDegraded",
              f'(count by () ({am_up} == 1) or group by () ({am_up}) * 0) < {peers}\n'
              # A peer down also leaves each survivor seeing one member fewer: that is the same incident, so a
              # peer has not joined only when it sees fewer members than peers answer (at most `peers`).
              f'or\n({am("alertmanager_cluster_members")} < {peers}\n'
              f'and\n{am("alertmanager_cluster_members")} < on () group_left () count by () ({am_up} == 1))\n'
              f"or\n({absent_targets(am, spec.cluster)}) * 0",
              h.members_for, "warning",
              f"{{{{ with $labels.instance }}}}The Alertmanager at {{{{ . }}}} sees {{{{ $value }}}} of the {peers} "
              f"cluster members configured: it has not joined its peers, so both sides send (duplicates)."
              # Only the absent branch carries `job` without `instance`: no target at all is not a degraded
              # cluster but an unwatched one, and says so.
              f"{{{{ else }}}}{{{{ if $labels.job }}}}Alertmanager peers are not scraped: selector {unscraped} "
              f"matches no target, so nothing here watches the Alertmanager cluster (check the scrape "
              f"configuration before the peers).{{{{ else }}}}Only {{{{ $value }}}} of the {peers} Alertmanager "
              f"peers answer: one more failure and notifications wait for the last ones (or stop)."
              f"{{{{ end }}}}{{{{ end }}}}",
              labels=dict(LABELS)),
        Alert("PrometheusReplicasDisagree",
              f"count by (disagreeing_alert) (\n"
              f"  label_replace(\n"
              f"    count without ({label}) "
              f'(max_over_time(ALERTS{{alertstate="firing", {label}=~".+"}}[{tolerance(spec)}]))\n'
              f'    < on () group_left () count by () ({federated("up")} == 1),\n'
              f'    "disagreeing_alert", "$1", "alertname", "(.*)"\n'
              f"  )\n"
              f")\n"
              f'and on () (min by () (time() - {prometheus("process_start_time_seconds")})'
              f" > {num(restart_settle_s(spec))})",
              disagreement_for, "warning",
              f"{{{{ $value }}}} alert(s) named {{{{ $labels.disagreeing_alert }}}} fire on some Prometheus "
              f"replicas and not on the others for over {disagreement_for}: the replicas see different data "
              f"(a target only one of them reaches, different rules or configuration).",
              labels=dict(LABELS)),
        Alert("NotifierOutboxGrowing",
              f"{notifier_sel('inferwatch_notifier_outbox_due')} > {h.outbox_due_rows}\n"
              f"and\nderiv({notifier_sel('inferwatch_notifier_outbox_due')}[{window}]) > 0",
              spec.layers.notifier.for_, "warning",
              f"The notifier at {{{{ $labels.instance }}}} (node {{{{ $labels.node }}}}) has {{{{ $value }}}} "
              f"notifications due and unsent, and the backlog grew over the last {window}: it receives faster "
              f"than its channels take them, and a lost disk would lose them.",
              labels={**notifier.LABELS}),
    ]
    return [Group("inferwatch-ha.alerts", alerts)]
