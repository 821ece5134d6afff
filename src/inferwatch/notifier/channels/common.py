"""What every channel says about a group, before any markup: its title and counts, its alerts in order
(firing first, each with its own status), and where each label and annotation goes.

Every label and annotation is reachable from the message:
  - group level: the key labels (KEY_LABELS) the alerts share, in the text; the other shared labels and
    shared annotations in a details line;
  - alert level: the labels that tell the alert apart from the group (its identity), in the text; the
    annotations the template does not show in a details line; runbook_url and generatorURL as links when
    they are http(s) URLs, in the details otherwise.
A digest (several groups in one chat message, when a destination's rate holds messages back) gives each
group one line that tells it apart from the others (digest_lines): its status and count, alert name,
severity, the labels whose values differ between the groups, and its runbook link.
Counts never over-claim: Alertmanager's `truncatedAlerts` are alerts it left out of the payload without
saying whether they fire, so the title says "12 more not included", never "FIRING:14", and the counts of a
cut group are lower bounds: `[FIRING:2+] ... — at least 2 firing, at least 1 resolved, 37 more not included
(40 in the group)`.
"""

from __future__ import annotations

import dataclasses
import functools
import string
from collections import Counter

from inferwatch.notifier.channels.template import identifiers
from inferwatch.notifier.model import Alert, Notification, WebhookMessage

# Labels worth showing next to the title, in this order; the others are in the details.
KEY_LABELS = ("severity", "layer", "node", "gpu", "triton", "model", "version", "tenant", "tier", "window", "team",
              "instance", "job", "route")
LINK_ANNOTATIONS = ("runbook_url",)
DIGEST_LINE_LABELS = 6         # labels named on one group's line of a digest; the others are counted
DIGEST_LINE_VALUES = 3         # values named of a label that varies inside one group; the others are counted
DIGEST_VALUE_CHARS = 60        # a label value (or alert name) on a digest line, at most, cut marker included
DIGEST_URL_MAX_CHARS = 1000    # a longer runbook URL is not linked from a digest line (it cannot be cut)
DIGEST_MORE_NAMES = 5          # alert names counted in a digest's "…and N more group(s)" line, at most
TEMPLATE_ANNOTATIONS = ("summary", "description", "runbook_url")  # annotations a template can place


# ------------------------------------------------------------------------------------------------ titles
def counts_phrase(group: WebhookMessage) -> str:
    """`2 firing, 1 resolved`; '' when the status count says it all. When Alertmanager cut the group, each
    count is a lower bound and the group's size is stated: `at least 2 firing, at least 1 resolved, 37 more
    not included (40 in the group)`."""
    parts = []
    firing, resolved = len(group.firing), len(group.resolved)
    cut = group.truncated_alerts
    least = "at least " if cut else ""
    if firing:
        parts.append(f"{least}{firing} firing")
    if resolved:
        parts.append(f"{least}{resolved} resolved")
    if cut:
        parts.append(f"{cut} more not included ({len(group.alerts) + cut} in the group)")
    return ", ".join(parts) if len(parts) > 1 else ""


def title_parts(group: WebhookMessage) -> list[tuple[str, bool]]:
    """The title as (text, is_value) pieces: `[FIRING:2] TritonServerDown node-a — 2 firing, 1 resolved`.
    Alertmanager's default title shape; the number counts the alerts present with the group's status, with a
    `+` when Alertmanager left alerts out (`[FIRING:2+] ... — at least 2 firing, ..., 12 more not included
    (15 in the group)`). Pieces marked is_value come from the alerts and must be shown exactly."""
    shown = group.firing if group.status == "firing" else group.resolved
    name = group.common_labels.get("alertname") or group.group_labels.get("alertname") or ""
    plus = "+" if group.truncated_alerts else ""
    parts: list[tuple[str, bool]] = [(f"[{group.status.upper()}:{len(shown)}{plus}] ", False)]
    parts.append((name, True) if name else ("alerts", False))
    for k, v in group.group_labels.items():
        if k != "alertname" and v:
            parts += [(" ", False), (v, True)]
    counts = counts_phrase(group)
    if counts:
        parts.append((f" — {counts}", False))
    return parts


def group_title(group: WebhookMessage) -> str:
    return "".join(text for text, _ in title_parts(group))


def coalesced_title(n: Notification) -> str:
    """`[FIRING] 3 notifications, 30 alerts (coalesced), 12 more not included` (alerts present in the
    payloads; the ones Alertmanager left out are counted apart)."""
    present = sum(len(g.alerts) for g in n.groups)
    truncated = sum(g.truncated_alerts for g in n.groups)
    more = f", {truncated} more not included" if truncated else ""
    return f"[{n.status.upper()}] {len(n.groups)} notifications, {present} alerts (coalesced){more}"


