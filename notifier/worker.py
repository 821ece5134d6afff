"""Delivery worker: one thread per channel sends what is due in the outbox, and alone owns retries.

Per pass for a channel: take due rows; wait for the destination's rate limiter (rows keep piling up
meanwhile); chat channels send one group per message while the backlog is short and everything pending
as one digest when it is long (coalescing, see COALESCE_BACKLOG_S); phone channels send one group at a
time after dropping rows superseded by a newer state of the same group. Outcomes:
ok → delivered; retryable → retried after exponential backoff with jitter (capped, Retry-After honoured)
until `max_delivery_age`, then dead-lettered (reason max_age); permanent → dead-lettered at once with the
channel's reason. A provider "too long" answer gets one immediate resend at half the size budget.
Backoff: "exponential backoff and jitter" (AWS Architecture Blog, 2015), the equal-jitter variant.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import logging
import random
import threading
import time
from typing import Callable

from inferwatch.notifier.channels import DIGEST_KINDS, default_rate
from inferwatch.notifier.channels.base import Channel, DeliveryResult
from inferwatch.notifier.metrics import NotifierMetrics
from inferwatch.notifier.model import Notification
from inferwatch.notifier.outbox import Delivery, Outbox
from inferwatch.notifier.ratelimit import RateLimiter
from inferwatch.spec import Spec

log = logging.getLogger(__name__)

MAX_DIGEST_ROWS = 10_000   # one digest covers at most this many notifications; the rest go in the next
# Chat channels send one message per group while the backlog drains within this many seconds at the
# destination's rate; beyond it, everything pending goes out as one digest so nothing waits longer.
COALESCE_BACKLOG_S = 30.0
IDLE_POLL_S = 1.0          # re-check the outbox at least this often (rows may be added by `outbox retry`)


def backoff_delay(attempts: int, initial_s: float, max_s: float, rng: random.Random) -> float:
    """Delay before attempt `attempts + 1`: min(max, initial·2^attempts), half of it random (equal jitter)."""
    base = min(max_s, initial_s * (2 ** min(attempts, 30)))
    return base / 2 + rng.uniform(0, base / 2)


class DeliveryWorker:
    def __init__(self, spec: Spec, outbox: Outbox, channels: dict[str, Channel], metrics: NotifierMetrics,
                 routes_enrich: dict[int, tuple[str, float]] | None = None, *,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None):
        self.spec = spec
        self.outbox = outbox
        self.channels = channels
        self.metrics = metrics
        self.clock = clock
        self.rng = rng or random.Random()
        self.routes_enrich = routes_enrich or {}
        self.limiters = {}
        for name, ch in channels.items():
            cspec = spec.channels[name]
            limit = cspec.rate_limit or default_rate(ch.kind)
            window = cspec.rate_window.seconds if cspec.rate_limit else 60.0
            self.limiters[name] = RateLimiter(limit, window)
        self._wake = {name: threading.Event() for name in channels}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._enrich_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="enrich")
        self._enrichers: dict[str, Callable] = {}

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for name in self.channels:
            t = threading.Thread(target=self._run, args=(name,), name=f"deliver-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 15.0) -> None:
        self._stop.set()
        for ev in self._wake.values():
            ev.set()
        for t in self._threads:
            t.join(timeout)
        self._enrich_pool.shutdown(wait=False, cancel_futures=True)

    def wake(self, channel: str | None = None) -> None:
        for name, ev in self._wake.items():
            if channel is None or name == channel:
                ev.set()

    # ---------------------------------------------------------------------------------- the loop
    def _run(self, name: str) -> None:
        while not self._stop.is_set():
            try:
                delay = self.step(name)
            except Exception:  # never let one bad pass kill the channel's thread
                log.exception("delivery pass for channel %s failed", name)
                delay = IDLE_POLL_S
            if delay > 0:
                self._wake[name].wait(min(delay, IDLE_POLL_S))
                self._wake[name].clear()
        self.outbox.close()

    def step(self, name: str) -> float:
        """One pass for channel `name`: send at most one message. Returns seconds to wait before the next."""
        now = self.clock()
        rows = self.outbox.due(name, now, MAX_DIGEST_ROWS)
        if not rows:
            nxt = self.outbox.next_due(name)
            return IDLE_POLL_S if nxt is None else max(0.0, nxt - now)
        rows = self._expire(name, rows, now)
        if not rows:
            return 0.0
        wait = self.limiters[name].wait_time(now)
        if wait > 0:
            return wait
        channel = self.channels[name]
        if channel.kind in DIGEST_KINDS:
            backlog_s = len(rows) * self.limiters[name].spacing_s
            batch = rows if backlog_s > COALESCE_BACKLOG_S else rows[:1]
        else:
            batch = [self._supersede(name, rows, now)]
        self._deliver(name, channel, batch)
        return 0.0

    def _expire(self, name: str, rows: list[Delivery], now: float) -> list[Delivery]:
        max_age = self.spec.notifier.max_delivery_age.seconds
        old = [r for r in rows if r.attempts > 0 and now - r.age_origin > max_age]
        if old:
            self._dead(name, old, "max_age", f"still failing after {max_age:.0f}s: {old[0].last_error}", now)
        return [r for r in rows if r not in old]

    def _supersede(self, name: str, rows: list[Delivery], now: float) -> Delivery:
        """The first due row, after rows of the same group and kind that a newer row replaces are dropped."""
        first = rows[0]
        same = [r for r in rows if r.group_key == first.group_key and r.kind == first.kind]
        if len(same) > 1:
            older = same[:-1]
            self.outbox.finish([r.id for r in older], "superseded", now, "superseded", f"by delivery {same[-1].id}")
            self.metrics.notifications.labels(name, "superseded").inc(len(older))
        return same[-1]

    def _deliver(self, name: str, channel: Channel, rows: list[Delivery]) -> None:
        messages = self.outbox.messages(sorted({r.message_id for r in rows}))
        notification = Notification(channel=name, groups=[messages[r.message_id] for r in rows],
                                    ids=[r.id for r in rows], escalated=all(r.kind == "escalation" for r in rows))
        if len(rows) == 1:
            notification.enrichment = self._enrich(rows[0].route, notification)
        limiter = self.limiters[name]
        result = self._send(name, channel, notification)
        if not result.ok and result.reason == "too_long":
            # The provider measured differently from us: one resend at half the budget, right away.
            limiter.wait_time(self.clock())
            notification.budget_factor = 0.5
            result = self._send(name, channel, notification)
        now = self.clock()
        ids = [r.id for r in rows]
        if result.ok:
            self.outbox.finish(ids, "delivered", now)
            self.metrics.notifications.labels(name, "delivered").inc(len(rows))
            log.info("delivered %d notification(s) (%d alerts) to %s", len(rows), notification.alert_count(), name)
        elif result.retryable:
            if result.reason == "rate_limited":
                limiter.block(now, result.retry_after or 60.0)
            s = self.spec.notifier
            schedule = []
            for r in rows:
                delay = backoff_delay(r.attempts, s.retry_initial.seconds, s.retry_max.seconds, self.rng)
                schedule.append((r.id, now + max(delay, result.retry_after or 0.0)))
            self.outbox.reschedule(schedule, result.reason, result.detail)
            self.metrics.notifications.labels(name, "retried").inc(len(rows))
            log.warning("delivery to %s failed (%s: %s); %d notification(s) will be retried",
                        name, result.reason, result.detail, len(rows))
        else:
            self._dead(name, rows, result.reason, result.detail, now)

    def _send(self, name: str, channel: Channel, n: Notification) -> DeliveryResult:
        self.limiters[name].record(self.clock())
        t0 = time.perf_counter()
        try:
            result = channel.send(n)
        except Exception as exc:  # a bug in a channel must not lose the notification: retry it
            log.exception("channel %s raised", name)
            result = DeliveryResult.fail("provider_error", f"channel raised {type(exc).__name__}", retryable=True)
        self.metrics.latency.labels(name).observe(time.perf_counter() - t0)
        if not result.ok:  # the channel logged it; every failed send is counted, resent at once or not
            self.metrics.send_errors.labels(name, result.reason).inc()
        return result

    def _dead(self, name: str, rows: list[Delivery], reason: str, detail: str, now: float) -> None:
        self.outbox.finish([r.id for r in rows], "dead", now, reason, detail)
        self.metrics.notifications.labels(name, "dead_lettered").inc(len(rows))
        self.metrics.dead_letters.labels(name, reason).inc(len(rows))
        log.error("dead-lettered %d notification(s) for %s (%s: %s); replay with `inferwatch notifier outbox "
                  "retry ID`", len(rows), name, reason, detail)

    # --------------------------------------------------------------------------------- enrichment
    def _enrich(self, route: int, n: Notification) -> str:
        """Text from the route's enrich hook (issue 9's top triage finding), or '' after its timeout."""
        hook = self.routes_enrich.get(route)
        if not hook or n.status != "firing":
            return ""
        target, timeout = hook
        try:
            fn = self._enrichers.get(target)
            if fn is None:
                module, func = target.split(":", 1)
                fn = self._enrichers[target] = getattr(importlib.import_module(module), func)
            future = self._enrich_pool.submit(fn, n)
            return str(future.result(timeout=timeout) or "")[:1000]
        except concurrent.futures.TimeoutError:
            log.info("enrichment %s took longer than %.1fs; sent without it", target, timeout)
        except Exception as exc:
            log.warning("enrichment %s failed: %s", target, type(exc).__name__)
        return ""
