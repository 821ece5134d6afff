"""Spec checks the rules need beyond what loading the spec checks: every window long enough for the scrape
interval, the scrape interval not shorter than Triton's metrics interval, TTFT SLO thresholds and P95
targets on bucket edges.

Each failure is a SpecError naming the field, so `inferwatch generate` exits 2 with one clear line.
"""

from __future__ import annotations

from inferwatch.spec import Duration, Spec, SpecError

# rate() needs two samples in its window to return anything and several to be steady; four scrapes is the
# usual minimum (Prometheus docs, "rate": the range should be at least four times the scrape interval).
MIN_SCRAPES_PER_WINDOW = 4


def ttft_bucket_edges() -> tuple[float, ...]:
    """The gateway's TTFT histogram buckets (inferwatch.exporters.gateway.metrics.TTFT_BUCKETS)."""
    from inferwatch.exporters.gateway.metrics import TTFT_BUCKETS

    return tuple(float(b) for b in TTFT_BUCKETS)


def _check_window(path: str, window: Duration, scrape: Duration) -> None:
    if window.ms < MIN_SCRAPES_PER_WINDOW * scrape.ms:
        raise SpecError(path, f"expected at least {MIN_SCRAPES_PER_WINDOW} scrape intervals "
                              f"({MIN_SCRAPES_PER_WINDOW} x prometheus.scrape_interval {scrape} = "
                              f"{Duration(MIN_SCRAPES_PER_WINDOW * scrape.ms)}), got {window}")


def validate(spec: Spec) -> None:
    """Raise SpecError at the first setting the generated rules could not honour."""
    scrape = spec.prometheus.scrape_interval
    for i, target in enumerate(spec.targets.triton):
        # Scraping faster than Triton refreshes its GPU/CPU gauges gives repeated samples, not new data.
        if scrape.ms < target.metrics_interval_ms:
            raise SpecError("prometheus.scrape_interval",
                            f"expected at least Triton's metrics interval (targets.triton[{i}]."
                            f"metrics_interval_ms = {target.metrics_interval_ms} ms), got {scrape}")
    if spec.prometheus.evaluation_interval.ms <= 0:
        raise SpecError("prometheus.evaluation_interval", "expected a positive duration, got 0s")
    _check_window("prometheus.rate_window", spec.prometheus.rate_window, scrape)
    _check_window("layers.L1.vanished_gpu_lookback", spec.layers.L1.vanished_gpu_lookback, scrape)
    from inferwatch.exporters.gpu.nvml import CLOCKS_EVENT_REASONS

    known = [name for name, _bit in CLOCKS_EVENT_REASONS]
    for reason in spec.layers.L1.throttle_reasons:
        if reason not in known:
            raise SpecError("layers.L1.throttle_reasons",
                            f"expected clocks-event reasons as NVML names them ({', '.join(known)}), got {reason!r}")
    for i, pair in enumerate(spec.layers.L3.burn_rate_windows):
        _check_window(f"layers.L3.burn_rate_windows[{i}].short", pair.short, scrape)
    names = [pair.name for pair in spec.layers.L3.burn_rate_windows]
    if len(set(names)) != len(names):
        raise SpecError("layers.L3.burn_rate_windows", f"expected distinct names, got {names}")
    if spec.layers.L3.throughput_baseline_offset.ms < spec.prometheus.rate_window.ms:
        raise SpecError("layers.L3.throughput_baseline_offset",
                        f"expected at least prometheus.rate_window ({spec.prometheus.rate_window}), "
                        f"got {spec.layers.L3.throughput_baseline_offset}")
    edges = ttft_bucket_edges()
    for name, tier in spec.tiers.items():
        # The SLI counts requests under the threshold from one bucket; between edges it would need
        # interpolation, i.e. a different SLO than the one written down.
        if not any(abs(tier.ttft_slo_seconds - e) < 1e-9 for e in edges):
            raise SpecError(f"tiers.{name}.ttft_slo_seconds",
                            f"expected a TTFT histogram bucket edge ({', '.join(f'{e:g}' for e in edges)}), "
                            f"got {tier.ttft_slo_seconds:g}")
        if tier.ttft_p95_seconds <= 0:
            raise SpecError(f"tiers.{name}.ttft_p95_seconds",
                            f"expected a positive number, got {tier.ttft_p95_seconds}")
        # LlmTtftP95High judges the P95 against the target from the bucket at the target (rules/llm.py).
        if not any(abs(tier.ttft_p95_seconds - e) < 1e-9 for e in edges):
            raise SpecError(f"tiers.{name}.ttft_p95_seconds",
                            f"expected a TTFT histogram bucket edge ({', '.join(f'{e:g}' for e in edges)}), "
                            f"got {tier.ttft_p95_seconds:g}")
