"""`python -m inferwatch.exporters.gpu [flags]`: the GPU exporter alone, same flags as
`inferwatch exporter gpu`, without importing the other components (for hosts that carry only this one)."""

from __future__ import annotations

import argparse
import sys

from inferwatch.cli import run_command, setup_logging
from inferwatch.exporters.gpu import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferwatch.exporters.gpu")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="exporter", required=True)
    cli.register(sub)
    args = parser.parse_args(["gpu", *(sys.argv[1:] if argv is None else argv)])
    setup_logging(args.verbose)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
