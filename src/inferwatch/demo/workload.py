"""The demo's traffic: several tenants and tiers streaming `toy_llm` through the gateway, and batched
`classifier` requests straight to Triton, with knobs the faults turn at run time.

Rates are modest on purpose (about 4 streams/s and 6 classifier requests/s): the demo shares two CPU cores
with Triton, Prometheus and the exporters, and a saturated machine would raise alerts of its own.
"""

from __future__ import annotations

import dataclasses
import threading

from inferwatch.traffic import TrafficLoop, infer_classifier, stream_toy_llm

NORMAL_FIRST_TOKEN_MS = 20


@dataclasses.dataclass(frozen=True)
class Flow:
    """One stream of LLM requests: a tenant (X-Tenant-ID) calling from a service (X-Service-Name, which
    the spec maps to a tier) at `rate_per_s`."""

    tenant: str
    service: str
    tier: str
    rate_per_s: float
    max_tokens: int = 12


# Tenants, services and tiers as the demo spec declares them.
FLOWS = (
    Flow("acme", "chat-web", "realtime", 1.2),
    Flow("globex", "voice-assistant", "realtime", 0.8),
    Flow("initech", "summarizer", "standard", 1.0, max_tokens=24),
    Flow("globex", "nightly-batch", "batch", 0.5, max_tokens=32),
)
CLASSIFIER_RATE_PER_S = 6.0
CLASSIFIER_BATCH = 2


class Knobs:
    """What the faults change, read by every request as it is sent (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.classifier_fail = 0.0
        self.first_token_delay_ms: dict[str, int] = {}  # tier -> delay while slowed

    def set_classifier_fail(self, share: float) -> None:
        with self._lock:
            self.classifier_fail = share

    def set_first_token_delay(self, tier: str, delay_ms: int | None) -> None:
        with self._lock:
            if delay_ms is None:
                self.first_token_delay_ms.pop(tier, None)
            else:
                self.first_token_delay_ms[tier] = delay_ms

    def first_token_ms(self, tier: str) -> int:
        with self._lock:
            return self.first_token_delay_ms.get(tier, NORMAL_FIRST_TOKEN_MS)


class Workload:
    """All traffic loops. `start()` / `stop()`; `summary()` for the status line."""

    def __init__(self, gateway_url: str, triton_url: str, spec, flows: tuple[Flow, ...] = FLOWS):
        self.knobs = Knobs()
        self.started = False
        self.loops: list[TrafficLoop] = []
        headers_of = {f: {spec.gateway.tenant_header: f.tenant, spec.gateway.service_header: f.service}
                      for f in flows}

        def llm(flow: Flow):
            return lambda: stream_toy_llm(gateway_url, max_tokens=flow.max_tokens, headers=headers_of[flow],
                                          first_token_delay_ms=self.knobs.first_token_ms(flow.tier))

        for flow in flows:
            self.loops.append(TrafficLoop(f"toy_llm {flow.tenant}/{flow.service}", llm(flow), flow.rate_per_s,
                                          workers=6))
        self.loops.append(TrafficLoop(
            "classifier", lambda: infer_classifier(triton_url, batch=CLASSIFIER_BATCH, fail=self.knobs.classifier_fail),
            CLASSIFIER_RATE_PER_S, workers=4))

    def start(self) -> "Workload":
        for loop in self.loops:
            loop.start()
        self.started = True
        return self

    def stop(self) -> None:
        """Stop sending and wait for requests in flight; safe before start() and twice."""
        if self.started:
            for loop in self.loops:
                loop.stop()
        self.started = False

    def totals(self) -> dict[str, tuple[int, int]]:
        """{'toy_llm': (ok, failed), 'classifier': (ok, failed)} so far."""
        out: dict[str, list[int]] = {}
        for loop in self.loops:
            key = loop.name.split()[0]
            ok, failed = out.setdefault(key, [0, 0])
            out[key] = [ok + loop.stats.ok, failed + loop.stats.failed]
        return {k: (v[0], v[1]) for k, v in out.items()}

    def describe(self) -> str:
        streams = sum(loop.rate for loop in self.loops if loop.name.startswith("toy_llm"))
        tenants = sorted({f.tenant for f in FLOWS})
        tiers = sorted({f.tier for f in FLOWS})
        return (f"toy_llm {streams:g} streams/s through the gateway (tenants {', '.join(tenants)}; tiers "
                f"{', '.join(tiers)}), classifier {CLASSIFIER_RATE_PER_S:g} req/s (batch {CLASSIFIER_BATCH}) to Triton")
