"""Token counts an upstream reports: which values are counts, and which are impossible readings.

Every count the gateway reads from an answer (OpenAI `usage.prompt_tokens` / `completion_tokens`, Triton
`input_token_count` / `output_token_count` as a body field, an event field or a KServe v2 output tensor, and
the in-process API's `usage(...)`) passes `token_count` before it reaches a metric, a header or the usage log.

A count is a JSON integer `0 <= n <= MAX_TOKENS`. "Integer" as JSON Schema defines it (Validation §6.1.1
"type": a number with a zero fractional part), so `12` and `12.0` are 12; `1.5`, `true`/`false` (a JSON
boolean, not a number, though Python's bool is an int), `"12"` (a string) are not counts, whatever a lenient
parser would make of them. `null` or a missing field is "not reported": unknown, not an impossible reading.

MAX_TOKENS is 2**31 - 1, the most an INT32 count tensor (Triton's count outputs) holds; no model's context
window comes within three orders of magnitude of it, so a larger value is a broken upstream, not a long
answer. An impossible count makes the request's counts unknown (exchange.py: unmetered, reason
`invalid_count`): it is never clamped, never exported and never added to gateway_tokens_total.
"""

from __future__ import annotations

MAX_TOKENS = 2**31 - 1

# Why a value is not a count (the log line names it; the metric counts reason="invalid_count").
NOT_INTEGER = "not an integer"
NEGATIVE = "negative"
TOO_LARGE = f"above {MAX_TOKENS}"
BACKWARDS = "below an earlier cumulative count"
ABOVE_WHOLE = "above the count it is a part of"


class InvalidCount(ValueError):
    """An impossible count: `field` (e.g. "usage.completion_tokens"), `why` (one of the texts above) and a
    short repr of the value (at most 40 characters, one line)."""

    def __init__(self, field: str, why: str, value):
        self.field = field
        self.why = why
        text = repr(value)
        self.value = text if len(text) <= 40 else text[:37] + "..."
        super().__init__(f"{field} {why}")


def token_count(value, field: str) -> int | None:
    """`value` as a count, None when it is None (not reported). Raises InvalidCount otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidCount(field, NOT_INTEGER, value)
    if isinstance(value, float):
        if not value.is_integer():  # also NaN and infinity
            raise InvalidCount(field, NOT_INTEGER, value)
        if value < 0:
            raise InvalidCount(field, NEGATIVE, value)
        if value > MAX_TOKENS:
            raise InvalidCount(field, TOO_LARGE, value)
        value = int(value)
    if value < 0:
        raise InvalidCount(field, NEGATIVE, value)
    if value > MAX_TOKENS:
        raise InvalidCount(field, TOO_LARGE, value)
    return value


def part_count(container, key: str, whole: int | None, field: str) -> int | None:
    """A token type reported inside a usage object's details object (`container`, e.g.
    `usage.prompt_tokens_details`, any value: not a dict means not reported) under `key`, as token_count; and
    InvalidCount when it exceeds `whole`, the count it is a part of (cached prompt tokens above the prompt)."""
    if not isinstance(container, dict):
        return None
    n = token_count(container.get(key), field)
    if n is not None and whole is not None and n > whole:
        raise InvalidCount(field, ABOVE_WHOLE, container.get(key))
    return n


def cumulative_count(value, earlier: int, field: str) -> int | None:
    """A count that only grows over a stream (a running `usage`, Triton `output_token_count`): as
    token_count, and InvalidCount when it is below `earlier`, the last one seen."""
    n = token_count(value, field)
    if n is not None and n < earlier:
        raise InvalidCount(field, BACKWARDS, value)
    return n
