"""`inferwatch check`: validate a spec file and summarise what it declares."""

from __future__ import annotations

import argparse

from inferwatch.spec import load_spec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a spec file (errors name the field and what was expected)")
    p.add_argument("--spec", default=None, metavar="FILE", help="spec file (default ./inferwatch.yaml)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    print(f"{args.spec or 'inferwatch.yaml'}: OK ({len(spec.targets.triton)} Triton target(s), "
          f"{len(spec.tiers)} tier(s), {len(spec.tenants)} tenant(s), {len(spec.channels)} channel(s), "
          f"{len(spec.routes)} route(s))")
    return 0
