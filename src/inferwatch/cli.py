"""`inferwatch` command line: one console script, one subcommand per component.

Each component registers its own subcommand from its module (`register(subparsers)`), so this file only
lists them. Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad configuration (one-line reason).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import re
import sys

from inferwatch import redaction
from inferwatch.errors import StackError, UsageError
from inferwatch.specload import SpecError

# Top-level subcommands, in the order --help lists them. Each module defines register(subparsers).
COMMANDS = [
    "inferwatch.check",
    "inferwatch.generate",
    "inferwatch.demo",
    "inferwatch.stack",
    "inferwatch.triage.cli",
    "inferwatch.notifier.cli",
]
# `inferwatch exporter <name>` subcommands.
EXPORTERS: list[str] = [
    "inferwatch.exporters.triton.cli",
    "inferwatch.exporters.gateway.cli",
    "inferwatch.exporters.gpu.cli",
]
# The subcommand each module above registers: a command line that names one imports only its module (the
# others import aiohttp, the triage engine, the generators: about a second of CPU, many seconds on a busy
# machine, for every `inferwatch ...` a test or a supervisor starts). tests/test_cli_errors.py checks the map
# against what the modules register.
COMMAND_OF = {"inferwatch.check": "check", "inferwatch.generate": "generate", "inferwatch.demo": "demo",
              "inferwatch.stack": "stack", "inferwatch.triage.cli": "triage", "inferwatch.notifier.cli": "notifier",
              "inferwatch.exporters.triton.cli": "triton", "inferwatch.exporters.gateway.cli": "gateway",
              "inferwatch.exporters.gpu.cli": "gpu"}


def _named_commands(argv: list[str]) -> tuple[str | None, str | None]:
    """(command, exporter) the command line names before any other argument: None where it names none, or
    starts with an option other than -v (then every module is imported, as for --help)."""
    words = list(argv)
    while words and words[0] in ("-v", "--verbose"):
        words.pop(0)
    command = words[0] if words and not words[0].startswith("-") else None
    exporter = words[1] if command == "exporter" and len(words) > 1 and not words[1].startswith("-") else None
    return command, exporter


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line's parser (argv None); with `argv` (the arguments to parse) naming a known
    command, only that command's module is imported: the parser then knows that command alone, all `argv`
    can reach."""
    command, exporter = _named_commands(argv) if argv is not None else (None, None)
    commands = [m for m in COMMANDS if COMMAND_OF.get(m) == command] or COMMANDS
    exporters = [m for m in EXPORTERS if COMMAND_OF.get(m) == exporter] or EXPORTERS
    if command == "exporter":
        commands = []
    elif command is not None and commands is not COMMANDS:
        exporters = []
    parser = argparse.ArgumentParser(
        prog="inferwatch",
        description="Observability and alerting for NVIDIA Triton inference platforms: "
                    "L1 GPUs, L2 Triton runtime, L3 LLM user experience.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in commands:
        importlib.import_module(module).register(sub)
    if exporters:
        exp = sub.add_parser("exporter", help="run one of the exporters (serves /metrics)",
                             description="Run an exporter. Each serves Prometheus /metrics.")
        exp_sub = exp.add_subparsers(dest="exporter", metavar="EXPORTER", required=True)
        for module in exporters:
            importlib.import_module(module).register(exp_sub)
    return parser


def port(text: str) -> int:
    """argparse type for a TCP port: an integer 1-65535 (0, "any free port", is not a usable service port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, got {value}")
    return value


def add_service_args(parser: argparse.ArgumentParser, default_port: int, host: str = "127.0.0.1") -> None:
    """--host/--port every service subcommand takes."""
    parser.add_argument("--host", default=host, help=f"address to listen on (default {host})")
    parser.add_argument("--port", type=port, default=default_port,
                        help=f"port to listen on, 1-65535 (default {default_port})")


def add_spec_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", default=None, metavar="FILE",
                        help="spec file (default ./inferwatch.yaml if present, else built-in defaults)")


def setup_logging(verbose: bool = False) -> None:
    """stderr logging for every command, with the one redaction filter (inferwatch.redaction) on every
    handler, so no log line of ours or of a library (urllib3, aiohttp, asyncio; warnings included) can show
    a secret, with -v as without."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)
    redaction.install()


# errno values of a socket that cannot listen where asked (bind/listen), named in the message with host:port.
_LISTEN_ERRNOS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}
# uvloop/asyncio put the address in the message: "error while attempting to bind on address ('h', p): ..."
_BIND_ADDRESS = re.compile(r"address \('([^']*)', (\d+)\)(?:: )?(.*)")


def describe_os_error(exc: OSError | OverflowError, args: argparse.Namespace) -> str:
    """One line `<what> (<host:port or path>)` for an OSError/OverflowError raised while a service starts."""
    if isinstance(exc, OverflowError):  # socket.bind() on a port > 65535 that no argparse type caught
        return f"{exc} ({getattr(args, 'host', '?')}:{getattr(args, 'port', '?')})"
    what = exc.strerror or str(exc)
    if exc.filename is not None:
        return f"{what} ({exc.filename})"
    m = _BIND_ADDRESS.search(str(exc))
    if m:
        return f"cannot listen: {m.group(3) or what} ({m.group(1)}:{m.group(2)})"
    if exc.errno in _LISTEN_ERRNOS and hasattr(args, "port"):
        return f"cannot listen: {what.lower()} ({args.host}:{args.port})"
    return what


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(args.verbose)
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run `args.func(args)`, mapping every expected failure to one stderr line and an exit code."""
    try:
        return int(args.func(args) or 0)
    except (SpecError, UsageError) as exc:
        print(f"inferwatch: error: {redaction.redact(str(exc))}", file=sys.stderr)
        return 2
    except StackError as exc:
        print(f"inferwatch: error: {redaction.redact(str(exc))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (OSError, OverflowError) as exc:
        # A port in use, a non-local --host, an unusable data directory: configuration, not a crash.
        print(f"inferwatch: error: {redaction.redact(describe_os_error(exc, args))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
