"""Run the proxy (httpserver.py, with the connection bounds of bounds.py) and its /metrics endpoint (aiohttp)
on one event loop, until SIGINT/SIGTERM (/metrics is rendered in a forked child, off this loop: exposition.py)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
from typing import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.bounds import ConnectionBounds, ConnectionMetrics
from inferwatch.exporters.gateway.exposition import metrics_handler
from inferwatch.exporters.gateway.httpserver import HttpServer
from inferwatch.exporters.gateway.meter import Usage
from inferwatch.exporters.gateway.proxy import Proxy
from inferwatch.exporters.gateway.serverlog import ServerLog

log = logging.getLogger(__name__)


def usage_writer(fd: int) -> Callable[[Usage], None]:
    """A usage sink writing one JSON line per finished request (the per-request billing record) to the open
    file descriptor `fd` (an O_APPEND file, or a pipe), one `os.write` per record and no buffer between.

    Why unbuffered: a record the disk cannot take raises OSError (ENOSPC, EPIPE ...) at once, so the caller
    counts it lost (api.Gateway); a buffered stream kept it, said nothing, and wrote it or tore it later. On an
    O_APPEND file each write lands whole at the end, so the records of several workers never interleave. A
    record cut by an error after a partial write is ended by the next record's leading newline, so no later
    record is glued to it (readers skip the one cut line)."""
    torn = False

    def write(usage: Usage) -> None:
        nonlocal torn
        data = (("\n" if torn else "") + json.dumps(usage.__dict__, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except OSError:
                torn = len(view) < len(data)
                raise
        torn = False

    return write


def metrics_app(gateway: Gateway, forked: bool = True) -> web.Application:
    """/metrics through prometheus-client's own aiohttp handler (content negotiation, gzip when the scraper
    accepts it), run off the proxy's loop (exposition.py)."""
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(gateway.metrics.registry, forked))
    return app


async def serve(proxy: Proxy, host: str, port: int, metrics_port: int | None, metrics_host: str | None = None,
                stop: asyncio.Event | None = None,
                on_ready: Callable[[int, int | None], None] | None = None, forked_metrics: bool = True,
                reuse_port: bool = False, grpc_proxy=None, grpc_port: int = 0) -> None:
    """Serve until `stop` is set (or a signal arrives when `stop` is None).

    `forked_metrics`: render /metrics in a forked child (exposition.py), which needs this loop's thread to be
    the only one touching the registry; pass False when other threads read it (in-process tests).
    `metrics_port` None: no /metrics here (a worker of workers.py: its parent serves them);
    `reuse_port`: bind with SO_REUSEPORT, sharing the port with the other workers.
    `grpc_proxy` (grpcproxy.GrpcProxy): also serve gRPC on `grpc_port`, on this loop (its bound port is
    `grpc_proxy.port` once `on_ready` is called).

    Port 0 lets the OS pick; `on_ready(port, metrics_port)` is called with the ports actually bound once
    the sockets listen. A bind failure (OSError, e.g. EADDRINUSE) propagates out of this coroutine.
    """
    if metrics_port is not None:
        # Process CPU and memory next to the gateway metrics: the proxy's own cost is part of what it reports.
        # pid fixed to this process: /metrics is rendered in a forked child, whose own figures would be wrong.
        pid = os.getpid()
        ProcessCollector(pid=lambda: pid, registry=proxy.gateway.metrics.registry)
    settings = proxy.gateway.spec.gateway
    bounds = ConnectionBounds(max_connections=settings.max_connections,
                              header_timeout_s=settings.header_timeout.seconds,
                              body_timeout_s=settings.body_timeout.seconds,
                              idle_timeout_s=settings.idle_timeout.seconds,
                              send_timeout_s=settings.send_timeout.seconds,
                              metrics=ConnectionMetrics(proxy.gateway.metrics.registry))
    server = HttpServer(proxy.handle, max_body_bytes=proxy.max_body_bytes, bounds=bounds)
    metrics_runner = None
    await proxy.open()
    try:
        port = await server.start(host, port, reuse_port)
        if grpc_proxy is not None:
            grpc_port = grpc_proxy.port = await grpc_proxy.start(host, grpc_port, reuse_port)
            log.info("gateway gRPC listener on %s:%d -> %s (%s)", host, grpc_port, grpc_proxy.upstream,
                     "TLS" if grpc_proxy.credentials is not None else "h2c")
        if metrics_port is not None:
            metrics_runner = web.AppRunner(metrics_app(proxy.gateway, forked_metrics), access_log=None,
                                           logger=ServerLog())
            await metrics_runner.setup()
            await web.TCPSite(metrics_runner, metrics_host or host, metrics_port).start()
            metrics_port = metrics_runner.addresses[0][1]
            log.info("gateway proxy on http://%s:%d -> %s (at most %d client connections); metrics on "
                     "http://%s:%d/metrics", host, port, proxy.upstream, bounds.max_connections,
                     metrics_host or host, metrics_port)
        else:
            log.info("gateway worker %d: proxy on http://%s:%d -> %s (at most %d client connections)", os.getpid(),
                     host, port, proxy.upstream, bounds.max_connections)
        if on_ready is not None:
            on_ready(port, metrics_port)
        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await server.stop()
        if grpc_proxy is not None:
            await grpc_proxy.stop()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await proxy.close()


async def serve_metrics(registry: CollectorRegistry, host: str, port: int, stop: asyncio.Event) -> None:
    """Serve `registry` on /metrics (rendered in place: for a process that carries no proxy traffic, the
    parent of workers.py) until `stop` is set."""
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(registry, forked=False))
    runner = web.AppRunner(app, access_log=None, logger=ServerLog())
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("gateway metrics on http://%s:%d/metrics", host, runner.addresses[0][1])
        await stop.wait()
    finally:
        await runner.cleanup()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it cuts the proxy's per-event CPU, see docs/dependencies.md), else asyncio's default loop;
    INFERWATCH_GATEWAY_LOOP=asyncio forces the default (to compare, or to rule uvloop out)."""
    if os.environ.get("INFERWATCH_GATEWAY_LOOP", "") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run_forever(proxy: Proxy, host: str, port: int, metrics_port: int | None, **kwargs) -> None:
    """Run `serve` (same arguments) on a new event loop until SIGINT/SIGTERM, as the process's owner."""
    # Everything built so far (modules, spec, registry) lives as long as the process: leave it out of the
    # garbage collector's full scans, which a streamed event's garbage would otherwise trigger over it.
    gc.freeze()
    loop = new_event_loop()
    try:
        loop.run_until_complete(serve(proxy, host, port, metrics_port, **kwargs))
    finally:
        loop.close()
