"""The chat end marker, event by event: the gateway takes for `[DONE]` exactly what the official `openai`
client takes for it (its own SSE decoder decides each row), so a client that hangs up at the marker it saw
is never metered `cancelled`, and one that hangs up at what is not a marker is.

Each row is the stream's last event as raw bytes, after token chunks and a final usage chunk but with no
finish_reason (then only the marker tells the answer is complete)."""

from __future__ import annotations

import json

import pytest

from dialect_fixtures import chat, chat_usage
from gateway_support import make_spec
from inferwatch.exporters.gateway.api import Gateway

streaming = pytest.importorskip("openai._streaming")

# (row, the last event's bytes, whether the official client ends the stream there)
MARKERS = [
    ("plain", b"data: [DONE]\n\n", True),
    ("trailing-space", b"data: [DONE] \n\n", True),
    ("no-space", b"data:[DONE]\n\n", True),
    ("crlf", b"data: [DONE]\r\n\r\n", True),
    ("cr", b"data: [DONE]\r\r", True),
    ("named-event", b"event: done\ndata: [DONE]\n\n", True),
    ("with-id", b"id: 7\ndata: [DONE]\n\n", True),
    ("two-data-lines", b"data: [DONE]\ndata: x\n\n", True),
    ("suffix", b"data: [DONE]x\n\n", True),
    ("two-leading-spaces", b"data:  [DONE]\n\n", False),
    ("lower-case", b"data: [done]\n\n", False),
    ("no-brackets", b"data: DONE\n\n", False),
    ("comment", b": [DONE]\n\n", False),
    ("unfinished-event", b"data: [DONE]\n", False),
]


def client_ends(raw: bytes) -> bool:
    """Whether the official client's SSE decoder sees an event its stream stops at (`_streaming.py`)."""
    return any(sse.data.startswith("[DONE]") for sse in streaming.SSEDecoder().iter_bytes(iter([raw])))


@pytest.mark.parametrize("row, last, ends", MARKERS, ids=[m[0] for m in MARKERS])
def test_the_client_hanging_up_at_its_end_marker_is_ok(row, last, ends):
    assert client_ends(last) is ends  # the table states the client's rule (it fails if the client changes)
    records = []
    gateway = Gateway(make_spec(), usage_sink=records.append)
    body = json.dumps({"model": "gpt-test", "messages": [], "stream": True}).encode()
    ex = gateway.exchange("POST", "/v1/chat/completions", {"content-type": "application/json"}, body)
    ex.response_start(200, "text/event-stream")
    for data in [chat({"role": "assistant", "content": ""}), chat({"content": "a"}), chat_usage(3, 2), last]:
        ex.chunk(data)
    ex.finish("cancelled", 200)  # the client hung up before the body's end
    [usage] = records
    assert (usage.outcome, usage.output_tokens) == ("ok" if ends else "cancelled", 2)
