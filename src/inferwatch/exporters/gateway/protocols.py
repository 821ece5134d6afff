"""How each protocol's responses reveal tokens, errors and a complete end (routes.py says which are metered).

What counts as generated output (one rule, so a field a server renames or adds is not silently dropped):
- OpenAI-compatible chat chunk: a choice whose `delta` has any non-empty field other than `role`
  (`content`, `reasoning_content`, `reasoning`, `tool_calls`, `function_call`, `refusal`, `audio`, and
  whatever comes next); "", null, [] and {} are empty. A completions chunk: a non-empty `choices[].text`.
- Triton: an event with a non-empty `text_output`, or the model's cumulative `output_token_count`.

What ends a stream well (else it is an error, `truncated`):
- OpenAI-compatible: `data: [DONE]`, or a clean end of the body after every choice seen got a
  `finish_reason` (several servers close the stream without `[DONE]`).
- Triton: a clean end of the body (Triton sends no end marker).

What makes the answer complete when the client leaves before the body's end (`answered`; then it is not
`cancelled`): OpenAI-compatible, `[DONE]` relayed, or every choice's finish_reason and then a `usage` object;
Triton, nothing (no end marker tells it).

Errors: an event or body in any shape below, or an SSE event named `error`. Its `code` and
`type` are kept:
- OpenAI / vLLM nested `{"error": {"message", "type", "code"}}`;
- vLLM's flat ErrorResponse `{"object": "error", "message", "type", "code"}`;
- TGI `{"error": "...", "error_type": "..."}`; Triton `{"error": "..."}` (neither code nor type);
- Anthropic `{"type": "error", "error": {"type", "message"}}`; OpenAI Responses `{"type": "error", "code",
  "message"}`.

Wire facts (docs/gateway-apis.md, "Which servers are metered how"): Triton streams `data: {json}\\n\\n`
per response with no `[DONE]`; an error after the stream began is `data: {"error": ...}` under HTTP 200, and
a non-streamed `/generate` may also answer 200 with an `error` body. OpenAI streams end with `data: [DONE]`; with
`stream_options.include_usage` a last chunk with empty `choices` carries `usage`, and an interrupted stream
may never send it.
"""

from __future__ import annotations

import json
import re

from inferwatch.exporters.gateway.counts import cumulative_count, part_count, token_count
from inferwatch.exporters.gateway.meter import RequestMeter
from inferwatch.exporters.gateway.sse import ErrorEvent

# Triton output carrying the cumulative exact token count (toy_llm; name it the same in your model).
COUNT_FIELD = b'"output_token_count":'
INPUT_COUNT_FIELD = b'"input_token_count":'
# Delta fields that describe a chunk rather than carry generated output.
NOT_OUTPUT = frozenset(("role",))


def _count_after(data: bytes, field: bytes, name: str, earlier: int | None = None) -> int | None:
    """The count that follows `"field":` in JSON bytes (scalar or first array element), without parsing the
    document: None when the field is absent or null; raises InvalidCount (counts.py) for any other value
    that is not a count, and for one below `earlier` (a cumulative count going back).

    Safe because a key with its quotes and colon cannot occur unescaped inside a JSON string."""
    i = data.find(field)
    if i < 0:
        return None
    found = _VALUE_AT.match(data, i + len(field))  # a C match where the value starts: once per event
    token = found.group(1) if found is not None else b""  # (the pattern matches the empty string too)
    value: object
    if token.isdigit() and len(token) < 10:
        value = int(token)  # the usual case, below MAX_TOKENS by its length
    else:
        try:
            value = json.loads(token)
        except ValueError:  # a string, object or anything else that is not a JSON scalar on its own
            value = token.decode("utf-8", "replace")
    return token_count(value, name) if earlier is None else cumulative_count(value, earlier, name)


_VALUE_AT = re.compile(rb"[ \[]*([^,\]}\s]*)")


