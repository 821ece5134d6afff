"""Shared helpers for the GPU exporter tests: a settable clock, the example scenarios, text parsing, a fake
kubelet serving the PodResources API on a unix socket."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.gpu.podresources import api_pb2, api_pb2_grpc

SCENARIOS = Path(__file__).resolve().parents[1] / "src" / "inferwatch" / "exporters" / "gpu" / "scenarios"


class FakeClock:
    """A clock tests move by hand, so scenario times and backoff are exact and nothing sleeps."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def render(collector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def samples(text: str, name: str | None = None) -> list:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples if name is None or s.name == name]


def by_gpu(text: str, name: str) -> dict[str, float]:
    """{gpu label: value} of the whole-GPU series (MIG instance series left out)."""
    return {s.labels["gpu"]: s.value for s in samples(text, name) if "GPU_I_ID" not in s.labels}


def wait_until(predicate, what: str, limit_s: float = 20.0) -> None:
    """Poll a condition a background thread makes true (a bound on waiting, not a timed assertion)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's side of PodResourcesLister.List (the real v1 service definition): answers whatever `pods`
    holds now. pods: [(namespace, pod, [(container, resource, [device ids])])]."""

    def __init__(self):
        self.pods: list = []
        self.calls = 0
        self.fail_with: grpc.StatusCode | None = None
        self._lock = threading.Lock()

    def List(self, request, context):  # noqa: N802 - the service's method name
        with self._lock:
            self.calls += 1
            if self.fail_with is not None:
                context.abort(self.fail_with, "kubelet restarting")
            return api_pb2.ListPodResourcesResponse(pod_resources=[
                api_pb2.PodResources(namespace=ns, name=name, containers=[
                    api_pb2.ContainerResources(name=container, devices=[
                        api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)])
                    for container, resource, ids in containers])
                for ns, name, containers in self.pods])


@contextlib.contextmanager
def fake_kubelet():
    """A FakeKubelet serving gRPC on a unix socket; yields (fake, socket path)."""
    # A short directory: unix socket paths are limited to about 108 bytes.
    with tempfile.TemporaryDirectory(prefix="kubelet-") as tmp:
        path = os.path.join(tmp, "kubelet.sock")
        fake = FakeKubelet()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(fake, server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        try:
            yield fake, path
        finally:
            server.stop(grace=None)
