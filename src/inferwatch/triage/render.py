"""Terminal (rich) and JSON forms of triage results."""

from __future__ import annotations

import json
from typing import IO, Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferwatch.triage.engine import AlertTriage, format_value

__all__ = ["print_results", "results_json", "condition_line"]

_SCOPE_LABELS = ("node", "triton", "model", "version", "tenant", "tier", "gpu", "window", "signal", "channel",
                 "severity", "layer")


def results_json(results: Iterable[AlertTriage]) -> str:
    return json.dumps({"alerts": [r.to_dict() for r in results]}, indent=2, sort_keys=False)


def condition_line(r: AlertTriage) -> str:
    """One plain sentence on the alert's own condition at the evaluation time."""
    c = r.condition
    when = format_value(r.evaluated_at, "timestamp")
    if c is None:
        return ""
    if c.holds is True:
        return f"The alert's condition holds at {when}: {c.summary}"
    if c.holds is False:
        return (f"The alert's condition does not hold at {when}: {c.summary} Nothing is wrong by the "
                f"alert's own measure now, so no cause is named.")
    missing = "; ".join(f"{n}: {r.why_missing(n)}" for n in c.missing) or "a value could not be computed"
    return f"The alert's condition could not be checked at {when}: {missing}."


def print_results(results: list[AlertTriage], file: IO[str] | None = None, width: int | None = None) -> None:
    console = Console(file=file, width=width, highlight=False, soft_wrap=False)
    if not results:
        console.print("No firing alerts to triage.")
        return
    for r in results:
        scope = ", ".join(f"{k}={r.labels[k]}" for k in _SCOPE_LABELS if r.labels.get(k))
        console.rule(Text.assemble((r.alert, "bold"), f"  {scope}" if scope else ""))
        if r.error and not r.evidence:
            console.print(Text(r.error, style="red"))
            continue
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("evidence")
        table.add_column("value", justify="right")
        table.add_column("what it is")
        for e in r.evidence:
            style = "red" if e.result.error else ("dim" if e.result.value is None else "")
            what = e.help
            if e.skipped:
                what = f"{e.help} — not run: {e.skipped}"
            elif e.result.error:
                what = f"{e.help} — query failed: {e.result.error}"
            table.add_row(e.result.name, Text(e.shown, style=style), what)
        console.print(table)
        for st in r.stale_sources:
            console.print(Text.assemble(("stale source: ", "bold red"), (st.source, "bold"), f" — {st.reason}"))
        if r.error:
            console.print(Text(r.error, style="red"))
        if r.condition is not None:
            style = {True: "bold", False: "bold green", None: "bold yellow"}[r.condition.holds]
            console.print(Text(condition_line(r), style=style))
        for i, f in enumerate(r.findings):
            marker = "likely cause" if i == 0 else "also"
            console.print(Text.assemble((f"{marker}: ", "bold"), (f.cause, "bold yellow"),
                                        f" ({f.layer}) ", f.summary))  # as the hook writes it
            if f.action and i == 0:
                console.print(Text.assemble(("  next: ", "bold"), f.action))
        for u in r.not_judged:
            missing = "; ".join(f"{n}: {r.why_missing(n)}" for n in u.missing) or "a value could not be computed"
            console.print(Text.assemble(("not judged: ", "bold"), (u.cause, "yellow"), f" ({u.layer}), evidence "
                                        f"missing — {missing}"))
        if not r.findings and r.condition is not None and r.condition.holds is not False:
            console.print(Text("No finding matched the evidence; work through the runbook by hand.", style="yellow"))
        console.print(Text.assemble(("runbook: ", "bold"), r.runbook_url))
        console.print()
