"""Route matchers that can never match: `inferwatch check` rejects them, naming the nearest valid label or value.

A typo in a route (`match: {layr: L1}`, `match: {layer: l1}`) is valid YAML and a valid spec, yet the route
never matches, so GPU pages fall through to the catch-all. The labels alerts can carry and the values of the
fixed-valued ones come from the rules registry (`inferwatch.rules.names.ALERTS`, checked against the generated
rule files by tests/test_rules_labels.py); `tier`, `tenant` and burn-rate `window` values from the spec (plus
`other`, which the gateway uses for anything undeclared); the spec's external labels (`spec.external_labels`, the
cluster's name among them) are on every alert, and alerts on a source's series carry the `=` labels of its selector
(spec `selectors`, e.g. `namespace` and `service`; the exporter-down alerts' absent() forms keep them too). The
cluster label takes any value: on a central store every cluster's alerts carry their own.
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


def _alert_can_match(name: str, info: AlertInfo, equal: dict[str, str], regex: dict[str, re.Pattern],
                     external: set[str], from_selectors: set[str] = frozenset()) -> bool:
    fixed = {"alertname": (name,), "layer": (info.layer,), "severity": info.severities}
    # An alert naming its series' job carries the rest of the source's selector labels too.
    carried = set(info.labels) | set(fixed) | external | (from_selectors if "job" in info.labels else set())
    for label in set(equal) | set(regex):
        if label not in carried:
            return False
        if label in fixed:
            options = fixed[label]
            if label in equal and equal[label] not in options:
                return False
            if label in regex and not any(regex[label].fullmatch(v) for v in options):
                return False
    return True


def check_routes(spec: Spec) -> None:
    """Raise SpecError (field `routes[i].match.<label>` or `.match_re.<label>`) for the first route matcher
    no alert of the rules can satisfy."""
    external = set(spec.external_labels)
    from_selectors = selector_labels(spec)
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
        if not any(_alert_can_match(n, info, route.match, regex, external, from_selectors)
                   for n, info in ALERTS.items()):
            wanted = ", ".join([f"{k}={v}" for k, v in route.match.items()]
                               + [f"{k}=~{v}" for k, v in route.match_re.items()])
            raise SpecError(f"routes[{i}].match", f"no alert carries all of {wanted}: the route can never match")
