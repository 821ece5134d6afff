"""The gateway's gRPC listener: every RPC of Triton's gRPC API forwarded unchanged, LLM calls metered.

A generic handler takes every method name (Triton's `inference.GRPCInferenceService` and anything else the
upstream serves) and forwards its messages as bytes, never re-encoded, over one HTTP/2 channel to the
upstream's gRPC address: unary calls, server streams and the bidirectional `ModelStreamInfer` alike (on the
wire every gRPC call is a stream of messages). What travels:
- request metadata to the upstream, minus the transport's own keys (`:`-pseudo-headers, `grpc-*`,
  `content-type`, `te`, `user-agent`, `host`); the upstream's initial and trailing metadata back, minus any
  `x-token-used*` of the upstream's (the billing trailers are the gateway's alone);
- the client's deadline (the upstream call gets the time that remains), and cancellation both ways: a client
  that cancels, or whose deadline passes, cancels the upstream call; an upstream that fails ends the
  client's call with the upstream's status and details;
- flow control: one message is read from the upstream only once the previous one was handed to the client's
  transport (`await context.write`), so a slow client slows the upstream stream; nothing is buffered whole.

Limits: a client message above `gateway.max_body_bytes` and an upstream message above
`gateway.max_answer_bytes` are refused by gRPC itself (RESOURCE_EXHAUSTED); HTTP/2 windows do not grow (no
BDP probing), so what is held for a client that does not read is bounded per call; at most
`gateway.max_connections` calls are held: a new call beyond closes the one idle longest (RESOURCE_EXHAUSTED to
it), and a call on which no message moved either way for `gateway.upstream_timeout` is closed
(DEADLINE_EXCEEDED), both counted in gateway_grpc_calls_closed_total{reason}. A failure of the gateway's own
channel (Triton unreachable) reaches the client without Triton's address (the log has it).

Metering reads a copy of each message (grpcmeter.py). Metering never costs a client its call: an unexpected
failure while metering (a bug) stops metering that call (reason `meter_error`, logged at most once a minute)
and the forwarding goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import AsyncIterator

import grpc
from prometheus_client import Counter

from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.credentials import UpstreamCredential
from inferwatch.exporters.gateway.grpcmeter import SERVICE, CallMeter
from inferwatch.exporters.gateway.tenancy import Tenancy, TenantRefused
from inferwatch.ratelog import ConditionLog

log = logging.getLogger(__name__)
_bugs = ConditionLog(log)

# Metadata keys the transport owns: gRPC refuses them as call metadata, or sets them itself.
_TRANSPORT_KEYS = frozenset(("content-type", "te", "user-agent", "host"))
_TOKEN_PREFIX = "x-token-used"  # noqa: S105 (a metadata key, not a secret)
_KNOWN_METHODS = frozenset((
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer", "ModelStreamInfer",
    "ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
    "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting",
    "LogSettings"))


def method_label(method: str) -> str:
    """The bounded `method` label of a full method name: Triton's RPC name, else `other`."""
    service, _, name = method.lstrip("/").partition("/")
    return name if service == SERVICE and name in _KNOWN_METHODS else "other"


def forwarded_metadata(metadata) -> list[tuple[str, str | bytes]]:
    """The client's metadata the upstream gets (the transport's own keys left out)."""
    return [(k, v) for k, v in metadata or () if not k.startswith((":", "grpc-")) and k not in _TRANSPORT_KEYS]


def returned_metadata(metadata) -> list[tuple[str, str | bytes]]:
    """The upstream's metadata the client gets: the transport's keys and the upstream's billing keys left out."""
    return [(k, v) for k, v in forwarded_metadata(metadata) if not k.startswith(_TOKEN_PREFIX)]


