"""Which metric names a PromQL expression (or an annotation template's query) reads.

A small lexer, not a full parser: it drops strings, label matchers, grouping clauses, ranges and offsets, then
keeps identifiers that are not functions, keywords or numbers. Enough for the generated rules, which is what
the "correct names only" test needs; dashboards may use it on their queries too.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
             "offset", "inf", "nan", "atan2"}
_TEMPLATE_QUERY = re.compile(r'printf\s+"((?:[^"\\]|\\.)*)"')


def metric_names(expr: str) -> set[str]:
    """Metric names `expr` selects, e.g. {'nv_inference_request_success'} for
    `sum by (model) (rate(nv_inference_request_success{job="triton"}[5m]))`."""
    text = _STRING.sub(" ", expr)
    text = _BRACES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS or re.fullmatch(r"[0-9.e+-]+", name):
            continue
        names.add(name)
    return names


def template_queries(text: str) -> list[str]:
    """PromQL run by an annotation template (`printf "<query>" ... | query`), %q/%s replaced by a value."""
    queries = []
    for match in _TEMPLATE_QUERY.finditer(text):
        query = match.group(1).replace('\\"', '"')
        queries.append(re.sub(r"%[qsdv]", '"x"', query))
    return queries


def rule_metric_names(rule: dict) -> set[str]:
    """Metric names a rendered rule (dict with expr and maybe annotations) reads, template queries included."""
    names = metric_names(rule["expr"])
    for text in (rule.get("annotations") or {}).values():
        for query in template_queries(text):
            names |= metric_names(query)
    return names
