"""HTTP endpoint of the Triton collector: GET /metrics, rendered per scrape from the last poll's snapshots.

Served by inferwatch.httpserver (aiohttp, one loop thread; renders in its pool): header and idle timeouts
and a connection cap with the oldest idle connections closed first, counted in
inferwatch_triton_collector_http_connections{,_closed_total}. The format is the one prometheus-client
negotiates from Accept (OpenMetrics or the 0.0.4 text format), gzip when Accept-Encoding allows it, and
`?name[]=` filters as in prometheus-client's own handler.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from inferwatch.httpserver import BoundedServer, Bounds, ConnectionMetrics, exposition, metrics_response

METRICS_PREFIX = "inferwatch_triton_collector"


def metrics_server(registry: CollectorRegistry, host: str, port: int, bounds: Bounds = Bounds(), *,
                   client_connections: int = 0) -> BoundedServer:
    """A BoundedServer for `registry` (the TritonCollector's, plus process metrics), not started yet.
    `client_connections`: descriptors the collector's own Triton clients may hold, kept out of the cap."""
    connections = ConnectionMetrics(registry, METRICS_PREFIX)
    app = web.Application(client_max_size=1024)   # nothing here takes a body
    server = BoundedServer(app, host, port, bounds, name="triton-metrics", metrics=connections,
                           fd_reserve=client_connections)

    def render(names: list[str], accept: str | None, encoding: str | None) -> tuple[str, bool, bytes]:
        return exposition(registry.restricted_registry(names) if names else registry, accept, encoding)

    async def metrics(request: web.Request) -> web.Response:
        answer = await server.run_blocking(render, request.query.getall("name[]", []),
                                           request.headers.get("Accept"), request.headers.get("Accept-Encoding"))
        return metrics_response(*answer)

    async def index(request: web.Request) -> web.Response:
        return web.Response(text="inferwatch Triton collector: /metrics\n")

    app.add_routes([web.get("/metrics", metrics), web.get("/", index)])
    return server
