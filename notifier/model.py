"""The Alertmanager webhook payload (version "4") as typed data, and the Notification a channel sends.

Payload shape: Alertmanager `notify/webhook/webhook.go` (`Message{*template.Data; Version; GroupKey;
TruncatedAlerts}`), see research/alerting.md §4.1. Parsing is strict about structure (a clear PayloadError
naming the field) and lenient about content Alertmanager may leave empty (annotations, generatorURL).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

MAX_ALERTS = 10_000      # per webhook; Alertmanager's max_alerts is usually far lower
MAX_LABELS = 256         # per alert
MAX_VALUE_CHARS = 16_384  # per label or annotation value


class PayloadError(ValueError):
    """A webhook body the notifier cannot accept; the message says which field is wrong and why."""


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
        """Identifies this exact notification: same group, status and alert states → same key.

        Alertmanager retries and HA peers resend byte-different JSON for the same state (key order, timing),
        so the key covers only what makes the notification distinct.
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
def parse_webhook(body: bytes) -> WebhookMessage:
    """Parse and validate a webhook body. Raises PayloadError('field: what is wrong')."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("body is not JSON: nested too deeply") from None
    return message_from_dict(data)


def message_from_dict(data: Any) -> WebhookMessage:
    if not isinstance(data, dict):
        raise PayloadError(f"body: expected a JSON object, got {type(data).__name__}")
    version = data.get("version")
    if version != "4":
        raise PayloadError(f"version: expected \"4\" (Alertmanager webhook), got {_show(version)}")
    alerts_raw = data.get("alerts")
    if not isinstance(alerts_raw, list) or not alerts_raw:
        raise PayloadError(f"alerts: expected a non-empty list, got {_show(alerts_raw)}")
    if len(alerts_raw) > MAX_ALERTS:
        raise PayloadError(f"alerts: at most {MAX_ALERTS} alerts per webhook, got {len(alerts_raw)}")
    alerts = tuple(_alert(a, f"alerts[{i}]") for i, a in enumerate(alerts_raw))
    truncated = data.get("truncatedAlerts", 0)
    if isinstance(truncated, bool) or not isinstance(truncated, int) or truncated < 0:
        raise PayloadError(f"truncatedAlerts: expected a non-negative integer, got {_show(truncated)}")
    return WebhookMessage(
        receiver=_str(data.get("receiver", ""), "receiver"),
        status=_status(data.get("status"), "status"),
        alerts=alerts,
        group_labels=_labels(data.get("groupLabels", {}), "groupLabels"),
        common_labels=_labels(data.get("commonLabels", {}), "commonLabels"),
        common_annotations=_labels(data.get("commonAnnotations", {}), "commonAnnotations"),
        external_url=_str(data.get("externalURL", ""), "externalURL"),
        group_key=_required_str(data.get("groupKey"), "groupKey"),
        truncated_alerts=truncated,
    )


def _alert(raw: Any, path: str) -> Alert:
    if not isinstance(raw, dict):
        raise PayloadError(f"{path}: expected an object, got {_show(raw)}")
    labels = _labels(raw.get("labels"), f"{path}.labels")
    if not labels.get("alertname"):
        raise PayloadError(f"{path}.labels.alertname: required")
    return Alert(
        status=_status(raw.get("status"), f"{path}.status"),
        labels=labels,
        annotations=_labels(raw.get("annotations") or {}, f"{path}.annotations"),
        starts_at=_str(raw.get("startsAt", ""), f"{path}.startsAt"),
        ends_at=_str(raw.get("endsAt", ""), f"{path}.endsAt"),
        generator_url=_str(raw.get("generatorURL", ""), f"{path}.generatorURL"),
        fingerprint=_str(raw.get("fingerprint", ""), f"{path}.fingerprint"),
    )


def _labels(raw: Any, path: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise PayloadError(f"{path}: expected an object of strings, got {_show(raw)}")
    if len(raw) > MAX_LABELS:
        raise PayloadError(f"{path}: at most {MAX_LABELS} entries, got {len(raw)}")
    out = {}
    for k, v in raw.items():
        if not isinstance(v, str):
            raise PayloadError(f"{path}.{_clip(k)}: expected a string, got {_show(v)}")
        if len(v) > MAX_VALUE_CHARS:
            raise PayloadError(f"{path}.{_clip(k)}: longer than {MAX_VALUE_CHARS} characters")
        out[k] = v
    return out


def _status(raw: Any, path: str) -> str:
    if raw not in ("firing", "resolved"):
        raise PayloadError(f"{path}: expected \"firing\" or \"resolved\", got {_show(raw)}")
    return raw


def _str(raw: Any, path: str) -> str:
    if not isinstance(raw, str):
        raise PayloadError(f"{path}: expected a string, got {_show(raw)}")
    if len(raw) > MAX_VALUE_CHARS:
        raise PayloadError(f"{path}: longer than {MAX_VALUE_CHARS} characters")
    return raw


def _required_str(raw: Any, path: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise PayloadError(f"{path}: expected a non-empty string, got {_show(raw)}")
    return _str(raw, path)


def _clip(text: Any, limit: int = 40) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "…"


def _show(value: Any) -> str:
    """A short, log-safe rendering of an offending value (never the whole body)."""
    try:
        return _clip(json.dumps(value, ensure_ascii=True), 60)
    except (TypeError, ValueError, RecursionError):
        return type(value).__name__
