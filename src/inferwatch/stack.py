"""`inferwatch stack triton`: run the `tritonserver` that nvidia-pytriton installs in this environment on a
plain model repository, in the foreground.

The bundled binary does not serve a plain repository by itself: the Python backend needs a backend folder
holding `backends/python/*` plus the stub for this Python version, and the stub needs this interpreter's
libpython and the wheel's CUDA runtime on LD_LIBRARY_PATH. This command prepares both (the launcher the
tests and the demo use, inferwatch.testing.triton) and then becomes tritonserver (exec), so signals, logs
and the exit status are Triton's own.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from inferwatch.cli import port
from inferwatch.errors import UsageError

DEFAULT_WORKDIR = ".inferwatch-triton"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stack", help="run parts of the stack locally (the virtual environment's tritonserver)",
                       description="Run parts of the stack from this virtual environment.")
    stack_sub = p.add_subparsers(dest="part", metavar="PART", required=True)
    t = stack_sub.add_parser(
        "triton", help="run the tritonserver nvidia-pytriton ships on a model repository (foreground)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Arguments after `--` go to tritonserver unchanged, e.g. `-- --log-verbose=1`. "
               "Stop it with Ctrl-C or SIGTERM.")
    t.add_argument("--model-repository", metavar="DIR", default=None,
                   help="model repository to serve (default: the example repository, examples/model_repository)")
    t.add_argument("--host", default="127.0.0.1",
                   help="address HTTP, gRPC and metrics listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    t.add_argument("--http-port", type=port, default=8000, help="HTTP API port (default 8000)")
    t.add_argument("--grpc-port", type=port, default=8001, help="gRPC API port (default 8001)")
    t.add_argument("--metrics-port", type=port, default=8002, help="Prometheus /metrics port (default 8002)")
    t.add_argument("--metrics-interval-ms", type=int, default=2000,
                   help="how often Triton refreshes its metrics (default 2000, Triton's own; the spec's "
                        "targets.triton[].metrics_interval_ms should say the same)")
    t.add_argument("--workdir", default=DEFAULT_WORKDIR, metavar="DIR",
                   help=f"where the backend folder is built (default ./{DEFAULT_WORKDIR})")
    t.add_argument("tritonserver_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    t.set_defaults(func=run_triton)


def triton_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) for tritonserver. Raises UsageError for bad arguments, StackError when
    nvidia-pytriton (the binary or the Python stub) is missing."""
    from inferwatch.testing import triton  # the test-stack launcher: only this command needs it

    repository = Path(args.model_repository) if args.model_repository else triton.EXAMPLE_MODEL_REPOSITORY
    if not repository.is_dir():
        what = "--model-repository" if args.model_repository else "the example model repository"
        raise UsageError(f"{what}: not a directory: {repository}"
                         + ("" if args.model_repository else " (give --model-repository DIR)"))
    ports = {"--http-port": args.http_port, "--grpc-port": args.grpc_port, "--metrics-port": args.metrics_port}
    if len(set(ports.values())) < len(ports):
        raise UsageError(f"ports must differ: {', '.join(f'{k} {v}' for k, v in ports.items())}")
    if args.metrics_interval_ms < 1:
        raise UsageError(f"--metrics-interval-ms: expected at least 1, got {args.metrics_interval_ms}")
    extra = list(args.tritonserver_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    workdir = Path(args.workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--workdir: cannot create {workdir}: {exc.strerror}") from None
    argv = triton.server_argv(repository.resolve(), workdir.resolve(), host=args.host, http_port=args.http_port,
                              grpc_port=args.grpc_port, metrics_port=args.metrics_port,
                              metrics_interval_ms=args.metrics_interval_ms, extra_args=extra)
    return argv, triton.server_env()


def run_triton(args: argparse.Namespace) -> int:
    argv, env = triton_command(args)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"inferwatch: starting tritonserver on {argv[1].split('=', 1)[1]}: HTTP http://{host}:{args.http_port}, "
          f"gRPC {host}:{args.grpc_port}, metrics http://{host}:{args.metrics_port}/metrics",
          file=sys.stderr, flush=True)
    os.execve(argv[0], argv, env)  # noqa: S606 - becomes tritonserver (module doc); returns only by raising OSError (run_command reports it)
    return 1
