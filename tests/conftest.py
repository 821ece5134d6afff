"""Real-stack test harness: the real tritonserver, Prometheus and Alertmanager on free loopback ports.

A missing binary fails the test with the command that installs it (never a silent skip).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import sys
import tempfile
from pathlib import Path

import pytest

from inferwatch.errors import StackError
from inferwatch.testing.alertmanager import start_alertmanager
from inferwatch.testing.prometheus import start_prometheus
from inferwatch.testing.triton import EXAMPLE_MODEL_REPOSITORY, start_triton

REPO_ROOT = Path(__file__).resolve().parents[1]
# Folders beside the checkout (its parent's other children) exist on the developer's machine only: a test
# that opens a file there passes here and fails in every other checkout, so such an open fails at once.
# The interpreter, the temporary folder and the user's dot-folders (caches) are the machine's, not notes.
_MACHINE = tuple(str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                    tempfile.gettempdir()}) + (str(Path.home()) + "/.",)


def _refuse_paths_beside_the_checkout(event: str, args: tuple) -> None:
    if event != "open" or not isinstance(args[0], (str, Path)):
        return
    path = Path(args[0])
    if not path.is_absolute():
        return
    resolved = str(path.resolve())
    parent = str(REPO_ROOT.parent) + "/"
    if (resolved.startswith(parent) and not resolved.startswith(str(REPO_ROOT) + "/")
            and not resolved.startswith(_MACHINE)):
        raise PermissionError(f"a test opened {resolved}, outside the repository {REPO_ROOT}; put what it needs "
                              f"under tests/fixtures/")


sys.addaudithook(_refuse_paths_beside_the_checkout)


def _start(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except StackError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def triton(tmp_path_factory):
    """The real Triton serving examples/model_repository (classifier v1+v2, toy_llm), shared by the session."""
    server = _start(start_triton, tmp_path_factory.mktemp("triton"), EXAMPLE_MODEL_REPOSITORY,
                    ready_path="/v2/health/ready")
    yield server
    server.stop()


@contextlib.contextmanager
def _servers(tmp_path_factory, name: str, start_fn):
    """Yield factory(first_arg, **kwargs) starting servers in fresh folders; all stop when the test ends."""
    started = []

    def factory(first_arg, **kwargs):
        server = _start(start_fn, tmp_path_factory.mktemp(name), first_arg, **kwargs)
        started.append(server)
        return server

    try:
        yield factory
    finally:
        for server in started:
            with contextlib.suppress(Exception):
                server.stop()


@pytest.fixture
def triton_factory(tmp_path_factory):
    """Start extra Triton servers: factory(model_repository=EXAMPLE, **start_triton kwargs)."""
    with _servers(tmp_path_factory, "triton-extra", start_triton) as factory:
        yield lambda model_repository=EXAMPLE_MODEL_REPOSITORY, **kwargs: factory(model_repository, **kwargs)


@pytest.fixture
def prometheus_factory(tmp_path_factory):
    """Start Prometheus: factory(config_path, **start_prometheus kwargs)."""
    with _servers(tmp_path_factory, "prometheus", start_prometheus) as factory:
        yield factory


@pytest.fixture
def alertmanager_factory(tmp_path_factory):
    """Start Alertmanager: factory(config_path, **start_alertmanager kwargs)."""
    with _servers(tmp_path_factory, "alertmanager", start_alertmanager) as factory:
        yield factory


# A module that leaves many more open files than it found leaks them (an unclosed socket, sqlite connection,
# pipe or session): over the whole suite such leaks once passed 1,024 descriptors, where select() fails. The
# count is taken after a garbage collection (objects nobody holds any more are closed by it), after the
# module's own fixtures are gone; session fixtures first used in a module (the shared Triton) open a few.
# INFERWATCH_FD_LEAK_LIMIT=0 only reports (the summary line at the end), failing no module.
FD_LEAK_LIMIT = int(os.environ.get("INFERWATCH_FD_LEAK_LIMIT", "24"))
_FD_DIR = Path("/proc/self/fd")
_FD_GROWTH: dict[str, int] = {}  # module -> open files it left (negative: it closed some it found)


def _open_fds() -> dict[int, str]:
    """{fd: what it is (a path, socket:[inode], pipe:[inode])} of this process; {} where /proc is missing."""
    out = {}
    with contextlib.suppress(OSError):
        for entry in _FD_DIR.iterdir():
            with contextlib.suppress(OSError):
                out[int(entry.name)] = os.readlink(entry)
    return out


@pytest.fixture(scope="module", autouse=True)
def _no_fd_leak_per_module(request):
    """Fail the module's last test (at teardown) when the module left more than FD_LEAK_LIMIT (env
    INFERWATCH_FD_LEAK_LIMIT) descriptors open; the message lists the new ones by kind."""
    gc.collect()
    before = _open_fds()
    yield
    gc.collect()
    after = _open_fds()
    new = {fd: what for fd, what in after.items() if before.get(fd) != what}
    _FD_GROWTH[request.module.__name__] = len(after) - len(before)
    if before and FD_LEAK_LIMIT > 0 and len(after) - len(before) > FD_LEAK_LIMIT:
        kinds = collections.Counter(what.split(":")[0] if what.startswith(("socket:", "pipe:", "anon_inode:"))
                                    else what for what in new.values())
        pytest.fail(f"{request.module.__name__} left {len(after) - len(before)} more open files than it found "
                    f"({len(before)} -> {len(after)}; limit {FD_LEAK_LIMIT}): "
                    + ", ".join(f"{n} x {k}" for k, n in kinds.most_common(8)), pytrace=False)


def pytest_terminal_summary(terminalreporter):
    """The modules that left the most open files, so a slow leak shows before it reaches the limit."""
    grown = sorted(((n, m) for m, n in _FD_GROWTH.items() if n > 0), reverse=True)[:5]
    if grown:
        terminalreporter.write_line("open files left per module (most first): "
                                    + ", ".join(f"{m} +{n}" for n, m in grown))


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL (Debian's postgresql) on a loopback port, shared by the session; tests take a fresh
    database each from `pg_database`."""
    from inferwatch.testing.postgres import start_postgres

    server = _start(start_postgres, tmp_path_factory.mktemp("postgres"))
    yield server
    server.stop()


@pytest.fixture
def pg_database(postgres, monkeypatch):
    """A fresh empty database on the session's PostgreSQL: (url without password, password). The password is
    also in $INFERWATCH_TEST_PGPASSWORD, for specs that reference it (`password: ${INFERWATCH_TEST_PGPASSWORD}`)."""
    import uuid

    url = postgres.create_database(f"t_{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("INFERWATCH_TEST_PGPASSWORD", postgres.password)
    return url, postgres.password
