"""Triton's statistics answer (`GET /v2/models/stats`) read as Triton writes it, with exact integers.

Shape (server docs/protocol/extension_statistics.md; every count and duration is a uint64 in the protocol):
  {"model_stats": [{"name", "version", "last_inference", "inference_count", "execution_count",
                    "inference_stats": {"success"|"fail"|"queue"|"compute_input"|"compute_infer"|
                                        "compute_output"|"cache_hit"|"cache_miss": {"count", "ns"}},
                    "batch_stats": [{"batch_size", "compute_input"|"compute_infer"|"compute_output": {...}}],
                    "response_stats": {...}, "memory_usage": [...]}]}

How it is written varies, and every variant below reads the same:
- uint64 values as JSON numbers (Triton's HTTP frontend) or as decimal strings (the protobuf JSON mapping of
  the gRPC `ModelStatistics` answer, e.g. tritonclient's `as_json=True`);
- zero values left out (protobuf JSON): `"fail": {}`, no `batch_stats`, no `execution_count` all read as 0;
- field names in snake_case or the protobuf JSON lowerCamelCase (`inferenceStats`, `computeInfer`, ...);
- cumulative nanoseconds above 2^53, where a float64 no longer holds every integer: values are parsed as
  Python ints (the answer is decoded with `decode_json`, which never makes a float of a number) and means are
  computed from the integers, rounded once at the end.

Not read: `response_stats` (per response index; empty for Python-backend models on 2.51), `memory_usage`,
`last_inference`.

A malformed entry (a negative count, a fraction, a value ≥ 2^64, a missing name) drops that model version's
statistics only; the parser reports it in `problems` so the reader can count and log it.
"""

from __future__ import annotations

import dataclasses
import decimal
from typing import Any

# inference_stats fields (extension_statistics.md; cache_miss since 22.01). Closed set: the `stat` label.
INFERENCE_STATS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                   "cache_hit", "cache_miss")
# batch_stats phases.
BATCH_PHASES = ("compute_input", "compute_infer", "compute_output")
UINT64_LIMIT = 2 ** 64
NS_PER_SECOND = 10 ** 9


@dataclasses.dataclass(frozen=True)
class DurationStat:
    """A Triton `$duration_stat`: how many times it was collected and the total time, both exact ints."""

    count: int = 0
    ns: int = 0

    @property
    def seconds(self) -> float:
        """Total duration in seconds, rounded once (int / int true division is correctly rounded)."""
        return self.ns / NS_PER_SECOND

    def mean_seconds(self) -> float | None:
        """Mean duration per count in seconds, from the exact integers; None when count is 0 (unknown)."""
        if self.count == 0:
            return None
        return self.ns / (self.count * NS_PER_SECOND)


@dataclasses.dataclass(frozen=True)
class ModelStats:
    """One model version's statistics. `inference` holds every name of INFERENCE_STATS; `batches` maps an
    executed batch size to its BATCH_PHASES stats (compute_infer.count = executions of that size)."""

    inference_count: int
    execution_count: int
    inference: dict[str, DurationStat]
    batches: dict[int, dict[str, DurationStat]]

    def executions_by_batch_size(self) -> dict[int, int]:
        return {size: phases["compute_infer"].count for size, phases in self.batches.items()}


class BadValue(ValueError):
    """A statistic that is not a uint64 (negative, fractional, too large, not a number)."""


def exact_int(value: object, where: str) -> int:
    """A uint64 written as a JSON number or a decimal string → int, without a float round trip.

    Accepts int, decimal.Decimal (from `decode_json`), an integral float (only from callers that decoded with
    floats; the value may already be rounded) and strings such as "7" or "9007199254740993".
    Raises BadValue naming `where` for anything else.
    """
    if isinstance(value, bool):
        raise BadValue(f"{where}: expected an unsigned integer, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, (str, decimal.Decimal, float)):
        try:
            dec = decimal.Decimal(value.strip() if isinstance(value, str) else value)
        except (decimal.InvalidOperation, ValueError):
            raise BadValue(f"{where}: expected an unsigned integer, got {str(value)[:40]!r}") from None
        if not dec.is_finite() or dec != dec.to_integral_value():
            raise BadValue(f"{where}: expected an unsigned integer, got {str(value)[:40]!r}")
        if not 0 <= dec < UINT64_LIMIT:  # before int(): "1e999999999" must not become a huge int
            raise BadValue(f"{where}: {str(value)[:40]} is outside uint64")
        number = int(dec)
    else:
        raise BadValue(f"{where}: expected an unsigned integer, got {type(value).__name__}")
    if not 0 <= number < UINT64_LIMIT:
        raise BadValue(f"{where}: {number} is outside uint64")
    return number


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.capitalize() for part in rest)


