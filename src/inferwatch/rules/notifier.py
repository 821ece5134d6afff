"""Notifier self-alerts: layer L1 (they page) and label `component: notifier`, which Alertmanager routes to a
fallback receiver that does not go through the notifier (a broken notifier cannot report itself).

Metrics (notifier/metrics.py): inferwatch_notifier_notifications_total{channel,outcome} with outcome
delivered|retried|dead_lettered|superseded|cancelled, inferwatch_notifier_dead_letters_total{channel,reason},
inferwatch_notifier_oldest_pending_age_seconds, inferwatch_notifier_unrouted_total,
inferwatch_notifier_outbox_writable, inferwatch_notifier_webhooks_total{outcome},
inferwatch_notifier_outbox_damaged_timestamp_seconds (notifier/integrity.py).
"""

from __future__ import annotations

from inferwatch.rules.builders import exporter_down, num
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.spec import Duration, Spec

LABELS = {"component": "notifier"}
# superseded (a newer state of the same alert replaced it) and cancelled (resolved before sending) are neither
# a success nor a failure of the provider.
ATTEMPTS = 'outcome=~"delivered|retried|dead_lettered"'
FAILED = 'outcome=~"retried|dead_lettered"'
# Webhook answers Alertmanager does not retry (4xx): each one is a notification nobody will receive.
REFUSED = 'outcome=~"unauthorized|too_large|malformed|wrong_endpoint"'
# How long NotifierOutboxDamaged fires after a damaged outbox was moved aside: a working day, long enough
# for the owners to read the lost notifications from the moved-aside file.
DAMAGED_FOR_S = 86400


def groups(spec: Spec) -> list[Group]:
    n = spec.layers.notifier
    window = str(spec.prometheus.rate_window)
    notifier = spec.selectors.of("notifier")
    keep = "node, channel"
    sent = f"sum by ({keep}) (rate({notifier('inferwatch_notifier_notifications_total', ATTEMPTS)}[{window}]))"
    alerts: list[Recording | Alert] = [
        Alert("NotifierDeliveryFailing",
              f"sum by ({keep}) (rate({notifier('inferwatch_notifier_notifications_total', FAILED)}[{window}]))\n"
              f"/ on ({keep})\n{sent}\n> {num(n.delivery_failure_ratio)}\n"
              f"and on ({keep})\n{sent} > {num(n.min_attempt_rate)}",
              n.for_, "critical",
              f"The notifier on node {{{{ $labels.node }}}} fails {{{{ $value | humanizePercentage }}}} of its "
              f"delivery attempts to channel {{{{ $labels.channel }}}} over {window}: alerts of that channel's "
              f"routes are late or lost.",
              labels={**LABELS, "signal": "failure_ratio"}),
        Alert("NotifierDeliveryFailing",
              f"{notifier('inferwatch_notifier_oldest_pending_age_seconds')} > {num(n.oldest_pending_seconds)}",
              n.for_, "critical",
              "The notifier on node {{ $labels.node }} has a notification waiting for "
              "{{ $value | humanizeDuration }}: deliveries are stuck.",
              labels={**LABELS, "signal": "stuck"}),
        # A dead letter is a notification nobody received: page on the first one.
        Alert("NotifierDeadLetters",
              f"sum by ({keep}, reason) (increase({notifier('inferwatch_notifier_dead_letters_total')}[{window}])) > 0",
              Duration(0), "critical",
              f"The notifier on node {{{{ $labels.node }}}} gave up on notifications to channel "
              f"{{{{ $labels.channel }}}} ({{{{ $labels.reason }}}}) in the last {window}: nobody received them; "
              f"read them from the outbox's dead letters.",
              labels=dict(LABELS)),
        # An unrouted alert reached a catch-all (or a dead letter), not the people who own it: a routing gap.
        Alert("NotifierUnroutedAlerts",
              f"sum by (node) (increase({notifier('inferwatch_notifier_unrouted_total')}[{window}])) > 0",
              Duration(0), "warning",
              f"The notifier on node {{{{ $labels.node }}}} received {{{{ $value | humanize }}}} notification(s) "
              f"in the last {window} that no route matched: they went to the catch-all "
              f"(notifier.unrouted_receivers) or were kept as dead letters, not to their owners. Add a route.",
              labels=dict(LABELS)),
        # The outbox cannot be written (disk full, I/O errors): intake answers 503 (Alertmanager retries, then
        # gives up) and delivery outcomes are held in memory.
        Alert("NotifierOutboxUnwritable", f"{notifier('inferwatch_notifier_outbox_writable')} == 0", n.down_for,
              "critical",
              "The notifier on node {{ $labels.node }} cannot write its outbox (disk full or failing): it "
              "refuses new alerts with 503 until it can, and /-/ready fails.",
              labels=dict(LABELS)),
        # A damaged or incomplete outbox was moved aside at start (--move-damaged-outbox): acknowledged
        # notifications in it were never delivered. Fires for a day after the move (the timestamp is kept in
        # the new outbox, so restarts do not end it early).
        Alert("NotifierOutboxDamaged",
              f"time() - {notifier('inferwatch_notifier_outbox_damaged_timestamp_seconds')} < {DAMAGED_FOR_S}",
              Duration(0), "critical",
              "The notifier on node {{ $labels.node }} found its outbox damaged or incomplete and moved it aside "
              "{{ $value | humanizeDuration }} ago: notifications it had acknowledged in it were not delivered; "
              "read them from the moved-aside file.",
              labels=dict(LABELS)),
        # Always firing: Alertmanager sends it to the dead man's switch (notifier.heartbeat_url) every
        # heartbeat_interval; the switch pages when it stops arriving. Its own label keeps it off every other
        # route.
        Alert("InferwatchHeartbeat", "vector(1)", Duration(0), "info",
              "Always firing (value {{ $value }}): proves that Prometheus evaluates the rules and Alertmanager "
              "delivers their alerts. It is sent to the dead man's switch only.",
              labels={"component": "heartbeat"}),
        Alert("NotifierWebhooksRefused",
              f"sum by (node, outcome) "
              f"(increase({notifier('inferwatch_notifier_webhooks_total', REFUSED)}[{window}])) > 0",
              Duration(0), "warning",
              f"The notifier on node {{{{ $labels.node }}}} refused {{{{ $value | humanize }}}} webhook(s) "
              f"({{{{ $labels.outcome }}}}) in the last {window}: Alertmanager does not retry a 4xx, so those "
              f"notifications are lost; its log names the reason.",
              labels=dict(LABELS)),
        exporter_down("NotifierDown", notifier, for_=n.down_for, severity="critical", what="the notifier",
                      has_targets=True, labels=LABELS, cluster=spec.cluster),
    ]
    return [Group("inferwatch-notifier.alerts", alerts)]
