"""`inferwatch exporter gateway`: the L3 streaming proxy with its /metrics (default ports 8080 and 9402)."""

from __future__ import annotations

import argparse
import os
import sys
from urllib.parse import urlsplit

from inferwatch.cli import UsageError, add_service_args, add_spec_arg, port
from inferwatch.spec import load_spec


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "gateway", help="L3 gateway exporter: streaming proxy measuring TTFT, ITL, tokens per tenant",
        description="Streaming reverse proxy in front of Triton or an OpenAI-compatible server. Forwards every "
                    "request unchanged (paths made canonical; %2F refused with 400); meters OpenAI "
                    "/v1/chat/completions and /v1/completions, and Triton generate/generate_stream (every model) "
                    "or, when the spec lists gateway.llm_models, generate/generate_stream/infer of those models; "
                    "serves gateway_* metrics on --metrics-port.")
    p.add_argument("--upstream", action="append", default=[], metavar="URL",
                   help="base URL requests are forwarded to, e.g. http://triton:8000; user:password@ in it is "
                        "sent as HTTP Basic auth and never logged. With the spec's `upstreams` (several "
                        "servers, one chosen per request by path prefix or model): optional, NAME=URL replaces "
                        "that upstream's URL (to add credentials), repeatable")
    add_service_args(p, 8080)
    p.add_argument("--metrics-port", type=port, default=9402,
                   help="port serving /metrics on the same --host, 1-65535 (default 9402)")
    add_spec_arg(p)
    p.add_argument("--workers", type=_workers, default=1, metavar="N",
                   help="proxy processes sharing --port (SO_REUSEPORT), 1-64 (default 1). With N > 1 the main "
                        "process serves /metrics, summed over the workers (prometheus-client multiprocess "
                        "mode), and carries no traffic; a worker that dies stops the gateway (exit 1)")
    p.add_argument("--grpc-upstream", metavar="HOST:PORT", default=None,
                   help="also serve Triton's gRPC API on --grpc-port, forwarding every call to this gRPC address "
                        "(e.g. triton:8001) and metering ModelStreamInfer/ModelInfer of the LLM models; TLS when "
                        "the spec's gateway.grpc_certificate_file is set (default: no gRPC listener)")
    p.add_argument("--grpc-port", type=port, default=8081,
                   help="port of the gRPC listener on the same --host, 1-65535 (default 8081)")
    p.add_argument("--usage-log", metavar="FILE", default=None,
                   help="append one JSON line per finished LLM request (tenant, model, tokens, outcome): the "
                        "per-request billing record; '-' for stdout (default: off)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inferwatch.exporters.gateway.api import Gateway
    from inferwatch.exporters.gateway.proxy import Proxy
    from inferwatch.exporters.gateway.server import run_forever, usage_writer

    if args.port == args.metrics_port:
        raise UsageError(f"--port and --metrics-port must differ (both {args.port})")
    if args.grpc_upstream is not None:
        check_grpc_upstream(args.grpc_upstream)
        if args.grpc_port in (args.port, args.metrics_port):
            raise UsageError(f"--grpc-port must differ from --port and --metrics-port (all {args.grpc_port})")
    spec = load_spec(args.spec)
    urls = upstream_urls(spec, args.upstream)
    if args.grpc_upstream is not None:
        check_grpc_fleet(spec)
    tls = grpc_tls(spec) if args.grpc_upstream is not None else None
    for secret in spec.gateway.otlp.headers.values():
        secret.reveal()  # a header that cannot be resolved stops the start here, not in a worker (SpecError)

    def grpc_kwargs(gateway) -> dict:
        if args.grpc_upstream is None:
            return {}
        from inferwatch.exporters.gateway.grpcproxy import GrpcProxy

        cert, key = tls if tls is not None else (None, None)
        return {"grpc_proxy": GrpcProxy(gateway, args.grpc_upstream, certificate=cert, private_key=key),
                "grpc_port": args.grpc_port}

    sink = None
    if args.usage_log:
        try:
            fd = sys.stdout.fileno() if args.usage_log == "-" else os.open(
                args.usage_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise UsageError(f"--usage-log: cannot open {args.usage_log}: {exc.strerror}") from None
        sink = usage_writer(fd)

    def handler(gateway):
        if isinstance(urls, str):
            return Proxy(gateway, urls)
        from inferwatch.exporters.gateway.router import Router

        return Router(gateway, urls)

    if args.workers == 1:
        gateway = Gateway(spec, usage_sink=sink)
        try:
            run_forever(handler(gateway), args.host, args.port, args.metrics_port, **grpc_kwargs(gateway))
        finally:
            gateway.close()
        return 0
    import asyncio

    from inferwatch.exporters.gateway.server import serve_metrics
    from inferwatch.exporters.gateway.workers import run_workers, worker_ready

    def start_worker() -> None:
        # Built in the worker, after the fork: its metrics must be the multiprocess kind (workers.py).
        gateway = Gateway(spec, usage_sink=sink)
        try:
            run_forever(handler(gateway), args.host, args.port, None, reuse_port=True,
                        on_ready=lambda *_: worker_ready(), **grpc_kwargs(gateway))
        finally:
            gateway.close()

    def metrics(registry, stop: asyncio.Event):
        return serve_metrics(registry, args.host, args.metrics_port, stop)

    return run_workers(args.workers, start_worker, metrics)


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of workers 1-64, got {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"expected a number of workers 1-64, got {value}")
    return value


def upstream_urls(spec, given: list[str]) -> str | dict[str, str]:
    """The one upstream URL (no `upstreams` in the spec: exactly one --upstream URL), or every upstream's
    URL by name: the spec's, replaced by each `--upstream NAME=URL`. Raises UsageError (never echoing a URL:
    it may hold credentials)."""
    if not spec.upstreams:
        if len(given) != 1:
            raise UsageError("--upstream: expected one URL (or list several servers in the spec's `upstreams`)")
        check_upstream(given[0])
        return given[0]
    urls = {name: up.url for name, up in spec.upstreams.items()}
    for value in given:
        name, sep, url = value.partition("=")
        if not sep or "://" in name:
            raise UsageError("--upstream: with the spec's `upstreams`, expected NAME=URL (the value given is not "
                             "shown: it may hold credentials)")
        if name not in urls:
            raise UsageError(f"--upstream: {name!r} is not in the spec's upstreams "
                             f"({', '.join(spec.upstreams)})")
        check_upstream(url)
        urls[name] = url
    return urls


def check_upstream(url: str) -> None:
    """Raise UsageError unless `url` is an http(s) URL with a host and a valid port. The message never
    echoes the value whole: it may hold credentials (user:password@)."""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # .port raises ValueError when it is not 0-65535
    except ValueError as exc:
        raise UsageError(f"--upstream: {exc} (the URL is not shown: it may hold credentials)") from None
    if parts.scheme not in ("http", "https") or not host:
        raise UsageError("--upstream: expected an http(s) URL with a host, such as http://127.0.0.1:8000 "
                         "(the value given is not shown: it may hold credentials)")


def check_grpc_upstream(address: str) -> None:
    """Raise UsageError unless `address` is `host:port` (a gRPC target: no scheme, no path)."""
    host, sep, port_text = address.rpartition(":")
    if "@" in address:
        raise UsageError("--grpc-upstream: expected HOST:PORT without user:password@ (a gRPC target carries no "
                         "credentials; the value given is not shown)")
    if not sep or not host or "/" in address or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise UsageError("--grpc-upstream: expected HOST:PORT, such as 127.0.0.1:8001 or triton:8001 "
                         "(the value given is not shown: it may hold credentials)")


def check_grpc_fleet(spec) -> None:
    """Raise UsageError where `--grpc-upstream` and the spec's `upstreams` do not combine. The gRPC listener
    forwards every call to its one address (calls are not routed by model), so the spec may name at most one
    Triton server: with several, a call for a model of another Triton would get this one's NOT_FOUND; with
    none, the address is a Triton the spec does not know (its models are no upstream's). Without `upstreams`
    (every model is Triton's) anything goes."""
    if not spec.upstreams:
        return
    tritons = [name for name, up in spec.upstreams.items() if up.kind == "triton"]
    if len(tritons) > 1:
        raise UsageError(f"--grpc-upstream: the spec's upstreams list {len(tritons)} Triton servers "
                         f"({', '.join(tritons)}), and the gRPC listener forwards every call to one address (it "
                         f"does not route calls by model): run one gateway per Triton for gRPC clients")
    if not tritons:
        raise UsageError("--grpc-upstream: the spec's upstreams list no Triton server (kind: triton), and gRPC "
                         "is Triton's API: add the Triton that --grpc-upstream points at to `upstreams`")


def grpc_tls(spec) -> tuple[bytes, bytes] | None:
    """(certificate chain, private key) PEM bytes from the spec's gateway.grpc_*_file, or None (h2c).
    Raises UsageError naming the file that cannot be read (never its content)."""
    settings = spec.gateway
    if not settings.grpc_certificate_file:
        return None
    out = []
    for name in ("grpc_certificate_file", "grpc_private_key_file"):
        path = getattr(settings, name)
        try:
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError as exc:
            raise UsageError(f"gateway.{name}: cannot read {path}: {exc.strerror}") from None
    return out[0], out[1]
