"""The three faults of the demo scenario, one per layer, each with the alert it must raise and the channel
the spec routes that layer to.

- GPU overheat (L1 → phone): the simulated GPU's temperature is driven past the critical threshold through
  the GPU exporter's POST /sim/events, and the driver reports thermal slowdown;
- classifier failing a share of its requests (L2 → Slack): the example model raises for that share;
- slow first tokens for one tier (L3 → WeCom): toy_llm streams for that tier wait before the first token.
"""

from __future__ import annotations

import dataclasses

import requests

from inferwatch.demo.workload import Knobs


@dataclasses.dataclass
class Fault:
    """`inject()` / `remove()` act on the running stack; `alert` is the alert the fault must raise (others of
    the same layer may come with it)."""

    key: str
    title: str
    layer: str
    alert: str
    detail: str

    def inject(self) -> None:
        raise NotImplementedError

    def remove(self) -> None:
        raise NotImplementedError


@dataclasses.dataclass
class GpuOverheat(Fault):
    exporter_url: str = ""
    gpu: int = 0
    peak_celsius: float = 92.0
    normal_celsius: float = 44.0

    def _post(self, events: list[dict]) -> None:
        resp = requests.post(f"{self.exporter_url}/sim/events", json=events, timeout=10)
        resp.raise_for_status()

    def inject(self) -> None:
        # Like exporters/gpu/scenarios/overheat.yaml, faster: a climb over seconds, then thermal slowdown.
        self._post([{"gpu": self.gpu, "ramp": {"temperature_c": self.peak_celsius, "power_w": 320}, "over": "6s"},
                    {"at": "5s", "gpu": self.gpu,
                     "set": {"clocks_event_reasons": ["sw_thermal_slowdown"], "sm_clock_mhz": 1410}}])

    def remove(self) -> None:
        self._post([{"gpu": self.gpu, "ramp": {"temperature_c": self.normal_celsius, "power_w": 210}, "over": "4s"},
                    {"gpu": self.gpu, "set": {"clocks_event_reasons": [], "sm_clock_mhz": 1755}}])


@dataclasses.dataclass
class ClassifierFailures(Fault):
    knobs: Knobs | None = None
    share: float = 0.3

    def inject(self) -> None:
        self.knobs.set_classifier_fail(self.share)

    def remove(self) -> None:
        self.knobs.set_classifier_fail(0.0)


@dataclasses.dataclass
class SlowFirstTokens(Fault):
    knobs: Knobs | None = None
    tier: str = "realtime"
    delay_ms: int = 1500

    def inject(self) -> None:
        self.knobs.set_first_token_delay(self.tier, self.delay_ms)

    def remove(self) -> None:
        self.knobs.set_first_token_delay(self.tier, None)


def demo_faults(knobs: Knobs, gpu_exporter_url: str, gpu_node: str, simulated_gpu_note: str = "") -> list[Fault]:
    """The scenario's faults in injection order."""
    return [
        GpuOverheat("gpu", "GPU overheat", "L1", "GpuTemperatureCritical",
                    f"GPU 0 on {gpu_node}: 44 → 92 °C in 6 s, then sw_thermal_slowdown{simulated_gpu_note}",
                    exporter_url=gpu_exporter_url),
        ClassifierFailures("classifier", "classifier failing", "L2", "TritonModelErrorRatioHigh",
                           "classifier raises for 30 % of its requests (failure reason BACKEND)", knobs=knobs),
        SlowFirstTokens("ttft", "slow first tokens", "L3", "LlmTtftP95High",
                        "toy_llm waits 1.5 s before the first token for tier realtime (tenants acme, globex)",
                        knobs=knobs),
    ]
