"""Several clusters: the cluster label kept through every aggregation and vector matching of a PromQL
expression, and a matcher added to every vector selector of one (dashboards, runbook evidence).

A Prometheus watching one cluster stores its series without the cluster label: it adds its external labels
only to what it sends (remote write, federation, alerts). A central store (VictoriaMetrics fed by each
cluster's vmagent or agent-mode Prometheus) holds every cluster's series, each carrying the label. An
expression that groups `by (cluster, ...)` and matches `on (cluster, ...)` is right in both: where the label
is absent it is the empty value on every side and changes nothing; where present, no sum adds two clusters
and no `and on (model)` lets cluster a's traffic vouch for cluster b's errors. `without (...)`, `ignoring
(...)` and one-to-one matching on all labels keep it already.

The pass works on the text, token by token (strings, label matchers and ranges are skipped, never
rewritten), so the area modules write their PromQL once, for one cluster, and cannot forget the label;
tests/test_rules_cluster.py checks the result with Prometheus' own parser (promql-parser) and runs the rules'
promtool tests with and without the label.
"""

from __future__ import annotations

import re
from typing import Iterator

__all__ = ["keep_label", "select", "tokens"]

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"[0-9.][0-9A-Za-z_.]*")
_SPACE = re.compile(r"\s*")
# Keywords that take a parenthesised label list; `by` and `on` are the ones that drop unlisted labels.
_GROUPING = ("by", "without", "on", "ignoring", "group_left", "group_right")
_KEEPING = ("by", "on")
# Aggregation operators may be followed by `by (...)` before their parenthesis: never a metric name.
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                 "topk", "quantile", "limitk", "limit_ratio"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", *_GROUPING, *_AGGREGATIONS}


def _string_end(text: str, i: int) -> int:
    quote = text[i]
    j = i + 1
    while j < len(text):
        if text[j] == "\\" and quote != "`":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    raise ValueError(f"unterminated string at {i + 1} in {text!r}")


def tokens(text: str) -> Iterator[tuple[str, int, int]]:
    """(kind, start, end) over `text`: kind is `string`, `comment`, `ident`, `number`, `space` or the
    character itself (`(`, `{`, `[`, `,` ...)."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'`":
            end = _string_end(text, i)
            yield "string", i, end
        elif ch == "#":
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            yield "comment", i, end
        elif ch.isspace():
            end = _SPACE.match(text, i).end()
            yield "space", i, end
        elif _IDENT.match(text, i) and not ch.isdigit():
            end = _IDENT.match(text, i).end()
            yield "ident", i, end
        elif ch.isdigit() or (ch == "." and i + 1 < len(text) and text[i + 1].isdigit()):
            end = _NUMBER.match(text, i).end()
            yield "number", i, end
        else:
            end = i + 1
            yield ch, i, end
        i = end


def _closing(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket closing the one at `start` (strings inside skipped)."""
    depth = 0
    for kind, _s, e in tokens(text[start:]):
        if kind == open_ch:
            depth += 1
        elif kind == close_ch:
            depth -= 1
            if depth == 0:
                return start + e
    raise ValueError(f"unbalanced {open_ch} at {start + 1} in {text!r}")


def _rewrite(expr: str, *, keep: str | None = None, matcher: str | None = None) -> str:
    """The one walk both transforms share: label lists after `by`/`on` gain `keep`, vector selectors gain
    `matcher`. Label matchers, ranges/subqueries' durations and strings are copied as they are."""
    out: list[str] = []
    i = 0
    n = len(expr)
    while i < n:
        kind, s, e = next(tokens(expr[i:]))
        s, e = s + i, e + i
        word = expr[s:e]
        if kind == "ident" and word.lower() in _GROUPING:
            after = _SPACE.match(expr, e).end()
            if after < n and expr[after] == "(":
                close = _closing(expr, after, "(", ")")
                labels = [x.strip() for x in expr[after + 1:close - 1].split(",") if x.strip()]
                if keep and word.lower() in _KEEPING and keep not in labels:
                    out.append(f"{word} ({', '.join([keep, *labels])})")
                else:
                    out.append(expr[s:close])
                i = close
                continue
            out.append(word)
            i = e
            continue
        if kind == "ident" and word.lower() not in _KEYWORDS:
            after = _SPACE.match(expr, e).end()
            if after < n and expr[after] == "(":  # a function call
                out.append(word)
                i = e
                continue
            if after < n and expr[after] == "{":
                close = _closing(expr, after, "{", "}")
                out.append(word + _with_matcher(expr[after:close], matcher))
                i = close
                continue
            out.append(word + (f"{{{matcher}}}" if matcher else ""))
            i = e
            continue
        if kind == "{":  # a selector without a metric name
            close = _closing(expr, s, "{", "}")
            out.append(_with_matcher(expr[s:close], matcher))
            i = close
            continue
        if kind == "[":  # a range or subquery's durations: nothing to rewrite
            close = expr.index("]", s) + 1
            out.append(expr[s:close])
            i = close
            continue
        out.append(word)
        i = e
    return "".join(out)


def _with_matcher(braces: str, matcher: str | None) -> str:
    if not matcher:
        return braces
    inner = braces[1:-1].strip()
    return f"{{{matcher}, {inner}}}" if inner else f"{{{matcher}}}"


def keep_label(expr: str, label: str) -> str:
    """`expr` with `label` first in every `by (...)` and `on (...)` list that lacks it:
    `sum by (model) (x) / on (model) y` -> `sum by (cluster, model) (x) / on (cluster, model) y`."""
    return _rewrite(expr, keep=label)


def select(expr: str, matcher: str) -> str:
    """`expr` with `matcher` (PromQL text such as `cluster=~"$cluster"`) first in every vector selector:
    `max(up{job="x"}) + y` -> `max(up{cluster=~"$cluster", job="x"}) + y{cluster=~"$cluster"}`."""
    return _rewrite(expr, matcher=matcher)
