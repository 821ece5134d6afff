"""Terminal (rich) and JSON forms of triage results."""

from __future__ import annotations

import json
from typing import IO, Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from inferwatch.triage.engine import AlertTriage

__all__ = ["print_results", "results_json"]

_SCOPE_LABELS = ("node", "triton", "model", "version", "tenant", "tier", "gpu", "window", "severity", "layer")


def results_json(results: Iterable[AlertTriage]) -> str:
    return json.dumps({"alerts": [r.to_dict() for r in results]}, indent=2, sort_keys=False)


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
            value = Text(e.shown, style="red" if e.result.error else ("dim" if e.result.value is None else ""))
            what = e.help if not e.result.error else f"{e.help} — query failed: {e.result.error}"
            table.add_row(e.result.name, value, what)
        console.print(table)
        if r.findings:
            for i, f in enumerate(r.findings):
                marker = "likely cause" if i == 0 else "also"
                console.print(Text.assemble((f"{marker}: ", "bold"), (f.cause, "bold yellow"),
                                            f" ({f.layer}) ", f.summary))  # as the hook writes it
                if f.action and i == 0:
                    console.print(Text.assemble(("  next: ", "bold"), f.action))
        else:
            console.print(Text("No finding matched the evidence; work through the runbook by hand.", style="yellow"))
        console.print(Text.assemble(("runbook: ", "bold"), r.runbook_url))
        console.print()
