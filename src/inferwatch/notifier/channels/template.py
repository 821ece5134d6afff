"""The per-alert template (`channels.X.template`, string.Template with `${label}` placeholders) as styled
runs, so that a value from an alert is never parsed as markup.

The template text is the operator's and may use the channel's emphasis markers (Slack: `*bold*`,
`_italic_`, `~strike~`, `` `code` ``; WeCom: `**bold**`, `*italic*`, `` `code` ``). Values substituted
into it are kept apart as runs marked `value=True`, carrying the style of the markers around them; each
channel then renders a value in a form its provider shows literally (Slack rich-text elements, WeCom code
spans or a plain-text message). A marker is a style only when it occurs an even number of times in the
template's own text; otherwise it is an ordinary character. Lines left empty (an annotation that is not
set) are dropped, as the string rendering does.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Callable

from inferwatch.notifier.channels.text import cut_parts

SLACK_MARKERS = {"*": "bold", "_": "italic", "~": "strike", "`": "code"}
WECOM_MARKERS = {"**": "bold", "*": "italic", "`": "code"}


@dataclasses.dataclass(frozen=True)
class Run:
    """A piece of rendered text: template text (value=False) or one substituted value (value=True)."""

    text: str
    value: bool = False
    styles: frozenset[str] = frozenset()


Line = list[Run]


def identifiers(template: str) -> set[str]:
    """Placeholder names the template uses."""
    return set(string.Template(template).get_identifiers())


def template_lines(template: str, fields: dict[str, str], markers: dict[str, str], cap: int | None = None,
                   measure: Callable[[str], int] = len) -> list[Line]:
    """`template` with `fields` substituted, as lines of runs (see the module docstring). Unknown
    placeholders stay as written, `$$` is a literal `$` (string.Template's safe_substitute rules).
    A value longer than `cap` (by `measure`) is cut; its cut marker follows as a run styled "marker"."""
    pieces: list[tuple[str, bool]] = []  # (text, is_value)
    literal = ""
    pos = 0
    for m in string.Template.pattern.finditer(template):
        literal += template[pos:m.start()]
        name = m.group("named") or m.group("braced")
        if m.group("escaped") is not None:
            literal += "$"
        elif name is not None and name in fields:
            pieces.append((literal, False))
            pieces.append((fields[name], True))
            literal = ""
        else:
            literal += m.group(0)
        pos = m.end()
    pieces.append((literal + template[pos:], False))
    active = _paired_markers("".join(t for t, v in pieces if not v), markers)
    runs = _style(pieces, active, markers)
    if cap is not None:
        runs = [piece for run in runs for piece in cut_run(run, cap, measure)]
    return _lines(runs)


def cut_run(run: Run, cap: int, measure: Callable[[str], int] = len) -> list[Run]:
    """[run] when it fits `cap`, else [the kept part, its cut marker as a run styled "marker"]."""
    kept, marker = cut_parts(run.text, cap, measure)
    if not marker:
        return [run]
    return [Run(kept, run.value, run.styles), Run(marker, False, run.styles | {"marker"})]


def _tokens(text: str, markers: list[str]):
    """Yield (marker, None) or (None, char) over `text`, longest marker first (`**` before `*`)."""
    i = 0
    while i < len(text):
        for mark in markers:
            if text.startswith(mark, i):
                yield mark, None
                i += len(mark)
                break
        else:
            yield None, text[i]
            i += 1


def _paired_markers(literal_text: str, markers: dict[str, str]) -> list[str]:
    order = sorted(markers, key=len, reverse=True)
    counts = {m: 0 for m in order}
    for mark, _ in _tokens(literal_text, order):
        if mark:
            counts[mark] += 1
    return [m for m in order if counts[m] and counts[m] % 2 == 0]


def _style(pieces: list[tuple[str, bool]], active: list[str], markers: dict[str, str]) -> list[Run]:
    styles: set[str] = set()
    runs: list[Run] = []
    for text, is_value in pieces:
        if is_value:
            runs.append(Run(text, True, frozenset(styles)))
            continue
        buf = ""
        for mark, char in _tokens(text, active):
            if mark is None:
                buf += char
                continue
            style = markers[mark]
            if "code" in styles and style != "code":  # inside a code span every marker is literal
                buf += mark
                continue
            if buf:
                runs.append(Run(buf, False, frozenset(styles)))
                buf = ""
            styles ^= {style}
        if buf:
            runs.append(Run(buf, False, frozenset(styles)))
    return runs


def _lines(runs: list[Run]) -> list[Line]:
    """Split template text at its newlines (a value keeps its own); drop lines with nothing visible."""
    lines: list[Line] = [[]]
    for run in runs:
        if run.value:
            lines[-1].append(run)
            continue
        parts = run.text.split("\n")
        for i, part in enumerate(parts):
            if i:
                lines.append([])
            if part:
                lines[-1].append(Run(part, False, run.styles))
    return [line for line in lines if any(r.text.strip() for r in line)]


def plain(line: Line) -> str:
    return "".join(r.text for r in line)
