"""What the demo watches: alerts as Prometheus evaluates them, and messages as the channel simulators
received them (parsed back into alert name, firing/resolved, runbook link and triage finding).

Messages are read from what the simulated providers accepted, so a message counts only when it went through
Prometheus → Alertmanager → notifier → channel adapter → provider API, exactly as it would in production.
"""

from __future__ import annotations

import dataclasses
import re
import time

import requests

from inferwatch.rules.names import ALERTS
from inferwatch.testing.channel_text import slack_block_display, slack_display

# `[FIRING:2] AlertName extra` — the notifier's titles (notifier/channels/common.py group_title).
TITLE = re.compile(r"\[(FIRING|RESOLVED):\d+\+?\] ([A-Za-z0-9_]+)")  # "+": Alertmanager cut the group
# Coalesced chat messages list "AlertName (firing): N".
COALESCED = re.compile(r"([A-Z][A-Za-z0-9_]+) \((firing|resolved)\): \d+")
WECOM_RUNBOOK = re.compile(r"\[Runbook\]\((\S+?)\)")


@dataclasses.dataclass
class Delivery:
    """One message a simulated provider accepted."""

    at: float               # time.time() when the provider accepted it
    provider: str           # pagerduty | slack | wecom | voice
    channel: str            # the spec channel name of that provider ('' when none is configured)
    status: str             # firing | resolved
    alerts: tuple[str, ...]  # alert names the message is about
    title: str
    runbook: str = ""
    triage: str = ""
    group: str = ""         # the group's label values from the title (`toy_llm acme realtime warning`)

    @property
    def layers(self) -> set[str]:
        return {ALERTS[a].layer for a in self.alerts if a in ALERTS}


def group_of(title: str) -> str:
    """The group's label values in a notifier title: `[FIRING:1] LlmTtftP95High toy_llm acme realtime` ->
    `toy_llm acme realtime` (PagerDuty summaries continue with ` — <summary>`)."""
    m = TITLE.search(title)
    return title[m.end():].split(" — ", 1)[0].strip() if m else ""


def _pagerduty(body: dict, dedup_names: dict[str, tuple]) -> tuple[str, tuple[str, ...], str, str, str]:
    dedup = body.get("dedup_key", "")
    if body.get("event_action") == "resolve":
        names, group = dedup_names.get(dedup, ((), ""))
        return "resolved", names, f"resolve {', '.join(names) or dedup[:12]}" + (f" {group}" if group else ""), "", ""
    payload = body.get("payload") or {}
    summary = payload.get("summary", "")
    m = TITLE.search(summary)
    named = payload.get("group")
    names = (m.group(2),) if m else ((str(named),) if named else ())
    dedup_names[dedup] = (names, group_of(summary))
    runbook = next((link.get("href", "") for link in body.get("links", []) if link.get("text") == "Runbook"), "")
    triage = (payload.get("custom_details") or {}).get("triage", "")
    return "firing", names, summary, runbook, triage


def _slack(body: dict) -> tuple[str, tuple[str, ...], str, str, str]:
    title = body.get("text", "")
    runbook = triage = ""
    for block in body.get("blocks", []):
        for element in block.get("elements", []):
            if (element.get("text") or {}).get("text") == "Runbook":
                runbook = element.get("url", "")
        text, _ = slack_block_display(block)
        if text.startswith("Triage: "):
            triage = text.split("Triage: ", 1)[1].strip()
    return (*_names(title, json_text=slack_display(body)[0]), title, runbook, triage)


def _wecom(text: str) -> tuple[str, tuple[str, ...], str, str, str]:
    first = text.splitlines()[0] if text else ""
    title = re.sub(r"<[^>]+>", "", first).lstrip("# ").strip()
    m = WECOM_RUNBOOK.search(text)
    # Markdown quotes it ("> Triage: `…`" when the finding has markdown characters); a text message does not.
    triage = next((line.split("Triage:", 1)[1].strip().strip("`") for line in text.splitlines()
                   if line.startswith(("> Triage:", "Triage:"))), "")
    return (*_names(text), title, m.group(1) if m else "", triage)


