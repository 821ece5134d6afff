"""`inferwatch check`: validate a spec file and summarise what it declares."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferwatch.generate import render_all
from inferwatch.spec import DEFAULT_SPEC_PATH, load_spec
from inferwatch.specload import SpecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a spec file (errors name the field and what was expected)")
    p.add_argument("--spec", default=None, metavar="FILE", help="spec file (default ./inferwatch.yaml, else the built-in defaults)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    file = args.spec or (DEFAULT_SPEC_PATH if Path(DEFAULT_SPEC_PATH).exists() else None)
    spec = load_spec(file)
    # The generators validate more than the loader (bucket edges, window/interval ratios, tier values):
    # run them too, so a spec `check` accepts is one `generate` accepts.
    try:
        render_all(spec)
    except SpecError as exc:
        raise exc.with_file(file or "built-in defaults") from None
    name = file or f"built-in defaults (no --spec and no ./{DEFAULT_SPEC_PATH})"
    print(f"{name}: OK ({len(spec.targets.triton)} Triton target(s), "
          f"{len(spec.tiers)} tier(s), {len(spec.tenants)} tenant(s), {len(spec.channels)} channel(s), "
          f"{len(spec.routes)} route(s))")
    return 0
