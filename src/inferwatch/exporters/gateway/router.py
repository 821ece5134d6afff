"""One gateway in front of several upstreams (spec `upstreams`, upstreams.py): a Proxy per upstream,
one chosen per request, before anything is forwarded or metered.

The choice (inferwatch.upstreams.choose): the longest `path_prefix` the request path starts with (the
prefix is cut off, so `/vllm/v1/completions` reaches the vLLM upstream as `/v1/completions`), else the upstream
listing the request's model, else the default upstream. The model is the one the request names: Triton's
`/v2/models/<model>/...` path, or the `model` field of a JSON body (OpenAI's /v1/... requests). A request
whose target is not canonical goes to the default upstream's Proxy, which refuses it (400).

Each upstream's failures the gateway answers for (502 unreachable or broken, 504 silent) are counted in
`gateway_upstream_failures_total{upstream, outcome}` (outcome `error` or `timeout`), so a failing vLLM is
told apart from a failing Triton; what the upstream itself answers is in gateway_requests_total.
"""

from __future__ import annotations

import json
import re
from typing import Coroutine

from prometheus_client import Counter

from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.httpserver import Request, ServerConnection
from inferwatch.exporters.gateway.proxy import Proxy
from inferwatch.exporters.gateway.routes import BadTarget, canonical_target, decoded_path
from inferwatch.upstreams import choose, default_name

__all__ = ["Router", "request_model"]

_TRITON_MODEL = re.compile(r"^/v2/models/([^/]+)(?:/|$)")


def request_model(path: str, body: bytes) -> str | None:
    """The model a request names: Triton's path segment, else the `model` string of a JSON object body;
    None when neither says (not JSON, no such field, not a string)."""
    m = _TRITON_MODEL.match(path)
    if m:
        return m.group(1)
    if body.lstrip()[:1] != b"{":
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to read ([[[[...]]]])
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    return model if isinstance(model, str) else None


class Router:
    """The handler of a gateway with several upstreams: `urls` maps each upstream's name (its `upstream` label)
    to its base URL (credentials in it are sent as Basic auth, as Proxy does, and never logged). Same
    interface as Proxy for server.py: `gateway`, `max_body_bytes`, `upstream` (safe to log), `open`,
    `close`, `handle`."""

    def __init__(self, gateway: Gateway, urls: dict[str, str], timeout_s: float | None = None,
                 max_body_bytes: int | None = None):
        spec = gateway.spec
        missing = sorted(set(spec.upstreams) - set(urls))
        if missing:
            raise ValueError(f"no URL for upstream {missing[0]}")
        self.gateway = gateway
        self.spec = spec
        self.failures = Counter("gateway_upstream_failures", "Requests the gateway failed for an upstream (502 "
                                "unreachable or broken: error, 504 silent: timeout), by upstream.",
                                ("upstream", "outcome"), registry=gateway.metrics.registry)
        self.proxies: dict[str, Proxy] = {}
        for name in spec.upstreams:
            proxy = Proxy(gateway, urls[name], timeout_s, max_body_bytes)
            proxy.on_failure = self._counter(name)
            self.proxies[name] = proxy
        self.default = self.proxies[default_name(spec) or next(iter(self.proxies))]
        self.max_body_bytes = self.default.max_body_bytes
        self.upstream = ", ".join(f"{name}={p.upstream}" for name, p in self.proxies.items())
        self._prefixes = {name: up.path_prefix for name, up in spec.upstreams.items() if up.path_prefix}
        self._by_model = any(up.models for up in spec.upstreams.values())

    def _counter(self, name: str):
        children = {outcome: self.failures.labels(name, outcome) for outcome in ("error", "timeout")}
        return lambda outcome: children[outcome].inc() if outcome in children else None

    async def open(self) -> None:
        for proxy in self.proxies.values():
            await proxy.open()

    async def close(self) -> None:
        for proxy in self.proxies.values():
            await proxy.close()

    def handle(self, request: Request, conn: ServerConnection) -> Coroutine | None:
        """Hand `request` to its upstream's Proxy (the path prefix of a prefix-chosen upstream cut off)."""
        try:
            path = decoded_path(canonical_target(request.target))
        except BadTarget:
            return self.default.handle(request, conn)  # refused there, with the reason
        model = request_model(path, request.body) if self._by_model else None
        name = choose(self.spec, path, model)
        proxy = self.proxies[name] if name is not None else self.default
        prefix = self._prefixes.get(name or "")
        if prefix:
            target = canonical_target(request.target)
            if target.startswith(prefix):  # else the prefix was percent-encoded: forwarded as sent
                request.target = "/" + target[len(prefix):].lstrip("/")
        return proxy.handle(request, conn)
