"""Shared helpers for the GPU exporter tests: a settable clock, the example scenarios, text parsing."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

SCENARIOS = Path(__file__).resolve().parents[1] / "exporters" / "gpu" / "scenarios"


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
