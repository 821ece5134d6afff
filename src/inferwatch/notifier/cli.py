"""`inferwatch notifier`: run the notifier, test routes, inspect and replay the outbox.

  inferwatch notifier [--spec FILE] [--host H] [--port 9410] [--data-dir DIR] [--shared-port PORT]
  inferwatch notifier routes test --all             every alert x severity -> channels, escalation, inhibitions
  inferwatch notifier routes test key=value ...     where an alert with these labels goes: the generated
                                                    Alertmanager tree first, then the notifier's routes
  inferwatch notifier outbox list [--all]           pending and dead-lettered deliveries
  inferwatch notifier outbox retry ID [--force]     put a dead-lettered delivery back in the queue
                                                    (--force: also one already delivered)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path
from typing import Any

from inferwatch.cli import UsageError, add_service_args, add_spec_arg
from inferwatch.redaction import redact
from inferwatch.spec import load_spec

DEFAULT_PORT = 9410
INTEGRATIONS = {"pagerduty_configs": "PagerDuty", "webhook_configs": "webhook", "slack_configs": "Slack"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("notifier", help="receive Alertmanager webhooks; route by layer to phone, Slack, WeCom",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_spec_arg(p)
    add_service_args(p, DEFAULT_PORT)
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="directory of the SQLite outbox (default: notifier.data_dir from the spec)")
    p.add_argument("--shared-port", type=int, default=None, metavar="PORT",
                   help="also accept webhooks on PORT, bound with SO_REUSEPORT: replicas on one host (each with "
                        "its own --port and --data-dir) share it, and a dead replica's connections go to the "
                        "others; point targets.notifier at it")
    p.add_argument("--move-damaged-outbox", action="store_true",
                   help="when the outbox is damaged or lacks acknowledged webhooks (refused otherwise), move its "
                        "files aside to <file>.damaged-<time> and start empty, recording the loss "
                        "(inferwatch_notifier_outbox_lost_webhooks, alert NotifierOutboxDamaged)")
    p.set_defaults(func=run, notifier_command=None)
    nsub = p.add_subparsers(dest="notifier_command", metavar="{routes,outbox}")

    routes = nsub.add_parser("routes", help="routing tools")
    rsub = routes.add_subparsers(dest="routes_command", metavar="test", required=True)
    test = rsub.add_parser("test", help="print where an alert with these labels goes: Alertmanager's routing "
                                        "tree generated from the spec (like `amtool config routes test`), then "
                                        "the notifier's routes")
    test.add_argument("labels", nargs="*", metavar="key=value", help="alert labels, e.g. layer=L2 severity=critical")
    test.add_argument("--all", action="store_true", dest="all_alerts",
                      help="instead: every alert x severity (x burn-rate window) -> channels, escalation, inhibitions")
    test.add_argument("--verify", default=None, metavar="A,B",
                      help="exit 1 unless the receivers are exactly this comma-separated list")
    _sub_spec_args(test, data_dir=False)

    outbox = nsub.add_parser("outbox", help="show or replay deliveries in the outbox")
    osub = outbox.add_subparsers(dest="outbox_command", metavar="{list,retry,copy}", required=True)
    lst = osub.add_parser("list", help="pending and dead-lettered deliveries, newest first")
    lst.add_argument("--all", action="store_true", help="also delivered, superseded and cancelled ones")
    lst.add_argument("--limit", type=int, default=100, help="at most this many rows (default 100)")
    retry = osub.add_parser("retry", help="put a delivery (e.g. a dead letter) back in the queue")
    retry.add_argument("id", type=int, help="delivery id as `outbox list` prints it")
    retry.add_argument("--force", action="store_true",
                       help="re-send even a delivery that was already delivered (refused without it)")
    copy = osub.add_parser("copy", help="copy the SQLite outbox in --data-dir into the spec's PostgreSQL outbox "
                                        "(notifier.outbox.url), once, with the notifier stopped")
    for q in (lst, retry, copy):
        _sub_spec_args(q)


def _sub_spec_args(parser: argparse.ArgumentParser, data_dir: bool = True) -> None:
    # SUPPRESS: a subcommand's unset flag must not overwrite the same flag given before the subcommand.
    parser.add_argument("--spec", default=argparse.SUPPRESS, metavar="FILE",
                        help="spec file (default ./inferwatch.yaml if present, else built-in defaults)")
    if data_dir:
        parser.add_argument("--data-dir", default=argparse.SUPPRESS, metavar="DIR",
                            help="outbox directory (default: notifier.data_dir from the spec)")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    if args.notifier_command == "routes":
        return _routes_test(spec, args)
    if args.notifier_command == "outbox":
        return _outbox(spec, args)
    from inferwatch.notifier import integrity

    # The data folder and outbox checks first, which need none of the service's imports (a second of CPU): a
    # refusal is one line at once. The service checks again when it opens the outbox.
    integrity.check_data_dir(Path(args.data_dir or spec.notifier.data_dir) / integrity.OUTBOX_FILE,
                             args.move_damaged_outbox)
    from inferwatch.notifier.service import NotifierService

    if args.spec:
        # Enrichment hooks (e.g. inferwatch.triage.hook) read the same spec the notifier runs with.
        os.environ.setdefault("INFERWATCH_SPEC", str(Path(args.spec).resolve()))
    NotifierService(spec, args.data_dir, args.host, args.port, args.shared_port,
                    move_damaged=args.move_damaged_outbox).serve_forever()
    return 0


def _routes_test(spec, args) -> int:
    """Where an alert with these labels goes: first Alertmanager's routing tree as `inferwatch generate` writes
    it for this spec (an alert it sends to another receiver never reaches the notifier), then, for the
    receivers that post to the notifier, the notifier's own routes."""
    from inferwatch.deploy.alertmanager import config as alertmanager_config
    from inferwatch.notifier import amtree
    from inferwatch.notifier.routing import Router, parse_label_args

    if getattr(args, "all_alerts", False):
        from inferwatch.deploy.routetable import effective_table, render

        print(render(effective_table(spec)))
        return 0
    if not args.labels:
        raise UsageError("expected alert labels (e.g. layer=L2 severity=critical), or --all")
    try:
        labels = parse_label_args(args.labels)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    am = alertmanager_config(spec)
    kinds = {r["name"]: r for r in am["receivers"]}
    router = Router(spec)
    final: list[str] = []
    lines: list[str] = []
    am_receivers = amtree.receivers(am, labels)
    via_notifier = any(kinds[n].get("webhook_configs") for n in am_receivers)
    for name in am_receivers:
        if kinds[name].get("webhook_configs"):
            lines.append(f"  alertmanager: {name} (webhook to the notifier, which routes it by its own routes)")
            reached = router.receivers(labels)
            final += [r for r in reached if r not in final]
            matched = router.match(labels)
            if matched:
                lines.append(f"  notifier: route {', '.join(str(m.index + 1) for m in matched)} -> {','.join(reached)}")
            elif reached:
                lines.append("  notifier: no route matched -> notifier.unrouted_receivers catch-all "
                             f"{','.join(reached)}")
            else:
                lines.append("  notifier: no route matched and no catch-all channel: kept as an `unrouted` dead letter")
            for m in matched:
                if m.escalate_after_s is not None:
                    lines.append(f"  escalates to {','.join(m.escalate_to)} after {m.escalate_after_s:.0f}s "
                                 "still firing")
        else:
            what = ", ".join(INTEGRATIONS.get(k, k) for k in kinds[name] if k.endswith("_configs"))
            lines.append(f"  alertmanager: {name} (Alertmanager's own {what} integration: the notifier never "
                         f"sees this alert)")
            final.append(name)
    if final:
        unrouted = via_notifier and not router.match(labels)
        print(",".join(final) + ("  (no route matched: notifier.unrouted_receivers catch-all)" if unrouted else ""))
    else:
        print("(no route matched and no catch-all channel: kept as an `unrouted` dead letter)")
    print("\n".join(lines))
    if args.verify is not None:
        expected = [r for r in args.verify.split(",") if r]
        if expected != final:
            print(f"WARNING: expected receivers {expected}, got {final}")
            return 1
    return 0


