"""The notifier's enrichment hook: the top triage finding for one alert, or None, within a deadline.

`make_enricher(prometheus_url)` returns a callable `enrich(labels) -> str | None` that the notifier may
call while formatting a message. It never raises and never takes longer than `timeout` seconds: the work
runs in a daemon thread and is abandoned (its result discarded) when the deadline passes, so a slow or
dead Prometheus never delays delivery by more than the timeout.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Mapping

from inferwatch.triage.engine import triage_alert
from inferwatch.triage.evidence import Runbook, load_runbooks
from inferwatch.triage.sources import PrometheusSource

__all__ = ["make_enricher", "DEFAULT_TIMEOUT_SECONDS"]

log = logging.getLogger(__name__)

# Short on purpose: the finding is a courtesy; the page must not wait for it.
DEFAULT_TIMEOUT_SECONDS = 2.0


def make_enricher(prometheus_url: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                  runbook_dir: Path | None = None) -> Callable[[Mapping[str, str]], str | None]:
    """Build `enrich(labels)`: one line 'likely cause: <cause> [<layer>]: <summary>' or None (no page, no
    finding, Prometheus slow or down). Runbooks are loaded once here; a broken page set raises RunbookError
    now, at start-up, not during delivery."""
    runbooks: dict[str, Runbook] = load_runbooks(runbook_dir)

    def work(labels: Mapping[str, str], out: list) -> None:
        name = labels.get("alertname", "")
        runbook = runbooks.get(name)
        if runbook is None:
            return
        # No retries and per-call timeouts inside the deadline: a dead Prometheus fails in milliseconds.
        source = PrometheusSource(prometheus_url, timeout=timeout, retries=0)
        result = triage_alert(name, labels, runbook, source, runbook_url="")
        if result.top:
            out.append(f"likely cause: {result.top.cause} [{result.top.layer}]: {result.top.summary}")

    def enrich(labels: Mapping[str, str]) -> str | None:
        out: list[str] = []

        def guarded() -> None:
            try:
                work(labels, out)
            except Exception:  # noqa: BLE001 — enrichment must never break delivery
                log.debug("triage enrichment failed for %s", labels.get("alertname"), exc_info=True)

        thread = threading.Thread(target=guarded, name="triage-enrich", daemon=True)
        thread.start()
        thread.join(timeout)
        return out[0] if out else None

    return enrich
