"""L3 gateway semantic exporter: a streaming reverse proxy (and an in-process API) measuring TTFT, inter-token
latency, time per output token, output length, tokens/s and exact token usage per tenant, model and tier."""

from inferwatch.exporters.gateway.api import Gateway, TrackedRequest
from inferwatch.exporters.gateway.asgi import GatewayMiddleware
from inferwatch.exporters.gateway.meter import RequestMeter, Usage
from inferwatch.exporters.gateway.metrics import GatewayMetrics

__all__ = ["Gateway", "TrackedRequest", "GatewayMiddleware", "RequestMeter", "Usage", "GatewayMetrics"]
