"""The one writer of delivery outcomes: the channel threads hand it what became of each send, it writes them
to the outbox in batches (one transaction for everything queued), and until an outcome is on disk its rows
are *held*: the worker leaves them out of its passes. A finished row (delivered, dead, superseded) is held
until written, so it is never sent again; a row to retry is held only until its next attempt is due, so a
retry whose schedule cannot be written still happens (its outcomes queue up and are written in order).

When the outbox cannot be written (disk full, I/O error), the outcomes stay queued and held in memory and the
write is retried with backoff (RETRY_INITIAL_S doubling to RETRY_MAX_S), and at once when another write
(intake, the readiness probe) succeeds; the outbox logs the condition once when it starts and once when it
ends. Memory is bounded by the outbox's pending rows: a held row is never
picked again, so each row has at most one queued outcome.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from inferwatch.notifier.backend import OutboxBackend
from inferwatch.notifier.outbox import OutboxError, Outcome

log = logging.getLogger(__name__)

RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 10.0


class OutcomeRecorder:
    def __init__(self, outbox: OutboxBackend, metrics=None, *, on_written: Callable[[str], None] | None = None):
        self.outbox = outbox
        self.metrics = metrics
        self.on_written = on_written or (lambda channel: None)
        self._queue: list[tuple[str, Outcome]] = []
        # channel -> row id -> [held until (inf: until written), outcomes of the row still queued]
        self._held: dict[str, dict[int, list]] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._nudged = False
        outbox.on_writable(self.nudge)

    # ------------------------------------------------------------------------------- channel threads
    def put(self, channel: str, outcome: Outcome) -> None:
        """Queue `outcome`; its rows are held from now until it is written (a retry: until it is due)."""
        until = dict(outcome.schedule) if outcome.state == "pending" else {}
        with self._cond:
            self._queue.append((channel, outcome))
            held = self._held.setdefault(channel, {})
            for i in outcome.ids:
                entry = held.setdefault(i, [0.0, 0])
                entry[0] = until.get(i, float("inf"))
                entry[1] += 1
            self._cond.notify()
        self._gauge()

    def nudge(self) -> None:
        """The outbox can be written again: retry held writes now instead of after the backoff."""
        with self._cond:
            self._nudged = True
            self._cond.notify()

    def held(self, channel: str, now: float) -> frozenset[int]:
        """Rows of `channel` the worker must leave out at `now`."""
        with self._cond:
            return frozenset(i for i, (until, _) in self._held.get(channel, {}).items() if until > now)

    def unrecorded(self, now: float) -> tuple[frozenset[int], frozenset[int]]:
        """(rows finished whose outcome is not written yet, rows waiting for a retry not written yet and not
        due at `now`), over every channel: what the outbox still shows as pending and due although it is not."""
        with self._cond:
            rows = [(i, until) for held in self._held.values() for i, (until, _) in held.items()]
        return (frozenset(i for i, until in rows if until == float("inf")),
                frozenset(i for i, until in rows if now < until < float("inf")))

    def pending(self) -> int:
        """Deliveries whose outcome is not written yet."""
        with self._cond:
            return sum(len(rows) for rows in self._held.values())

    # ------------------------------------------------------------------------------------- the thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="record-outcomes", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Write what is queued (within `timeout`), then stop."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.pending():
            log.warning("%d delivery outcome(s) could not be written before stopping; those deliveries are sent "
                        "again after the restart", self.pending())

    def _run(self) -> None:
        delay = RETRY_INITIAL_S
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if not self._queue:
                    break
                batch = list(self._queue)
            if self.write(batch):
                delay = RETRY_INITIAL_S
                continue
            if self._stop:
                break
            with self._cond:  # wait before the next try; stop() and nudge() interrupt the wait
                if not self._nudged:
                    self._cond.wait(delay)
                self._nudged = False
            delay = min(RETRY_MAX_S, delay * 2)
        self.outbox.close()

    def write(self, batch: list[tuple[str, Outcome]]) -> bool:
        """Write `batch` (a prefix of the queue) in one transaction; on success release its rows."""
        try:
            self.outbox.record([o for _, o in batch])
        except OutboxError:
            return False  # the outbox logged the condition; keep everything held and queued
        with self._cond:
            del self._queue[:len(batch)]
            for channel, outcome in batch:
                held = self._held[channel]
                for i in outcome.ids:
                    held[i][1] -= 1
                    if not held[i][1]:
                        del held[i]
        self._gauge()
        for channel in {c for c, _ in batch}:
            self.on_written(channel)
        return True

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.unrecorded.set(self.pending())
