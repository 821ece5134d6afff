"""Which requests are LLM requests, and how each protocol's responses reveal tokens and errors.

Routes (everything else passes through unmetered):
- Triton `POST /v2/models/<m>[/versions/<v>]/generate_stream` (SSE) and `/generate`, `/infer` (JSON);
- OpenAI-compatible `POST /v1/chat/completions` and `/v1/completions`, streamed when the body says
  `"stream": true`.

Wire facts (research/llm_metrics.md §6): Triton streams `data: {json}\\n\\n` per response with no `[DONE]`;
an error after the stream began is `data: {"error": ...}` under HTTP 200, and a non-streamed `/generate`
may also answer 200 with an `error` body. OpenAI streams end with `data: [DONE]`; with
`stream_options.include_usage` a last chunk with empty `choices` carries `usage`, and an interrupted
stream may never send it; a stream without `[DONE]` is incomplete (an error).
"""

from __future__ import annotations

import dataclasses
import json
import re

from inferwatch.exporters.gateway.meter import RequestMeter

_TRITON_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/(generate_stream|generate|infer)$")
_OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions")
# Triton output carrying the cumulative exact token count (toy_llm; name it the same in your model).
COUNT_FIELD = b'"output_token_count":'
INPUT_COUNT_FIELD = b'"input_token_count":'


@dataclasses.dataclass(frozen=True)
class Route:
    """A metered request: `protocol` is "triton" or "openai"; `model` as the client named it (or None)."""

    protocol: str
    endpoint: str
    model: str | None


def classify(method: str, path: str, body: bytes) -> Route | None:
    """The Route of a request, or None when the gateway only passes it through."""
    if method != "POST":
        return None
    m = _TRITON_PATH.match(path)
    if m:
        return Route("triton", m.group(2), m.group(1))
    if path in _OPENAI_PATHS:
        model = None
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("model"), str):
            model = doc["model"]
        return Route("openai", path.rsplit("/", 1)[1], model)
    return None


def _int_after(data: bytes, field: bytes) -> int | None:
    """The integer that follows `"field":` in JSON bytes (scalar or first array element), without parsing JSON.

    Safe because a key with its quotes and colon cannot occur unescaped inside a JSON string.
    """
    i = data.find(field)
    if i < 0:
        return None
    i += len(field)
    n = len(data)
    while i < n and data[i] in b" [":
        i += 1
    j = i
    while j < n and 48 <= data[j] <= 57:
        j += 1
    return int(data[i:j]) if j > i else None


def _is_error(data: bytes) -> bool:
    if b'"error"' not in data:  # cheap guard: most events never mention it
        return False
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return isinstance(doc, dict) and bool(doc.get("error"))


class TritonEvents:
    """Reads Triton generate responses. With the count field every event's tokens are exact
    (cumulative count minus the previous one); without it, an event with non-empty `text_output` is one token.
    """

    __slots__ = ("meter", "error", "complete", "_cumulative")

    def __init__(self, meter: RequestMeter):
        self.meter = meter
        self.error = False
        self.complete = True  # a Triton stream has no end marker: ending cleanly is completion
        self._cumulative = 0

    def event(self, data: bytes, now: float) -> None:
        if _is_error(data):
            self.error = True
            return
        total = _int_after(data, COUNT_FIELD)
        if total is not None:
            n = total - self._cumulative
            self._cumulative = total
            self.meter.set_exact_output_tokens(total, "count_field")
            self.meter.tokens(n, now)
        elif b'"text_output"' in data and b'"text_output":""' not in data:
            self.meter.tokens(1, now)
        if not self.meter.input_tokens:
            inputs = _int_after(data, INPUT_COUNT_FIELD)
            if inputs:
                self.meter.input_tokens = inputs

    def body(self, data: bytes, now: float) -> None:
        """A whole non-streamed response (/generate or /infer)."""
        if _is_error(data):
            self.error = True
            return
        total = _int_after(data, COUNT_FIELD)
        if total is None and b'"outputs"' in data:
            total = _infer_output_count(data)
        if total is not None:
            self.meter.set_exact_output_tokens(total, "count_field")
            self.meter.tokens(total, now)
        inputs = _int_after(data, INPUT_COUNT_FIELD)
        if inputs:
            self.meter.input_tokens = inputs


def _infer_output_count(data: bytes) -> int | None:
    """`output_token_count` from a KServe v2 /infer response: {"outputs": [{"name", "data": [N]}]}."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    for out in doc.get("outputs") or () if isinstance(doc, dict) else ():
        if isinstance(out, dict) and out.get("name") == "output_token_count":
            values = out.get("data") or [None]
            return values[-1] if isinstance(values[-1], int) else None
    return None


def _choice_tokens(choice: dict) -> int:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        has = delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls") \
            or delta.get("refusal")
    else:
        has = choice.get("text")
    if not has:
        return 0
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        # Token-level logprobs list one entry per token: an exact count for a multi-token chunk.
        listed = logprobs.get("content") or logprobs.get("tokens")
        if isinstance(listed, list) and listed:
            return len(listed)
    return 1


class OpenAIEvents:
    """Reads OpenAI-compatible chunks. Tokens per event: the cumulative `usage.completion_tokens` delta when
    the upstream sends usage on every chunk (vLLM `continuous_usage_stats`), else the number of token
    logprobs, else one per non-empty choice. A final `usage` makes the request's total exact.
    """

    __slots__ = ("meter", "error", "complete", "_usage_cumulative")

    def __init__(self, meter: RequestMeter):
        self.meter = meter
        self.error = False
        self.complete = False  # until [DONE]
        self._usage_cumulative = 0

    def event(self, data: bytes, now: float) -> None:
        if data == b"[DONE]":
            self.complete = True
            return
        doc = self._document(data)
        if doc is None:
            return
        n = 0
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict):
                n += _choice_tokens(choice)
        total = self._usage(doc.get("usage"))
        if total is not None:
            delta = total - self._usage_cumulative
            self._usage_cumulative = total
            if n and delta > 0:
                n = delta
        self.meter.tokens(n, now)

    def body(self, data: bytes, now: float) -> None:
        doc = self._document(data)
        if doc is None:
            return
        total = self._usage(doc.get("usage"))
        if total:
            self.meter.tokens(total, now)

    def _document(self, data: bytes) -> dict | None:
        """The JSON object in `data`; None when it is not one, or when it is an error (then sets `error`)."""
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        if doc.get("error"):
            self.error = True
            return None
        return doc

    def _usage(self, usage) -> int | None:
        if not isinstance(usage, dict):
            return None
        prompt = usage.get("prompt_tokens")
        if isinstance(prompt, int):
            self.meter.input_tokens = prompt
        completion = usage.get("completion_tokens")
        if isinstance(completion, int):
            self.meter.set_exact_output_tokens(completion, "usage")
            return completion
        return None


def reader_for(route: Route, meter: RequestMeter):
    return TritonEvents(meter) if route.protocol == "triton" else OpenAIEvents(meter)
