"""The real Triton server shipped in `nvidia-pytriton`, serving a plain model repository on loopback.

Two facts learned by running it (docs/sources.md#triton): the Python backend stub links the system libpython, so
LD_LIBRARY_PATH must point at the running interpreter's LIBDIR; and a plain repository needs a backend
directory holding `backends/python/*` plus the stub matching this Python version.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from inferwatch.testing.process import ManagedProcess, StackError, free_port, http_ok

INSTALL_HINT = "pip install 'nvidia-pytriton==0.7.0' (or: make test / make demo, which install it)"
REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_MODEL_REPOSITORY = REPO_ROOT / "examples" / "model_repository"


def pytriton_dir() -> Path:
    try:
        import pytriton  # noqa: F401  (only to find the bundled server)
    except ImportError:
        raise StackError(f"tritonserver not available: nvidia-pytriton is not installed; {INSTALL_HINT}") from None
    return Path(pytriton.__file__).parent / "tritonserver"


def backend_directory(workdir: Path) -> Path:
    """Build (once per workdir) a backend folder: backends/python/* + the stub for this Python version."""
    src = pytriton_dir()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = src / "python_backend_stubs" / python / "triton_python_backend_stub"
    if not stub.exists():
        raise StackError(f"no Triton Python backend stub for Python {python} in {src}")
    dest = workdir / "backends"
    python_dir = dest / "python"
    if not (python_dir / "triton_python_backend_stub").exists():
        python_dir.mkdir(parents=True, exist_ok=True)
        for item in (src / "backends" / "python").iterdir():
            if item.is_file():
                shutil.copy2(item, python_dir / item.name)
        shutil.copy2(stub, python_dir / "triton_python_backend_stub")
    return dest


def server_env() -> dict:
    """Environment for tritonserver: this interpreter's libpython and packages visible to backend stubs."""
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    # The copied stub loses its $ORIGIN-relative rpath to the wheel's bundled CUDA runtime.
    bundled = str(pytriton_dir().parent.parent / "nvidia_pytriton.libs")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, bundled, env.get("LD_LIBRARY_PATH", "")) if p)
    # The stub embeds an interpreter that finds its prefix through `python3` on PATH (as pytriton does):
    # put this environment's bin first so the models see its site-packages (numpy).
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return env


@dataclasses.dataclass
class TritonServer:
    """A running tritonserver. `url` is the HTTP API base, `metrics_url` its /metrics."""

    process: ManagedProcess
    http_port: int
    grpc_port: int
    metrics_port: int
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_address(self) -> str:
        return f"{self.host}:{self.metrics_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_address}/metrics"

    def stop(self) -> None:
        self.process.stop()


def server_binary() -> Path:
    """The bundled tritonserver. Raises StackError (with the install command) when it is missing."""
    binary = pytriton_dir() / "bin" / "tritonserver"
    if not binary.exists():
        raise StackError(f"tritonserver binary missing at {binary}; {INSTALL_HINT}")
    return binary


def server_argv(model_repository: Path, workdir: Path, *, host: str, http_port: int, grpc_port: int,
                metrics_port: int, metrics_interval_ms: int = 2000, summary_latencies: bool = True,
                extra_args: list[str] | None = None) -> list[str]:
    """tritonserver's command line serving `model_repository` on `host` (HTTP, gRPC and metrics), with the
    backend folder built under `workdir`. Raises StackError when the binary or the Python stub is missing."""
    return [
        str(server_binary()),
        f"--model-repository={model_repository}",
        f"--backend-directory={backend_directory(Path(workdir))}",
        f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
        f"--http-address={host}", f"--grpc-address={host}", f"--metrics-address={host}",
        # P95 queue time in rules needs summaries (docs/sources.md#triton); counters stay on too.
        *(["--metrics-config=summary_latencies=true"] if summary_latencies else []),
        f"--metrics-interval-ms={metrics_interval_ms}",
    ] + list(extra_args or [])


def start_triton(workdir: Path, model_repository: Path = EXAMPLE_MODEL_REPOSITORY, *,
                 extra_args: list[str] | None = None, metrics_interval_ms: int = 1000,
                 ready_path: str = "/v2/health/live", timeout: float = 120.0,
                 http_port: int | None = None, metrics_port: int | None = None,
                 summary_latencies: bool = True, lifeline: bool = False, host: str = "127.0.0.1") -> TritonServer:
    """Start tritonserver on free loopback ports and wait until `ready_path` answers 200.

    `host`: the loopback address it listens on (another 127.x.y.z lets two servers share one port, as pods
    behind one Service name do).

    `ready_path` defaults to liveness: with strict readiness a repository holding a model that fails to
    load never becomes ready, and tests of that case still need a running server.
    `summary_latencies=False` leaves summaries off (Triton's default), e.g. to test the fallback to averages;
    a later `--metrics-config=summary_latencies=false` in extra_args does not undo an earlier `true`.
    `lifeline=True`: it dies with this process, however this process dies (ManagedProcess).
    Raises StackError (with the install command) when the binary is missing, or the log tail on failure.
    """
    workdir = Path(workdir)
    http_port = http_port or free_port(host)
    grpc_port = free_port(host)
    metrics_port = metrics_port or free_port(host)
    argv = server_argv(model_repository, workdir, host=host, http_port=http_port, grpc_port=grpc_port,
                       metrics_port=metrics_port, metrics_interval_ms=metrics_interval_ms,
                       summary_latencies=summary_latencies,
                       extra_args=["--allow-gpu-metrics=false", "--log-verbose=0", *(extra_args or [])])
    url = f"http://{host}:{http_port}"
    process = ManagedProcess("tritonserver", argv, workdir / "tritonserver.log",
                             ready=lambda: http_ok(url + ready_path), env=server_env(),
                             lifeline=lifeline)
    process.start(timeout=timeout)
    return TritonServer(process, http_port, grpc_port, metrics_port, host)
