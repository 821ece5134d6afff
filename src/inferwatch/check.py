"""`inferwatch check`: validate a spec file and summarise what it declares."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferwatch.deploy.prometheus import unmatched_selectors
from inferwatch.deploy.routecheck import check_routes
from inferwatch.errors import UsageError
from inferwatch.generate import render_all
from inferwatch.spec import DEFAULT_SPEC_PATH, load_spec
from inferwatch.specload import SpecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a spec file (errors name the field and what was expected)")
    p.add_argument("--spec", default=None, metavar="FILE",
                   help="spec file (default ./inferwatch.yaml, else the built-in defaults)")
    p.add_argument("--prometheus", metavar="URL", default=None,
                   help="also read this live Prometheus: do the spec's selectors match its series, with the labels "
                        "and metrics the rules need, scraped once and often enough, rules evaluating "
                        "(inferwatch/livecheck.py); exit 1 with one line per problem")
    p.add_argument("--alertmanager", metavar="URL", default=None,
                   help="with --prometheus: check this Alertmanager answers and Prometheus sends alerts to it")
    p.set_defaults(func=run)


def unresolved_secrets(spec) -> list[str]:
    """'field.path: why' for every channel/notifier secret that does not resolve in this environment."""
    found = []
    secrets = [s for c in spec.channels.values() for s in (c.url, c.routing_key, *c.headers.values())]
    secrets += [spec.notifier.bearer_token, spec.notifier.basic_auth_password]
    for secret in secrets:
        if secret is None:
            continue
        try:
            secret.reveal()
        except SpecError as exc:
            found.append(str(exc))
    return found


def missing_alertmanager_files(spec) -> list[str]:
    """'field: why' for every secret file the generated Alertmanager configuration reads that is not readable
    here (they usually live only where Alertmanager runs, so this is a warning)."""
    from inferwatch.deploy.alertmanager import secret_files

    out = []
    for name, (path, what) in secret_files(spec).items():
        try:
            Path(path).read_bytes()
        except OSError as exc:
            out.append(f"{name}: {path} is not readable here ({exc.strerror}); Alertmanager reads {what} from it")
    return out


def run(args: argparse.Namespace) -> int:
    file = args.spec or (DEFAULT_SPEC_PATH if Path(DEFAULT_SPEC_PATH).exists() else None)
    spec = load_spec(file)
    # The generators validate more than the loader (bucket edges, window/interval ratios, tier values):
    # run them too, so a spec `check` accepts is one `generate` accepts.
    try:
        render_all(spec)
        # A route that can never match is valid YAML and a valid spec, yet its alerts fall through to the
        # catch-all: reject it, naming the nearest label or value alerts really carry.
        check_routes(spec)
    except SpecError as exc:
        raise exc.with_file(file or "built-in defaults") from None
    # Thresholds that contradict each other (an SLO tighter than its own P95 target, a `for` longer than its
    # window, a severity no channel receives) are each valid alone: refuse them together, with the figures.
    from inferwatch.speccheck import findings

    found = findings(spec)
    refused = [f for f in found if f.refuse]
    for finding in refused:
        print(f"{file or 'built-in defaults'}: {finding}", file=sys.stderr)
    if refused:
        return 2
    name = file or f"built-in defaults (no --spec and no ./{DEFAULT_SPEC_PATH})"
    # Secrets are often only present where the notifier runs, so an unresolved one is a warning here;
    # `inferwatch notifier` itself refuses to start without them.
    for warning in unresolved_secrets(spec):
        print(f"warning: {warning} (the notifier will not start without it)", file=sys.stderr)
    for warning in missing_alertmanager_files(spec):
        print(f"warning: {warning}", file=sys.stderr)
    # A selector the generated scrape configuration cannot satisfy (a regex, `!=`) is fine for a Prometheus
    # of one's own (the Prometheus Operator's), but the generated prometheus.yml would leave alerts blind.
    for warning in unmatched_selectors(spec):
        print(f"warning: {warning}", file=sys.stderr)
    # Selectors, identity labels and upstreams each valid alone that do not fit together.
    from inferwatch.sourcecheck import findings as source_findings

    for warning in source_findings(spec):
        print(f"warning: {warning}", file=sys.stderr)
    # Declared tenants that the generated Kubernetes gateway would bill `other` (it trusts only loopback there).
    from inferwatch.deploy.kubernetes.tenancy import findings as tenant_trust_findings

    for trust in tenant_trust_findings(spec):
        print(f"warning: {trust}", file=sys.stderr)
    # Prices and budgets naming models or tenants the spec does not declare, and models without a price.
    from inferwatch.billing import findings as billing_findings

    for warning in billing_findings(spec):
        print(f"warning: {warning}", file=sys.stderr)
    # A trusted network holding every address (0.0.0.0/0, ::/0): anyone may set the tenant header.
    from inferwatch.networks import open_trust_findings

    for trust in open_trust_findings(spec):
        print(f"warning: {trust}", file=sys.stderr)
    print(f"{name}: OK ({len(spec.targets.triton)} Triton target(s), "
          f"{len(spec.tiers)} tier(s), {len(spec.tenants)} tenant(s), {len(spec.channels)} channel(s), "
          f"{len(spec.routes)} route(s))")
    for finding in found:
        print(f"warning: {finding}", file=sys.stderr)
    if getattr(args, "prometheus", None):
        # The live check answers another question (does the spec fit this Prometheus): its problem lines alone,
        # not below the route table.
        return _live(spec, args.prometheus, args.alertmanager)
    if getattr(args, "alertmanager", None):
        raise UsageError("--alertmanager needs --prometheus (the check reads where Prometheus sends alerts)")
    from inferwatch.deploy.routetable import effective_table, render

    print("\nWhere each alert goes (Alertmanager's tree, then the notifier's routes):")
    print(render(effective_table(spec)))
    return 0


def _live(spec, prometheus: str, alertmanager: str | None) -> int:
    from inferwatch.livecheck import LiveCheckError, live_problems

    try:
        problems = live_problems(spec, prometheus, alertmanager)
    except LiveCheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for problem in problems:
        print(problem)
    where = prometheus + (f" and {alertmanager}" if alertmanager else "")
    print(f"{where}: {len(problems)} problem(s)" if problems else f"{where}: OK, the spec fits")
    return 1 if problems else 0
