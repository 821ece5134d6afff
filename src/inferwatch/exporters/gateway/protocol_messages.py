"""The Anthropic Messages API (`POST /v1/messages`; Anthropic, vLLM, the gateways agents use).

Stream (Anthropic docs, "Streaming Messages"; every event is `event: <type>` + `data: {"type": <type>, ...}`):
- `message_start`: `message.usage.input_tokens` (plus `cache_creation_input_tokens` and
  `cache_read_input_tokens` when present: all prompt tokens, as OpenAI's `prompt_tokens` counts cached ones;
  the two are also kept as the token types cache_creation_input and cached_input, parts of that sum);
- `content_block_delta`: generated output when its `delta` has a non-empty field other than `type`
  (`text_delta` text, `thinking_delta` thinking, `input_json_delta` partial_json, and whatever comes next),
  except `signature_delta` and `citations_delta`, which carry no generated token; one chunk each of unknown
  token count; content blocks follow each other, so the answer is one sequence;
- `message_delta`: `usage.output_tokens`, cumulative (exact);
- `message_stop`: the end marker; a stream that ends without it was truncated;
- `error` (`event: error`, `{"type": "error", "error": {"type": "overloaded_error", "message"}}`): an error
  whose `type` is kept (there is no code); `ping` is ignored.

Not streamed: the Message object with `usage` {`input_tokens`, `output_tokens`}; an error answer is the same
error object under HTTP 4xx/5xx (529 overloaded).
"""

from __future__ import annotations

from inferwatch.exporters.gateway.counts import token_count
from inferwatch.exporters.gateway.meter import RequestMeter
from inferwatch.exporters.gateway.protocols import MarkedReader, is_error_doc, parse_json
from inferwatch.exporters.gateway.sse import ErrorEvent

# Delta types that describe a block rather than carry generated tokens.
NOT_OUTPUT_DELTAS = frozenset(("signature_delta", "citations_delta"))
INPUT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _generated(delta) -> bool:
    if not isinstance(delta, dict) or delta.get("type") in NOT_OUTPUT_DELTAS:
        return False
    return any(value for key, value in delta.items() if key != "type")


class MessagesEvents(MarkedReader):
    """Reads a Messages API stream or body (module docstring)."""

    __slots__ = ()

    def __init__(self, meter: RequestMeter):
        super().__init__(meter, complete=False)  # until message_stop

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
        if kind == "content_block_delta":
            if _generated(doc.get("delta")):
                self.meter.tokens(1, now, 0, False)
        elif kind == "message_delta":
            self._usage(doc.get("usage"))
        elif kind == "message_start":
            message = doc.get("message")
            if isinstance(message, dict):
                self._usage(message.get("usage"), outputs=False)
        elif kind == "message_stop":
            self.complete = True
        elif is_error_doc(doc):
            self._fail(doc)

    def body(self, data: bytes, now: float) -> None:
        try:
            doc = parse_json(data)
        except ValueError:
            return
        if is_error_doc(doc):
            self._fail(doc)
        elif isinstance(doc, dict):
            self._usage(doc.get("usage"))

    def _usage(self, usage, outputs: bool = True) -> None:
        """Input (summed over INPUT_FIELDS) and output counts of a usage object. Raises InvalidCount.
        `outputs` False: message_start's output count (the first few tokens) is superseded by message_delta."""
        if not isinstance(usage, dict):
            return
        counts = [token_count(usage.get(name), f"usage.{name}") for name in INPUT_FIELDS]
        if counts[0] is not None:
            self.meter.input_tokens = sum(c for c in counts if c is not None)
            self.meter.set_detail(1, counts[1])
            self.meter.set_detail(0, counts[2])
        if outputs:
            out = token_count(usage.get("output_tokens"), "usage.output_tokens")
            if out is not None:
                self.meter.set_exact_output_tokens(out, "usage")
