"""HTTP endpoint of the GPU exporter: GET /metrics (cached bytes, exposition.py), and POST /sim/events on a
simulator (simapi.py, test-only, loopback peers only by default).

/metrics answers with the format prometheus-client negotiates from Accept (OpenMetrics or the 0.0.4 text
format), gzip when Accept-Encoding allows it, and `?name[]=` filters as prometheus-client's own handler does.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer

from inferwatch.exporters.gpu import simapi
from inferwatch.exporters.gpu.exposition import ExpositionCache

log = logging.getLogger(__name__)


class _QuietHandler(WSGIRequestHandler):
    def handle(self) -> None:
        # From request line to last byte written, a scrape counts as in flight: background rendering steps
        # aside for it (exposition.Scrapes).
        scrapes = getattr(self.server, "scrapes", None)
        if scrapes is None:
            return super().handle()
        scrapes.begin()
        try:
            super().handle()
        finally:
            scrapes.end()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)


def make_app(cache: ExpositionCache, sim: Any = None, sim_any_host: bool = False) -> Callable:
    """The WSGI app: /metrics from `cache`; /sim/events only when `sim` (a SimNvml) is given, and only from
    loopback peers unless `sim_any_host`."""

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return _metrics(cache, environ, start_response)
        if path == "/sim/events" and sim is not None:
            return simapi.handle(sim, environ, start_response, sim_any_host)
        if path == "/":
            body = "inferwatch GPU exporter: /metrics" + (", POST /sim/events (test-only)" if sim is not None else "")
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [body.encode() + b"\n"]
        return simapi.answer(start_response, "404 Not Found", {"error": f"no such path {simapi.short(path)}"})

    return app


def _metrics(cache: ExpositionCache, environ: dict, start_response: Callable) -> list[bytes]:
    method = environ.get("REQUEST_METHOD", "GET")
    if method not in ("GET", "HEAD"):
        start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
        return [f"# HTTP 405: {simapi.short(method)}; use GET\n".encode()]
    accept, encoding = environ.get("HTTP_ACCEPT"), environ.get("HTTP_ACCEPT_ENCODING")
    names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
    content_type, gzipped, body = (cache.restricted(names, accept, encoding) if names
                                   else cache.body(accept, encoding))
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    if gzipped:
        headers.append(("Content-Encoding", "gzip"))
    start_response("200 OK", headers)
    return [body] if method == "GET" else []


class MetricsServer:
    """The app on prometheus-client's threading WSGI server. `port` 0 picks a free port (`.port` after).
    Raises OSError when the address cannot be bound."""

    def __init__(self, app: Callable, host: str, port: int, cache: ExpositionCache | None = None):
        self._server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
        self._server.scrapes = cache.scrapes if cache is not None else None
        self.host, self.port = host, self._server.server_port
        self.cache = cache
        self._thread: threading.Thread | None = None

    @classmethod
    def for_collector(cls, collector: Any, host: str, port: int, sim: Any = None,
                      sim_any_host: bool = False) -> MetricsServer:
        """Serve a GpuCollector: its own registry, a cache re-rendered after each of its publications."""
        # support_collectors_without_names: the collector has no describe() (its families vary with the GPUs),
        # and prometheus-client's `name[]` filter still has to reach it.
        registry = CollectorRegistry(support_collectors_without_names=True)
        registry.register(collector)
        cache = ExpositionCache(registry, lambda: collector.version)
        collector.on_publish.append(cache.prerender)
        collector.yield_to = cache.scrapes
        return cls(make_app(cache, sim, sim_any_host), host, port, cache)

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="gpu-metrics-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
