"""HTTP endpoint of the GPU exporter: GET /metrics (prometheus_client), and POST /sim/events on a simulator.

POST /sim/events takes a JSON (or YAML) list of scenario timeline entries (scenario.py), `at` counted from
the moment they arrive, e.g. `[{"gpu": 0, "ramp": {"temperature_c": 92}, "over": "30s"}]`. Answers 200 with
`{"added": N}`, or 400 with the reason when an entry is invalid (nothing is added then).
"""

from __future__ import annotations

import json
import logging
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import yaml
from prometheus_client import CollectorRegistry, make_wsgi_app

from inferwatch.specload import SpecError

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 1 << 20


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds the process open


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)


def make_app(registry: CollectorRegistry, sim: Any = None) -> Callable:
    """The WSGI app: /metrics always; /sim/events only when `sim` (a SimNvml) is given."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        path, method = environ.get("PATH_INFO", "/"), environ.get("REQUEST_METHOD", "GET")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/sim/events" and sim is not None:
            if method != "POST":
                return _answer(start_response, "405 Method Not Allowed", {"error": "POST a list of events"})
            return _post_events(sim, environ, start_response)
        if path == "/":
            body = "inferwatch GPU exporter: /metrics" + (", POST /sim/events" if sim is not None else "")
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [body.encode() + b"\n"]
        return _answer(start_response, "404 Not Found", {"error": f"no such path {path}"})

    return app


def _post_events(sim: Any, environ: dict, start_response: Callable) -> list[bytes]:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > MAX_BODY_BYTES:
        return _answer(start_response, "413 Payload Too Large", {"error": f"body over {MAX_BODY_BYTES} bytes"})
    raw = environ["wsgi.input"].read(length) if length else b""
    try:
        entries = yaml.safe_load(raw.decode()) if raw else None  # YAML is a superset of JSON
        changes = sim.add_events(entries)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        return _answer(start_response, "400 Bad Request", {"error": f"body is not JSON or YAML: {exc}"})
    except SpecError as exc:
        return _answer(start_response, "400 Bad Request", {"error": str(exc)})
    log.info("simulator: %d event(s) added at t=%.1fs", len(changes), sim.now())
    return _answer(start_response, "200 OK", {"added": len(changes)})


def _answer(start_response: Callable, status: str, body: dict) -> list[bytes]:
    start_response(status, [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]


class MetricsServer:
    """The app on a threading HTTP server. `port` 0 picks a free port (see `.port` after start)."""

    def __init__(self, app: Callable, host: str, port: int):
        self._server = make_server(host, port, app, _ThreadingServer, handler_class=_QuietHandler)
        self.host, self.port = host, self._server.server_port
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="gpu-metrics-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