def field(obj: dict, name: str, default: object = None) -> Any:
    """`obj[name]` under its snake_case or protobuf-JSON lowerCamelCase name; `default` when absent (a JSON
    value: its type is what the caller checks)."""
    if name in obj:
        return obj[name]
    return obj.get(_camel(name), default)


def duration_stat(value: object, where: str) -> DurationStat:
    """`{"count", "ns"}` → DurationStat; absent, null or `{}` (zero values left out) read as 0."""
    if value is None:
        return DurationStat()
    if not isinstance(value, dict):
        raise BadValue(f"{where}: expected an object, got {type(value).__name__}")
    return DurationStat(exact_int(field(value, "count", 0), f"{where}.count"),
                        exact_int(field(value, "ns", 0), f"{where}.ns"))


def parse_model_stat(stat: object) -> tuple[tuple[str, str], ModelStats]:
    """One `$model_stat` → ((name, version), ModelStats). Raises BadValue on a malformed entry."""
    if not isinstance(stat, dict) or not isinstance(stat.get("name"), str) or not stat["name"]:
        raise BadValue("model_stats entry without a name")
    key = (stat["name"], str(field(stat, "version", "") or ""))
    where = f"{key[0]!r} version {key[1]!r}"  # repr: a name may hold any character, a newline included
    inference = field(stat, "inference_stats") or {}
    if not isinstance(inference, dict):
        raise BadValue(f"{where}: inference_stats is not an object")
    batches: dict[int, dict[str, DurationStat]] = {}
    batch_list = field(stat, "batch_stats") or []
    if not isinstance(batch_list, list):
        raise BadValue(f"{where}: batch_stats is not a list")
    for batch in batch_list:
        if not isinstance(batch, dict):
            raise BadValue(f"{where}: batch_stats entry is not an object")
        size = exact_int(field(batch, "batch_size", 0), f"{where}: batch_size")
        batches[size] = {p: duration_stat(field(batch, p), f"{where}: batch {size} {p}") for p in BATCH_PHASES}
    return key, ModelStats(
        inference_count=exact_int(field(stat, "inference_count", 0), f"{where}: inference_count"),
        execution_count=exact_int(field(stat, "execution_count", 0), f"{where}: execution_count"),
        inference={s: duration_stat(field(inference, s), f"{where}: {s}") for s in INFERENCE_STATS},
        batches=batches,
    )


def parse_stats(answer: object) -> tuple[dict[tuple[str, str], ModelStats], list[tuple[str, str]]]:
    """Statistics answer → ({(model, version): ModelStats}, problems).

    `problems` holds (model name, text) for each model version whose entry was malformed and left out
    ("" as the name when the entry has none). Raises ValueError when the
    answer as a whole has the wrong shape (not `{"model_stats": [...]}`).
    """
    if not isinstance(answer, dict):
        raise ValueError("statistics: expected {\"model_stats\": [...]}")
    entries = field(answer, "model_stats", [])
    if not isinstance(entries, list):
        raise ValueError("statistics: model_stats is not a list")
    out: dict[tuple[str, str], ModelStats] = {}
    problems: list[tuple[str, str]] = []
    for entry in entries:
        try:
            key, stats = parse_model_stat(entry)
        except BadValue as exc:
            name = entry.get("name") if isinstance(entry, dict) else None
            problems.append((name if isinstance(name, str) else "", str(exc)))
            continue
        out[key] = stats
    return out, problems