def counts_by_name(n: Notification) -> list[tuple[str, str, int]]:
    """(alertname, status, count) over every alert of every group; alerts Alertmanager left out of a
    payload count under the group's alertname with status "not included"."""
    counter: Counter = Counter()
    for g in n.groups:
        for a in g.alerts:
            counter[(a.name, a.status)] += 1
        if g.truncated_alerts:
            counter[(g.common_labels.get("alertname", ""), "not included")] += g.truncated_alerts
    return [(name, status, c) for (name, status), c in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]


# ------------------------------------------------------------------------------------------------ labels
def key_labels(labels: dict[str, str]) -> list[tuple[str, str]]:
    return [(k, labels[k]) for k in KEY_LABELS if labels.get(k)]


def _ordered(pairs: dict[str, str]) -> list[tuple[str, str]]:
    """Key labels first (KEY_LABELS order), then the rest by name."""
    first = [(k, pairs[k]) for k in KEY_LABELS if k in pairs]
    return first + sorted((k, v) for k, v in pairs.items() if k not in KEY_LABELS)


def annotation(alert: Alert, group: WebhookMessage, key: str) -> str:
    return alert.annotations.get(key) or group.common_annotations.get(key, "")


def alert_fields(alert: Alert, group: WebhookMessage) -> dict[str, str]:
    """Fields a template may use: every label, plus status, summary, description, runbook_url, links."""
    fields = dict(alert.labels)
    fields.update(status=alert.status, summary=annotation(alert, group, "summary") or alert.name,
                  description=annotation(alert, group, "description"),
                  runbook_url=annotation(alert, group, "runbook_url"),
                  generator_url=alert.generator_url, alertmanager_url=group.external_url,
                  starts_at=alert.starts_at)
    fields.setdefault("severity", "")
    fields.setdefault("node", "")
    return fields


def render_template(template: str, fields: dict[str, str]) -> str:
    """string.Template with `${label}` placeholders; unknown ones stay as written (never an exception)."""
    text = string.Template(template).safe_substitute(fields)
    # Split at "\n" only: str.splitlines() also splits at U+2028, \x1c-\x1e and \x85 inside a value.
    return "\n".join(line for line in text.split("\n") if line.strip())  # an empty annotation leaves no gap


def is_http_url(url: str) -> bool:
    return url.startswith(("http://", "https://")) and len(url) <= 3000 and not any(c.isspace() for c in url)


# ------------------------------------------------------------------------------------------------ views
@dataclasses.dataclass
class AlertView:
    alert: Alert
    fields: dict[str, str]               # what the template substitutes
    identity: list[tuple[str, str]]      # labels that tell this alert apart from the group
    details: list[tuple[str, str]]       # annotations the template does not show; URLs that are not links
    links: list[tuple[str, str]]         # (text, url): Runbook, Prometheus

    @property
    def status(self) -> str:
        return self.alert.status

    @property
    def name(self) -> str:
        return self.alert.name


@dataclasses.dataclass
class GroupView:
    group: WebhookMessage
    key_labels: list[tuple[str, str]]    # shared key labels (in the text)
    details: list[tuple[str, str]]       # other shared labels and shared annotations
    alerts: list[AlertView]              # firing first, then resolved

    @property
    def first(self) -> AlertView:
        return self.alerts[0]


def group_view(group: WebhookMessage, template: str) -> GroupView:
    """The group as the channels show it (see the module docstring). `template` decides which annotations
    the text shows; the others go to the details."""
    shown_by_template = identifiers(template) & set(TEMPLATE_ANNOTATIONS)
    common = group.common_labels
    group_details = [(k, v) for k, v in _ordered(common) if k != "alertname" and k not in KEY_LABELS]
    group_details += [(k, v) for k, v in sorted(group.common_annotations.items())
                      if k not in shown_by_template and not (k in LINK_ANNOTATIONS and is_http_url(v))]
    ordered = [a for a in group.alerts if a.status == "firing"] + [a for a in group.alerts if a.status != "firing"]
    return GroupView(group, key_labels(common), group_details,
                     [_alert_view(a, group, shown_by_template) for a in ordered])


def _alert_view(alert: Alert, group: WebhookMessage, shown_by_template: set[str]) -> AlertView:
    common = group.common_labels
    identity = _ordered({k: v for k, v in alert.labels.items() if common.get(k) != v})
    details = [(k, v) for k, v in sorted(alert.annotations.items())
               if k not in shown_by_template and group.common_annotations.get(k) != v
               and not (k in LINK_ANNOTATIONS and is_http_url(v))]
    links = []
    runbook = annotation(alert, group, "runbook_url")
    if is_http_url(runbook):
        links.append(("Runbook", runbook))
    if is_http_url(alert.generator_url):
        links.append(("Prometheus", alert.generator_url))
    elif alert.generator_url:
        details.append(("generatorURL", alert.generator_url))
    return AlertView(alert, alert_fields(alert, group), identity, details, links)


