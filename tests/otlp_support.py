"""A local OTLP/HTTP metrics receiver: the narrowest boundary of the gateway's OpenTelemetry export.

It accepts `POST /v1/metrics` with a protobuf body and decodes it as the real
`opentelemetry.proto.collector.metrics.v1.ExportMetricsServiceRequest` (the `opentelemetry-proto` package,
the definitions every collector is built from), keeping each request's headers and decoded message. It
answers `status` (200 with an empty ExportMetricsServiceResponse, as the OTLP specification says, or an
error code to play a failing collector).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


class OtlpReceiver:
    """Receives OTLP/HTTP protobuf exports on a loopback port: `url` is the metrics endpoint; `exports` a
    list of (headers dict with lower-case names, ExportMetricsServiceRequest); `status` the answer's code."""

    def __init__(self, status: int = 200):
        self.status = status
        self.exports: list[tuple[dict[str, str], ExportMetricsServiceRequest]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the name http.server calls
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/metrics" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(400)
                    self.end_headers()
                    return
                message = ExportMetricsServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.exports.append(({k.lower(): v for k, v in self.headers.items()}, message))
                self.send_response(receiver.status)
                answer = ExportMetricsServiceResponse().SerializeToString() if receiver.status == 200 else b"no"
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def received(self) -> list[tuple[dict[str, str], ExportMetricsServiceRequest]]:
        with self.lock:
            return list(self.exports)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes(point_or_resource) -> dict:
    """A data point's (or resource's) attributes as a dict of plain values."""
    out = {}
    for kv in point_or_resource.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
    return out


def latest(exports, instance: str | None = None) -> dict:
    """The newest export of every writer (resource service.instance.id), or of `instance`: {instance:
    {metric name: Metric}} (cumulative points: the newest export holds every total)."""
    out: dict[str, dict] = {}
    for _headers, message in exports:
        for rm in message.resource_metrics:
            inst = attributes(rm.resource).get("service.instance.id")
            if instance is not None and inst != instance:
                continue
            metrics = {m.name: m for sm in rm.scope_metrics for m in sm.metrics}
            out[inst] = metrics
    return out


def histogram_sum(metrics_by_instance: dict, name: str, **attrs) -> tuple[int, float]:
    """(count, sum) over every writer of the points of histogram `name` whose attributes include `attrs`."""
    count, total = 0, 0.0
    for metrics in metrics_by_instance.values():
        metric = metrics.get(name)
        if metric is None:
            continue
        for point in metric.histogram.data_points:
            have = attributes(point)
            if all(have.get(k) == v for k, v in attrs.items()):
                count += point.count
                total += point.sum
    return count, total
