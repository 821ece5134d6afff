"""/metrics for the gateway, rendered outside the proxy's event loop and outside its interpreter lock.

Why: the gateway's page grows with tenants × models × tiers (7 histograms each): with 50 tenants it is about
1 MB and costs about 90 ms of CPU to render (190 ms wall on a loaded 2-core machine). Rendered on the proxy's
event loop, a scrape per second added 207 ms to TTFT p99; rendered on a thread of the same process it was no
better (the render holds the interpreter lock, and each handover to the proxy's thread waits on the OS
scheduler). Forked, the serving loop spends about 6 ms of CPU per scrape instead of about 92 ms, and its
longest stall per scrape is 7–36 ms instead of 140–370 ms. Measured with benchmarks/gateway_overhead.py
(docs/gateway.md#overhead).

How: each scrape forks the process; the child runs prometheus-client's own aiohttp handler
(`make_aiohttp_handler`: content negotiation, `name[]` filtering) on its copy of the registry, sends the
answer back through a pipe and exits; the proxy's loop only forks (about a millisecond) and reads the pipe.
gzip is applied by aiohttp on the way out, as that handler asks. Safe because the fork happens on the loop's
own thread, the only one that touches the registry (the CLI's case: serve(forked_metrics=False) is for
processes where other threads read it too), so no metric lock can be held in the child, and the child only
reads memory and leaves with os._exit (no cleanup, no logging, no I/O but the pipe).
Process metrics (`process_*`) are the gateway's own (ProcessCollector reads the parent's pid).
One render runs at a time; a child that does not answer within RENDER_TIMEOUT_S is killed (answer 503). A
child whose gateway died (SIGKILL) dies with it: the parent-death signal (inferwatch.lifetime; the loop's
thread that forks it lives as long as the gateway) and, everywhere, the pipe: its write fails once the reader
is gone.
Where os.fork does not exist, the handler renders in place.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from inferwatch.lifetime import die_with_parent

RENDER_TIMEOUT_S = 10.0


def metrics_handler(registry: CollectorRegistry, forked: bool = True):
    """An aiohttp handler for GET /metrics serving `registry` (see the module docstring); `forked=False`
    renders in place, on the serving loop (the benchmark's reference)."""
    render = make_aiohttp_handler(registry)
    if not forked or not hasattr(os, "fork"):
        return render
    lock = asyncio.Lock()

    async def metrics(request: web.Request) -> web.StreamResponse:
        async with lock:
            try:
                status, headers, body, compress = await asyncio.wait_for(_forked(render, request), RENDER_TIMEOUT_S)
            except (asyncio.TimeoutError, OSError, EOFError, pickle.UnpicklingError):
                return web.Response(status=503, text="metrics render failed\n")
        response = web.Response(status=status, headers=headers, body=body)
        if compress:
            response.enable_compression()
        return response

    return metrics


async def _forked(render, request: web.Request):
    """(status, headers, body, compress) of `render(request)` run in a forked child."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: render, send, leave without running any cleanup of the parent's state
        code = 1
        try:
            die_with_parent(parent, watch=False, code=1)  # no thread: this child lives for one render
            os.close(read_fd)
            coro = render(request)
            try:
                coro.send(None)  # the handler has no await: it completes on its first step
            except StopIteration as done:
                response = done.value
                answer = pickle.dumps((response.status, list(response.headers.items()), response.body,
                                       response.compression))
                view = memoryview(answer)
                while view:
                    view = view[os.write(write_fd, view):]
                code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        data = await _read_all(read_fd)
    except asyncio.CancelledError:
        _kill(pid)
        raise
    finally:
        os.close(read_fd)
        await asyncio.get_running_loop().run_in_executor(None, _reap, pid)
    status, headers, body, compress = pickle.loads(data)  # noqa: S301 - written by our own forked child
    return status, headers, body, compress


async def _read_all(fd: int) -> bytes:
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    parts: list[bytes] = []

    def readable() -> None:
        try:
            part = os.read(fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError as exc:
            loop.remove_reader(fd)
            if not done.done():
                done.set_exception(exc)
            return
        if part:
            parts.append(part)
        else:
            loop.remove_reader(fd)
            if not done.done():
                done.set_result(b"".join(parts))

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
