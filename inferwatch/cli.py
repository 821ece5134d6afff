"""`inferwatch` command line: one console script, one subcommand per component.

Each component registers its own subcommand from its module (`register(subparsers)`), so this file only
lists them. Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad configuration (one-line reason).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from inferwatch.errors import UsageError
from inferwatch.specload import SpecError
from inferwatch.stack.process import StackError

# Top-level subcommands, in the order --help lists them. Each module defines register(subparsers).
COMMANDS = [
    "inferwatch.check",
    "inferwatch.generate",
    "inferwatch.demo",
    "inferwatch.triage.cli",
    "inferwatch.notifier.cli",
]
# `inferwatch exporter <name>` subcommands.
EXPORTERS: list[str] = [
    "inferwatch.exporters.triton.cli",
    "inferwatch.exporters.gateway.cli",
    "inferwatch.exporters.gpu.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferwatch",
        description="Observability and alerting for NVIDIA Triton inference platforms: "
                    "L1 GPUs, L2 Triton runtime, L3 LLM user experience.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    if EXPORTERS:
        exp = sub.add_parser("exporter", help="run one of the exporters (serves /metrics)",
                             description="Run an exporter. Each serves Prometheus /metrics.")
        exp_sub = exp.add_subparsers(dest="exporter", metavar="EXPORTER", required=True)
        for module in EXPORTERS:
            importlib.import_module(module).register(exp_sub)
    return parser


def add_service_args(parser: argparse.ArgumentParser, default_port: int, host: str = "127.0.0.1") -> None:
    """--host/--port every service subcommand takes."""
    parser.add_argument("--host", default=host, help=f"address to listen on (default {host})")
    parser.add_argument("--port", type=int, default=default_port, help=f"port to listen on (default {default_port})")


def add_spec_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", default=None, metavar="FILE",
                        help="spec file (default ./inferwatch.yaml if present, else built-in defaults)")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except (SpecError, UsageError) as exc:
        print(f"inferwatch: error: {exc}", file=sys.stderr)
        return 2
    except StackError as exc:
        print(f"inferwatch: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
