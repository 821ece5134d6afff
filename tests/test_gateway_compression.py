"""Compressed answers through the real gateway process: the client gets the compressed bytes untouched, the
gateway meters a decoded copy (gzip, deflate, br, zstd); an answer it cannot decode is forwarded unmetered,
counted and logged once, never an error."""

from __future__ import annotations

import json
import sys
import zlib

import brotli
import pytest

from gateway_support import GatewayProcess, Script, ScriptedUpstream, chunk, through, timed_through

if sys.version_info >= (3, 14):
    from compression.zstd import ZstdCompressor
else:
    from backports.zstd import ZstdCompressor

CHAT = "/v1/chat/completions"
ANSWER = {"id": "c1", "object": "chat.completion", "model": "gpt-test",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "four tokens long"},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}


class Flushing:
    """A compressor that flushes after every event, as a streaming server must for events to go out."""

    def __init__(self, encoding: str):
        self.encoding = encoding
        if encoding in ("gzip", "deflate", "deflate-raw"):
            wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "deflate-raw": -zlib.MAX_WBITS}[encoding]
            self._c = zlib.compressobj(wbits=wbits)
        elif encoding == "br":
            self._c = brotli.Compressor()
        else:
            self._c = ZstdCompressor()

    def part(self, data: bytes) -> bytes:
        if self.encoding == "br":
            return self._c.process(data) + self._c.flush()
        if self.encoding == "zstd":
            return self._c.compress(data, ZstdCompressor.FLUSH_BLOCK)
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def end(self) -> bytes:
        if self.encoding == "br":
            return self._c.finish()
        if self.encoding == "zstd":
            return self._c.flush(ZstdCompressor.FLUSH_FRAME)
        return self._c.flush()


def compress(encoding: str, data: bytes) -> bytes:
    c = Flushing(encoding)
    return c.part(data) + c.end()