def _names(text: str, json_text: str = "") -> tuple[str, tuple[str, ...]]:
    found = TITLE.findall(text)
    if found:
        status = found[0][0].lower()
        return status, tuple(dict.fromkeys(name for _, name in found))
    coalesced = COALESCED.findall(text + json_text)
    status = "firing" if any(s == "firing" for _, s in coalesced) else "resolved"
    return status, tuple(dict.fromkeys(name for name, _ in coalesced))


class DeliveryLog:
    """Reads new messages from the simulators (call `poll()` repeatedly); keeps them in order."""

    def __init__(self, sims, channel_of_provider: dict[str, str]):
        self.sims = sims
        self.channel_of = channel_of_provider
        self.deliveries: list[Delivery] = []
        self._seen: dict[str, int] = {}
        self._dedup_names: dict[str, tuple] = {}

    def poll(self) -> list[Delivery]:
        new: list[Delivery] = []
        for provider in self.sims.providers:
            with provider.lock:
                received = list(provider.received)
            for r in received[self._seen.get(provider.name, 0):]:
                if provider.name == "pagerduty":
                    parsed = _pagerduty(r.body, self._dedup_names)
                elif provider.name == "slack":
                    parsed = _slack(r.body)
                elif provider.name == "wecom":
                    parsed = _wecom(r.text)
                else:
                    parsed = ("firing", (), r.text[:200], "", "")
                status, names, title, runbook, triage = parsed
                group = (self._dedup_names.get(r.body.get("dedup_key", ""), ((), ""))[1]
                         if provider.name == "pagerduty" else group_of(title))
                new.append(Delivery(r.at, provider.name, self.channel_of.get(provider.name, ""), status, names,
                                    title, runbook, triage, group))
            self._seen[provider.name] = len(received)
        new.sort(key=lambda d: d.at)
        self.deliveries.extend(new)
        return new

    def attempts(self) -> int:
        """Every request any provider saw, accepted or not."""
        return sum(p.attempts for p in self.sims.providers)


@dataclasses.dataclass
class AlertState:
    name: str
    layer: str
    severity: str
    labels: dict[str, str]
    first_firing: float | None = None
    last_firing: float | None = None
    cleared: float | None = None  # first poll after it had fired where it was no longer firing


class AlertWatch:
    """Polls Prometheus's /api/v1/alerts; one AlertState per alert name (first firing, cleared)."""

    def __init__(self, prometheus_url: str):
        self.url = prometheus_url.rstrip("/") + "/api/v1/alerts"
        self.alerts: dict[str, AlertState] = {}
        # Labels of every alert Prometheus had pending or firing at the last poll (one entry per series).
        self.active: list[dict[str, str]] = []
        self.error: str = ""

    def poll(self) -> tuple[list[AlertState], list[AlertState]]:
        """(alerts that started firing, alerts that cleared) since the last poll."""
        now = time.time()
        try:
            body = requests.get(self.url, timeout=3).json()
            current = body["data"]["alerts"]
            self.error = ""
        except (requests.RequestException, ValueError, KeyError) as exc:
            self.error = f"{type(exc).__name__}"
            return [], []
        self.active = [dict(a["labels"]) for a in current if a.get("state") in ("pending", "firing")]
        firing: dict[str, dict] = {}
        for a in current:
            if a.get("state") == "firing":
                firing.setdefault(a["labels"].get("alertname", "?"), a["labels"])
        started, cleared = [], []
        for name, labels in firing.items():
            state = self.alerts.get(name)
            if state is None or state.cleared is not None:
                state = AlertState(name, labels.get("layer", ""), labels.get("severity", ""), dict(labels), now)
                self.alerts[name] = state
                started.append(state)
            state.last_firing = now
        for name, state in self.alerts.items():
            if name not in firing and state.cleared is None:
                state.cleared = now
                cleared.append(state)
        return started, cleared

    def firing_now(self) -> list[str]:
        return sorted(n for n, s in self.alerts.items() if s.cleared is None)
