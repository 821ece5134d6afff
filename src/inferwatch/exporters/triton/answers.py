"""Reading Triton's answers with a size bound, and decoding JSON without floats.

Why a bound: an answer is held whole before it is parsed (a repository index, a statistics answer, a model
configuration). Without a limit, one huge or endless answer (a misconfigured proxy, a hostile endpoint, a
repository of thousands of models) is read into memory whole: a 200 MB index cost the collector about 2 GB.
With `limit` bytes, at most `limit` plus one chunk is held per call before the read is abandoned with
`AnswerTooLarge` (cause `too_large` in `inferwatch_triton_poll_errors_total`). The limit applies to the
decoded body, so a compressed answer cannot expand past it either.

Why no floats: Triton writes uint64 counts and nanosecond totals; a float64 holds every integer only up to
2^53 (about 104 days of cumulative nanoseconds). `decode_json` keeps integers as Python ints (the standard
library's behaviour) and turns any number written with a fraction or exponent into a `decimal.Decimal`,
so `stats.exact_int` can tell an integral value from a fractional one exactly.
"""

from __future__ import annotations

import decimal
import json

import aiohttp

CHUNK_BYTES = 64 * 1024
DEFAULT_MAX_ANSWER_BYTES = 16 * 1024 * 1024


class AnswerTooLarge(Exception):
    """An answer longer than the collector's limit; `limit` and what was seen are in the message."""


class HttpStatusError(Exception):
    """An HTTP error status from Triton. `status` is the code; the message holds Triton's error text."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytearray:
    """The whole body of `resp`, refusing (AnswerTooLarge) as soon as it passes `limit` bytes.

    A Content-Length above the limit is refused before any byte of the body is read.
    """
    if resp.content_length is not None and resp.content_length > limit:
        raise AnswerTooLarge(f"answer of {resp.content_length} bytes announced, limit {limit} bytes")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
        body += chunk
        if len(body) > limit:
            raise AnswerTooLarge(f"answer longer than the limit of {limit} bytes")
    return body


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number Triton writes")


def decode_json(body: bytes | bytearray | str) -> object:
    """JSON text → Python objects; integers stay exact ints, other numbers become Decimal, NaN and
    Infinity are refused (ValueError, as for any malformed JSON), and so is a value nested deeper than the
    interpreter's recursion limit (json raises RecursionError for `[[[[...]]]]`: no Triton answer is one)."""
    try:
        return json.loads(body, parse_float=decimal.Decimal, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def error_text(body: bytes | bytearray) -> str:
    """Triton's `{"error": "..."}` message from an error answer, or the start of the body, ≤ 200 chars."""
    try:
        doc = json.loads(body)
        text = doc.get("error") if isinstance(doc, dict) else None
    except (ValueError, RecursionError):
        text = None
    if not isinstance(text, str):
        text = bytes(body[:200]).decode("utf-8", "replace")
    return " ".join(text.split())[:200]
