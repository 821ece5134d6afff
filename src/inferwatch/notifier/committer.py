"""Group commit for the intake: webhooks that arrive while a commit is being fsynced are committed together
in the next transaction, one fsync for all of them, and each is answered only after that commit.

"On disk before the 2xx" holds for every webhook (its future is settled only after COMMIT returned under
synchronous=FULL); the number of fsyncs no longer grows with the number of webhooks, so intake is bounded
by the service's CPU rather than by the disk's commit rate. Batches are at most MAX_BATCH webhooks, so one
commit's latency stays bounded under a storm. The same technique as PostgreSQL's commit_delay and
InnoDB's binlog group commit, without any added delay: a batch is whatever queued during the last commit.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

from inferwatch.notifier.backend import OutboxBackend
from inferwatch.notifier.model import WebhookMessage
from inferwatch.notifier.outbox import OutboxError, Planned

MAX_BATCH = 256


class GroupCommitter:
    def __init__(self, outbox: OutboxBackend, max_batch: int = MAX_BATCH, metrics=None):
        self.outbox = outbox
        self.max_batch = max_batch
        self.metrics = metrics
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.commits = 0   # transactions written (for the benchmark: webhooks per fsync)
        self.webhooks = 0  # webhooks they carried

    def start(self) -> "GroupCommitter":
        self._thread = threading.Thread(target=self._run, name="intake-commit", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, message: WebhookMessage, planned: list[Planned], now: float) -> Future:
        """Queue one webhook; the future gives Outbox.accept's (accepted, ids) or raises OutboxError."""
        future: Future = Future()
        if not self.running:
            future.set_exception(OutboxError("the intake committer is not running"))
            return future
        self._queue.put((message, planned, now, future))
        return future

    def _run(self) -> None:
        stopping = False
        while not stopping:
            item = self._queue.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            try:
                self.outbox.accept_batch(batch)
            except Exception as exc:  # noqa: BLE001 - a bug must not stop intake: answer 503, keep running
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(OutboxError(f"intake commit failed: {type(exc).__name__}"))
            self.commits += 1
            self.webhooks += len(batch)
            if self.metrics is not None:
                self.metrics.intake_commits.inc()
        while True:  # anything submitted after stop: refuse it (Alertmanager retries a 503)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[3].set_exception(OutboxError("the notifier is stopping"))
        self.outbox.close()
