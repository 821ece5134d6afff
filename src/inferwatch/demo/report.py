"""What the demo user sees: start-up progress with URLs, a live status line, the timeline of each fault →
alert → channel → message (with runbook link and triage finding), and a summary table. rich renders it; on a
terminal the status line updates in place, elsewhere (CI logs, pipes) it is printed every STATUS_EVERY_S.
"""

from __future__ import annotations

import textwrap
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from inferwatch.demo.scenario import Event, ScenarioResult
from inferwatch.rules.names import ALERTS

STATUS_EVERY_S = 15.0
STYLE = {"fault": "bold red", "removed": "bold green", "firing": "red", "cleared": "green",
         "delivered": "bold magenta", "resolved": "bold cyan", "phase": "bold"}
LABEL = {"fault": "FAULT", "removed": "FIXED", "firing": "FIRING", "cleared": "CLEARED", "delivered": "SENT",
         "resolved": "RESOLVED", "phase": "==>"}
PROVIDER = {"pagerduty": "PagerDuty", "slack": "Slack", "wecom": "WeCom robot", "voice": "voice call"}
# Outside a terminal rich assumes 80 columns, too narrow for the timeline; CI logs take longer lines.
PLAIN_WIDTH = 140
EVENT_INDENT = 18  # "+  81.2s SENT     " : wrapped lines of an event start under its text


def _distinct(groups: list[str]) -> dict[str, str]:
    """Short names for alert groups: the words of each group's label values that not all groups share
    (`toy_llm acme realtime warning`, `toy_llm globex realtime warning` -> `acme`, `globex`)."""
    words = [g.split() for g in groups]
    common = set.intersection(*(set(w) for w in words)) if len(words) > 1 else set()
    return {g: " ".join(x for x in w if x not in common) or g for g, w in zip(groups, words, strict=True)}


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


