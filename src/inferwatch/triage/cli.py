"""`inferwatch triage`: gather the evidence each firing alert's runbook asks for and name the likely cause.

Takes the firing alerts from Alertmanager (default, or --firing), or the alerts named on the command line
(scoped with --label). Each alert's runbook page (runbooks/<AlertName>.md) lists PromQL evidence queries;
triage runs them against Prometheus scoped to the alert's labels and first checks the alert's own
condition with the rule's threshold from the spec: when it does not hold, it says so and names no cause.
Otherwise it evaluates the page's findings and prints the values, the likely cause(s), the findings it
could not judge for missing evidence (and which), and the runbook link. Exit 0 when triage ran, 1 when
Prometheus or Alertmanager cannot be reached, 2 on bad usage (unknown alert name, bad --label or --at).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from inferwatch.cli import UsageError, add_spec_arg
from inferwatch.spec import load_spec
from inferwatch.triage.engine import AlertTriage, triage_alert
from inferwatch.triage.evidence import default_runbook_dir, load_runbooks
from inferwatch.triage.render import print_results, results_json
from inferwatch.triage.sources import PrometheusSource, SourceUnreachable, fetch_firing_alerts
from inferwatch.triage.times import parse_time, starts_at

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("triage", help="gather runbook evidence for firing alerts and name the likely cause",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("alerts", nargs="*", metavar="ALERTNAME",
                   help="alert names to triage (default: every firing alert from Alertmanager)")
    p.add_argument("--firing", action="store_true",
                   help="take firing alerts (not silenced or inhibited) from Alertmanager; with ALERTNAMEs, "
                        "only those names")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="scope a named alert, e.g. --label model=llama --label tier=realtime (repeatable)")
    p.add_argument("--prometheus", metavar="URL", help="Prometheus base URL (default: spec targets.prometheus)")
    p.add_argument("--alertmanager", metavar="URL",
                   help="Alertmanager base URL (default: spec targets.alertmanager)")
    add_spec_arg(p)
    p.add_argument("--runbooks", metavar="DIR", default=None,
                   help=f"runbook pages directory (default: {default_runbook_dir()})")
    p.add_argument("--at", metavar="TIME", default=None,
                   help="evaluate the evidence at this time (RFC 3339 or unix seconds; default: now); for "
                        "a named alert also the fault time that time-based findings (a version loaded just "
                        "before) compare with; with --firing that is each alert's startsAt")
    p.add_argument("--timeout", type=positive_number, default=10.0, metavar="S",
                   help="per-request HTTP timeout in seconds (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the terminal view")
    p.set_defaults(func=run)


def positive_number(text: str) -> float:
    """argparse type: a finite number > 0 (a timeout of 0 or less makes every request fail at once)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def parse_labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--label expects KEY=VALUE, got {item!r}")
        labels[key.strip()] = value
    return labels


def parse_at(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError:
        raise UsageError(f"--at expects RFC 3339 (2024-05-01T12:00:00Z) or unix seconds, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    # urllib3 logs every connection retry at WARNING ("Retrying (Retry(total=0 ...)) after connection
    # broken ..."); triage reports an unreachable server itself in one line, so keep that noise out for
    # the duration of the command and restore the level afterwards (tests run commands in one process).
    urllib3_log = logging.getLogger("urllib3")
    saved = urllib3_log.level
    urllib3_log.setLevel(logging.ERROR)
    try:
        return _run(args)
    finally:
        urllib3_log.setLevel(saved)


def _run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    labels = parse_labels(args.label)
    at = parse_at(args.at)
    runbooks = load_runbooks(Path(args.runbooks) if args.runbooks else None)
    prometheus_url = args.prometheus or spec.targets.prometheus
    alertmanager_url = args.alertmanager or spec.targets.alertmanager
    for name in args.alerts:
        if name not in runbooks:
            raise UsageError(f"no runbook page for alert {name!r} (pages: {', '.join(sorted(runbooks))})")
    try:
        source = PrometheusSource(prometheus_url, timeout=args.timeout, at=at)
        source.check()
        if args.firing or not args.alerts:
            wanted = set(args.alerts)
            targets = [(a["labels"].get("alertname", "?"), a["labels"], (a.get("annotations") or {}).get("runbook_url"),
                        starts_at(a.get("startsAt")))
                       for a in fetch_firing_alerts(alertmanager_url, timeout=args.timeout)
                       if not wanted or a["labels"].get("alertname") in wanted]
        else:
            targets = [(name, {"alertname": name, **labels}, None, at) for name in args.alerts]
    except SourceUnreachable as exc:
        return _fail(args, str(exc))
    results: list[AlertTriage] = []
    for name, alert_labels, url, fault_time in targets:
        results.append(triage_alert(name, alert_labels, runbooks.get(name), source,
                                    url or f"{spec.runbook_base_url}{name}.md", spec=spec, fault_time=fault_time))
    if all(e.result.error and "unreachable" in e.result.error for r in results for e in r.evidence) \
            and any(r.evidence for r in results):
        return _fail(args, f"Prometheus at {prometheus_url} stopped answering during triage")
    if args.json:
        print(results_json(results))
    else:
        print_results(results)
    return 0


def _fail(args: argparse.Namespace, message: str) -> int:
    print(f"inferwatch triage: error: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"alerts": [], "error": message}, indent=2))
    return 1
