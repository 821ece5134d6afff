"""Routing by labels: which channels a group of alerts goes to.

Semantics follow Alertmanager's routing tree, flattened to one ordered list (docs/sources.md#alertmanager):
routes are tried in order, the first match stops the walk unless it says `continue: true`. A group is
matched on its common labels (the labels all its alerts share; Alertmanager groups by `severity` too, so
it is one of them). With no routes in the spec, the default is by layer and severity: L1 critical → the
phone channel (PagerDuty, else voice), L1 warning → the chat channel (Slack, else WeCom: a warning such as
GpuThrottling never rings the phone), L2 → Slack, L3 critical (the fast and slow burn-rate windows: users feel
it now) → the phone channel and WeCom, other L3 → WeCom.

An alert no route matches is never dropped: it goes to the catch-all `notifier.unrouted_receivers`, by
default the receivers an L2 alert reaches (the Slack/on-call channel: a human reads it there in working
hours, and an unrouted alert is a configuration gap, not yet a page), else every chat channel. With no
channel at all it is kept in the outbox as a dead letter with reason `unrouted`.
"""

from __future__ import annotations

import dataclasses
import re

from inferwatch.spec import Route, Spec

# (layer, severity or None for any) -> channel types, first declared channel of the first type present wins.
# Tried in this order, so a layer's severity-specific default comes before its catch-all.
DEFAULT_LAYER_CHANNELS: dict[tuple[str, str | None], tuple[str, ...]] = {
    ("L1", "warning"): ("slack", "wecom"),
    ("L1", None): ("pagerduty", "voice"),
    ("L2", None): ("slack",),
    ("L3", "critical"): ("pagerduty", "voice"),
    ("L3", None): ("wecom",),
}
# Channel types a default route also sends to, besides the one above: the model owners keep seeing their
# layer's pages in their chat.
DEFAULT_ALSO: dict[tuple[str, str | None], tuple[str, ...]] = {("L3", "critical"): ("wecom",)}
UNROUTED_ROUTE = -1            # route index of a catch-all delivery (no route matched)
UNROUTED_CHANNEL = "unrouted"  # channel column of an unrouted dead letter (no channel could take it)
CHAT_KINDS = ("slack", "wecom")


@dataclasses.dataclass(frozen=True)
class RouteMatch:
    index: int
    receivers: tuple[str, ...]
    escalate_after_s: float | None
    escalate_to: tuple[str, ...]
    enrich: str
    enrich_timeout_s: float


class Router:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.routes: list[Route] = list(spec.routes) or default_routes(spec)
        self._patterns = [{k: re.compile(v) for k, v in r.match_re.items()} for r in self.routes]
        self.unrouted_receivers: tuple[str, ...] = tuple(unrouted_receivers(spec, self))

    def match(self, labels: dict[str, str]) -> list[RouteMatch]:
        """The routes `labels` take, in order (several when routes say `continue: true`)."""
        out = []
        for i, route in enumerate(self.routes):
            if all(labels.get(k, "") == v for k, v in route.match.items()) and all(
                    p.fullmatch(labels.get(k, "")) for k, p in self._patterns[i].items()):
                out.append(RouteMatch(
                    i, tuple(route.receivers),
                    route.escalate_after.seconds if route.escalate_after else None,
                    tuple(route.escalate_to), route.enrich, route.enrich_timeout.seconds))
                if not route.continue_:
                    break
        return out

    def receivers(self, labels: dict[str, str]) -> list[str]:
        """Channel names `labels` reach, first-reached first, each once (the catch-all when no route matches)."""
        if not self.match(labels):
            return list(self.unrouted_receivers)
        seen: list[str] = []
        for m in self.match(labels):
            for name in m.receivers:
                if name not in seen:
                    seen.append(name)
        return seen


def default_routes(spec: Spec) -> list[Route]:
    """Layer (and severity) routes built from the first declared channel of each default type."""
    routes = []
    for (layer, severity), kinds in DEFAULT_LAYER_CHANNELS.items():
        match = {"layer": layer, **({"severity": severity} if severity else {})}
        for kind in kinds:
            names = [n for n, c in spec.channels.items() if c.type == kind]
            if names:
                also = [n for k in DEFAULT_ALSO.get((layer, severity), ())
                        for n in [n for n, c in spec.channels.items() if c.type == k][:1]]
                routes.append(Route(receivers=[names[0], *also], match=match))
                break
    return routes


def unrouted_receivers(spec: Spec, router: Router) -> list[str]:
    """The catch-all for alerts no route matches: `notifier.unrouted_receivers` when set (even empty), else
    the receivers of the routes a `layer=L2` alert takes, else every chat channel (Slack, WeCom)."""
    if spec.notifier.unrouted_receivers is not None:
        return list(spec.notifier.unrouted_receivers)
    out: list[str] = []
    for m in router.match({"layer": "L2"}):
        out += [n for n in m.receivers if n not in out]
    return out or [n for n, c in spec.channels.items() if c.type in CHAT_KINDS]


def parse_label_args(pairs: list[str]) -> dict[str, str]:
    """`["layer=L2", "severity=critical"]` → dict; ValueError naming the bad argument."""
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {pair!r}")
        labels[key.strip()] = value.strip().strip('"')
    return labels
