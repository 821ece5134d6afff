"""Real-stack test harness: the real tritonserver, Prometheus and Alertmanager on free loopback ports.

A missing binary fails the test with the command that installs it (never a silent skip).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from inferwatch.stack.alertmanager import start_alertmanager
from inferwatch.stack.process import StackError
from inferwatch.stack.prometheus import start_prometheus
from inferwatch.stack.triton import EXAMPLE_MODEL_REPOSITORY, start_triton

REPO_ROOT = Path(__file__).resolve().parents[1]


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


@pytest.fixture
def triton_factory(tmp_path_factory):
    """Start extra Triton servers (own repository or flags); all are stopped at the end of the test."""
    started = []

    def factory(model_repository: Path = EXAMPLE_MODEL_REPOSITORY, **kwargs):
        server = _start(start_triton, tmp_path_factory.mktemp("triton-extra"), model_repository, **kwargs)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@pytest.fixture
def prometheus_factory(tmp_path_factory):
    """Start Prometheus with a given config file; stopped at the end of the test."""
    started = []

    def factory(config_path: Path, **kwargs):
        server = _start(start_prometheus, tmp_path_factory.mktemp("prometheus"), config_path, **kwargs)
        started.append(server)
        return server

    yield factory
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()


@pytest.fixture
def alertmanager_factory(tmp_path_factory):
    """Start Alertmanager with a given config file; stopped at the end of the test."""
    started = []

    def factory(config_path: Path, **kwargs):
        server = _start(start_alertmanager, tmp_path_factory.mktemp("alertmanager"), config_path, **kwargs)
        started.append(server)
        return server

    yield factory
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()
