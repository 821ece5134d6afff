"""Metering of Triton's gRPC API (`inference.GRPCInferenceService`) from copies of the messages a call carries.

The gRPC listener (grpcproxy.py) forwards every message unchanged and hands a copy of each to a `CallMeter`,
which decodes only what metering needs with the service definition's own message classes (shipped with
`tritonclient`): a request's `model_name` and `id`, a response's `id`, `error_message`, its outputs
`output_token_count` / `input_token_count` / `text_output`, and the `triton_final_response` parameter.

Which calls are LLM calls (the HTTP rule of routes.py, read for gRPC):
- `ModelStreamInfer` (the bidirectional stream decoupled models answer on): every model when the spec's
  `gateway.llm_models` is unset, else the models it lists;
- `ModelInfer` (unary): only the models `gateway.llm_models` lists;
- every other RPC is forwarded and counted (`gateway_grpc_calls_total`), not metered.

One stream may carry several requests; each is metered on its own, keyed by its request `id` (Triton copies
it into every response, error responses included). Requests without an id are matched first in, first out.
Per request, as on the HTTP `generate_stream` path (protocols.TritonEvents):
- TTFT: arrival of the request message → the first response carrying output; ITL between such responses;
- tokens: the model's cumulative `output_token_count` output (exact, method `count_field`), else one token
  per response with a non-empty `text_output` (method `events`); input tokens from `input_token_count`;
- end: a response whose `triton_final_response` parameter is true (Triton sets it on every streamed
  response), an in-stream `error_message` (outcome `error`), or the end of the call: status OK completes
  what is open (Triton sends no final response for a request whose model sent its final flag alone, unless
  the client asked for an empty final response), CANCELLED is `cancelled`, DEADLINE_EXCEEDED `timeout`,
  anything else `error`.

The `code` label of gateway_requests_total is the HTTP status equivalent to the gRPC status
(`HTTP_STATUS_OF`, the mapping grpc-gateway's runtime.HTTPStatusFromCode uses), so rules and dashboards read
gRPC traffic exactly as HTTP traffic; an in-stream error is code 200 with outcome `error`, as an error event in
an HTTP stream is.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Iterable

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from inferwatch.exporters.gateway.counts import BACKWARDS, MAX_TOKENS, InvalidCount, token_count
from inferwatch.exporters.gateway.labels import LabelPolicy
from inferwatch.exporters.gateway.meter import RequestMeter, Usage
from inferwatch.exporters.gateway.metrics import GatewayMetrics

SERVICE = "inference.GRPCInferenceService"
STREAM_INFER = f"/{SERVICE}/ModelStreamInfer"
INFER = f"/{SERVICE}/ModelInfer"
COUNT_OUTPUT = "output_token_count"
INPUT_COUNT_OUTPUT = "input_token_count"
TEXT_OUTPUT = "text_output"
FINAL_PARAMETER = "triton_final_response"

# gRPC status → the HTTP status a REST client would have seen (grpc-gateway runtime.HTTPStatusFromCode;
# CANCELLED as nginx's 499, client closed request).
HTTP_STATUS_OF = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409, grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
_OUTCOME_OF = {grpc.StatusCode.OK: "ok", grpc.StatusCode.CANCELLED: "cancelled",
               grpc.StatusCode.DEADLINE_EXCEEDED: "timeout"}
# Little-endian element sizes of the integer types a count output may have (KServe v2 raw tensor layout).
_INT_SIZES = {"INT32": 4, "INT64": 8, "UINT32": 4, "UINT64": 8, "INT16": 2, "UINT16": 2, "INT8": 1, "UINT8": 1}


_COUNT_FIELD = f"outputs.{COUNT_OUTPUT}"
_INPUT_COUNT_FIELD = f"outputs.{INPUT_COUNT_OUTPUT}"
_stream_response = service_pb2.ModelStreamInferResponse.FromString
_infer_response = service_pb2.ModelInferResponse.FromString


def _tensor_last_int(output, raw: bytes | None):
    """The last element of an integer output tensor (raw little-endian bytes or typed contents); None when
    the tensor holds no element. Raises InvalidCount for a type that is not an integer."""
    datatype = output.datatype
    size = _INT_SIZES.get(datatype)
    if size is None:
        raise InvalidCount(f"outputs.{output.name}", "not an integer", datatype)
    if raw is not None:
        n = len(raw)
        if n < size:
            return None
        return int.from_bytes(raw[n - size:] if n > size else raw, "little", signed=datatype[0] == "I")
    contents = output.contents
    for values in (contents.int_contents, contents.int64_contents, contents.uint_contents,
                   contents.uint64_contents):
        if len(values):
            return values[-1]
    return None


def _text_nonempty(output, raw: bytes | None) -> bool:
    """Whether a BYTES output holds a non-empty element (raw: 4-byte little-endian length prefixes)."""
    if raw is not None:
        i = 0
        while i + 4 <= len(raw):
            n = int.from_bytes(raw[i:i + 4], "little")
            if n:
                return True
            i += 4 + n
        return False
    return any(output.contents.bytes_contents)


def _count(value, field: str) -> int | None:
    # An int within the count's range is the common case (Triton's INT32 counts), answered without a call
    # into counts.token_count, which decides every other value (and raises its InvalidCount).
    if value.__class__ is int and 0 <= value <= MAX_TOKENS:
        return value
    return token_count(value, field)


def response_readings(response) -> tuple[int | None, int | None, bool]:
    """(cumulative output count or None, input count or None, has non-empty text) of a ModelInferResponse.
    Raises InvalidCount for a count output that is not a count."""
    # Runs once per streamed response: each field of `response` is read once (every read of a upb
    # message's field builds a new Python object).
    raws = response.raw_output_contents
    nraws = len(raws)
    total = inputs = None
    text = False
    i = 0
    for output in response.outputs:
        name = output.name
        if name == COUNT_OUTPUT:
            total = _count(_tensor_last_int(output, raws[i] if i < nraws else None), _COUNT_FIELD)
        elif name == INPUT_COUNT_OUTPUT:
            inputs = _count(_tensor_last_int(output, raws[i] if i < nraws else None), _INPUT_COUNT_FIELD)
        elif name == TEXT_OUTPUT and not text:
            text = _text_nonempty(output, raws[i] if i < nraws else None)
        i += 1
    return total, inputs, text


def _is_final(response) -> bool:
    param = response.parameters.get(FINAL_PARAMETER)
    return param is not None and param.bool_param


class _Request:
    """One metered request of a call: its meter and the cumulative count seen so far."""

    __slots__ = ("meter", "cumulative")

    def __init__(self, meter: RequestMeter):
        self.meter = meter
        self.cumulative = 0


class CallMeter:
    """Meters the requests of one gRPC call. `method` is the full method name (`/inference.…/ModelInfer`),
    `metadata` the client's invocation metadata (lower-case keys, as gRPC requires).

    Feed `request(bytes)` for each client message and `response(bytes)` for each upstream message, then
    `end(code)` once. `usages` lists the billing records of the requests finished so far; `token_trailers()`
    the trailing metadata that carries their counts.
    """

    def __init__(self, method: str, metadata: Iterable[tuple[str, str | bytes]], metrics: GatewayMetrics,
                 labels: LabelPolicy, llm_models: frozenset[str] | None,
                 sink: Callable[[Usage], None] | None = None, clock=time.perf_counter,
                 on_unmetered: Callable[[str, str, str, str], None] | None = None):
        self.streamed = method == STREAM_INFER
        self.metering = self.streamed or method == INFER
        self.metrics = metrics
        self.labels = labels
        self.llm_models = llm_models
        self.sink = sink
        self.clock = clock
        self.on_unmetered = on_unmetered
        headers: dict[str, str] = {}
        for key, value in metadata:
            if isinstance(value, str):
                headers.setdefault(key, value)
        self.headers = headers
        self.by_id: dict[str, collections.deque[_Request]] = {}  # several only under a duplicated id
        self.anonymous: collections.deque[_Request] = collections.deque()
        self.usages: list[Usage] = []
        self.abandoned = False

    def abandon(self, reason: str) -> None:
        """Stop metering this call (`reason`: metrics.UNMETERED_REASONS): its open requests' counts become
        unknown, later messages are not read; `end` still finishes the open requests."""
        self.abandoned = True
        for entry in self._open():
            if entry.meter.unmetered is None:
                entry.meter.stop_metering(reason)
                entry.meter.series.count_unmetered(reason)

    def _is_llm(self, model: str) -> bool:
        if self.llm_models is not None:
            return model in self.llm_models
        return self.streamed

    def request(self, data: bytes, now: float | None = None) -> None:
        """A client message (ModelInferRequest) went upstream."""
        if not self.metering or self.abandoned:
            return
        try:
            message = service_pb2.ModelInferRequest.FromString(data)
        except DecodeError:  # not a ModelInferRequest: Triton refuses it and says why; nothing to meter
            return
        if not self._is_llm(message.model_name):
            return
        series = self.metrics.series(*self.labels.from_headers(self.headers, message.model_name))
        meter = RequestMeter(series, streamed=self.streamed, clock=self.clock,
                             started=self.clock() if now is None else now)
        entry = _Request(meter)
        if not message.id:
            self.anonymous.append(entry)
            return
        same = self.by_id.setdefault(message.id, collections.deque())
        same.append(entry)
        if len(same) > 1:
            # Responses name their request only by id: with two open under one id, no count can be given to
            # either (a client reusing ids must not be billed one request's tokens for three).
            for other in same:
                if other.meter.unmetered is None:
                    other.meter.stop_metering("duplicate_id")
                    other.meter.series.count_unmetered("duplicate_id")

    def _entry(self, request_id: str) -> _Request | None:
        if request_id:
            same = self.by_id.get(request_id)
            return same[0] if same else None
        return self.anonymous[0] if self.anonymous else None

    def _pop(self, request_id: str, entry: _Request) -> None:
        same = self.by_id.get(request_id) if request_id else None
        if same and same[0] is entry:
            same.popleft()
            if not same:
                del self.by_id[request_id]
        elif self.anonymous and self.anonymous[0] is entry:
            self.anonymous.popleft()

    def _open(self) -> list[_Request]:
        return [entry for same in self.by_id.values() for entry in same] + list(self.anonymous)

    def response(self, data: bytes, now: float | None = None) -> None:
        """An upstream message (ModelStreamInferResponse on a stream, ModelInferResponse on ModelInfer)."""
        if self.abandoned or not (self.by_id or self.anonymous):
            return
        if now is None:
            now = self.clock()
        try:
            if self.streamed:
                wrapper = _stream_response(data)
                error, response = wrapper.error_message, wrapper.infer_response
            else:
                error, response = "", _infer_response(data)
        except DecodeError:  # undecodable: the client gets it as sent; its request's counts stay as they are
            return
        request_id = response.id
        entry = self._entry(request_id)
        if entry is None:
            return
        meter = entry.meter
        if error:
            meter.error_type = "triton_error"
            self._pop(request_id, entry)
            self._finish(meter, "error", 200, now)
            return
        if meter.unmetered is None:
            try:
                total, inputs, text = response_readings(response)
                if total is not None and total < entry.cumulative:
                    raise InvalidCount(_COUNT_FIELD, BACKWARDS, total)
            except InvalidCount as exc:
                meter.stop_metering("invalid_count")
                meter.series.count_unmetered("invalid_count")
                if self.on_unmetered is not None:
                    self.on_unmetered("invalid_count", meter.series.key[1], str(exc), exc.value)
            else:
                if total is not None:
                    n = total - entry.cumulative
                    entry.cumulative = total
                    meter.set_exact_output_tokens(total, "count_field")
                    meter.tokens(n, now)
                elif text:
                    meter.tokens(1, now)
                if inputs is not None and meter.input_tokens is None:
                    meter.input_tokens = inputs
        if not self.streamed or _is_final(response):
            self._pop(request_id, entry)
            self._finish(meter, "ok", 200, now)

    def end(self, code: grpc.StatusCode, now: float | None = None) -> None:
        """The call ended with `code` (the status the client got): every request still open ends with it."""
        outcome = _OUTCOME_OF.get(code, "error")
        status = HTTP_STATUS_OF.get(code, 500)
        now = self.clock() if now is None else now
        for entry in self._open():
            if outcome == "error":
                entry.meter.error_type = f"grpc_{code.name.lower()}"
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and entry.meter.unmetered is None:
                # A message above a size limit was dropped: what it carried is unknown, not 0.
                entry.meter.stop_metering("too_large")
                entry.meter.series.count_unmetered("too_large")
            self._finish(entry.meter, outcome, status, now)
        self.by_id.clear()
        self.anonymous.clear()

    def _finish(self, meter: RequestMeter, outcome: str, code: int, now: float) -> None:
        usage = meter.finish(outcome, code, now)
        if usage is not None:
            self.usages.append(usage)
            if self.sink is not None:
                self.sink(usage)

    def token_trailers(self) -> list[tuple[str, str]]:
        """The billing trailers of the call's metered requests, the HTTP gateway's three names in lower case:
        `x-token-used-output` and `x-token-used-input` when every request's count of that kind is known, and
        `x-token-used` (input + output) when both are; none for a call that metered no request (unknown is
        never sent as 0)."""
        if not self.usages:
            return []
        out = [u.output_tokens for u in self.usages]
        inp = [u.input_tokens for u in self.usages]
        trailers = []
        output = sum(out) if None not in out else None  # type: ignore[arg-type]
        inputs = sum(inp) if None not in inp else None  # type: ignore[arg-type]
        if output is not None:
            trailers.append(("x-token-used-output", str(output)))
        if inputs is not None:
            trailers.append(("x-token-used-input", str(inputs)))
        if output is not None and inputs is not None:
            trailers.append(("x-token-used", str(output + inputs)))
        return trailers
