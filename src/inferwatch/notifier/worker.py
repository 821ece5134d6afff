"""Delivery worker: one thread per channel picks what is due in the outbox and hands each message to the
channel's senders (at most MAX_IN_FLIGHT at once, never two of one group); it alone owns retries.

Per pass for a channel: take due rows; wait for the destination's rate limiter (rows keep piling up
meanwhile); chat channels send one group per message while the backlog is short and everything pending
as one digest when it is long: longer than COALESCE_BACKLOG_S at the destination's rate, or longer than
COALESCE_SELF_S at the time a send takes now (the notifier itself falling behind, e.g. a storm of hundreds
of webhooks a second: one message per group would make every later one wait). Phone channels send one
group at a time after dropping rows superseded by a newer state of the same group. Outcomes:
ok → delivered; retryable → retried after exponential backoff with jitter (capped, Retry-After honoured)
until `max_delivery_age`, then dead-lettered (reason max_age); permanent → dead-lettered at once with the
channel's reason. A provider "too long" answer gets one immediate resend at half the size budget.
Backoff: "exponential backoff and jitter" (AWS Architecture Blog, 2015), the equal-jitter variant.

Outcomes are not written by the sending thread: it hands them to the OutcomeRecorder, which writes them in
batches, and the rows stay out of every later pass until their outcome is on disk. So a delivery whose
outcome cannot be written (disk full) is never sent again by this process, whatever the disk does; only a
restart before the write succeeds sends it once more (at-least-once).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import importlib
import inspect
import logging
import random
import threading
import time
from typing import Callable

from inferwatch.notifier.backend import OutboxBackend
from inferwatch.notifier.channels import DIGEST_KINDS, default_rate
from inferwatch.notifier.channels.base import Channel, DeliveryResult
from inferwatch.notifier.metrics import NotifierMetrics
from inferwatch.notifier.model import Notification
from inferwatch.notifier.outbox import Delivery, Outcome
from inferwatch.notifier.recorder import OutcomeRecorder
from inferwatch.notifier.senders import make_sender
from inferwatch.ratelog import ConditionLog
from inferwatch.spec import Spec

log = logging.getLogger(__name__)

MAX_DIGEST_ROWS = 10_000   # one digest covers at most this many notifications; the rest go in the next
# Chat channels send one message per group while the backlog drains within this many seconds at the
# destination's rate; beyond it, everything pending goes out as one digest so nothing waits longer.
COALESCE_BACKLOG_S = 30.0
COALESCE_SELF_S = 0.5      # ... or when sending the backlog one group at a time would take longer than this
# Sends in flight per channel: a slow answer (a provider's 200-300 ms, a loaded machine) must not make every
# other group wait. Messages of one group are never in flight together, so they arrive in order. Phone
# channels send one message per group (no digest), so in a storm they need more in flight than chat ones.
MAX_IN_FLIGHT = {"chat": 4, "phone": 16}
SEND_TIME_EWMA = 0.2       # weight of the newest send in the running average of a channel's send time
# A rate-limit answer without Retry-After pauses its channel this long (at most notifier.retry_max).
DEFAULT_RATE_PAUSE_S = 60.0
IDLE_POLL_S = 1.0          # re-check the outbox at least this often (rows may be added by `outbox retry`)
# Enrichment (a route's `enrich` hook): at most this many hooks at once; after one ran out of time, pages go
# without enrichment this long (its source is hung: waiting again per page would delay every page).
ENRICH_WORKERS = 2
ENRICH_PAUSE_S = 30.0
FINISHED_MEMORY = 100_000  # outcomes of the most recent deliveries kept for watch() (a send may beat the watch)


@dataclasses.dataclass
class _Watch:
    left: set[int]
    delivered: int
    future: concurrent.futures.Future


def backoff_delay(attempts: int, initial_s: float, max_s: float, rng: random.Random) -> float:
    """Delay before attempt `attempts + 1`: min(max, initial·2^attempts), half of it random (equal jitter)."""
    base = min(max_s, initial_s * (2 ** min(attempts, 30)))
    return base / 2 + rng.uniform(0, base / 2)


class DeliveryWorker:
    def __init__(self, spec: Spec, outbox: OutboxBackend, channels: dict[str, Channel], metrics: NotifierMetrics,
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
            # Shared by the replicas of a PostgreSQL outbox, this process's own with SQLite.
            self.limiters[name] = outbox.rate_limiter(name, limit, window)
        self._wake = {name: threading.Event() for name in channels}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._enrich_pool = concurrent.futures.ThreadPoolExecutor(max_workers=ENRICH_WORKERS,
                                                                  thread_name_prefix="enrich")
        self._enrich_slots = threading.BoundedSemaphore(ENRICH_WORKERS)
        self._enrich_paused_until = 0.0
        self._enrich_log = ConditionLog(log)
        self._enrichers: dict[str, Callable] = {}
        self.recorder = OutcomeRecorder(outbox, metrics, on_written=self.wake)
        collector = getattr(metrics, "outbox_collector", None)
        if collector is not None:
            collector.recorder = self.recorder  # outbox_due leaves out sent, unrecorded rows
        self._send_s: dict[str, float] = {}  # running average of each channel's send time (seconds)
        self._errors = ConditionLog(log)
        self.sender = make_sender(spec, channels)
        self._room = {name: MAX_IN_FLIGHT["chat" if ch.kind in DIGEST_KINDS else "phone"]
                      for name, ch in channels.items()}
        self._pools = {name: concurrent.futures.ThreadPoolExecutor(self._room[name], thread_name_prefix=f"send-{name}")
                       for name in channels}
        self._lock = threading.Lock()
        self._watches: dict[int, list[_Watch]] = {}  # row id -> webhooks waiting for its first outcome
        self._finished: collections.OrderedDict[int, bool] = collections.OrderedDict()  # row id -> delivered
        self._in_flight: dict[str, dict[int, str]] = {name: {} for name in channels}  # row id -> group key
        self._sends: dict[str, int] = {name: 0 for name in channels}  # sends in flight

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.recorder.start()
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
        for pool in self._pools.values():
            pool.shutdown(wait=True)
        self.sender.close()
        self.recorder.stop(timeout)
        self._enrich_pool.shutdown(wait=False, cancel_futures=True)

    def watch(self, ids: list[int]) -> concurrent.futures.Future:
        """A future resolved with how many of `ids` were delivered, once each has its first outcome (delivered,
        failed and retried later, dead-lettered, superseded). For the intake's answer_wait: the answer then
        says "at the channel" rather than "on disk". Ids must be due now (a deferred escalation never is)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            left = {i for i in ids if i not in self._finished}
            w = _Watch(left, sum(self._finished.get(i, False) for i in ids), future)
            for i in left:
                self._watches.setdefault(i, []).append(w)
        if not left:
            future.set_result(w.delivered)
        return future

    def _outcome(self, name: str, outcome: Outcome) -> None:
        """Hand `outcome` to the recorder and settle the webhooks waiting for its rows."""
        self.recorder.put(name, outcome)
        delivered = outcome.state == "delivered"
        settled = []
        with self._lock:
            for i in outcome.ids:
                if i not in self._finished:
                    self._finished[i] = delivered
                    if len(self._finished) > FINISHED_MEMORY:
                        self._finished.popitem(last=False)
                for w in self._watches.pop(i, ()):
                    w.left.discard(i)
                    w.delivered += delivered
                    if not w.left:
                        settled.append(w)
        for w in settled:
            if not w.future.done():
                w.future.set_result(w.delivered)

    def wake(self, channel: str | None = None) -> None:
        for name, ev in self._wake.items():
            if channel is None or name == channel:
                ev.set()

    # ---------------------------------------------------------------------------------- the loop
    def _run(self, name: str) -> None:
        while not self._stop.is_set():
            try:
                delay = self.step(name)
            except Exception:  # noqa: BLE001 - never let one bad pass kill the channel's thread
                self._errors.log(name, logging.ERROR, "delivery pass for channel %s failed", name, exc_info=True)
                delay = IDLE_POLL_S
            if delay > 0:
                self._wake[name].wait(min(delay, IDLE_POLL_S))
                self._wake[name].clear()
        self.outbox.close()

    def step(self, name: str) -> float:
        """One pass for channel `name`: start what is due, as far as there is room in flight (a chat channel:
        one message, one group or a digest; a phone channel: one message per group). Returns seconds to wait
        before the next pass."""
        now = self.clock()
        with self._lock:
            room = self._room[name] - self._sends[name]
            flying = dict(self._in_flight[name])
        if room <= 0:
            return IDLE_POLL_S  # a finished send wakes this thread
        busy_groups = set(flying.values())
        exclude = self.recorder.held(name, now) | flying.keys()
        channel = self.channels[name]
        rows = [r for r in self.outbox.due(name, now, 2 * self._room[name], exclude=exclude)
                if r.group_key not in busy_groups]
        if not rows:
            nxt = self.outbox.next_due(name)
            # Rows due but held or in flight wait for the recorder or the send, which wake this thread.
            return IDLE_POLL_S if nxt is None or nxt <= now else nxt - now
        if channel.kind not in DIGEST_KINDS:
            batches = [[r] for r in self._supersede(name, rows, now)][:room]
        elif self._backlog_long(name, now, exclude):
            batches = [[r for r in self.outbox.due(name, now, MAX_DIGEST_ROWS, exclude=exclude)
                        if r.group_key not in busy_groups]]
        else:  # one group per message, several groups in flight, never two messages of one group
            firsts: dict[str, Delivery] = {}
            for r in rows:
                firsts.setdefault(r.group_key, r)
            batches = [[r] for r in firsts.values()][:room]
        for batch in batches:
            batch = self._expire(name, batch, now)
            if not batch:
                continue
            wait = self.limiters[name].wait_time(now)
            if wait > 0:
                return wait
            self._start(name, channel, batch, now)
        return 0.0

    def _start(self, name: str, channel: Channel, rows: list[Delivery], now: float) -> None:
        """Hand one message (for `rows`) to the channel's senders."""
        messages = self.outbox.messages(sorted({r.message_id for r in rows}))
        notification = Notification(channel=name, groups=[messages[r.message_id] for r in rows],
                                    ids=[r.id for r in rows], escalated=all(r.kind == "escalation" for r in rows))
        with self._lock:
            self._sends[name] += 1
            self._in_flight[name].update((r.id, r.group_key) for r in rows)
        self.limiters[name].record(now)  # counted when it starts, so the next pass keeps the spacing
        self._pools[name].submit(self._deliver, name, channel, rows, notification)

    def _backlog_long(self, name: str, now: float, held) -> bool:
        """Would sending what is due one group at a time take too long (see COALESCE_BACKLOG_S/_SELF_S)?
        Counts at most as many rows as decide it, so the check stays cheap under any backlog."""
        per_row_s = max(self.limiters[name].spacing_s, 1e-6)
        rows_allowed = COALESCE_BACKLOG_S / per_row_s
        send_s = self._send_s.get(name)
        if send_s:
            rows_allowed = min(rows_allowed, COALESCE_SELF_S / send_s)
        limit = int(rows_allowed) + 1
        return self.outbox.count_due(name, now, limit + len(held)) - len(held) >= limit

    def _expire(self, name: str, rows: list[Delivery], now: float) -> list[Delivery]:
        max_age = self.spec.notifier.max_delivery_age.seconds
        old = [r for r in rows if r.attempts > 0 and now - r.age_origin > max_age]
        if old:
            self._dead(name, old, "max_age", f"still failing after {max_age:.0f}s: {old[0].last_error}", now)
        return [r for r in rows if r not in old]

    def _supersede(self, name: str, rows: list[Delivery], now: float) -> list[Delivery]:
        """Phone channels: of `rows` (oldest first), the newest per group and kind; the older ones, which it
        replaces (PagerDuty keeps one incident per dedup key), are finished as superseded."""
        newest: dict[tuple[str, str], Delivery] = {}
        older: list[Delivery] = []
        for r in rows:
            key = (r.group_key, r.kind)
            if key in newest:
                older.append(newest[key])
            newest[key] = r
        for r in older:
            self._outcome(name, Outcome.finished([r.id], "superseded", now, "superseded",
                                                     f"by delivery {newest[(r.group_key, r.kind)].id}"))
        if older:
            self.metrics.notifications.labels(name, "superseded").inc(len(older))
        return sorted(newest.values(), key=lambda r: r.id)

    def _deliver(self, name: str, channel: Channel, rows: list[Delivery], notification: Notification) -> None:
        """Send `notification` (one of the channel's sends in flight) and hand the outcome to the recorder."""
        try:
            self._send_and_record(name, channel, rows, notification)
        except Exception:  # noqa: BLE001 - never lose the rows: they stay pending and are sent again
            self._errors.log(f"{name}:send", logging.ERROR, "delivery to %s failed unexpectedly", name, exc_info=True)
        finally:
            with self._lock:
                self._sends[name] -= 1
                for r in rows:
                    self._in_flight[name].pop(r.id, None)
            self._wake[name].set()

    def _send_and_record(self, name: str, channel: Channel, rows: list[Delivery], notification: Notification) -> None:
        if len(rows) == 1:
            notification.enrichment = self._enrich(rows[0].route, notification)
        limiter = self.limiters[name]
        result = self._send(name, channel, notification)
        if not result.ok and result.reason == "too_long":
            # The provider measured differently from us: one resend at half the budget, right away.
            limiter.wait_time(self.clock())
            notification.budget_factor = 0.5
            limiter.record(self.clock())
            result = self._send(name, channel, notification)
        now = self.clock()
        ids = [r.id for r in rows]
        if result.ok:
            self._outcome(name, Outcome.finished(ids, "delivered", now))
            self.metrics.notifications.labels(name, "delivered").inc(len(rows))
            # DEBUG: a storm delivers hundreds a second (counted in notifications_total); failures are WARNING.
            log.debug("delivered %d notification(s) (%d alerts) to %s", len(rows), notification.alert_count(), name)
        elif result.retryable:
            s = self.spec.notifier
            asked = self._provider_wait(name, result)
            if result.reason == "rate_limited":
                # The provider throttles the destination, not one message: pause the channel, never longer than
                # retry_max (a Retry-After of years must not stop every later page).
                limiter.block(now, min(DEFAULT_RATE_PAUSE_S, s.retry_max.seconds) if asked is None else asked)
            max_age = s.max_delivery_age.seconds
            schedule = []
            for r in rows:
                delay = max(backoff_delay(r.attempts, s.retry_initial.seconds, s.retry_max.seconds, self.rng),
                            asked or 0.0)
                # Never beyond the row's max_delivery_age: its last try falls on its deadline, then it expires.
                schedule.append((r.id, min(now + delay, max(now, r.age_origin + max_age))))
            self._outcome(name, Outcome.retry(schedule, result.reason, result.detail))
            self.metrics.notifications.labels(name, "retried").inc(len(rows))
            log.warning("delivery to %s failed (%s: %s); %d notification(s) will be retried",
                        name, result.reason, result.detail, len(rows))
        else:
            self._dead(name, rows, result.reason, result.detail, now)

    def _provider_wait(self, name: str, result: DeliveryResult) -> float | None:
        """The wait the provider asked for (Retry-After, a rate errcode), clamped to `notifier.retry_max`
        (logged, once a minute per channel, when it was longer); None when it asked for none."""
        if result.retry_after is None:
            return None
        limit = self.spec.notifier.retry_max.seconds
        if result.retry_after > limit:
            self._errors.log(f"{name}:retry_after", logging.WARNING,
                             "channel %s: the provider asked for a %.0fs wait (Retry-After or its rate "
                             "answer); waiting %.0fs (notifier.retry_max) instead", name, result.retry_after, limit)
            return limit
        return result.retry_after

    def _send(self, name: str, channel: Channel, n: Notification) -> DeliveryResult:
        t0 = time.perf_counter()
        try:
            result = self.sender.send(name, n)
        except Exception as exc:  # a bug in a channel must not lose the notification: retry it
            log.exception("channel %s raised", name)
            result = DeliveryResult.fail("provider_error", f"channel raised {type(exc).__name__}", retryable=True)
        took = time.perf_counter() - t0
        self.metrics.latency.labels(name).observe(took)
        last = self._send_s.get(name)
        self._send_s[name] = took if last is None else last + SEND_TIME_EWMA * (took - last)
        if not result.ok:  # the channel logged it; every failed send is counted, resent at once or not
            self.metrics.send_errors.labels(name, result.reason).inc()
        return result

    def _dead(self, name: str, rows: list[Delivery], reason: str, detail: str, now: float) -> None:
        self._outcome(name, Outcome.finished([r.id for r in rows], "dead", now, reason, detail))
        self.metrics.notifications.labels(name, "dead_lettered").inc(len(rows))
        self.metrics.dead_letters.labels(name, reason).inc(len(rows))
        log.error("dead-lettered %d notification(s) for %s (%s: %s); replay with `inferwatch notifier outbox "
                  "retry ID`", len(rows), name, reason, detail)

    # --------------------------------------------------------------------------------- enrichment
    def _enrich(self, route: int, n: Notification) -> str:
        """Text from the route's enrich hook (the top finding of `inferwatch triage` for the alert), or ''.

        Bounds: one notification waits at most the route's `enrich_timeout` (a hook that takes a `deadline`
        keyword gets it, time.monotonic() seconds, and stops its own work there); at most ENRICH_WORKERS hooks
        run at once and a page never queues behind them (it goes without); after a hook ran out of time, pages
        go without enrichment for ENRICH_PAUSE_S, so a batch of any size waits at most one enrich_timeout per
        send slot, not one per page, while the hook's source is hung."""
        hook = self.routes_enrich.get(route)
        if not hook or n.status != "firing":
            return ""
        target, timeout = hook
        if time.monotonic() < self._enrich_paused_until:
            return ""
        if not self._enrich_slots.acquire(blocking=False):
            self._enrich_log.log(f"{target}:busy", logging.INFO, "enrichment %s: %d hooks still running; pages go "
                                 "without it meanwhile", target, ENRICH_WORKERS)
            return ""
        deadline = time.monotonic() + timeout
        try:
            fn = self._enrichers.get(target)
            if fn is None:
                module, func = target.split(":", 1)
                fn = getattr(importlib.import_module(module), func)
                try:
                    takes_deadline = "deadline" in inspect.signature(fn).parameters
                except (TypeError, ValueError):
                    takes_deadline = False
                fn = self._enrichers[target] = functools.partial(_with_deadline, fn) if takes_deadline else fn
            future = self._enrich_pool.submit(fn, n, deadline) if isinstance(fn, functools.partial) \
                else self._enrich_pool.submit(fn, n)
        except Exception as exc:  # noqa: BLE001 - an unimportable hook: the page goes out without it
            self._enrich_slots.release()
            self._enrich_log.log(f"{target}:import", logging.WARNING, "enrichment %s failed: %s", target,
                                 type(exc).__name__)
            return ""
        future.add_done_callback(lambda _f: self._enrich_slots.release())
        try:
            return str(future.result(timeout=max(deadline - time.monotonic(), 0.0)) or "")[:1000]
        except concurrent.futures.TimeoutError:
            self._enrich_paused_until = time.monotonic() + ENRICH_PAUSE_S
            self._enrich_log.log(f"{target}:timeout", logging.WARNING, "enrichment %s took longer than %.1fs; pages "
                                 "go without it for %.0fs", target, timeout, ENRICH_PAUSE_S)
        except Exception as exc:  # noqa: BLE001 - the user's hook may raise anything; the page goes out without it
            self._enrich_log.log(f"{target}:error", logging.WARNING, "enrichment %s failed: %s", target,
                                 type(exc).__name__)
        return ""


def _with_deadline(fn: Callable, n: Notification, deadline: float):
    return fn(n, deadline=deadline)
