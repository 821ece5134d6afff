"""The notifier's enrichment hook: the top triage finding for an alert, in one line.

Two ways in:
- `top_finding(notification)` is the `module:function` a notifier route names
  (`enrich: inferwatch.triage.hook:top_finding`); the notifier calls it with its Notification and enforces
  the route's `enrich_timeout` itself. Prometheus is `$INFERWATCH_PROMETHEUS_URL`, else `targets.prometheus`
  of the spec at `$INFERWATCH_SPEC` (default ./inferwatch.yaml).
- `make_enricher(prometheus_url, timeout=...)` returns `enrich(labels) -> str | None` that enforces its own
  deadline (a daemon thread abandoned when the deadline passes), for callers without one.

Neither raises for Prometheus trouble: no page, no finding, or a slow or dead Prometheus all give no text.
Nor does either add a finding when the alert's own condition does not hold when the hook runs (the fault is
gone, or the spec's threshold says it never was): triage names no cause then, and the hook adds nothing.
Time-based findings compare with the alert's startsAt.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from inferwatch.spec import Spec
from inferwatch.triage.engine import triage_alert
from inferwatch.triage.evidence import Runbook, load_runbooks
from inferwatch.triage.sources import PrometheusSource, QueryResult
from inferwatch.triage.times import starts_at

__all__ = ["top_finding", "top_finding_for", "make_enricher", "DEFAULT_TIMEOUT_SECONDS"]

log = logging.getLogger(__name__)

# Short on purpose: the finding is a courtesy; the page must not wait for it.
DEFAULT_TIMEOUT_SECONDS = 2.0
MAX_ALERTS_TRIAGED = 3


class _DeadlineSource(PrometheusSource):
    """Prometheus queries that all end by `deadline` (time.monotonic() seconds): each HTTP call's timeout is
    what is left (at most `timeout`), and none starts once it has passed (an error result instead)."""

    def __init__(self, url: str, *, timeout: float, deadline: float | None):
        super().__init__(url, timeout=timeout, retries=0)
        self.deadline = deadline

    def query(self, name: str, expr: str) -> QueryResult:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0.01:
                return QueryResult(name, expr, error="enrichment deadline passed")
            self.client._timeout = min(self.timeout, left)
        return super().query(name, expr)

    def close(self) -> None:
        self.client._session.close()  # no connection left open once the finding is given (or given up)


def top_finding_for(labels: Mapping[str, str], prometheus_url: str, runbooks: Mapping[str, Runbook],
                    timeout: float = DEFAULT_TIMEOUT_SECONDS, spec: Spec | None = None,
                    fault_time: float | None = None, deadline: float | None = None) -> str | None:
    """'likely cause: <cause> (<layer>): <summary>' for the alert with `labels`, 'no cause named: <why>' when
    a source the page reads stopped reporting, or None (no page, the alert's condition does not hold now, no
    finding). Thresholds come from `spec` (default: the built-in
    defaults); `fault_time` is the alert's startsAt in unix seconds. Each HTTP call is bounded by `timeout`
    and never retried, so a dead Prometheus fails in milliseconds; with `deadline` (time.monotonic() seconds)
    all of them end by then, and the connections are closed on return."""
    name = labels.get("alertname", "")
    runbook = runbooks.get(name)
    if runbook is None:
        return None
    source = _DeadlineSource(prometheus_url, timeout=timeout, deadline=deadline)
    try:
        result = triage_alert(name, labels, runbook, source, runbook_url="", spec=spec, fault_time=fault_time)
    finally:
        source.close()
    if result.top is None and result.stale_sources:
        # The on-call should know the evidence is missing because a source stopped, not that nothing matched.
        return "no cause named: " + "; ".join(st.reason for st in result.stale_sources)
    if result.top is None or result.condition is None or result.condition.holds is False:
        return None
    # Parentheses, not brackets: WeCom's markdown escaping turns [ ] into full-width ［ ］, so a bracketed
    # layer would read differently per channel.
    return f"likely cause: {result.top.cause} ({result.top.layer}): {result.top.summary}"


def make_enricher(prometheus_url: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                  request_timeout: float | None = None, runbook_dir: Path | None = None,
                  spec: Spec | None = None) -> Callable[..., str | None]:
    """Build `enrich(labels, fault_time=None)` that returns within `timeout` seconds (the work left behind
    finishes on its own, each HTTP call bounded by `request_timeout`, default `timeout`). Thresholds come
    from `spec` (default: the built-in defaults). Runbooks load once, here: a broken page set raises
    RunbookError at start-up, not during delivery."""
    runbooks = load_runbooks(runbook_dir)
    per_request = request_timeout or timeout

    def enrich(labels: Mapping[str, str], fault_time: float | None = None) -> str | None:
        out: list[str | None] = []

        def work() -> None:
            try:
                out.append(top_finding_for(labels, prometheus_url, runbooks, per_request, spec, fault_time))
            except Exception:  # noqa: BLE001 — enrichment must never break delivery
                log.debug("triage enrichment failed for %s", labels.get("alertname"), exc_info=True)

        thread = threading.Thread(target=work, name="triage-enrich", daemon=True)
        thread.start()
        thread.join(timeout)
        return out[0] if out else None

    return enrich


_state: dict[str, Any] = {}
_lock = threading.Lock()


def _configured() -> tuple[str, dict[str, Runbook], Spec]:
    with _lock:
        if "runbooks" not in _state:
            from inferwatch.spec import load_spec

            spec = load_spec(os.environ.get("INFERWATCH_SPEC"))
            _state["url"] = os.environ.get("INFERWATCH_PROMETHEUS_URL") or spec.targets.prometheus
            _state["spec"] = spec
            _state["runbooks"] = load_runbooks()
        return _state["url"], _state["runbooks"], _state["spec"]


def top_finding(notification: Any, deadline: float | None = None) -> str:
    """Notifier hook: the top finding of the first firing alert of `notification` (its `.alerts`, each with
    `.status` and `.labels`) that has a runbook page and a finding; '' when there is none. The notifier passes
    `deadline` (time.monotonic() seconds, its route's enrich_timeout from now): every query of every alert
    triaged ends by then."""
    url, runbooks, spec = _configured()
    candidates = [a for a in getattr(notification, "alerts", [])
                  if getattr(a, "status", "firing") == "firing" and a.labels.get("alertname") in runbooks]
    # A storm-coalesced notification may hold thousands of alerts; the first few are enough for one line.
    for alert in candidates[:MAX_ALERTS_TRIAGED]:
        if deadline is not None and time.monotonic() >= deadline:
            break
        text = top_finding_for(alert.labels, url, runbooks, spec=spec, deadline=deadline,
                               fault_time=starts_at(getattr(alert, "starts_at", None)))
        if text:
            return text
    return ""
