"""Where a channel send runs: in the delivery worker's own threads, or in a pool of processes.

CPython runs one thread at a time, and a send (rendering the message, the HTTP request through `requests`)
costs about a millisecond of CPU, so in one process intake and delivery share one core. With
`notifier.send_processes: N` the sends run in N processes (started with `spawn`, each building its own
channels from the spec and its own log handlers with the redaction filter, at a lower CPU priority than the
intake): the worker keeps choosing, retrying and recording in the main process, and a storm's sends use the
other cores.

A pool process that dies (OOM-killed) breaks the pool: the send in flight is reported as a retryable
`provider_error` and a new pool is started for the next one. A pool process whose notifier died (SIGKILL)
exits with it (inferwatch.lifetime: the kernel's parent-death signal, else within PARENT_POLL_S); the
notifier's pid is handed to each process by the notifier, never read by the process itself, which under load
may start after its notifier died and would then watch its adoptive parent forever.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import signal
import threading

from inferwatch.lifetime import die_with_parent
from inferwatch.notifier.channels import build_channel
from inferwatch.notifier.channels.base import Channel, DeliveryResult
from inferwatch.notifier.model import Notification
from inferwatch.spec import Spec

log = logging.getLogger(__name__)


class ThreadSender:
    """Sends in the calling thread (`send_processes: 0`)."""

    def __init__(self, channels: dict[str, Channel]):
        self.channels = channels

    def send(self, name: str, notification: Notification) -> DeliveryResult:
        return self.channels[name].send(notification)

    def close(self) -> None:
        """Close each channel's kept-alive connections (the worker's send threads have ended): a stopped
        notifier holds no socket to a provider."""
        for channel in self.channels.values():
            close = getattr(channel, "close", None)
            if close is not None:
                close()


_channels: dict[str, Channel] = {}  # in a pool process


SEND_NICENESS = 5  # below the intake: under CPU contention, accepting alerts (Alertmanager waits) comes first


def _start_process(spec: Spec, level: int, parent: int) -> None:
    from inferwatch.cli import setup_logging

    # The threads that spawn the pool (the sender's owner; a send thread after a broken pool) live until the
    # pool closes, so the parent-death signal is safe to arm here (inferwatch.lifetime).
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent stops the pool
    try:
        os.nice(SEND_NICENESS)
    except OSError:
        pass
    setup_logging(verbose=level <= logging.DEBUG)
    logging.getLogger().setLevel(level)
    _channels.update({name: build_channel(name, c) for name, c in spec.channels.items()})


def _send_in_process(name: str, notification: Notification) -> DeliveryResult:
    return _channels[name].send(notification)


class ProcessSender:
    """Sends in a pool of `processes` processes."""

    def __init__(self, spec: Spec, processes: int):
        self.spec = spec
        self.processes = processes
        self._lock = threading.Lock()
        self._pool = self._new_pool()

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        pool = concurrent.futures.ProcessPoolExecutor(
            self.processes, mp_context=multiprocessing.get_context("spawn"), initializer=_start_process,
            initargs=(self.spec, logging.getLogger().getEffectiveLevel(), os.getpid()))
        # Start every process now (in the background), not when the first alert must go out.
        for _ in range(self.processes):
            pool.submit(os.getpid)
        return pool

    def send(self, name: str, notification: Notification) -> DeliveryResult:
        pool = self._pool
        try:
            return pool.submit(_send_in_process, name, notification).result()
        except concurrent.futures.process.BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    log.error("a send process died; starting a new pool of %d", self.processes)
                    self._pool = self._new_pool()
            return DeliveryResult.fail("provider_error", "send process died", retryable=True)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def make_sender(spec: Spec, channels: dict[str, Channel]):
    processes = spec.notifier.send_processes
    return ProcessSender(spec, processes) if processes > 0 else ThreadSender(channels)
