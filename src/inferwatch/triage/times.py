"""Times triage reads: --at and Alertmanager's startsAt (RFC 3339, nanosecond fractions as Alertmanager
writes them), or unix seconds."""

from __future__ import annotations

import datetime as dt
import math

__all__ = ["parse_time", "starts_at"]


def parse_time(text: str) -> float:
    """RFC 3339 (`2024-05-01T12:00:00Z`, fractions beyond microseconds cut) or unix seconds → unix
    seconds. A time without an offset is local time. Raises ValueError for anything else (NaN, inf too)."""
    try:
        value = float(text)
    except ValueError:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    if not math.isfinite(value):
        raise ValueError(f"not a finite time: {text!r}")
    return value


def starts_at(value: object) -> float | None:
    """An alert's startsAt (when its rule started firing) in unix seconds; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None
