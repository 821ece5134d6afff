"""Multi-process mode (`--workers N`): N proxy processes sharing the port, one /metrics for all of them.

Why: one event loop is one core. Under load its own queue is what a stream waits in before its first token
is forwarded, and a saturated upstream can push more events than one loop relays (docs/gateway.md#overhead).

How:
- the parent forks the workers before it creates any event loop or metric, then only supervises and serves
  /metrics; it carries no traffic, so rendering /metrics (about 90 ms of CPU for a 1 MB page) delays no
  stream and needs no fork per scrape;
- each worker binds the proxy port with SO_REUSEPORT: the kernel spreads new connections over the workers'
  sockets (a connection, and every request on it, stays with one worker);
- metrics go through prometheus-client's multiprocess mode: each worker's values live in memory-mapped
  files under a private directory (PROMETHEUS_MULTIPROC_DIR, new for each run, so a restart never adds a
  dead run's counts; removed at exit; one a gateway killed before its cleanup left is removed by the next
  gateway to start: the parent holds an flock on `.owner.lock` inside it for its whole life, which the
  kernel releases however it ends, see `sweep_stale_directories`) and the parent's
  MultiProcessCollector adds them up per label set (histograms bucket by bucket; in-flight gauges over
  live workers only). A worker's counters outlive it, so totals never go backwards;
- `process_cpu_seconds_total` and `process_resident_memory_bytes` are the sums over the parent and the live
  workers (the gateway's whole cost); `gateway_workers` is the number of live workers.
- a worker that fails is not replaced: the gateway logs it, stops the others and exits 1, so that its
  supervisor (Kubernetes, systemd) restarts it whole (a half-sized gateway would hide the fault); a worker
  that stopped cleanly (SIGTERM sent to the whole process group) stops the gateway with exit code 0;
- SIGTERM/SIGINT to the parent stops the workers (each closes its connections as the single-process
  gateway does) and then the parent; a parent that dies without stopping them (SIGKILL, the OOM killer)
  takes them with it (inferwatch.lifetime: the parent-death signal, and the parent pid polled), so no worker
  keeps the port and serves on alone.
The usage log is opened by each worker in append mode; one record is one write, so lines never mix.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Awaitable, Callable

from prometheus_client import CollectorRegistry, multiprocess, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inferwatch.lifetime import die_with_parent

log = logging.getLogger(__name__)
_READY = b"r"
_STOP_TIMEOUT_S = 10.0
PREFIX = "inferwatch-gateway-metrics-"
LOCK = ".owner.lock"
# A directory without its lock file this old is one a gateway was killed in before locking it (mkdtemp and
# the lock are microseconds apart); a younger one may be another gateway's that is starting now.
_UNLOCKED_GRACE_S = 60.0


def sweep_stale_directories(base: str) -> list[str]:
    """Remove the metric directories under `base` (PREFIX*, this user's) whose gateway is gone: its
    `.owner.lock` not held, or no lock file and older than a minute. Returns the removed paths. A held lock
    (a live gateway, in any PID namespace sharing `base`) keeps its directory; errors skip the entry."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False) \
                    or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            try:
                fd = os.open(os.path.join(entry.path, LOCK), os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:
                if time.time() - entry.stat(follow_symlinks=False).st_mtime < _UNLOCKED_GRACE_S:
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # Removed while this process holds the lock, so no gateway starting now can be taking it.
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
            except BlockingIOError:
                pass  # its gateway is alive
            finally:
                os.close(fd)
        except OSError:
            continue
    return removed


def _private_directory() -> tuple[str, int]:
    """A new metric directory under the temporary directory (TMPDIR) and the fd of its held lock, after
    sweeping the directories killed gateways left there."""
    base = tempfile.gettempdir()
    for path in sweep_stale_directories(base):
        log.info("removed the metric files a killed gateway left in %s", path)
    directory = tempfile.mkdtemp(prefix=PREFIX)
    fd = os.open(os.path.join(directory, LOCK), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return directory, fd


class WorkersProcessCollector(Collector):
    """process_cpu_seconds_total / process_resident_memory_bytes summed over the parent and `pids()`
    (read from /proc), and gateway_workers = len(pids())."""

    def __init__(self, pids: Callable[[], list[int]], registry: CollectorRegistry):
        self._pids = pids
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")
        registry.register(self)

    def collect(self):
        cpu = rss = 0.0
        workers = self._pids()
        for pid in [os.getpid(), *workers]:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # exited between the list and the read
            cpu += (int(fields[11]) + int(fields[12])) / self._ticks
            rss += int(fields[21]) * self._page
        yield _gauge_like("process_cpu_seconds", "Total user and system CPU time of the gateway's processes "
                          "(parent and workers) in seconds.", cpu, counter=True)
        yield _gauge_like("process_resident_memory_bytes", "Resident memory of the gateway's processes "
                          "(parent and workers) in bytes.", rss)
        yield _gauge_like("gateway_workers", "Proxy worker processes running (--workers).", float(len(workers)))


def _gauge_like(name: str, documentation: str, value: float, counter: bool = False):
    if counter:
        from prometheus_client.core import CounterMetricFamily

        return CounterMetricFamily(name, documentation, value=value)
    return GaugeMetricFamily(name, documentation, value=value)


def run_workers(count: int, start_worker: Callable[[], None],
                serve_metrics: Callable[[CollectorRegistry, asyncio.Event], Awaitable[None]]) -> int:
    """Fork `count` workers running `start_worker()` (it must bind the proxy port with SO_REUSEPORT, call
    `worker_ready()` once listening, and return once SIGTERM asked it to stop), then run
    `serve_metrics(registry, stop)` in this process until a signal or a worker's exit.
    Returns the exit code: 0 after a signal, 1 when a worker exited on its own."""
    directory, lock_fd = _private_directory()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    live: set[int] = set()
    ready_r, ready_w = os.pipe()
    parent = os.getpid()
    try:
        for index in range(count):
            pid = os.fork()
            if pid == 0:
                die_with_parent(parent)  # forked by this (main) thread, which lives as long as the gateway
                os.close(ready_r)
                os.close(lock_fd)  # the lock is the parent's alone: it is free once the parent is gone
                _worker_main(index, start_worker, ready_w)  # never returns
            live.add(pid)
        os.close(ready_w)
        return _parent(live, count, ready_r, directory, serve_metrics)
    finally:
        for pid in live:  # only workers not yet reaped: a reaped pid may belong to another process now
            _signal(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        shutil.rmtree(directory, ignore_errors=True)
        os.close(lock_fd)


def _worker_main(index: int, start_worker: Callable[[], None], ready_w: int) -> None:
    global _ready_fd
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops workers with SIGTERM, once
        # Every metric this process creates from here on writes to its own memory-mapped file.
        values.ValueClass = values.MultiProcessValue()
        _ready_fd = ready_w
        start_worker()
        code = 0
    except BaseException:  # noqa: BLE001 - a worker reports any failure, then leaves without the parent's cleanup
        log.exception("gateway worker %d failed", index)
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


_ready_fd: int | None = None


def worker_ready() -> None:
    """Tell the parent this worker listens (called in the worker once its socket is bound)."""
    global _ready_fd
    if _ready_fd is not None:
        os.write(_ready_fd, _READY)
        os.close(_ready_fd)
        _ready_fd = None


def _reap(live: set[int], directory: str) -> list[tuple[int, int]]:
    """Workers that exited since the last call: (pid, wait status); they leave `live`."""
    gone = []
    for pid in list(live):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            live.discard(pid)
            multiprocess.mark_process_dead(pid, directory)  # its in-flight gauge leaves the sum
            gone.append((pid, status))
    return gone


def _parent(live: set[int], count: int, ready_r: int, directory: str, serve_metrics) -> int:
    from inferwatch.exporters.gateway.server import new_event_loop

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    WorkersProcessCollector(lambda: sorted(live), registry)
    loop = new_event_loop()
    failed = False

    async def supervise(stop: asyncio.Event) -> None:
        nonlocal failed
        while not stop.is_set():
            for pid, status in _reap(live, directory):
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                    # Only a stop request ends a worker cleanly (a SIGTERM sent to the whole process group).
                    log.info("gateway worker (pid %d) stopped: stopping the gateway", pid)
                else:
                    log.error("gateway worker (pid %d) exited (%s): stopping the gateway so that its "
                              "supervisor restarts it whole", pid, _describe(status))
                    failed = True
                stop.set()
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except asyncio.TimeoutError:
                pass

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watcher = asyncio.create_task(supervise(stop))
        try:
            await _wait_ready(ready_r, count, stop)
            if not stop.is_set():
                await serve_metrics(registry, stop)
        finally:
            stop.set()
            await watcher
            for pid in live:
                _signal(pid, signal.SIGTERM)
            deadline = loop.time() + _STOP_TIMEOUT_S
            while live and loop.time() < deadline:
                _reap(live, directory)
                await asyncio.sleep(0.05)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return 1 if failed else 0


async def _wait_ready(ready_r: int, count: int, stop: asyncio.Event) -> None:
    """Until every worker wrote its ready byte, the pipe closed (a worker died before it was ready: the
    supervisor reports it) or `stop` is set."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    got = 0

    def readable() -> None:
        nonlocal got
        data = os.read(ready_r, 64)
        got += len(data)
        if (not data or got >= count) and not done.done():
            done.set_result(None)

    os.set_blocking(ready_r, False)
    loop.add_reader(ready_r, readable)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((done, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        loop.remove_reader(ready_r)
        os.close(ready_r)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
