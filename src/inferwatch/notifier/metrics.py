"""The notifier's own metrics, all series created at zero at start-up.

Names carry the `inferwatch_notifier_` prefix (docs/conventions.md); docs/notifier.md lists them
and rules/notifier.py alerts on them, so a rename must change them too
(tests/test_rules_live_names.py fails on a rule reading a name no source exposes).

Outbox depth and oldest pending age are read from the outbox at scrape time, so they are true even
right after a restart.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from inferwatch.notifier.channels.base import REASONS
from inferwatch.notifier.model import REPAIR_KINDS
from inferwatch.notifier.outbox import WRITE_OPERATIONS
from inferwatch.notifier.routing import UNROUTED_CHANNEL

OUTCOMES = ("delivered", "retried", "dead_lettered", "superseded", "cancelled")
# What POST /alerts answered. Everything but accepted/duplicate is a webhook Alertmanager will not retry
# (4xx) or is retrying (unavailable = 503 while the outbox cannot be written; aborted = the sender closed the
# connection before its body was complete: no answer reached it, so Alertmanager retries).
WEBHOOK_OUTCOMES = ("accepted", "duplicate", "stale", "unauthorized", "too_large", "malformed", "wrong_endpoint",
                    "unavailable", "aborted")
# Why the server closed a client connection itself (inferwatch/connections.py).
CLOSE_REASONS = ("connection_cap", "header_timeout", "idle_timeout")
# Seconds; a healthy provider answers in 0.1-1 s, a hung one hits the channel timeout (default 10 s).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class NotifierMetrics:
    def __init__(self, channels: list[str], outbox=None):
        self.registry = CollectorRegistry(auto_describe=True)
        self.notifications = Counter("inferwatch_notifier_notifications_total",
                                     "Deliveries finished or retried, by channel and outcome.",
                                     ["channel", "outcome"], registry=self.registry)
        self.latency = Histogram("inferwatch_notifier_delivery_duration_seconds",
                                 "Time one send to a provider took (request and answer).",
                                 ["channel"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.dead_letters = Counter("inferwatch_notifier_dead_letters_total",
                                    "Deliveries given up, by channel and reason.",
                                    ["channel", "reason"], registry=self.registry)
        self.send_errors = Counter("inferwatch_notifier_send_errors_total",
                                   "Failed sends (every provider error answer, timeout or connection failure, "
                                   "whether retried or not), by channel and reason.",
                                   ["channel", "reason"], registry=self.registry)
        self.unrouted = Counter("inferwatch_notifier_unrouted_total",
                                "Accepted notifications no route matched (sent to notifier.unrouted_receivers, "
                                "or dead-lettered with reason unrouted when no channel can take them).",
                                registry=self.registry)
        self.webhooks = Counter("inferwatch_notifier_webhooks_total",
                                "Webhooks POSTed to the notifier, by what it answered (accepted, duplicate, stale: "
                                "a late copy of a resolved group, or why it refused: unauthorized, too_large, "
                                "malformed, wrong_endpoint, unavailable; aborted: the body never arrived whole).",
                                ["outcome"], registry=self.registry)
        self.repairs = Counter("inferwatch_notifier_webhook_repairs_total",
                               "Changes intake made to keep an alert it could not keep as sent (value_cut, "
                               "entries_dropped, alerts_dropped, invalid_unicode).", ["kind"], registry=self.registry)
        self.intake_commits = Counter("inferwatch_notifier_intake_commits_total",
                                      "Intake transactions committed, each fsynced and holding every webhook "
                                      "that arrived during the previous one (group commit).", registry=self.registry)
        self.unrecorded = Gauge("inferwatch_notifier_unrecorded_outcomes",
                                "Deliveries whose outcome (sent, failed) is held in memory because the outbox "
                                "could not be written yet; they are not sent again meanwhile.",
                                registry=self.registry)
        self.connections = Gauge("inferwatch_notifier_http_connections", "Open client connections to the intake.",
                                 registry=self.registry)
        self.connections_closed = Counter("inferwatch_notifier_http_connections_closed_total",
                                          "Client connections the notifier closed itself, by reason.",
                                          ["reason"], registry=self.registry)
        for outcome in WEBHOOK_OUTCOMES:
            self.webhooks.labels(outcome)
        for kind in REPAIR_KINDS:
            self.repairs.labels(kind)
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason)
        # An unrouted alert no channel can take is a dead letter of the pseudo-channel "unrouted".
        self.dead_letters.labels(UNROUTED_CHANNEL, "unrouted")
        for ch in channels:
            self.latency.labels(ch)
            for outcome in OUTCOMES:
                self.notifications.labels(ch, outcome)
            for reason in REASONS:
                self.dead_letters.labels(ch, reason)
                if reason != "max_age":  # max_age is the worker giving up, not a send
                    self.send_errors.labels(ch, reason)
        self.outbox_collector = None
        if outbox is not None:
            self.outbox_collector = _OutboxCollector(outbox)
            self.registry.register(self.outbox_collector)


class _OutboxCollector:
    def __init__(self, outbox):
        self.outbox = outbox
        # The OutcomeRecorder (set by the delivery worker): rows sent whose outcome is not on disk yet are not
        # backlog, although the outbox still says pending (a full disk).
        self.recorder = None

    def describe(self):
        # Names only (no outbox read): the registry indexes them, so `/metrics?name[]=...` finds them.
        return [GaugeMetricFamily("inferwatch_notifier_outbox_writable", ""),
                CounterMetricFamily("inferwatch_notifier_outbox_write_errors", "", labels=["operation"]),
                GaugeMetricFamily("inferwatch_notifier_outbox_depth", ""),
                GaugeMetricFamily("inferwatch_notifier_outbox_due", ""),
                GaugeMetricFamily("inferwatch_notifier_oldest_pending_age_seconds", "")]

    def collect(self):
        writable = GaugeMetricFamily("inferwatch_notifier_outbox_writable",
                                     "1 while the outbox can be written, 0 after a write failed (disk full, "
                                     "I/O error) until a write succeeds again.")
        writable.add_metric([], 1 if self.outbox.writable else 0)
        yield writable
        errors = CounterMetricFamily("inferwatch_notifier_outbox_write_errors",
                                     "Failed outbox writes, by operation (intake, record, probe).",
                                     labels=["operation"])
        for op in WRITE_OPERATIONS:
            errors.add_metric([op], self.outbox.write_errors[op])
        yield errors
        depth = GaugeMetricFamily("inferwatch_notifier_outbox_depth", "Deliveries waiting in the outbox.")
        due = GaugeMetricFamily("inferwatch_notifier_outbox_due", "Deliveries waiting in the outbox that are due "
                                "now (escalations waiting for their escalate_after not counted): the backlog.")
        age = GaugeMetricFamily("inferwatch_notifier_oldest_pending_age_seconds",
                                "Age of the oldest due delivery still waiting (0 when none).")
        try:
            now = time.time()
            finished, held = (self.recorder.unrecorded(now) if self.recorder is not None
                              else (frozenset(), frozenset()))
            n, n_due, oldest = self.outbox.backlog(now, finished=finished, held=held)
        except Exception:  # noqa: BLE001 - a locked or broken outbox must not fail the scrape; the intake reports it
            return
        depth.add_metric([], n)
        due.add_metric([], n_due)
        age.add_metric([], oldest)
        yield depth
        yield due
        yield age
