"""Route matchers that can never match: `inferwatch check` rejects them, naming the nearest valid label or value.

A typo in a route (`match: {layr: L1}`, `match: {layer: l1}`) is valid YAML and a valid spec, yet the route
never matches, so GPU pages fall through to the catch-all. The labels alerts can carry and the values of the
fixed-valued ones come from the rules registry (`inferwatch.rules.names.ALERTS`, checked against the generated
rule files by tests/test_rules_labels.py); `tier`, `tenant` and burn-rate `window` values from the spec (plus
`other`, which the gateway uses for anything undeclared); the spec's external labels (`spec.external_labels`, the
cluster's name among them) are on every alert, and alerts on a source's series carry the `=` labels of its
selector (spec `selectors`, e.g. `namespace` and `service`; the exporter-down alerts' absent() forms keep them
too), only the alerts whose expression reads that source, and only with the selector's value. A route's
matchers are a conjunction: some alert must carry all of them at once (`{layer: L3, service: web-chat}` with
`service` from the Triton selector can never match). The cluster label takes any value: on a central store
every cluster's alerts carry their own.
"""

from __future__ import annotations

import difflib
import re

from inferwatch.rules.names import ALERTS, FIXED_LABEL_VALUES, AlertInfo, alert_label_names
from inferwatch.spec import OTHER, Spec, SpecError


def _nearest(word: str, choices) -> str | None:
    choices = sorted(set(choices))
    same_case = [c for c in choices if c.lower() == word.lower()]
    if same_case:
        return same_case[0]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def _hint(word: str, choices) -> str:
    near = _nearest(word, choices)
    return f"did you mean {near!r}? " if near else ""


def _known_values(spec: Spec) -> dict[str, tuple[str, ...]]:
    values = dict(FIXED_LABEL_VALUES)
    values["tier"] = (*spec.tiers, OTHER)
    values["window"] = tuple(pair.name for pair in spec.layers.L3.burn_rate_windows)
    if spec.tenants:
        values["tenant"] = (*spec.tenants, OTHER)
    for label, value in spec.prometheus.external_labels.items():
        if label != spec.cluster.label:
            values[label] = (value,)
    return values


def selector_labels(spec: Spec) -> set[str]:
    """Labels the spec's selectors require with `=` (every selected series, and the alerts on them, carry them)."""
    from inferwatch.selectors import SOURCES

    return {label for source in SOURCES for label in spec.selectors.of(source).labels}


def alert_selector_labels(spec: Spec) -> dict[str, dict[str, set[str]]]:
    """alert name -> {label: values} of the `=` labels of the selectors its expression reads (from the rules
    generated for `spec`): a layer=L3 alert carries the gateway selector's `namespace`, never the Triton one's.
    Only alerts that keep their series' `job` keep these labels (an aggregation drops them)."""
    from inferwatch.rules.generate import rule_groups
    from inferwatch.rules.model import Alert
    from inferwatch.selectors import SOURCES

    selectors = {source: spec.selectors.of(source) for source in SOURCES}
    out: dict[str, dict[str, set[str]]] = {}
    for groups in rule_groups(spec).values():
        for rule in (r for g in groups for r in g.rules if isinstance(r, Alert)):
            carried = out.setdefault(rule.alert, {})
            if "job" not in ALERTS[rule.alert].labels:
                continue
            for selector in selectors.values():
                text = str(selector)
                if text and ("{" + text + "}" in rule.expr or "{" + text + "," in rule.expr):
                    for label, value in selector.labels.items():
                        carried.setdefault(label, set()).add(value)
    return out