# ------------------------------------------------------------------------------------------------ digests
class DigestLine:
    """One group on its line of a digest: what tells it apart from the digest's other groups. Name and
    status are known for every group (the "…and N more" line counts them); the rest is worked out only for
    the lines a message shows."""

    def __init__(self, group: WebhookMessage, summary: dict[str, str], differ: set[str]):
        self.group = group
        self._summary = summary
        self._differ = differ
        self.name = summary.get("alertname", "")   # '' when the group has none; `A,B` when its alerts differ
        self.severity = summary.get("severity", "")

    @property
    def status(self) -> str:
        return self.group.status

    @functools.cached_property
    def tag(self) -> str:
        """`[FIRING:2]`, `[RESOLVED:1]`, `[FIRING:2+]` (title_parts' first piece)."""
        return title_parts(self.group)[0][0].strip()

    @functools.cached_property
    def counts(self) -> str:
        """counts_phrase: '' when the tag says it all."""
        return counts_phrase(self.group)

    @functools.cached_property
    def _named(self) -> list[tuple[str, str]]:
        s, g = self._summary, self.group
        if self._differ:
            return _ordered({k: s[k] for k in self._differ if k in s})
        return [(k, v) for k, v in g.group_labels.items() if k not in ("alertname", "severity") and v]

    @property
    def labels(self) -> list[tuple[str, str]]:
        """The labels that tell the groups apart (see digest_lines), at most DIGEST_LINE_LABELS."""
        return self._named[:DIGEST_LINE_LABELS]

    @property
    def more_labels(self) -> int:
        """Labels that tell the groups apart but are not named (over DIGEST_LINE_LABELS)."""
        return max(0, len(self._named) - DIGEST_LINE_LABELS)

    @functools.cached_property
    def runbook(self) -> str:
        """The group's runbook_url (shared, else its first alert's): an http(s) URL of at most
        DIGEST_URL_MAX_CHARS, or ''."""
        g = self.group
        url = g.common_annotations.get("runbook_url") or next(
            (a.annotations["runbook_url"] for a in g.firing + g.resolved if a.annotations.get("runbook_url")), "")
        return url if len(url) <= DIGEST_URL_MAX_CHARS and is_http_url(url) else ""


def digest_lines(n: Notification) -> list[DigestLine]:
    """One DigestLine per group of `n`, firing groups first (then in the order given).

    The labels named are the ones that tell the groups apart: every label whose value is not the same in
    all groups (present in some and not others counts as differing), key labels (KEY_LABELS) first, at most
    DIGEST_LINE_LABELS. A group's value of a label is its common label, or for a label its alerts do not
    share, their values (`0,1,2,+5`). When no label differs (one group firing and then resolved), its group
    labels (Alertmanager's `groupLabels`) are named instead. Alert name and severity are named apart and
    never counted among the labels. Cost: linear in the number of labels of all alerts."""
    summaries = [_label_summary(g) for g in n.groups]
    values: dict[str, set] = {}
    for s in summaries:
        for k in s:
            values.setdefault(k, set())
    for s in summaries:
        for k, vs in values.items():
            vs.add(s.get(k))
    differ = {k for k, vs in values.items() if len(vs) > 1} - {"alertname", "severity"}
    lines = [DigestLine(g, s, differ) for g, s in zip(n.groups, summaries, strict=True)]
    return [x for x in lines if x.status == "firing"] + [x for x in lines if x.status != "firing"]


def _label_summary(g: WebhookMessage) -> dict[str, str]:
    """The group's labels: its common (and group) labels as they are; a label its alerts do not share as
    their values, sorted, the first DIGEST_LINE_VALUES named and the rest counted (`0,1,2,+5`)."""
    out = {k: v for k, v in g.group_labels.items() if v}
    out.update((k, v) for k, v in g.common_labels.items() if v)
    varying: dict[str, set[str]] = {}
    for a in g.alerts:
        for k, v in a.labels.items():
            if k not in out and v:
                varying.setdefault(k, set()).add(v)
    for k, vs in varying.items():
        first = sorted(vs)[:DIGEST_LINE_VALUES]
        out[k] = ",".join(first) + (f",+{len(vs) - len(first)}" if len(vs) > len(first) else "")
    return out


def omitted_names(lines: list[DigestLine]) -> list[tuple[str, str, int]]:
    """(alertname, status, groups) over `lines`, most groups first: what a digest's "…and N more group(s)"
    line counts."""
    counter: Counter = Counter((x.name, x.status) for x in lines)
    return [(name, status, c) for (name, status), c in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]
