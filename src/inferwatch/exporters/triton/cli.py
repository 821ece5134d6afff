"""`inferwatch exporter triton`: serve the Triton collector's /metrics (default port 9401)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, ProcessCollector

from inferwatch import redaction
from inferwatch.cli import UsageError, add_service_args, add_spec_arg
from inferwatch.exporters.triton.answers import DEFAULT_MAX_ANSWER_BYTES
from inferwatch.exporters.triton.collector import TritonCollector
from inferwatch.exporters.triton.reader import TargetConfig
from inferwatch.exporters.triton.server import metrics_server
from inferwatch.httpserver import add_bound_args, bounds_from_args
from inferwatch.specload import Duration

log = logging.getLogger(__name__)
DEFAULT_PORT = 9401


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "triton", help="L2 Triton collector: model state, batching and config from Triton's HTTP API",
        description="Poll Triton's HTTP API (health, repository index, model config, statistics) in the "
                    "background and serve inferwatch_triton_* metrics. Scrapes serve the last poll. "
                    "Run Triton with --metrics-config summary_latencies=true so P95 queue time exists.")
    p.add_argument("--triton-url", action="append", default=[], metavar="URL",
                   help="Triton HTTP API base, e.g. http://127.0.0.1:8000 (repeatable; the `triton` label is "
                        "the URL's host:port). Credentials in it (http://USER:PASSWORD@HOST:PORT) are sent as "
                        "Basic auth and never logged or put in a label")
    p.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                   help="Triton's own /metrics for the N-th --triton-url (repeatable, in the same order; "
                        "default http://HOST:8002/metrics); read to tell whether summaries are on")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                   help="extra request header for every target, e.g. triton-access-token=SECRET for "
                        "restricted APIs (repeatable; overrides a spec header of the same name)")
    add_spec_arg(p)
    p.add_argument("--no-spec-targets", action="store_true",
                   help="ignore targets.triton of the spec (use only --triton-url)")
    p.add_argument("--interval", default="10s", metavar="DURATION",
                   help="time between polls, e.g. 10s (default 10s)")
    p.add_argument("--timeout", default="5s", metavar="DURATION",
                   help="timeout of each Triton API call (default 5s)")
    p.add_argument("--concurrency", type=int, default=16, metavar="N",
                   help="API calls in flight per Triton at once (default 16)")
    p.add_argument("--max-answer-bytes", type=int, default=None, metavar="BYTES",
                   help="largest answer read from a Triton's API for every target (default: the spec target's "
                        "max_answer_bytes, else 16777216 = 16 MiB); a longer one fails that call with cause "
                        "too_large")
    p.add_argument("--config-max-age", default="10m", metavar="DURATION",
                   help="a model's configuration is read again when its versions or states change, and at the "
                        "latest after this long (default 10m; 0 reads every configuration every poll)")
    p.add_argument("--bls-step", action="append", default=[], metavar="PARENT=STEP[,STEP...]",
                   help="models a BLS (Python backend) model calls from its code, which its configuration cannot "
                        "tell: they are then labelled as steps of PARENT like ensemble steps (repeatable)")
    add_service_args(p, DEFAULT_PORT)
    add_bound_args(p)
    p.set_defaults(func=run)


def _duration(text: str, flag: str, *, zero_ok: bool = False) -> float:
    try:
        seconds = 0.0 if zero_ok and text.strip() == "0" else Duration.parse(text).seconds
    except Exception as exc:  # noqa: BLE001 - Duration raises SpecError/ValueError; both are usage errors
        raise UsageError(f"{flag}: {exc}") from None
    if seconds < 0 or (seconds == 0 and not zero_ok):
        raise UsageError(f"{flag}: expected a positive duration, got {text!r}")
    return seconds


def parse_bls_steps(items: list[str]) -> dict[str, tuple[str, ...]]:
    """`--bls-step PARENT=STEP[,STEP...]` values → {parent: steps}. Raises UsageError on a malformed value."""
    out: dict[str, tuple[str, ...]] = {}
    for item in items:
        parent, sep, steps = item.partition("=")
        names = tuple(s.strip() for s in steps.split(",") if s.strip())
        if not sep or not parent.strip() or not names:
            raise UsageError(f"--bls-step: expected PARENT=STEP[,STEP...], got {item!r}")
        out[parent.strip()] = out.get(parent.strip(), ()) + names
    return out


def parse_headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--header: expected NAME=VALUE, got {item.split('=')[0]!r}...")
        headers[name.strip()] = value
    return headers


def build_targets(args: argparse.Namespace) -> list[TargetConfig]:
    """Targets from --triton-url (+ --metrics-url, --header) and the spec's targets.triton.

    Raises UsageError (no target, a bad URL, more --metrics-url than --triton-url) or SpecError (spec, or a
    header secret that cannot be resolved).
    """
    cli_headers = parse_headers(args.header)
    if args.max_answer_bytes is not None and args.max_answer_bytes < 1024:
        raise UsageError(f"--max-answer-bytes: expected at least 1024, got {args.max_answer_bytes}")
    if len(args.metrics_url) > len(args.triton_url):
        raise UsageError("--metrics-url: more given than --triton-url")
    targets = []
    # Credentials in a target URL (http://user:pass@triton:8000) are sent (aiohttp makes them a Basic
    # credential) but never shown: registered for redaction before anything can log or raise with them.
    for url in (*args.triton_url, *args.metrics_url):
        redaction.register_url_credentials(url)
    for i, url in enumerate(args.triton_url):
        parsed = urlparse(url)
        try:
            url_port = parsed.port  # None when absent; ValueError when not a number or out of 0-65535
        except ValueError:
            url_port = 0
        if parsed.scheme not in ("http", "https") or not parsed.hostname or url_port == 0:
            raise UsageError(f"--triton-url: expected http(s)://HOST:PORT with a port 1-65535, "
                             f"got {redaction.redact(url)!r}")
        metrics = args.metrics_url[i] if i < len(args.metrics_url) else ""
        # The `triton` label is host:port, never the user-info.
        targets.append(TargetConfig(redaction.address(url), url, metrics, dict(cli_headers),
                                    args.max_answer_bytes or DEFAULT_MAX_ANSWER_BYTES))
    if not args.no_spec_targets and (args.spec or not targets):
        from inferwatch.spec import load_spec

        spec = load_spec(args.spec)
        for t in spec.targets.triton:
            redaction.register_url_credentials(t.url)
            redaction.register_url_credentials(t.metrics_url)
            headers = {name: secret.reveal() for name, secret in t.headers.items()}
            headers.update(cli_headers)
            targets.append(TargetConfig(t.name, t.url, t.metrics_url, headers,
                                        args.max_answer_bytes or t.max_answer_bytes))
    if not targets:
        raise UsageError("no Triton to poll: give --triton-url or a spec with targets.triton")
    names = [t.name for t in targets]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"duplicate Triton target names: {', '.join(dupes)}")
    return targets


def run(args: argparse.Namespace) -> int:
    targets = build_targets(args)
    interval = _duration(args.interval, "--interval")
    timeout = _duration(args.timeout, "--timeout")
    if args.concurrency < 1:
        raise UsageError("--concurrency: expected at least 1")
    config_max_age = _duration(args.config_max_age, "--config-max-age", zero_ok=True)
    bounds = bounds_from_args(args)
    collector = TritonCollector(targets, interval=interval, timeout=timeout, concurrency=args.concurrency,
                                config_max_age=config_max_age, bls_steps=parse_bls_steps(args.bls_step))
    # The collector's families vary with what was polled (no describe()); `?name[]=` still has to reach them.
    registry = CollectorRegistry(support_collectors_without_names=True)
    registry.register(collector)
    ProcessCollector(registry=registry)
    # Each target holds up to --concurrency client connections: kept out of the cap on scrape connections.
    server = metrics_server(registry, args.host, args.port, bounds, client_connections=args.concurrency * len(targets))
    try:
        # Bind first: a port that cannot be had fails start-up before any poll runs (and logs).
        server.start()
    except BaseException:
        collector.close()
        raise
    collector.start()
    log.info("triton collector on http://%s:%d/metrics polling %s every %gs (at most %d connections, header "
             "timeout %gs, idle timeout %gs)", args.host, server.port, ", ".join(t.name for t in targets), interval,
             server.max_connections, bounds.header_timeout_s, bounds.idle_timeout_s)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        server.stop()
        collector.close()
    return 0
