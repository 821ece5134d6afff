"""Embeddings (`POST /v1/embeddings`; OpenAI, vLLM, Triton's OpenAI frontend, TEI) and other calls that bill
input tokens only, never streamed.

The answer `{"object": "list", "data": [...], "usage": {"prompt_tokens", "total_tokens"}}` bills
`usage.prompt_tokens` (else `total_tokens`, which is the same for an embedding) as input tokens (exact); an
embedding generates nothing, so its output count is a known 0, not an unknown. Errors: an error object in
any shape (protocols.py "Errors"), under HTTP 200 or an error status.
"""

from __future__ import annotations

from inferwatch.exporters.gateway.counts import token_count
from inferwatch.exporters.gateway.meter import RequestMeter
from inferwatch.exporters.gateway.protocols import Reader, is_error_doc, parse_json


class EmbeddingsBody(Reader):
    """Reads an embeddings answer (module docstring); a stream of it is not expected and is not counted."""

    __slots__ = ()

    def __init__(self, meter: RequestMeter):
        super().__init__(meter, complete=True)

    def event(self, data: bytes, now: float) -> None:
        if b'"error' in data:
            try:
                doc = parse_json(data)
            except ValueError:
                return
            if is_error_doc(doc):
                self._fail(doc)

    def body(self, data: bytes, now: float) -> None:
        try:
            doc = parse_json(data)
        except ValueError:
            return
        if is_error_doc(doc):
            self._fail(doc)
            return
        usage = doc.get("usage") if isinstance(doc, dict) else None
        if not isinstance(usage, dict):
            return
        inputs = token_count(usage.get("prompt_tokens"), "usage.prompt_tokens")
        if inputs is None:
            inputs = token_count(usage.get("total_tokens"), "usage.total_tokens")
        if inputs is not None:
            self.meter.input_tokens = inputs
            self.meter.set_exact_output_tokens(0, "usage")