class Reporter:
    def __init__(self, console: Console | None = None):
        if console is None:
            console = Console(highlight=False)
            if not console.is_terminal:
                console = Console(highlight=False, width=PLAIN_WIDTH)
        self.console = console
        self.t0 = time.time()
        self._live: Live | None = None
        self._last_status = 0.0

    # ------------------------------------------------------------------------------------ start-up
    def line(self, text: str, style: str = "") -> None:
        self.console.print(Text(text, style=style))

    def service(self, service) -> None:
        urls = "  ".join(f"{k} {v}" for k, v in service.urls.items())
        self.console.print(Text.assemble(("  ✓ ", "green"), (f"{service.name:<17}", "bold"), f"{service.what}\n",
                                         ("                      " + urls, "dim")))

    # -------------------------------------------------------------------------------------- running
    def begin(self, t0: float) -> None:
        self.t0 = t0
        if self.console.is_terminal:
            self._live = Live(Text(""), console=self.console, refresh_per_second=2, transient=True)
            self._live.start()

    def status(self, text: str) -> None:
        if self._live is not None:
            self._live.update(Text(text, style="dim"))
        elif time.time() - self._last_status >= STATUS_EVERY_S:
            self._last_status = time.time()
            self.console.print(self._wrap([("  status ", "dim")], text, 9, "dim"))

    def _wrap(self, head: list[tuple[str, str]], body: str, indent: int, style: str = "") -> Text:
        """`head` then `body` wrapped at word boundaries to the console width, continuation lines indented."""
        width = max(40, self.console.width - indent)
        lines = textwrap.wrap(body, width, break_long_words=False, break_on_hyphens=False) or [""]
        text = Text.assemble(*head)
        text.append(lines[0], style)
        for line in lines[1:]:
            text.append("\n" + " " * indent + line, style)
        return text

    def event(self, e: Event) -> None:
        stamp = f"+{e.at - self.t0:6.1f}s "
        label = f"{LABEL.get(e.kind, e.kind):<9}"
        after = f"  ({e.after_s:.1f} s after the {'fault' if e.kind in ('firing', 'delivered') else 'fix'})" \
            if e.after_s is not None else ""
        if e.kind == "firing" and e.alert:
            body = f"{e.text} [{e.alert.layer}, {e.alert.severity}] in Prometheus"
        elif e.kind == "cleared":
            body = f"{e.text} no longer firing"
        elif e.kind in ("delivered", "resolved") and e.delivery:
            d = e.delivery
            body = f"{d.channel or '?'} ({PROVIDER.get(d.provider, d.provider)}) received: {d.title}"
        else:
            body = e.text
        self.console.print(self._wrap([(stamp, "dim"), (label, STYLE.get(e.kind, ""))], body + after, EVENT_INDENT))
        if e.kind == "delivered" and e.delivery:
            if e.delivery.runbook:
                self.console.print(self._wrap([(" " * EVENT_INDENT + "runbook: ", "dim")], e.delivery.runbook,
                                              EVENT_INDENT + 9, "dim"))
            if e.delivery.triage:
                self.console.print(self._wrap([(" " * EVENT_INDENT + "triage:  ", "dim")], e.delivery.triage,
                                              EVENT_INDENT + 9, "dim"))

    def end(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -------------------------------------------------------------------------------------- summary
    def summary(self, result: ScenarioResult) -> None:
        table = Table(title="inferwatch demo: fault → alert → channel", show_lines=True)
        for col in ("fault", "layer", "alert", "delivered to", "fired after", "message after", "resolved after"):
            table.add_column(col, no_wrap=col not in ("fault", "message after", "resolved after"))
        for o in result.outcomes:
            d = o.delivered
            ok = d is not None and d.channel in o.expected_channels
            delivered = (f"[green]{d.channel}[/] ({PROVIDER.get(d.provider, d.provider)})" if ok else
                         f"[red]{d.channel if d else 'nothing'}[/] (expected {', '.join(o.expected_channels)})")
            table.add_row(o.fault.title, o.fault.layer, o.fault.alert,
                          delivered, _secs(o.after(o.fired_at, o.injected_at)),
                          self._per_group(o, o.groups, o.injected_at),
                          self._per_group(o, o.group_resolutions, o.removed_at, o.groups))
        self.console.print(table)
        self.console.print(Text("times: fault injected → alert firing in Prometheus → message accepted by the "
                                "channel; fault removed → resolution message; one line per alert group (e.g. "
                                "per tenant) when the alert fired for several", style="dim"))
        for o in result.outcomes:
            d = o.delivered
            if d is None:
                continue
            head = Text(o.fault.alert, style="bold")
            for name, c in o.companions.items():
                # One line per severity it was sent with, each to the channel that severity went to.
                info = ALERTS.get(name)
                sent = o.companion_severities.get(name) or {"": c}
                order = list(info.severities) if info else []
                for severity, d in sorted(sent.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order
                                          else len(order)):
                    label = f" ({severity})" if severity else ""
                    head.append(f"\n  with {name}{label} → {d.channel} ({PROVIDER.get(d.provider, d.provider)})")
            self.console.print(head)
            self.console.print(self._wrap([("  runbook: ", "")], d.runbook or "—", 11))
            self.console.print(self._wrap([("  triage:  ", "")], d.triage or "— (none in the message)", 11))
        clean = result.clean_deliveries()
        span = (result.first_fault_at or result.ended_at) - result.traffic_started_at
        self.console.print(Text(f"clean stretch: {len(clean)} message(s) in {span:.0f} s without a fault "
                                f"(expected 0)", style="green" if not clean else "bold red"))
        counts: dict[str, list[int]] = {}
        for d in result.deliveries:
            c = counts.setdefault(f"{d.channel or '?'} ({PROVIDER.get(d.provider, d.provider)})", [0, 0])
            c[d.status == "resolved"] += 1
        self.console.print(self._wrap([("messages: ", "")], "; ".join(
            f"{k}: {f} firing, {r} resolved" for k, (f, r) in sorted(counts.items())) or "none", 10))

    @staticmethod
    def _per_group(o, deliveries: dict, since: float | None, expected: dict | None = None) -> str:
        """One time per alert group, named by what tells the groups apart; `—` for a group still waiting."""
        groups = list(expected or deliveries)
        if not groups:
            return "—"
        if len(groups) == 1:
            d = deliveries.get(groups[0])
            return _secs(o.after(d.at if d else None, since))
        names = _distinct(groups)
        return "\n".join(f"{names[g]} {_secs(o.after(deliveries[g].at if g in deliveries else None, since))}"
                         for g in groups)
