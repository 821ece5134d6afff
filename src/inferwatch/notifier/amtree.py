"""Alertmanager's routing tree and label matchers, evaluated here the way Alertmanager does, so
`inferwatch notifier routes test` can say where the generated configuration sends an alert before the
notifier's own routes are tried (an alert Alertmanager sends elsewhere never reaches the notifier).

Semantics (Alertmanager dispatch/route.go `Route.Match`, pkg/labels matchers): a route matches when all its
matchers match; its children are tried in order, each matching child is followed (depth first) and the walk
stops after the first one unless that child has `continue: true`; a matching route none of whose children
match is itself the result. A matcher on a missing label sees the empty string; regular expressions are
anchored at both ends. tests/test_notifier_routes.py compares this with `amtool config routes test`.
"""

from __future__ import annotations

import dataclasses
import json
import re

_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$')


@dataclasses.dataclass(frozen=True)
class Matcher:
    name: str
    op: str  # = != =~ !~
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        hit = re.fullmatch(self.value, actual) is not None
        return hit if self.op == "=~" else not hit


def parse_matcher(text: str) -> Matcher:
    """`name="value"`, `name=~"re"`, `name!="v"`, `name!~"re"` (value quoted or bare). ValueError otherwise."""
    m = _MATCHER.match(text)
    if not m:
        raise ValueError(f"not an Alertmanager matcher: {text!r}")
    name, op, value = m.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = json.loads(value)
    return Matcher(name, op, value)


def route_matchers(route: dict) -> list[Matcher]:
    """A route's matchers: `matchers` plus the older `match` / `match_re` maps."""
    out = [parse_matcher(m) for m in route.get("matchers", [])]
    out += [Matcher(k, "=", str(v)) for k, v in (route.get("match") or {}).items()]
    out += [Matcher(k, "=~", str(v)) for k, v in (route.get("match_re") or {}).items()]
    return out


def matching_routes(route: dict, labels: dict[str, str], inherited: str | None = None) -> list[dict]:
    """The routes (dicts, with `receiver` filled in from the parent where a child leaves it out) an alert
    with `labels` ends at, in Alertmanager's order."""
    if not all(m.matches(labels) for m in route_matchers(route)):
        return []
    receiver = route.get("receiver") or inherited
    found: list[dict] = []
    for child in route.get("routes") or []:
        hits = matching_routes(child, labels, receiver)
        found += hits
        if hits and not child.get("continue", False):
            break
    return found or [{**route, "receiver": receiver}]


def receivers(config: dict, labels: dict[str, str]) -> list[str]:
    """Receiver names an alert reaches in an Alertmanager configuration (the root route always matches)."""
    out: list[str] = []
    for route in matching_routes(config["route"], labels):
        if route["receiver"] not in out:
            out.append(route["receiver"])
    return out