def _outbox(spec, args) -> int:
    from inferwatch.notifier.backend import open_postgres, uses_postgres
    from inferwatch.notifier.outbox import Outbox, OutboxError
    from inferwatch.notifier.service import OUTBOX_FILE

    if args.outbox_command == "copy":
        return _outbox_copy(spec, args)
    outbox: Any
    if uses_postgres(spec):  # the shared PostgreSQL outbox the spec names (--data-dir does not apply)
        outbox = open_postgres(spec)
        path: Any = outbox.path
    else:
        path = Path(args.data_dir or spec.notifier.data_dir) / OUTBOX_FILE
        if not path.exists():
            raise UsageError(f"no outbox at {path} (pass --data-dir)")
        outbox = Outbox(path, dedup_window_s=spec.notifier.dedup_window.seconds)
    try:
        return _outbox_command(spec, args, outbox, path)
    except OutboxError as exc:
        raise UsageError(f"the outbox {path} cannot be used now: {exc}") from None
    finally:
        outbox.close_all()


def _outbox_copy(spec, args) -> int:
    import sqlite3

    from inferwatch.notifier.backend import open_postgres, uses_postgres
    from inferwatch.notifier.outbox import OutboxError
    from inferwatch.notifier.outboxcopy import copy_sqlite_to_postgres
    from inferwatch.notifier.service import OUTBOX_FILE

    if not uses_postgres(spec):
        raise UsageError("outbox copy needs a PostgreSQL outbox in the spec (notifier.outbox.url) to copy into")
    path = Path(args.data_dir or spec.notifier.data_dir) / OUTBOX_FILE
    if not path.exists():
        raise UsageError(f"no outbox at {path} (pass --data-dir)")
    outbox = open_postgres(spec)
    try:
        report = copy_sqlite_to_postgres(path, outbox)
    except sqlite3.Error as exc:
        raise UsageError(f"cannot read the outbox {path}: {exc}") from None
    except OutboxError as exc:
        raise UsageError(f"nothing copied: {exc}") from None
    finally:
        outbox.close_all()
    print(f"copied {report.messages} webhook(s) and {report.deliveries} deliveries from {path} to {outbox.path} "
          f"({report.skipped} already there, {report.intake} intake keys, {report.resolutions} resolutions)")
    return 0


