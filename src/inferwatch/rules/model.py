"""The shapes a rule generator produces: recording rules, alerting rules and the groups holding them.

Area modules (gpu, triton, llm, notifier) build these; `inferwatch.rules.generate` applies the
whole-output passes (layer label, static summary, runbook URL) and renders YAML.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from inferwatch.spec import Duration


@dataclasses.dataclass
class Recording:
    """A recording rule. `record` follows `level:metric:operation` (Prometheus naming best practice)."""

    record: str
    expr: str
    labels: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        out: dict = {"record": self.record, "expr": self.expr}
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


@dataclasses.dataclass
class Alert:
    """An alerting rule before the whole-output pass. `layer`, `summary` and `runbook_url` are added from the
    registry (`inferwatch.rules.names.ALERTS`), so no area module repeats them."""

    alert: str
    expr: str
    for_: Duration
    severity: str
    description: str
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        out: dict = {"alert": self.alert, "expr": self.expr}
        if self.for_.ms:
            out["for"] = str(self.for_)
        out["labels"] = {**self.labels, "severity": self.severity}
        out["annotations"] = {"description": self.description, **self.annotations}
        return out


@dataclasses.dataclass
class Group:
    """A rule group. Rules in one group run in order, so a recording rule may use one recorded above it."""

    name: str
    rules: Sequence[Recording | Alert]  # read only: each area builds its list of one kind or both
    interval: Duration | None = None

    def to_dict(self) -> dict:
        out: dict = {"name": self.name}
        if self.interval is not None:
            out["interval"] = str(self.interval)
        out["rules"] = [r.to_dict() for r in self.rules]
        return out