def parse_json(data: bytes):
    """The JSON value in an event's data or a body; raises ValueError when it is not JSON.

    An event stream is UTF-8, and a client decodes it replacing each invalid sequence with U+FFFD (WHATWG
    HTML §9.2.6, "UTF-8 decode"): an event with a broken byte is still the event the client sees, so it is
    read (and its tokens counted) the same way. json.loads on bytes would refuse it instead. A value nested
    deeper than the interpreter's recursion limit (`[[[[...]]]]`, a few bytes per level) is refused as well:
    json.loads raises RecursionError for it, which no caller would take for "not JSON"."""
    try:
        try:
            return json.loads(data)
        except UnicodeDecodeError:
            return json.loads(data.decode("utf-8", "replace"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


class Reader:
    """What every protocol reader records: an error (with the upstream's code and type) and completeness."""

    __slots__ = ("meter", "error", "error_code", "error_type", "complete")

    def __init__(self, meter: RequestMeter, complete: bool):
        self.meter = meter
        self.error = False
        self.error_code: int | str | None = None
        self.error_type: str | None = None
        self.complete = complete

    def _fail(self, doc) -> None:
        """Record an error from a JSON document (or None when the error's body is not JSON)."""
        self.error = True
        code, kind = error_fields(doc)
        if isinstance(code, (int, str)) and not isinstance(code, bool):
            self.error_code = code if isinstance(code, int) else code[:64]
        if isinstance(kind, str):
            self.error_type = kind[:64]

    def event(self, data: bytes, now: float) -> None:
        """One stream event's data (an ErrorEvent for an event named `error`), arrived at `now`."""
        raise NotImplementedError

    def body(self, data: bytes, now: float) -> None:
        """A whole non-streamed answer under a status below 400."""
        raise NotImplementedError

    @property
    def ended_well(self) -> bool:
        return self.complete

    @property
    def answered(self) -> bool:
        """The whole answer reached the client: its end marker (or what a complete answer ends with) was
        relayed, so a client hanging up afterwards (the `openai` client closes the response at `[DONE]`,
        before the body's end) did not cancel anything. False for a protocol without an end marker."""
        return False

    def _error_event(self, data: bytes) -> None:
        """An `event: error` (its data may be the error object itself) or an error body."""
        try:
            doc = parse_json(data)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and not is_error_doc(doc):
            doc = {"error": doc}  # the event's name says it is an error: its data is the error object
        self._fail(doc)

    def error_body(self, data: bytes) -> None:
        """An error answer (HTTP status ≥ 400): keep its code and type when it says them."""
        if b'"error' in data:
            self._error_event(data)


class MarkedReader(Reader):
    """A reader of a protocol whose streams end with an end marker (Responses `response.completed`, Messages
    `message_stop`): `complete` records the marker, so the answer is answered once it was relayed."""

    __slots__ = ()

    @property
    def answered(self) -> bool:
        return self.complete


def is_error_doc(doc) -> bool:
    """Whether a parsed event or body is an error object, in any shape a server sends one (module
    docstring, "Errors")."""
    return isinstance(doc, dict) and bool(doc.get("error") or doc.get("object") == "error"
                                          or doc.get("type") == "error")


def error_fields(doc) -> tuple[object, object]:
    """(code, type) of an error object as its shape names them (module docstring, "Errors"), unchecked;
    (None, None) for a document that is not JSON."""
    if not isinstance(doc, dict):
        return None, None
    err = doc.get("error")
    if isinstance(err, dict):  # OpenAI / vLLM nested, Anthropic `{"type": "error", "error": {...}}`
        return err.get("code"), err.get("type")
    if err:  # TGI `{"error": "...", "error_type": ...}`, Triton `{"error": "..."}`
        return None, doc.get("error_type")
    if doc.get("object") == "error":  # vLLM's flat ErrorResponse
        return doc.get("code"), doc.get("type")
    # Responses API `{"type": "error", "code": ..., "message": ...}`; a bare `event: error` data object.
    kind = doc.get("type")
    return doc.get("code"), kind if kind != "error" else None


def _is_error(data: bytes):
    """The parsed document when `data` is an error object, else None (cheap guard first)."""
    if b'"error' not in data:  # most events never mention it
        return None
    try:
        doc = parse_json(data)
    except ValueError:
        return None
    return doc if is_error_doc(doc) else None


class TritonEvents(Reader):
    """Reads Triton generate responses. With the count field every event's tokens are exact
    (cumulative count minus the previous one); without it, an event with non-empty `text_output` is one token.
    """

    __slots__ = ("_cumulative",)

    def __init__(self, meter: RequestMeter):
        super().__init__(meter, complete=True)  # no end marker: ending cleanly is completion
        self._cumulative = 0

    def event(self, data: bytes, now: float) -> None:
        if type(data) is ErrorEvent:
            self._error_event(data)
            return
        if b'"error"' in data:  # most events never mention it: parse only those that do
            doc = _is_error(data)
            if doc is not None:
                self._fail(doc)
                return
        total = _count_after(data, COUNT_FIELD, "output_token_count", self._cumulative)
        if total is not None:
            n = total - self._cumulative
            self._cumulative = total
            self.meter.set_exact_output_tokens(total, "count_field")
            self.meter.tokens(n, now)
        elif b'"text_output"' in data and b'"text_output":""' not in data:
            self.meter.tokens(1, now, 0, False)  # one per event: an estimate (an event may hold several)
        if self.meter.input_tokens is None and INPUT_COUNT_FIELD in data:
            self.meter.input_tokens = _count_after(data, INPUT_COUNT_FIELD, "input_token_count")

    def body(self, data: bytes, now: float) -> None:
        """A whole non-streamed response (/generate or /infer)."""
        doc = _is_error(data)
        if doc is not None:
            self._fail(doc)
            return
        total = _count_after(data, COUNT_FIELD, "output_token_count")
        if total is None and b'"outputs"' in data:
            total = _infer_output_count(data)
        if total is not None:
            self.meter.set_exact_output_tokens(total, "count_field")
            self.meter.tokens(total, now)
        inputs = _count_after(data, INPUT_COUNT_FIELD, "input_token_count")
        if inputs is None and b'"outputs"' in data:
            inputs = _infer_output_count(data, "input_token_count")
        if inputs is not None:
            self.meter.input_tokens = inputs


def _infer_output_count(data: bytes, name: str = "output_token_count") -> int | None:
    """The count output `name` of a KServe v2 /infer response: {"outputs": [{"name", "data": [N]}]}.
    Raises InvalidCount when its last element is not a count."""
    try:
        doc = parse_json(data)
    except ValueError:
        return None
    for out in doc.get("outputs") or () if isinstance(doc, dict) else ():
        if isinstance(out, dict) and out.get("name") == name:
            values = out.get("data")
            if not isinstance(values, list) or not values:
                return None
            return token_count(values[-1], f"outputs.{name}")
    return None


def _choice_tokens(choice: dict) -> tuple[int, bool]:
    """(tokens, exact) of one chunk's choice: 0 without generated output; the number of its token logprobs
    (exact), else 1 (an estimate: a chunk may carry several tokens)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for key, value in delta.items():
            if value and key not in NOT_OUTPUT:
                break
        else:
            return 0, True
    elif not choice.get("text"):
        return 0, True
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        # Token-level logprobs list one entry per token: an exact count for a multi-token chunk.
        listed = logprobs.get("content") or logprobs.get("tokens")
        if isinstance(listed, list) and listed:
            return len(listed), True
    return 1, False


class OpenAIEvents(Reader):
    """Reads OpenAI-compatible chunks. Tokens per event: the cumulative `usage.completion_tokens` delta when
    the upstream sends usage on every chunk (vLLM `continuous_usage_stats`), else the number of token
    logprobs, else one per choice with generated output. A final `usage` makes the request's total exact.
    """

    __slots__ = ("_usage_cumulative", "_unfinished", "_finished", "_final_usage")

    def __init__(self, meter: RequestMeter):
        super().__init__(meter, complete=False)  # until [DONE], or every choice's finish_reason
        self._usage_cumulative = 0
        self._unfinished: set = set()
        self._finished = False
        self._final_usage = False  # a usage object arrived once every choice had finished

    def event(self, data: bytes, now: float) -> None:
        if data[:6] == b"[DONE]":
            # The end marker as the official client reads it (openai-python _streaming.py:
            # `sse.data.startswith("[DONE]")`): what ends the client's stream ends the answer.
            self.complete = True
            return
        if type(data) is ErrorEvent:
            self._error_event(data)
            return
        doc = self._document(data)
        if doc is None:
            return
        choices = doc.get("choices") or ()
        total = self._usage(doc.get("usage"))
        delta = 0
        if total is not None:
            delta = total - self._usage_cumulative
            self._usage_cumulative = total
        tokens = self.meter.tokens
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            n, exact = _choice_tokens(choice)
            index = choice.get("index", 0)
            if n and delta > 0 and len(choices) == 1:
                n, exact = delta, True  # a running usage (vLLM continuous_usage_stats): this chunk's count
            if choice.get("finish_reason"):
                self._unfinished.discard(index)
                self._finished = True
            elif isinstance(index, int):
                self._unfinished.add(index)
            # Each choice is its own sequence (meter.py): interleaved choices are not one faster stream.
            tokens(n, now, index if type(index) is int and index > 0 else 0, exact)
        if total is not None and self._finished and not self._unfinished:
            self._final_usage = True

    @property
    def ended_well(self) -> bool:
        """The stream said it was complete: [DONE], or a finish_reason for every choice it opened."""
        return self.complete or (self._finished and not self._unfinished)

    @property
    def answered(self) -> bool:
        """[DONE] was relayed, or every choice's finish_reason and then the usage that ends the answer."""
        return self.complete or self._final_usage

    def body(self, data: bytes, now: float) -> None:
        doc = self._document(data)
        if doc is None:
            return
        total = self._usage(doc.get("usage"))
        if total:
            self.meter.tokens(total, now)

    def _document(self, data: bytes) -> dict | None:
        """The JSON object in `data`; None when it is not one, or when it is an error (then records it)."""
        try:
            doc = parse_json(data)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        if doc.get("error") or doc.get("object") == "error":
            self._fail(doc)
            return None
        return doc

    def _usage(self, usage) -> int | None:
        """The output count of a `usage` object (cumulative over a stream), recording the input count too.
        Raises InvalidCount (counts.py) for a count that is not one."""
        if not isinstance(usage, dict):
            return None
        meter = self.meter
        prompt = token_count(usage.get("prompt_tokens"), "usage.prompt_tokens")
        if prompt is not None:
            meter.input_tokens = prompt
        completion = cumulative_count(usage.get("completion_tokens"), self._usage_cumulative,
                                      "usage.completion_tokens")
        if completion is not None:
            meter.set_exact_output_tokens(completion, "usage")
        # Token types (docs/cost-and-budgets.md): parts of prompt_tokens / completion_tokens, when reported.
        details = usage.get("prompt_tokens_details")
        if details is not None:
            meter.set_detail(0, part_count(details, "cached_tokens", prompt,
                                           "usage.prompt_tokens_details.cached_tokens"))
        details = usage.get("completion_tokens_details")
        if details is not None:
            meter.set_detail(2, part_count(details, "reasoning_tokens", completion,
                                           "usage.completion_tokens_details.reasoning_tokens"))
        return completion
