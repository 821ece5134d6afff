"""`GET /metrics` on an aiohttp server through prometheus-client's own exposition code.

The handler calls the WSGI app of `prometheus_client.make_wsgi_app`, so content negotiation (Prometheus
text 0.0.4, or OpenMetrics when the scraper's Accept asks for it), gzip when Accept-Encoding allows it,
`name[]` filtering and the OPTIONS/405 answers are the library's, not re-implemented here. Collection runs
in a worker thread: a collector reading SQLite must not stall the event loop.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CollectorRegistry, make_wsgi_app


def metrics_handler(registry: CollectorRegistry):
    """An aiohttp handler serving `registry`."""
    app = make_wsgi_app(registry)

    def call(environ: dict) -> tuple[str, list[tuple[str, str]], bytes]:
        answer: list = []
        body = b"".join(app(environ, lambda status, headers: answer.extend((status, headers))))
        return answer[0], answer[1], body

    async def handle(request: web.Request) -> web.Response:
        environ = {"REQUEST_METHOD": request.method, "PATH_INFO": request.path,
                   "QUERY_STRING": request.query_string,
                   "HTTP_ACCEPT": request.headers.get("Accept", ""),
                   "HTTP_ACCEPT_ENCODING": request.headers.get("Accept-Encoding", "")}
        status, headers, body = await asyncio.get_running_loop().run_in_executor(None, call, environ)
        response = web.Response(status=int(status.split()[0]), body=body)
        for name, value in headers:
            response.headers[name] = value
        return response

    return handle
