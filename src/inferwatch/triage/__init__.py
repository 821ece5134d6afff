"""Triage: run the evidence queries of each alert's runbook page against Prometheus and name the likely
cause. Entry points: `inferwatch triage` (cli.py), `triage_alert` (engine.py) and the notifier's
enrichment hook `make_enricher` (hook.py)."""

from inferwatch.triage.engine import AlertTriage, triage_alert
from inferwatch.triage.evidence import Runbook, RunbookError, load_runbook, load_runbooks
from inferwatch.triage.hook import make_enricher

__all__ = ["AlertTriage", "triage_alert", "Runbook", "RunbookError", "load_runbook", "load_runbooks",
           "make_enricher"]