def _outbox_command(spec, args, outbox, path) -> int:
    from inferwatch.notifier.outbox import AlreadyDelivered

    if args.outbox_command == "retry":
        row = outbox.get(args.id)
        if row is None:
            raise UsageError(f"no delivery with id {args.id} in {path}")
        if row.channel not in spec.channels:
            if row.channel != "unrouted":
                raise UsageError(f"delivery {args.id} is for channel {row.channel!r}, which "
                                 f"{args.spec or 'the spec in use (no --spec: ./inferwatch.yaml or built-in defaults)'}"
                                 " does not declare: pass the notifier's --spec")
            raise UsageError(f"delivery {args.id} is an unrouted alert, for a channel the spec does not declare: "
                             "add a route or notifier.unrouted_receivers; Alertmanager re-sends it at its "
                             "repeat_interval")
        try:
            d = outbox.retry(args.id, force=args.force)
        except KeyError:
            raise UsageError(f"no delivery with id {args.id} in {path}") from None
        except AlreadyDelivered as exc:
            raise UsageError(f"delivery {args.id} to {row.channel} was already delivered at "
                             f"{_utc(exc.delivery.finished_at)} UTC; pass --force to send it again") from None
        print(f"delivery {d.id} to {d.channel} is pending again; a running notifier sends it within a second")
        return 0
    states = ("pending", "dead", "delivered", "superseded", "cancelled") if args.all else ("pending", "dead")
    rows = outbox.list(states, args.limit)
    print(f"{'ID':>6}  {'STATE':<10} {'CHANNEL':<18} {'KIND':<10} {'STATUS':<8} {'ALERTS':>6} {'TRIES':>5}  "
          f"{'CREATED (UTC)':<19}  GROUP / LAST ERROR")
    for d in rows:
        created = _utc(d.created_at)
        # Stored errors are redacted when written; rows written by an older version may not be.
        err = f"  [{d.last_reason}] {redact(d.last_error)}" if d.last_reason else ""
        print(f"{d.id:>6}  {d.state:<10} {d.channel:<18} {d.kind:<10} {d.status:<8} {d.alerts:>6} {d.attempts:>5}  "
              f"{created}  {d.group_key}{err}")
    counts = outbox.counts()
    print("totals: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def _utc(epoch: float | None) -> str:
    if epoch is None:
        return "?"
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
