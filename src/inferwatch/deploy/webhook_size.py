"""How many alerts one Alertmanager webhook may carry so that its body always fits the notifier's
`notifier.max_body_bytes` (the webhook's `max_alerts`, written by alertmanager_config).

Alertmanager does not retry a 4xx, so a body the notifier refuses with 413 is a group nobody hears of.
With `max_alerts: N` Alertmanager sends the first N alerts and counts the rest in `truncatedAlerts`,
which the notifier shows ("12 more not included"). N is the largest count whose worst-case body fits:

    max_alerts = (max_body_bytes - envelope bound) // alert bound

Worst case, from what bounds each part (Alertmanager `notify/webhook`: the template data plus version,
groupKey and truncatedAlerts, encoded by Go's encoding/json):
- labels: every series a generated rule reads comes from a scrape job of the generated configuration, which
  sets `label_limit`, `label_name_length_limit` and `label_value_length_limit` (LABEL_LIMIT, NAME_LIMIT,
  VALUE_LIMIT below; Prometheus fails a scrape above them rather than store the series). An alert has at
  most those labels plus its rule's own, `alertname`, and the external labels; Prometheus drops __name__.
- Go's encoder escapes `<`, `>`, `&`, control characters and U+2028/U+2029 as \\uXXXX: at most
  JSON_ESCAPE (6) bytes for one byte of a value. The rule's own text (label values, annotation templates) is
  counted exactly; each `{{ ... }}` action of an annotation template at most one label value.
- generatorURL: the Prometheus external URL (at most EXTERNAL_URL_MAX bytes) + `/graph?g0.expr=` + the
  rule's expression query-escaped (at most 3 bytes a byte) + `&g0.tab=1`.
- the envelope: groupLabels and commonLabels (at most one alert's labels each), commonAnnotations (one
  alert's annotations), groupKey (the route's matchers and the group labels, quoted twice), externalURL.

The bound holds for the alerts of the generated rules; an alert another source posts to the same
Alertmanager can be larger (the notifier then answers 413, counted and alerted by NotifierWebhooksRefused).
"""

from __future__ import annotations

import re

from inferwatch.spec import Spec

LABEL_LIMIT = 40         # labels per series (target labels included) the generated scrape jobs accept
NAME_LIMIT = 64          # bytes per label name
VALUE_LIMIT = 1024         # bytes per label value (the Triton collector cuts `reason` at 200 characters: <= 800 bytes)
FEDERATION_LABEL_LIMIT = LABEL_LIMIT + 16  # federated ALERTS: an alert's labels plus alertstate and replica
JSON_ESCAPE = 6          # bytes Go's encoding/json writes at most for one byte of a string (\u003c)
URL_ESCAPE = 3           # bytes url.QueryEscape writes at most for one byte (%3C)
EXTERNAL_URL_MAX = 512   # bytes of a Prometheus or Alertmanager --web.external-url
TIME_BYTES = 40          # "2006-01-02T15:04:05.999999999+07:00" with quotes and key
ALERT_FIXED = 200        # keys, punctuation, status, startsAt, endsAt, fingerprint of one alert
ENVELOPE_FIXED = 300     # receiver, status, version, truncatedAlerts (20 digits), keys, punctuation
_ACTION = re.compile(r"\{\{.*?\}\}", re.S)


# Characters Go's encoder writes as a 6-byte \uXXXX escape (HTML escaping on): `<`, `>`, `&`, U+2028, U+2029 and
# the control characters other than \n, \r and \t (which, like `"` and `\`, take a 2-byte escape).
_SIX_BYTE_ESCAPE = re.compile("[<>&\u2028\u2029\x00-\x08\x0b\x0c\x0e-\x1f]")


def _escaped(text: str) -> int:
    """Bytes Go's encoding/json (HTML escaping on) writes for `text`, quotes included.

    Counted with str methods: render_all sizes every annotation of every generated rule several times, and a
    loop over the characters was a quarter of its time."""
    two = sum(text.count(c) for c in "\n\r\t\"\\")
    six = sum(6 - len(c.encode("utf-8")) for c in _SIX_BYTE_ESCAPE.findall(text))
    return 2 + len(text.encode("utf-8")) + two + six


