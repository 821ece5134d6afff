"""Which reader reads each protocol's answers: the protocol names a route carries (routes.py) → the reader
classes of protocols.py (Triton, OpenAI chat and completions) and the per-API modules (protocol_*.py)."""

from __future__ import annotations

from typing import Callable

from inferwatch.exporters.gateway.meter import RequestMeter
from inferwatch.exporters.gateway.protocol_embeddings import EmbeddingsBody
from inferwatch.exporters.gateway.protocol_messages import MessagesEvents
from inferwatch.exporters.gateway.protocol_responses import ResponsesEvents
from inferwatch.exporters.gateway.protocols import OpenAIEvents, Reader, TritonEvents
from inferwatch.exporters.gateway.routes import Route

# Every protocol routes.PROTOCOLS names, and "triton" (tests check the two agree).
READERS: dict[str, Callable[[RequestMeter], Reader]] = {
    "triton": TritonEvents,
    "openai": OpenAIEvents,
    "responses": ResponsesEvents,
    "messages": MessagesEvents,
    "embeddings": EmbeddingsBody,
}


def reader_for(route: Route, meter: RequestMeter) -> Reader:
    """The reader of `route`'s answers, fed by exchange.py."""
    return READERS[route.protocol](meter)