GAP = 0.4  # seconds between a stream's events
ENCODINGS = ["gzip", "deflate", "deflate-raw", "br", "zstd"]
HEADER = {"deflate-raw": "deflate"}  # raw DEFLATE is sent under `deflate` by some servers
ROWS = [f"whole_{e}" for e in ENCODINGS] + [f"stream_{e}" for e in ENCODINGS] + [
    "whole_gzip_then_br", "stream_plain", "unsupported", "corrupt", "unsupported_again"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    up = ScriptedUpstream()
    gw = GatewayProcess(up.url, {"tenants": ROWS, "models": ["gpt-test"]}, tmp_path_factory.mktemp("gateway"))
    yield gw, up
    gw.stop()
    up.stop()


def labels(row: str) -> dict:
    return {"tenant": row, "model": "gpt-test", "tier": "other"}


@pytest.mark.parametrize("encoding", ENCODINGS + ["gzip, br"])
def test_compressed_whole_answer_gets_x_token_used(stack, encoding):
    """The issue's input (gzip): X-Token-Used 15 and the client's bytes unchanged; the same for every encoding."""
    gw, up = stack
    row = "whole_gzip_then_br" if encoding == "gzip, br" else f"whole_{encoding}"
    body = json.dumps(ANSWER).encode()
    if encoding == "gzip, br":
        sent, header = compress("br", compress("gzip", body)), "gzip, br"  # applied in order: gzip, then br
    else:
        sent, header = compress(encoding, body), HEADER.get(encoding, encoding)
    up.scripts[row] = Script([sent], content_type="application/json", headers={"Content-Encoding": header})
    status, headers, raw = through(gw, row, CHAT, {"model": "gpt-test", "messages": []},
                                   {"Accept-Encoding": "gzip, deflate, br, zstd"})
    assert status == 200 and raw == sent and headers["Content-Encoding"] == header
    assert (headers["X-Token-Used"], headers["X-Token-Used-Input"], headers["X-Token-Used-Output"]) == ("15", "11", "4")
    usage = gw.wait_usage(tenant=row)
    assert (usage["outcome"], usage["input_tokens"], usage["output_tokens"], usage["unmetered"]) == ("ok", 11, 4, None)


def _stream_items(encode) -> list:
    events = [chunk({"content": "a"}), chunk({"content": "b"}), chunk({"content": "c"}, finish="stop")]
    items = []
    for i, e in enumerate(events):
        items += [("at", 0.2 + GAP * i), encode(b"data: " + e + b"\n\n")]
    return items + [encode(b"data: [DONE]\n\n")]


@pytest.mark.parametrize("encoding", ENCODINGS + ["plain"])
def test_compressed_stream_meters_like_the_plain_one(stack, encoding):
    gw, up = stack
    row = f"stream_{encoding}"
    if encoding == "plain":
        items, headers = _stream_items(lambda b: b), {}
    else:
        c = Flushing(encoding)
        items = _stream_items(c.part) + [c.end()]
        headers = {"Content-Encoding": HEADER.get(encoding, encoding)}
    up.scripts[row] = Script(items, headers=headers)
    status, _headers, raw, timing = timed_through(gw, up, row, CHAT, {"model": "gpt-test", "stream": True},
                                                  {"Accept-Encoding": "gzip, deflate, br, zstd"})
    assert status == 200 and raw == up.scripts[row].body()
    usage = gw.wait_usage(tenant=row)
    assert (usage["outcome"], usage["output_tokens"], usage["method"]) == ("ok", 3, "events")
    assert gw.value("gateway_time_to_first_token_seconds_count", **labels(row)) == 1
    # TTFT at the first event (write 0, 200 ms), not a later one; the time per output chunk: the two gaps as
    # written, from write 0 to write 2 (no per-token ITL: a chunk's token count is unknown without usage per
    # chunk). Bounds from when each write left the upstream and reached the client (Timing): any load.
    lo, hi = timing.ttft_bounds(0)
    assert lo <= gw.value("gateway_time_to_first_token_seconds_sum", **labels(row)) <= hi
    assert gw.value("gateway_time_per_output_chunk_seconds_count", **labels(row)) == 2
    lo, hi = timing.gap_bounds(0, 2)
    assert lo <= gw.value("gateway_time_per_output_chunk_seconds_sum", **labels(row)) <= hi
    assert gw.value("gateway_inter_token_latency_seconds_count", **labels(row)) == 0


def test_undecodable_answers_are_unmetered_counted_and_logged_once(stack):
    gw, up = stack
    body = json.dumps(ANSWER).encode()
    cases = {"unsupported": (b"\x1f\x9d" + body, "compress"), "unsupported_again": (b"\x1f\x9d" + body, "compress"),
             "corrupt": (b"\x1f\x8b\x08\x00garbage" + body, "gzip")}
    for row, (sent, encoding) in cases.items():
        up.scripts[row] = Script([sent], content_type="application/json", headers={"Content-Encoding": encoding})
        status, headers, raw = through(gw, row, CHAT, {"model": "gpt-test"})
        assert status == 200 and raw == sent  # forwarded untouched, never turned into an error
        assert not any(h.startswith("X-Token-Used") for h in headers)  # unknown, not 0
        usage = gw.wait_usage(tenant=row)
        assert (usage["outcome"], usage["output_tokens"], usage["input_tokens"]) == ("ok", None, None)
        assert usage["unmetered"] == "encoding"
        assert gw.value("gateway_requests_total", **labels(row), code="200", outcome="ok") == 1
        assert gw.value("gateway_tokens_total", **labels(row), type="output") is None
    assert gw.value("gateway_unmetered_responses_total", model="gpt-test", reason="encoding") == 3
    lines = [line for line in gw.output().splitlines() if "forwarded unmetered" in line]
    # One line per kind: the unsupported encoding (twice seen, logged once) and the corrupt gzip.
    assert len(lines) == 2, lines
    assert sum("'compress'" in line for line in lines) == 1
