"""The Alertmanager webhook payload (version "4") as typed data, and the Notification a channel sends.

Payload shape: Alertmanager `notify/webhook/webhook.go` (`Message{*template.Data; Version; GroupKey;
TruncatedAlerts uint64}`; times are Go `time.Time`, marshalled as RFC 3339 with nanoseconds).

Parsing refuses only what is not an Alertmanager payload at all (not JSON, not version "4", no alerts list,
a field of the wrong JSON type, a status other than firing/resolved): PayloadError names the field.
Anything Alertmanager may send is accepted and, where it exceeds a bound, made safe, because Alertmanager
does not retry a 4xx and the page would be lost (each change is reported as a Repair, logged and counted):
  - a string over MAX_VALUE_CHARS is cut, ending with a marker saying how many characters were cut;
  - a label or annotation set over MAX_LABELS entries keeps the first ones and says so in an annotation;
  - more than MAX_ALERTS alerts: the rest are counted in truncatedAlerts, as Alertmanager's max_alerts does;
  - a lone UTF-16 surrogate (`"\ud800"`, which cannot be stored or sent as UTF-8) and invalid UTF-8 bytes
    become U+FFFD;
  - an alert without `alertname` is kept (Alertmanager's API does not require one).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
from typing import Any

import ciso8601

MAX_ALERTS = 10_000       # alerts kept per webhook; more are counted as truncated (body size bounds it anyway)
UINT64_MAX = 2**64 - 1    # Alertmanager's truncatedAlerts is a Go uint64
MAX_LABELS = 256          # entries kept per label or annotation set
MAX_VALUE_CHARS = 16_384  # characters kept per string (label, annotation, URL); longer ones are cut
NOTE_ANNOTATION = "inferwatch_note"  # annotation that says what intake dropped from an alert


class PayloadError(ValueError):
    """A webhook body the notifier cannot accept; the message says which field is wrong and why."""


@dataclasses.dataclass(frozen=True)
class Repair:
    """One change intake made to keep an alert it could not keep as sent. `kind` is one of REPAIR_KINDS
    (a metric label, so a closed set); `path` is the field (`alerts[0].annotations.description`)."""

    kind: str
    path: str
    detail: str


REPAIR_KINDS = ("value_cut", "entries_dropped", "alerts_dropped", "invalid_unicode")


@dataclasses.dataclass(frozen=True)
class Alert:
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    ends_at: str
    generator_url: str
    fingerprint: str

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def to_json(self) -> dict:
        return {"status": self.status, "labels": self.labels, "annotations": self.annotations,
                "startsAt": self.starts_at, "endsAt": self.ends_at, "generatorURL": self.generator_url,
                "fingerprint": self.fingerprint}


@dataclasses.dataclass(frozen=True)
class WebhookMessage:
    """One Alertmanager notification: a group of alerts with its status."""

    receiver: str
    status: str
    alerts: tuple[Alert, ...]
    group_labels: dict[str, str]
    common_labels: dict[str, str]
    common_annotations: dict[str, str]
    external_url: str
    group_key: str
    truncated_alerts: int = 0

    def to_json(self) -> dict:
        return {"version": "4", "receiver": self.receiver, "status": self.status,
                "alerts": [a.to_json() for a in self.alerts], "groupLabels": self.group_labels,
                "commonLabels": self.common_labels, "commonAnnotations": self.common_annotations,
                "externalURL": self.external_url, "groupKey": self.group_key,
                "truncatedAlerts": self.truncated_alerts}

    @property
    def labels(self) -> dict[str, str]:
        """Labels routing looks at: the labels every alert of the group shares."""
        return self.common_labels

    @property
    def firing(self) -> list[Alert]:
        return [a for a in self.alerts if a.status == "firing"]

    @property
    def resolved(self) -> list[Alert]:
        return [a for a in self.alerts if a.status == "resolved"]

    def alert_count(self) -> int:
        return len(self.alerts) + self.truncated_alerts

    def delivery_key(self) -> str:
        """Identifies this notification: same group, receiver, status and alert states → same key.

        Alertmanager retries and HA peers resend byte-different JSON for the same state (key order, timing).
        The key covers what Alertmanager itself compares before notifying again (its DedupStage: the sets of
        firing and resolved alerts by fingerprint, i.e. by labels), plus each alert's start and end: an
        annotation change alone is not a new notification there (Alertmanager sends none for it before
        repeat_interval), and HA peers' copies differ in annotations that quote `$value`.
        """
        parts = [self.group_key, self.status, self.receiver]
        parts += sorted(f"{a.fingerprint}|{a.status}|{a.starts_at}|{a.ends_at}" for a in self.alerts)
        return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()


@dataclasses.dataclass
class Notification:
    """What a channel sends: one or more groups (more than one when coalesced under a storm).

    `ids` are the outbox rows it covers; `escalated` marks a chat alert escalated to phone;
    `budget_factor` < 1 asks a channel to render smaller (after a provider said "too long").
    """

    channel: str
    groups: list[WebhookMessage]
    ids: list[int] = dataclasses.field(default_factory=list)
    escalated: bool = False
    enrichment: str = ""
    budget_factor: float = 1.0

    @property
    def coalesced(self) -> bool:
        return len(self.groups) > 1

    @property
    def status(self) -> str:
        return "firing" if any(g.status == "firing" for g in self.groups) else "resolved"

    @property
    def alerts(self) -> list[Alert]:
        return [a for g in self.groups for a in g.alerts]

    def alert_count(self) -> int:
        return sum(g.alert_count() for g in self.groups)


# ------------------------------------------------------------------------------------------- parsing
def parse_webhook(body: bytes, repairs: list[Repair] | None = None) -> WebhookMessage:
    """Parse and validate a webhook body. Raises PayloadError('field: what is wrong'); appends to `repairs`
    each change made to keep an oversized or badly encoded value (see the module docstring)."""
    repairs = [] if repairs is None else repairs
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Go's encoding/json never writes invalid UTF-8; a proxy or a template may. Keep the page.
        text = body.decode("utf-8", errors="replace")
        repairs.append(Repair("invalid_unicode", "body", f"invalid UTF-8 at byte {exc.start} replaced by U+FFFD"))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("body is not JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's int_max_str_digits
        raise PayloadError(f"body is not JSON: {_clip(exc, 120)}") from None
    return message_from_dict(data, repairs)


def message_from_dict(data: Any, repairs: list[Repair] | None = None) -> WebhookMessage:
    """A WebhookMessage from decoded JSON (a webhook body, or one stored by the outbox)."""
    r = _Reader([] if repairs is None else repairs)
    if not isinstance(data, dict):
        raise PayloadError(f"body: expected a JSON object, got {_show(data)}")
    version = data.get("version")
    if version != "4":
        raise PayloadError(f"version: expected \"4\" (Alertmanager webhook), got {_show(version)}")
    alerts_raw = data.get("alerts")
    if not isinstance(alerts_raw, list) or not alerts_raw:
        raise PayloadError(f"alerts: expected a non-empty list, got {_show(alerts_raw)}")
    truncated = data.get("truncatedAlerts", 0)
    if isinstance(truncated, bool) or not isinstance(truncated, int) or not 0 <= truncated <= UINT64_MAX:
        # Alertmanager's field is a Go uint64: anything else did not come from an Alertmanager.
        raise PayloadError(f"truncatedAlerts: expected an integer from 0 to 2^64-1, got {_show(truncated)}")
    if len(alerts_raw) > MAX_ALERTS:
        extra = len(alerts_raw) - MAX_ALERTS
        r.repairs.append(Repair("alerts_dropped", "alerts", f"{extra} alerts over {MAX_ALERTS} counted as truncated"))
        truncated = min(UINT64_MAX, truncated + extra)  # still a uint64, as every value kept
        alerts_raw = alerts_raw[:MAX_ALERTS]
    alerts = tuple(r.alert(a, f"alerts[{i}]") for i, a in enumerate(alerts_raw))
    return WebhookMessage(
        receiver=r.text(data.get("receiver", ""), "receiver"),
        status=_status(data.get("status"), "status"),
        alerts=alerts,
        group_labels=r.labels(data.get("groupLabels") or {}, "groupLabels"),
        common_labels=r.labels(data.get("commonLabels") or {}, "commonLabels"),
        common_annotations=r.labels(data.get("commonAnnotations") or {}, "commonAnnotations"),
        external_url=r.text(data.get("externalURL", ""), "externalURL"),
        group_key=r.required_str(data.get("groupKey"), "groupKey"),
        truncated_alerts=truncated,
    )


_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads pairs valid surrogates, so any left is a lone one


def cut_marker(cut: int, total: int) -> str:
    """The visible end of a value intake shortened: says how much is missing."""
    return f" …[cut {cut:,} of {total:,} characters]"


class _Reader:
    """Validates fields and makes oversized or badly encoded values safe, recording each change."""

    def __init__(self, repairs: list[Repair]):
        self.repairs = repairs

    def alert(self, raw: Any, path: str) -> Alert:
        if not isinstance(raw, dict):
            raise PayloadError(f"{path}: expected an object, got {_show(raw)}")
        annotations = self.labels(raw.get("annotations") or {}, f"{path}.annotations")
        labels = self.labels(raw.get("labels"), f"{path}.labels", note=annotations)
        return Alert(
            status=_status(raw.get("status"), f"{path}.status"),
            labels=labels,
            annotations=annotations,
            starts_at=self.text(raw.get("startsAt", ""), f"{path}.startsAt"),
            ends_at=self.text(raw.get("endsAt", ""), f"{path}.endsAt"),
            generator_url=self.text(raw.get("generatorURL", ""), f"{path}.generatorURL"),
            fingerprint=self.text(raw.get("fingerprint", ""), f"{path}.fingerprint"),
        )

    def labels(self, raw: Any, path: str, note: dict[str, str] | None = None) -> dict[str, str]:
        """An object of strings. Over MAX_LABELS entries: the first are kept and `note` (the alert's
        annotations; the set itself for annotations) says how many were dropped."""
        if not isinstance(raw, dict):
            raise PayloadError(f"{path}: expected an object of strings, got {_show(raw)}")
        out: dict[str, str] = {}
        for i, (k, v) in enumerate(raw.items()):
            if not isinstance(v, str):
                raise PayloadError(f"{path}.{_clip(k)}: expected a string, got {_show(v)}")
            if i < MAX_LABELS:
                key = self.text(k, f"{path} key {_clip(k)}")
                out[key] = self.text(v, f"{path}.{_clip(key)}")
        if len(raw) > MAX_LABELS:
            dropped = len(raw) - MAX_LABELS
            what = path.rsplit(".", 1)[-1]
            self.repairs.append(Repair("entries_dropped", path, f"{dropped} of {len(raw)} entries dropped"))
            (out if note is None else note)[NOTE_ANNOTATION] = (
                f"{dropped} of {len(raw)} {what} dropped by inferwatch (at most {MAX_LABELS} kept)")
        return out

    def text(self, raw: Any, path: str) -> str:
        if not isinstance(raw, str):
            raise PayloadError(f"{path}: expected a string, got {_show(raw)}")
        if _SURROGATE.search(raw):
            raw = _SURROGATE.sub("\ufffd", raw)
            self.repairs.append(Repair("invalid_unicode", path, "lone UTF-16 surrogate replaced by U+FFFD"))
        if len(raw) > MAX_VALUE_CHARS:
            keep = MAX_VALUE_CHARS - len(cut_marker(len(raw), len(raw)))  # the longest the marker can be
            marker = cut_marker(len(raw) - keep, len(raw))
            self.repairs.append(Repair("value_cut", path, f"{len(raw):,} characters cut to {keep:,}"))
            raw = raw[:keep] + marker
        return raw

    def required_str(self, raw: Any, path: str) -> str:
        if not isinstance(raw, str) or not raw:
            raise PayloadError(f"{path}: expected a non-empty string, got {_show(raw)}")
        return self.text(raw, path)


def _status(raw: Any, path: str) -> str:
    if raw not in ("firing", "resolved"):
        raise PayloadError(f"{path}: expected \"firing\" or \"resolved\", got {_show(raw)}")
    return raw


def _clip(text: Any, limit: int = 40) -> str:
    text = _SURROGATE.sub("\ufffd", str(text))
    return text if len(text) <= limit else text[:limit] + "…"


def _show(value: Any) -> str:
    """A short, log-safe rendering of an offending value (never the whole body)."""
    try:
        return _clip(json.dumps(value, ensure_ascii=True), 60)
    except (TypeError, ValueError, RecursionError):
        return type(value).__name__


# -------------------------------------------------------------------------------------------- times
def parse_time(text: str) -> float | None:
    """An RFC 3339 time as Alertmanager writes it (Go's RFC3339Nano: `Z` or an offset such as `+08:00`,
    up to nine fractional digits) → epoch seconds, to the microsecond (further digits are dropped: a float
    epoch cannot hold them). None when unparsable, and for Go's zero time `0001-01-01T00:00:00Z`, which
    Alertmanager sends for "not set" (e.g. endsAt of a firing alert): unknown, never year 1.
    Parser: ciso8601.parse_rfc3339 (strict RFC 3339: date, time and offset all required)."""
    try:
        t = ciso8601.parse_rfc3339(text)
    except ValueError:
        return None
    if t == GO_ZERO_TIME:
        return None
    return t.timestamp()


GO_ZERO_TIME = dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)
