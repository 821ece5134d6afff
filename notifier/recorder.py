"""The one writer of delivery outcomes: the channel threads hand it what became of each send, it writes them
to the outbox in batches (one transaction for everything queued), and until an outcome is on disk its rows
are *held*: the worker leaves them out of every pass, so they are not sent again.

When the outbox cannot be written (disk full, I/O error), the outcomes stay queued and held in memory and the
write is retried with backoff (RETRY_INITIAL_S doubling to RETRY_MAX_S); the outbox logs the condition once
when it starts and once when it ends. Memory is bounded by the outbox's pending rows: a held row is never
picked again, so each row has at most one queued outcome.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from inferwatch.notifier.outbox import Outbox, OutboxError, Outcome

log = logging.getLogger(__name__)

RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 30.0


class OutcomeRecorder:
    def __init__(self, outbox: Outbox, metrics=None, *, on_written: Callable[[str], None] | None = None):
        self.outbox = outbox
        self.metrics = metrics
        self.on_written = on_written or (lambda channel: None)
        self._queue: list[tuple[str, Outcome]] = []
        self._held: dict[str, set[int]] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------- channel threads
    def put(self, channel: str, outcome: Outcome) -> None:
        """Queue `outcome`; its rows are held from now until it is written."""
        with self._cond:
            self._queue.append((channel, outcome))
            self._held.setdefault(channel, set()).update(outcome.ids)
            self._cond.notify()
        self._gauge()

    def held(self, channel: str) -> frozenset[int]:
        with self._cond:
            return frozenset(self._held.get(channel, ()))

    def pending(self) -> int:
        """Deliveries whose outcome is not written yet."""
        with self._cond:
            return sum(len(ids) for ids in self._held.values())

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
            with self._cond:  # wait before the next try; stop() interrupts the wait
                self._cond.wait(delay)
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
                self._held[channel].difference_update(outcome.ids)
        self._gauge()
        for channel in {c for c, _ in batch}:
            self.on_written(channel)
        return True

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.unrecorded.set(self.pending())