def _alert_can_match(name: str, info: AlertInfo, equal: dict[str, str], regex: dict[str, re.Pattern],
                     external: set[str], from_selectors: dict[str, set[str]] | None = None,
                     values: dict[str, tuple[str, ...]] | None = None) -> bool:
    """Whether one alert of `name` can carry every matcher at once (a route's matchers are a conjunction)."""
    fixed = {"alertname": (name,), "layer": (info.layer,), "severity": info.severities}
    options: dict[str, tuple[str, ...] | None] = {label: None for label in external}
    for label in info.labels:
        options[label] = (values or {}).get(label)
    for label, vals in (from_selectors or {}).items():
        if label not in info.labels:  # a label the alert has from its own series takes any value
            options[label] = tuple(sorted(vals))
    options.update(fixed)
    for label in set(equal) | set(regex):
        if label not in options:
            return False
        allowed = options[label]
        if allowed is None:
            continue
        if label in equal and equal[label] not in allowed:
            return False
        if label in regex and not any(regex[label].fullmatch(v) for v in allowed):
            return False
    return True


def _listing(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _conflict(route, regex, can) -> str:
    """Why no alert carries all of a route's matchers: the first matcher that no alert matching the others
    carries, and which alerts could carry it."""
    matchers = [(k, v, "=") for k, v in route.match.items()] + [(k, v, "=~") for k, v in route.match_re.items()]
    # Blame a label other than alertname/layer/severity first: those say which alerts the route is for.
    for label, value, op in sorted(matchers, key=lambda m: m[0] in ("alertname", "layer", "severity")):
        rest_eq = {k: v for k, v in route.match.items() if not (k == label and op == "=")}
        rest_re = {k: r for k, r in regex.items() if not (k == label and op == "=~")}
        if not any(can(n, info, rest_eq, rest_re) for n, info in ALERTS.items()):
            continue
        only_eq = {label: value} if op == "=" else {}
        only_re = {label: regex[label]} if op == "=~" else {}
        carriers = [n for n, info in ALERTS.items() if can(n, info, only_eq, only_re)]
        others = ", ".join(f"{k}{o}{v}" for k, v, o in matchers if k != label)
        return (f"no alert with {others} carries {label}{op}{value}; "
                f"alerts that can carry {label}{op}{value}: {_listing(carriers) or 'none'}")
    return ""


def check_routes(spec: Spec) -> None:
    """Raise SpecError (field `routes[i].match.<label>` or `.match_re.<label>`) for the first route matcher
    no alert of the rules can satisfy."""
    external = set(spec.external_labels)
    from_selectors = selector_labels(spec)
    per_alert = alert_selector_labels(spec) if spec.routes else {}
    labels = alert_label_names() | external | from_selectors
    values = _known_values(spec)
    for i, route in enumerate(spec.routes):
        regex = {k: re.compile(v) for k, v in route.match_re.items()}
        for field, matchers in (("match", route.match), ("match_re", route.match_re)):
            for label, value in matchers.items():
                path = f"routes[{i}].{field}.{label}"
                if label not in labels:
                    raise SpecError(path, f"no alert carries a label {label!r}: {_hint(label, labels)}"
                                          f"labels alerts carry: {', '.join(sorted(labels))}")
                options = values.get(label)
                if options is None:
                    continue  # node, model, gpu ...: any value can occur
                if field == "match" and value not in options:
                    raise SpecError(path, f"no alert has {label}={value!r}: {_hint(value, options)}"
                                          f"values: {', '.join(options)}")
                if field == "match_re" and not any(regex[label].fullmatch(v) for v in options):
                    raise SpecError(path, f"{value!r} matches no {label} an alert has: "
                                          f"{_hint(value, options)}values: {', '.join(options)}")
        def can(name, info, equal, regexes):
            return _alert_can_match(name, info, equal, regexes, external, per_alert.get(name, {}), values)

        if not any(can(n, info, route.match, regex) for n, info in ALERTS.items()):
            wanted = ", ".join([f"{k}={v}" for k, v in route.match.items()]
                               + [f"{k}=~{v}" for k, v in route.match_re.items()])
            why = _conflict(route, regex, can)
            raise SpecError(f"routes[{i}].match", f"no alert carries all of {wanted}: the route can never match"
                                                  + (f" ({why})" if why else ""))
