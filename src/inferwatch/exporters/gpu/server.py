"""HTTP endpoint of the GPU exporter: GET /metrics (cached bytes, exposition.py), and POST /sim/events on a
simulator (simapi.py, test-only, loopback peers only by default).

/metrics answers with the format prometheus-client negotiates from Accept (OpenMetrics or the 0.0.4 text
format), gzip when Accept-Encoding allows it, and `?name[]=` filters as prometheus-client's own handler does.
Served by inferwatch.httpserver (aiohttp, one loop thread): header and idle timeouts and a connection cap
with the oldest idle connections closed first, counted in inferwatch_gpu_exporter_http_connections{,_closed_total}.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from inferwatch.exporters.gpu import simapi
from inferwatch.exporters.gpu.exposition import ExpositionCache
from inferwatch.httpserver import BoundedServer, Bounds, ConnectionMetrics, metrics_response

METRICS_PREFIX = "inferwatch_gpu_exporter"


def make_app(server: BoundedServer | None, cache: ExpositionCache, sim: Any = None,
             sim_any_host: bool = False) -> web.Application:
    """The aiohttp app: /metrics from `cache`; /sim/events only when `sim` (a SimNvml) is given, and only from
    loopback peers unless `sim_any_host`. `server` runs the uncached `?name[]=` renders off the loop."""

    async def metrics(request: web.Request) -> web.Response:
        # From handler start to last byte handed to the socket, a scrape counts as in flight: background
        # rendering steps aside for it (exposition.Scrapes).
        cache.scrapes.begin()
        try:
            accept, encoding = request.headers.get("Accept"), request.headers.get("Accept-Encoding")
            names = request.query.getall("name[]", [])
            if names and server is not None:
                answer = await server.run_blocking(cache.restricted, names, accept, encoding)
            else:
                answer = cache.restricted(names, accept, encoding) if names else cache.body(accept, encoding)
            response = metrics_response(*answer)
            await response.prepare(request)
            await response.write_eof()
            return response
        finally:
            cache.scrapes.end()

    async def index(request: web.Request) -> web.Response:
        return web.Response(text="inferwatch GPU exporter: /metrics" +
                            (", POST /sim/events (test-only)" if sim is not None else "") + "\n")

    async def sim_events(request: web.Request) -> web.Response:
        refused = simapi.forbidden(request.remote or "", sim_any_host)
        if refused is not None:
            return web.json_response(refused, status=403)
        if request.content_length is not None and request.content_length > simapi.MAX_BODY_BYTES:
            return web.json_response(simapi.too_large(), status=413)
        try:
            raw = await asyncio.wait_for(request.read(), simapi.BODY_TIMEOUT_S)
        except web.HTTPRequestEntityTooLarge:
            return web.json_response(simapi.too_large(), status=413)
        except asyncio.TimeoutError:
            return web.json_response({"error": f"body not received within {simapi.BODY_TIMEOUT_S:g}s"}, status=408)
        status, body = simapi.apply(sim, raw)
        return web.json_response(body, status=status)

    app = web.Application(client_max_size=simapi.MAX_BODY_BYTES)
    app.add_routes([web.get("/metrics", metrics), web.get("/", index)])
    if sim is not None:
        app.add_routes([web.post("/sim/events", sim_events)])
    return app


class MetricsServer(BoundedServer):
    """A GpuCollector served on `host`:`port` (0: a free port, `.port` after `start()`). `start()` raises
    OSError when the address cannot be bound."""

    def __init__(self, collector: Any, host: str, port: int, sim: Any = None, sim_any_host: bool = False,
                 bounds: Bounds = Bounds()):
        # support_collectors_without_names: the collector has no describe() (its families vary with the GPUs),
        # and prometheus-client's `name[]` filter still has to reach it.
        registry = CollectorRegistry(support_collectors_without_names=True)
        registry.register(collector)
        # Connection figures are rendered with each collection (the body is cached per collection).
        connections = ConnectionMetrics(registry, METRICS_PREFIX)
        self.cache = ExpositionCache(registry, lambda: collector.version)
        collector.on_publish.append(self.cache.prerender)
        collector.yield_to = self.cache.scrapes
        super().__init__(make_app(self, self.cache, sim, sim_any_host), host, port, bounds, name="gpu-metrics",
                         metrics=connections)

    @classmethod
    def for_collector(cls, collector: Any, host: str, port: int, sim: Any = None, sim_any_host: bool = False,
                      bounds: Bounds = Bounds()) -> "MetricsServer":
        """Serve a GpuCollector: its own registry, a cache re-rendered after each of its publications."""
        return cls(collector, host, port, sim, sim_any_host, bounds)