class GrpcProxy:
    """Forward every gRPC call to `upstream` (`host:port`, h2c), metering Triton's LLM calls through `gateway`.

    `start(host, port)` binds (port 0: the OS picks; returns the port) and serves on the running loop; TLS
    when `certificate` and `private_key` (PEM bytes) are given. `stop()` ends the calls in progress."""

    def __init__(self, gateway: Gateway, upstream: str, *, certificate: bytes | None = None,
                 private_key: bytes | None = None):
        settings = gateway.spec.gateway
        self.gateway = gateway
        self.upstream = upstream
        self.max_request_bytes = settings.max_body_bytes
        self.max_response_bytes = settings.max_answer_bytes
        self.max_calls = settings.max_connections
        self.credentials = (grpc.ssl_server_credentials([(private_key, certificate)])
                            if certificate is not None and private_key is not None else None)
        llm = gateway.spec.gateway.llm_models
        self.llm_models = frozenset(llm) if llm is not None else None
        self.calls = Counter("gateway_grpc_calls", "gRPC calls forwarded by the gateway, by Triton RPC name (other: "
                             "any other method) and the gRPC status the client got.", ("method", "code"),
                             registry=gateway.metrics.registry)
        self.channel: grpc.aio.Channel | None = None
        self.server: grpc.aio.Server | None = None
        self.port: int | None = None
        self.idle_timeout_s = settings.upstream_timeout.seconds
        self.closed = Counter("gateway_grpc_calls_closed", "gRPC calls the gateway closed itself: reason=idle (no "
                              "message either way for gateway.upstream_timeout), cap (gateway.max_connections "
                              "calls held, this one idle longest).", ("reason",), registry=gateway.metrics.registry)
        self._active: dict[int, _Active] = {}
        self._sweeper: asyncio.Future | None = None
        self.tenancy = Tenancy(gateway.spec)  # who a call is billed to: the HTTP proxy's rules (tenancy.py)
        self.credential = UpstreamCredential(gateway.spec)  # gateway.upstream_authorization (credentials.py)
        self._refusals = ConditionLog(log)

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        self.channel = grpc.aio.insecure_channel(self.upstream, options=[
            ("grpc.max_receive_message_length", self.max_response_bytes),
            ("grpc.max_send_message_length", self.max_request_bytes),
            # No receive window growth (BDP probing): a call's window stays at HTTP/2's 64 KiB, so what Triton
            # sends ahead of a client that does not read is bounded per call, not grown to megabytes.
            ("grpc.http2.bdp_probe", 0)])
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", self.max_request_bytes),
            ("grpc.max_send_message_length", self.max_response_bytes),
            ("grpc.http2.bdp_probe", 0),  # the same bound for what a client sends ahead of a slow Triton
            ("grpc.so_reuseport", 1 if reuse_port else 0)])
        self.server.add_generic_rpc_handlers((_Handler(self),))
        address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        if self.credentials is not None:
            bound = self.server.add_secure_port(address, self.credentials)
        else:
            bound = self.server.add_insecure_port(address)
        if not bound:
            raise OSError(f"gRPC listener: cannot bind {address}")
        await self.server.start()
        self._sweeper = asyncio.ensure_future(self._sweep())
        return bound

    async def stop(self, grace: float | None = 1.0) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            await self.server.stop(grace)
        if self.channel is not None:
            await self.channel.close()

    async def _sweep(self) -> None:
        """Close calls on which no message moved either way for `idle_timeout_s` (a stream that sends and
        receives nothing holds a call slot, and Triton's resources, for nothing)."""
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout_s / 4))
            now = time.monotonic()
            for active in list(self._active.values()):
                if now - active.last > self.idle_timeout_s:
                    self._close(active, "idle", grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no message either way for {self.idle_timeout_s:g} s (gateway.upstream_timeout)")

    def _close(self, active: "_Active", reason: str, code: grpc.StatusCode, details: str) -> None:
        if active.closed is None:
            active.closed = (code, details)
            self.closed.labels(reason).inc()
            self._refusals.log(f"closed:{reason}", logging.INFO, "gRPC call closed by the gateway (%s): %s; "
                               "further ones within a minute are only counted in gateway_grpc_calls_closed_total",
                               reason, details)
            active.task.cancel()

    def _admit(self) -> "_Active":
        """Register the current call; at `max_calls`, the call idle longest is closed to make room (as the HTTP
        side closes the connection idle longest)."""
        if len(self._active) >= self.max_calls:
            oldest = min(self._active.values(), key=lambda a: a.last)
            self._close(oldest, "cap", grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the gateway holds gateway.max_connections ({self.max_calls}) calls and this one was "
                        f"idle longest")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("GrpcProxy.forward outside a task")
        active = self._active[id(task)] = _Active(task)
        return active

    async def forward(self, method: str, requests: AsyncIterator[bytes], context) -> None:
        """Forward one call (the generic handler's body); see the module docstring."""
        metadata = [(k, v) for k, v in context.invocation_metadata() or ()]
        try:
            tenant = self.tenancy.resolve([(k, v) for k, v in metadata if isinstance(v, str)], _peer_ip(context))
        except TenantRefused as exc:
            self._refusals.log(f"tenant:{str(exc)[:40]}", logging.INFO, "refused gRPC %s call from %s: %s",
                               method_label(method), context.peer(), exc)
            self.calls.labels(method_label(method), grpc.StatusCode.INVALID_ARGUMENT.name).inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        metadata = [(k, v) for k, v in metadata if k != self.tenancy.header]
        if tenant is not None:
            metadata.append((self.tenancy.header, tenant))  # lower case: gRPC metadata keys are
        metadata = self.credential.apply(metadata, "authorization")
        meter: CallMeter | None = CallMeter(method, metadata, self.gateway.metrics, self.gateway.labels,
                                            self.llm_models, self.gateway.usage_sink,
                                            on_unmetered=self.gateway._unmetered)

        def metered(fn, message: bytes) -> None:
            nonlocal meter
            if meter is None:
                return
            try:
                fn(message)
            except Exception as exc:  # noqa: BLE001 (a bug in metering: forwarding goes on, this call unmetered)
                meter.abandon("meter_error")
                _bugs.log(f"grpc\0{type(exc).__name__}", logging.ERROR, "gRPC %s: metering failed, the call is "
                          "forwarded unmetered: %s", method_label(method), type(exc).__name__, exc_info=True)

        if self.channel is None:
            raise RuntimeError("GrpcProxy.forward before start()")
        active = self._admit()
        try:
            await self._relay(method, requests, context, metadata, meter, metered, active)
        finally:
            self._active.pop(id(active.task), None)

    async def _relay(self, method, requests, context, metadata, meter, metered, active: "_Active") -> None:
        async def upstream_requests() -> AsyncIterator[bytes]:
            async for message in requests:
                active.last = time.monotonic()
                if meter is not None:
                    metered(meter.request, message)
                yield message

        assert self.channel is not None  # noqa: S101 (checked by forward)
        call = self.channel.stream_stream(method)(upstream_requests(), metadata=forwarded_metadata(metadata),
                                                  timeout=context.time_remaining())
        code, details, trailing = grpc.StatusCode.OK, "", ()
        try:
            initial = await call.initial_metadata()
            if initial:
                await context.send_initial_metadata(returned_metadata(initial))
            async for message in call:
                active.last = time.monotonic()
                if meter is not None:
                    metered(meter.response, message)
                await context.write(message)
            code = await call.code()
            details = await call.details()
            trailing = await call.trailing_metadata() or ()
        except asyncio.CancelledError:
            call.cancel()
            if active.closed is None:
                # The client cancelled, or its deadline passed: the upstream call goes with it.
                left = context.time_remaining()
                code = (grpc.StatusCode.DEADLINE_EXCEEDED if left is not None and left <= 0
                        else grpc.StatusCode.CANCELLED)
                self._end(method, meter, code)
                raise
            code, details = active.closed  # closed by the gateway (idle, or to make room): tell the client
            self._end(method, meter, code)
            context.set_code(code)
            context.set_details(details)
            return
        except grpc.aio.AioRpcError as exc:
            code, details, trailing = exc.code(), exc.details() or "", exc.trailing_metadata() or ()
            if code == grpc.StatusCode.UNAVAILABLE:
                # The gateway's own channel failed (Triton unreachable, or gone mid-call): gRPC's text names
                # Triton's address, which clients must not learn; the log keeps it.
                self._refusals.log(f"upstream:{code.name}", logging.WARNING, "gRPC %s: upstream %s: %s",
                                   method_label(method), code.name, details)
                details = f"upstream {code.name.lower().replace('_', ' ')} (the gateway's log says why)"
        except Exception:  # noqa: BLE001 (the client's side broke mid-call, e.g. ExecuteBatchError once it left)
            call.cancel()
            self._end(method, meter, grpc.StatusCode.CANCELLED)
            return
        self._end(method, meter, code)
        context.set_trailing_metadata(tuple(returned_metadata(trailing))
                                      + tuple(meter.token_trailers() if meter is not None else ()))
        if code != grpc.StatusCode.OK:
            context.set_code(code)
            context.set_details(details)

    def _end(self, method: str, meter: CallMeter | None, code: grpc.StatusCode) -> None:
        self.calls.labels(method_label(method), code.name).inc()
        if meter is not None:
            meter.end(code)


@dataclasses.dataclass
class _Active:
    """A call in progress: its handler task, when a message last moved, and why the gateway closed it."""

    task: asyncio.Task
    last: float = dataclasses.field(default_factory=time.monotonic)
    closed: tuple[grpc.StatusCode, str] | None = None


def _peer_ip(context) -> str | None:
    """The client's IP address from gRPC's peer string (`ipv4:1.2.3.4:5`, `ipv6:[::1]:5`), else None."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return None


class _Handler(grpc.GenericRpcHandler):
    """Every method, as a stream of raw messages both ways (no deserializer: bytes in, bytes out)."""

    def __init__(self, proxy: GrpcProxy):
        self.proxy = proxy

    def service(self, handler_call_details):
        method = handler_call_details.method
        proxy = self.proxy

        async def handle(requests, context):
            await proxy.forward(method, requests, context)

        return grpc.stream_stream_rpc_method_handler(handle)
