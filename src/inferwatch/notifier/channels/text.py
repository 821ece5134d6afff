"""Cutting text to a provider's limit, by code points (runes) or UTF-8 bytes, always with a visible marker
that says how much was cut, and finding the largest per-field length at which a whole message fits.

A field is never cut silently: the reader sees ` …[cut 98,500 of 100,000 characters]` and knows the full
value is in Alertmanager. Characters are never split (a CJK character is 3 UTF-8 bytes; Python strings are
indexed by code point, so a cut by runes never splits one either).
"""

from __future__ import annotations

from typing import Callable, TypeVar

MIN_FIELD_CHARS = 40   # below this a cut value says nothing; the compact rendering takes over instead

T = TypeVar("T")


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def cut_marker(cut: int, total: int) -> str:
    """The visible end of a shortened value: how many of its characters are missing."""
    return f" …[cut {cut:,} of {total:,} characters]"


def cut_parts(text: str, limit: int, measure: Callable[[str], int] = len) -> tuple[str, str]:
    """(kept prefix, marker) with measure(kept + marker) <= limit; ("text", "") when it fits.

    `measure` is len (runes) or utf8_len (bytes). Apart so that a channel can style the marker differently
    from the value (Slack: italic) or keep it outside a code span (WeCom). When even the marker does not fit,
    the marker is a bare "…" (and the result is empty when not even that fits).
    """
    if measure(text) <= limit:
        return text, ""
    marker = cut_marker(len(text), len(text))  # its longest form: the count below can only be smaller
    room = limit - measure(marker)
    if room < 0:  # not even the marker fits: a bare ellipsis, or nothing (never a silent partial value)
        if measure("…") > limit:
            return "", ""
        return _prefix(text, limit - measure("…"), measure), "…"
    kept = _prefix(text, room, measure)
    # The marker was sized for the longest count; with the real (shorter) count a character more may fit.
    longer = _prefix(text, limit - measure(cut_marker(len(text) - len(kept), len(text))), measure)
    if measure(longer + cut_marker(len(text) - len(longer), len(text))) <= limit:
        kept = longer
    return kept, cut_marker(len(text) - len(kept), len(text))


def cut(text: str, limit: int, measure: Callable[[str], int] = len) -> str:
    """`text` cut to at most `limit` (by `measure`), ending with the cut marker when cut."""
    kept, marker = cut_parts(text, limit, measure)
    return kept + marker


def cut_runes(text: str, limit: int) -> str:
    return cut(text, limit, len)


def cut_bytes(text: str, limit: int) -> str:
    return cut(text, limit, utf8_len)


def _prefix(text: str, room: int, measure: Callable[[str], int]) -> str:
    if room <= 0:
        return ""
    if measure is len:
        return text[:room]
    if measure is utf8_len:
        # errors="ignore" drops a trailing partial character, so a CJK character is never split.
        return text.encode("utf-8")[:room].decode("utf-8", errors="ignore")
    lo, hi = 0, len(text)  # any other measure: the longest prefix that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if measure(text[:mid]) <= room:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def fit_lines(head: str, lines: list[str], limit: int, more: Callable[[int], str], measure=len,
              sep: str = "\n") -> tuple[str, int]:
    """Join `head` and as many whole `lines` as fit in `limit` (by `measure`), then `more(n_left)`.

    Whole lines only, so a link or a code span is never cut in half. Returns (text, lines omitted).
    """
    out = head
    for i, line in enumerate(lines):
        left = len(lines) - i
        candidate = out + sep + line if out else line
        # Room must remain for the "…and N more" line unless this is the last line.
        tail = "" if left == 1 else sep + more(left - 1)
        if measure(candidate + tail) > limit:
            return (out + sep + more(left) if out else more(left)), left
        out = candidate
    return out, 0


def fit_field_cap(render: Callable[[int], tuple[T, float]], budget: int, max_cap: int,
                  min_cap: int = MIN_FIELD_CHARS) -> T | None:
    """The rendering at the largest per-field cap in [min_cap, max_cap] whose size is <= `budget`.

    `render(cap)` renders with every free-text field (descriptions, annotations, label values) cut to at
    most `cap` characters and returns (message, size). One cap for all fields cuts the largest fields first
    and leaves short ones whole. None when even `min_cap` does not fit (the caller renders compactly).
    Bisection to within 1/8 of the cap: a handful of renderings, each a few milliseconds.
    """
    message, size = render(max_cap)
    if size <= budget:
        return message
    best, size = render(min_cap)
    if size > budget:
        return None
    lo, hi = min_cap, max_cap  # lo fits, hi does not
    while hi - lo > max(1, lo // 8):
        mid = (lo + hi) // 2
        message, size = render(mid)
        if size <= budget:
            lo, best = mid, message
        else:
            hi = mid
    return best