def _value() -> int:
    return 2 + JSON_ESCAPE * VALUE_LIMIT


def _template(text: str) -> int:
    """Bound of a rendered annotation template: its literal text exactly, each action one label value."""
    actions = _ACTION.findall(text)
    literal = _ACTION.sub("", text)
    return _escaped(literal) + len(actions) * JSON_ESCAPE * VALUE_LIMIT


def labels_bound(spec: Spec, rule_labels: dict[str, str]) -> int:
    """Bytes of one alert's `labels` object: the series' labels, the rule's, alertname, external labels."""
    fixed = {**spec.prometheus.external_labels, **rule_labels, "alertname": "x" * NAME_LIMIT}
    exact = sum(_escaped(k) + _escaped(v) + 2 for k, v in fixed.items())
    return 2 + exact + LABEL_LIMIT * (2 + NAME_LIMIT + 2 + _value())


def annotations_bound(annotations: dict[str, str]) -> int:
    return 2 + sum(_escaped(k) + _template(v) + 2 for k, v in annotations.items())


def _rules(spec: Spec) -> list[dict]:
    from inferwatch.rules.generate import rule_groups

    return [r.to_dict() for groups in rule_groups(spec).values() for g in groups for r in g.rules
            if getattr(r, "alert", None)]


def alert_bound(spec: Spec, rule: dict) -> int:
    """Worst-case bytes of one alert of `rule` (a rendered alerting rule) in a webhook body."""
    url = EXTERNAL_URL_MAX + len("/graph?g0.expr=") + URL_ESCAPE * len(rule["expr"].encode("utf-8")) + 12
    return (ALERT_FIXED + labels_bound(spec, rule["labels"]) + annotations_bound(rule["annotations"])
            + len('"generatorURL":') + url + TIME_BYTES * 2)


def group_labels_bound(spec: Spec) -> int:
    """Bytes of `groupLabels`: the labels of the longest `group_by` of the generated routes (every label of an
    alert where a route groups by `...`)."""
    from inferwatch.deploy.alertmanager import config

    def walk(route):
        yield route.get("group_by", [])
        for child in route.get("routes", []):
            yield from walk(child)

    longest = max(len(g) if "..." not in g else LABEL_LIMIT + 16 for g in walk(config(spec, max_alerts=0)["route"]))
    return 2 + longest * (2 + NAME_LIMIT + 2 + _value())


def envelope_bound(spec: Spec, alert_labels: int, alert_annotations: int) -> int:
    """Bytes of a webhook body besides its alerts: groupLabels, commonLabels (one alert's labels at most),
    commonAnnotations, groupKey (route matchers and group labels, Go-quoted, then JSON-escaped: at most 6
    bytes a byte), externalURL and the fixed fields."""
    group = group_labels_bound(spec)
    group_key = JSON_ESCAPE * (1024 + group)
    return ENVELOPE_FIXED + group + alert_labels + alert_annotations + group_key + EXTERNAL_URL_MAX


def max_alerts(spec: Spec) -> int:
    """`max_alerts` of the generated webhook configs: the most alerts whose worst-case body fits
    `notifier.max_body_bytes`. Raises SpecError when not even one alert fits."""
    from inferwatch.spec import SpecError

    rules = _rules(spec)
    per_alert = max(alert_bound(spec, r) for r in rules)
    labels = max(labels_bound(spec, r["labels"]) for r in rules)
    annotations = max(annotations_bound(r["annotations"]) for r in rules)
    room = spec.notifier.max_body_bytes - envelope_bound(spec, labels, annotations)
    if room < per_alert:
        need = spec.notifier.max_body_bytes - room + per_alert
        raise SpecError("notifier.max_body_bytes", f"expected at least {need} (one alert of the generated "
                                                   f"rules with labels at the scrape limits), got "
                                                   f"{spec.notifier.max_body_bytes}")
    return room // per_alert


def scrape_limits(federation: bool = False) -> dict[str, int]:
    """The label limits every generated scrape job sets (Prometheus scrape_config keys)."""
    return {"label_limit": FEDERATION_LABEL_LIMIT if federation else LABEL_LIMIT,
            "label_name_length_limit": NAME_LIMIT, "label_value_length_limit": VALUE_LIMIT}

