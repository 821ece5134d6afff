"""The OpenAI Responses API (`POST /v1/responses`; OpenAI, vLLM, others): what its answer says.

Stream (OpenAI API reference, "Streaming events"; every event is `event: <type>` + `data: {"type": <type>,
"sequence_number", ...}`, and there is no `[DONE]`):
- generated output: any `response.*.delta` event with a non-empty `delta` (`response.output_text.delta`,
  `response.reasoning_text.delta`, `response.reasoning_summary_text.delta`, `response.refusal.delta`,
  `response.function_call_arguments.delta`, `response.audio.delta`, `response.audio.transcript.delta`, and
  whatever `.delta` comes next), one chunk each of unknown token count; output items follow each other, so
  the answer is one sequence;
- the end: `response.completed` or `response.incomplete` (stopped at `max_output_tokens`, a whole answer as
  a `length` finish is) carry `response.usage` {`input_tokens`, `output_tokens`} (exact; output includes
  reasoning tokens), with `input_tokens_details.cached_tokens` and `output_tokens_details.reasoning_tokens`
  (parts of them) when the server reports them; `response.failed` ends it as an error with `response.error.code`;
- errors: an `error` event `{"type": "error", "code", "message", "param"}` (protocols.py "Errors").
A stream that ends without one of the three terminal events was truncated.

Not streamed: the Response object, `usage` as above, `status` "failed" with its `error` is an error.
"""

from __future__ import annotations

from inferwatch.exporters.gateway.counts import part_count, token_count
from inferwatch.exporters.gateway.meter import RequestMeter
from inferwatch.exporters.gateway.protocols import MarkedReader, is_error_doc, parse_json
from inferwatch.exporters.gateway.sse import ErrorEvent

TERMINAL_OK = frozenset(("response.completed", "response.incomplete"))
FAILED = "response.failed"


class ResponsesEvents(MarkedReader):
    """Reads a Responses API stream or body (module docstring)."""

    __slots__ = ()

    def __init__(self, meter: RequestMeter):
        super().__init__(meter, complete=False)  # until a terminal event

    def event(self, data: bytes, now: float) -> None:
        if type(data) is ErrorEvent:
            self._error_event(data)
            return
        try:
            doc = parse_json(data)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        kind = doc.get("type")
        if isinstance(kind, str) and kind.endswith(".delta"):
            if doc.get("delta"):
                self.meter.tokens(1, now, 0, False)
            return
        if kind in TERMINAL_OK or kind == FAILED:
            response = doc.get("response")
            self._response(response if isinstance(response, dict) else {})
            self.complete = True
        elif is_error_doc(doc):
            self._fail(doc)

    def body(self, data: bytes, now: float) -> None:
        try:
            doc = parse_json(data)
        except ValueError:
            return
        if isinstance(doc, dict):
            self._response(doc)

    def _response(self, response: dict) -> None:
        """A Response object: its usage (exact) and, when it failed, its error. Raises InvalidCount."""
        if response.get("status") == "failed" or response.get("error"):
            self._fail(response if response.get("error") else {"error": {"code": "failed"}})
        usage = response.get("usage")
        if not isinstance(usage, dict):
            return
        inputs = token_count(usage.get("input_tokens"), "usage.input_tokens")
        if inputs is not None:
            self.meter.input_tokens = inputs
        outputs = token_count(usage.get("output_tokens"), "usage.output_tokens")
        if outputs is not None:
            self.meter.set_exact_output_tokens(outputs, "usage")
        self.meter.set_detail(0, part_count(usage.get("input_tokens_details"), "cached_tokens", inputs,
                                            "usage.input_tokens_details.cached_tokens"))
        self.meter.set_detail(2, part_count(usage.get("output_tokens_details"), "reasoning_tokens", outputs,
                                            "usage.output_tokens_details.reasoning_tokens"))
