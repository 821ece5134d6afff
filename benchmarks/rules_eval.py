"""Cost of the generated rules: synthetic series for M models x T tenants x R tiers x G GPUs, scraped by a real
Prometheus running the generated prometheus.yml and rules; reports rule-group evaluation time and the head
series count.

    .venv/bin/python benchmarks/rules_eval.py [--models 100 --tenants 20 --tiers 3 --gpus 16 --seconds 600]
                                              [--store prometheus|central|both]

Every evaluation of every group is sampled (Prometheus' `prometheus_rule_group_last_duration_seconds`, keyed
by `prometheus_rule_group_last_evaluation_timestamp_seconds`, read every 5 s from its own /metrics) once the
spec's rate window plus two evaluation intervals have passed, so that every rate() window holds a full
window of samples (a shorter run rates fewer samples per series and reads low). Per group: the median and the
slowest sampled evaluation; the budget is judged on the slowest, and missed iterations
(`prometheus_rule_group_iterations_missed_total`) are reported.

Synthetic targets speak the real exposition format with the real names and labels (Triton's nv_inference_*,
the collector's inferwatch_triton_*, dcgm-exporter names, gateway_* histograms with the gateway's own
buckets), counters growing at steady per-series rates. Windows longer than the run (1h ... 3d burn-rate
windows) only hold the run's samples, so their cost here is a lower bound of a long-running server's.
The central store (`--store central`, or after Prometheus with the default `both`): the same targets scraped
by vmagent into VictoriaMetrics as cluster `bench`, the rules generated with the cluster label evaluated by
vmalert (median iteration time per group, from its own /metrics). Budget (Prometheus): every group <= 1 s
at the 15 s interval, all groups <= 3 s.
Final line: JSON {"eval_seconds_max_group":..., "eval_seconds_all_groups":..., "within_budget":...,
"central": {...}, ...}: eval_seconds_max_group is the slowest sampled evaluation of the slowest group,
eval_seconds_all_groups the slowest evaluation interval's rule work (every group's evaluation in that interval
summed); medians alongside, and the sum of each group's slowest (maxima from different intervals: an upper
bound). For the central store, vmalert's summaries give per-group median and slowest only: its "all groups"
is the sum of each group's slowest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from inferwatch.exporters.gateway.metrics import ITL_BUCKETS, OUTPUT_TOKENS_BUCKETS, TTFT_BUCKETS  # noqa: E402
from inferwatch.rules.generate import outputs  # noqa: E402
from inferwatch.spec import load_spec, spec_from_dict  # noqa: E402
from inferwatch.testing.process import free_port  # noqa: E402
from inferwatch.testing.prometheus import start_prometheus  # noqa: E402


def _fmt_le(b: float) -> str:
    return repr(float(b))


class Body:
    """Series of one target as (line prefix, value per second or constant)."""

    def __init__(self):
        self.counters: list[tuple[str, float]] = []
        self.gauges: list[tuple[str, float]] = []

    def counter(self, prefix: str, per_s: float) -> None:
        self.counters.append((prefix, per_s))

    def gauge(self, prefix: str, value: float) -> None:
        self.gauges.append((prefix, value))

    def render(self, elapsed: float) -> bytes:
        lines = [f"{p} {r * elapsed:.3f}" for p, r in self.counters]
        lines += [f"{p} {v}" for p, v in self.gauges]
        return ("\n".join(lines) + "\n").encode()

    def __len__(self) -> int:
        return len(self.counters) + len(self.gauges)


def triton_body(models: int) -> Body:
    b = Body()
    for m in range(models):
        lab = f'model="model{m}",version="1"'
        b.counter(f"nv_inference_request_success{{{lab}}}", 10)
        for reason, r in (("REJECTED", 0), ("CANCELED", 0), ("BACKEND", 0.05), ("OTHER", 0)):
            b.counter(f'nv_inference_request_failure{{{lab},reason="{reason}"}}', r)
        b.counter(f"nv_inference_count{{{lab}}}", 40)
        b.counter(f"nv_inference_exec_count{{{lab}}}", 10)
        for name, us in (("request_duration_us", 20000), ("queue_duration_us", 5000),
                         ("compute_input_duration_us", 500), ("compute_infer_duration_us", 12000),
                         ("compute_output_duration_us", 500)):
            b.counter(f"nv_inference_{name}{{{lab}}}", 10 * us)
        b.gauge(f"nv_inference_pending_request_count{{{lab}}}", 3)
        for q in ("0.5", "0.9", "0.95", "0.99", "0.999"):
            b.gauge(f'nv_inference_queue_summary_us{{{lab},quantile="{q}"}}', 4000 + 1000 * float(q))
        b.counter(f"nv_inference_queue_summary_us_sum{{{lab}}}", 50000)
        b.counter(f"nv_inference_queue_summary_us_count{{{lab}}}", 10)
    return b


def collector_body(models: int) -> Body:
    b = Body()
    b.gauge('inferwatch_triton_up{triton="triton-0"}', 1)
    b.gauge('inferwatch_triton_server_live{triton="triton-0"}', 1)
    b.gauge('inferwatch_triton_server_ready{triton="triton-0"}', 1)
    for m in range(models):
        b.gauge(f'inferwatch_triton_model_ready{{triton="triton-0",model="model{m}",version="1"}}', 1)
        for state in ("READY", "UNAVAILABLE", "LOADING", "UNLOADING"):
            b.gauge(f'inferwatch_triton_model_state{{triton="triton-0",model="model{m}",version="1",'
                    f'state="{state}"}}', int(state == "READY"))
        b.gauge(f'inferwatch_triton_model_preferred_batch_size_max{{triton="triton-0",model="model{m}"}}', 16)
    return b


def gpu_body(gpus: int) -> Body:
    b = Body()
    for g in range(gpus):
        lab = f'gpu="{g}",UUID="GPU-{g:04d}",Hostname="node-a",modelName="NVIDIA H100",device="nvidia{g}"'
        for name, v in (("GPU_TEMP", 60), ("FB_USED", 40000), ("FB_FREE", 40000), ("FB_RESERVED", 500),
                        ("XID_ERRORS", 0), ("ROW_REMAP_FAILURE", 0)):
            b.gauge(f"DCGM_FI_DEV_{name}{{{lab}}}", v)
        b.counter(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{lab}}}", 0)
        b.gauge(f'inferwatch_gpu_up{{gpu="{g}",UUID="GPU-{g:04d}",Hostname="node-a"}}', 1)
        for reason in ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown", "gpu_idle"):
            b.gauge(f'inferwatch_gpu_clocks_event_active{{gpu="{g}",UUID="GPU-{g:04d}",Hostname="node-a",'
                    f'reason="{reason}"}}', 0)
        for xid in (48, 79):
            b.counter(f'inferwatch_gpu_xid_errors_total{{gpu="{g}",UUID="GPU-{g:04d}",Hostname="node-a",'
                      f'xid="{xid}"}}', 0)
    return b


def gateway_body(models: int, tenants: int, tiers: list[str]) -> Body:
    b = Body()
    for m in range(models):
        for t in range(tenants):
            for tier in tiers:
                lab = f'tenant="tenant{t}",model="model{m}",tier="{tier}"'
                rate = 0.01
                for code, outcome, share in (("200", "ok", 0.97), ("500", "error", 0.01),
                                             ("499", "cancelled", 0.02)):
                    b.counter(f'gateway_requests_total{{{lab},code="{code}",outcome="{outcome}"}}', rate * share)
                for name, buckets in (("gateway_time_to_first_token_seconds", TTFT_BUCKETS),
                                      ("gateway_inter_token_latency_seconds", ITL_BUCKETS),
                                      ("gateway_output_tokens", OUTPUT_TOKENS_BUCKETS)):
                    n = len(buckets)
                    for i, le in enumerate(buckets):
                        b.counter(f'{name}_bucket{{{lab},le="{_fmt_le(le)}"}}', rate * (i + 1) / n)
                    b.counter(f'{name}_bucket{{{lab},le="+Inf"}}', rate)
                    b.counter(f"{name}_sum{{{lab}}}", rate * 0.3)
                    b.counter(f"{name}_count{{{lab}}}", rate)
                b.counter(f'gateway_tokens_total{{{lab},type="input"}}', rate * 200)
                b.counter(f'gateway_tokens_total{{{lab},type="output"}}', rate * 100)
    return b


def serve(body: Body, started: float) -> tuple[ThreadingHTTPServer, int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            data = body.render(time.time() - started)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


BUDGET_GROUP_SECONDS = 1.0  # every group at a 15 s interval (a group slower than its interval skips evaluations)
BUDGET_ALL_SECONDS = 3.0


def run_prometheus(spec, seconds: float, warmup: float, started: float) -> tuple[dict, int, int, int]:
    """({group: {evaluation timestamp: seconds}, one per evaluation after `warmup`}, head series, unhealthy
    rules, missed iterations) from a real Prometheus running the generated prometheus.yml and rules for
    `seconds`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rel, text in outputs(spec).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        prom = start_prometheus(root / "prom", root / "deploy/prometheus/prometheus.yml")
        evaluations: dict[str, dict[float, float]] = {}
        try:
            deadline = time.monotonic() + seconds
            next_report = time.monotonic() + 15
            while time.monotonic() < deadline:
                time.sleep(min(5, max(0.0, deadline - time.monotonic())))
                text = requests.get(f"{prom.url}/metrics", timeout=30).text
                last = _group_gauges(text, "prometheus_rule_group_last_evaluation_timestamp_seconds")
                for group, duration in _group_gauges(text, "prometheus_rule_group_last_duration_seconds").items():
                    at = last.get(group, 0.0)
                    if at >= started + warmup:
                        evaluations.setdefault(group, {})[at] = duration
                if time.monotonic() >= next_report:
                    next_report += 15
                    latest = [v[max(v)] for v in evaluations.values() if v]
                    slowest = max((max(v.values()) for v in evaluations.values() if v), default=None)
                    print(f"  t={time.time() - started:5.0f}s head series "
                          f"{_metric(text, 'prometheus_tsdb_head_series')}"
                          + (f", slowest group now {max(latest) * 1000:.0f} ms (so far {slowest * 1000:.0f} ms), "
                             f"all groups now {sum(latest) * 1000:.0f} ms" if slowest is not None
                             else f" (warming up until t={warmup:.0f}s)"), flush=True)
            text = requests.get(f"{prom.url}/metrics", timeout=30).text
            series = int(float(_metric(text, "prometheus_tsdb_head_series")))
            missed = int(sum(_group_gauges(text, "prometheus_rule_group_iterations_missed_total").values()))
            rules = requests.get(f"{prom.url}/api/v1/rules", timeout=30).json()["data"]["groups"]
            unhealthy = [r["name"] for g in rules for r in g["rules"] if r["health"] != "ok"]
            slowest = sorted(((r["evaluationTime"], g["name"], r["name"]) for g in rules for r in g["rules"]),
                             reverse=True)[:10]
            print("slowest rules (last evaluation):")
            for took, group, name in slowest:
                print(f"  {took * 1000:9.1f} ms  {group:32s} {name}")
        finally:
            prom.stop()
    return evaluations, series, len(unhealthy), missed


def per_interval_sums(evaluations: dict[str, dict[float, float]], interval: float) -> tuple[list[float], int]:
    """(seconds of rule evaluation per evaluation interval, every group's evaluation in it summed, for each
    interval in which every group's evaluation was sampled; intervals between the first and the last complete
    one that lack a group: an evaluation missed or not sampled)."""
    rounds: dict[int, dict[str, float]] = {}
    for group, by_time in evaluations.items():
        for at, seconds in by_time.items():
            rounds.setdefault(int(at // interval), {})[group] = seconds
    complete = sorted(k for k, r in rounds.items() if len(r) == len(evaluations))
    incomplete = complete[-1] - complete[0] + 1 - len(complete) if complete else 0
    return [sum(rounds[k].values()) for k in complete], incomplete


def _group_gauges(text: str, name: str) -> dict[str, float]:
    """{group: value} of one of Prometheus' per-rule-group metrics (rule_group="<file>;<group>")."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        rf'^{name}\{{rule_group="[^"]*;([^"]+)"\}} (\S+)$', text, re.M)}


def run_central(spec, seconds: float, started: float) -> tuple[dict[str, tuple[float, float]], int, int]:
    """The same for the central store (inferwatch.deploy.central): vmagent scrapes the same targets as cluster
    `bench` into VictoriaMetrics, vmalert evaluates the rules generated with the cluster label there.
    ({group: (median, slowest evaluation seconds over vmalert's last 5 minutes)}, series in the store, rules
    with errors)."""
    from inferwatch.deploy.central import edge_scrape_config
    from inferwatch.testing.victoriametrics import start_edge, start_victoria_metrics, start_vmalert

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rules = root / "rules"
        rules.mkdir()
        for rel, text in outputs(spec).items():
            if rel.startswith("rules/generated/"):
                (rules / Path(rel).name).write_text(text)
        # Its default limit of 300,000 series per query is below the synthetic gateway's bucket series.
        vm = start_victoria_metrics(root / "vm", extra_args=["-search.maxUniqueTimeseries=5000000"])
        procs = [vm]
        try:
            central = dataclasses.replace(spec.central_store, url=vm.url)
            spec = dataclasses.replace(spec, central_store=central)
            (root / "edge.yml").write_text(yaml.safe_dump(edge_scrape_config(spec)))
            # The synthetic gateway target is ~50 MB of text per scrape, over vmagent's 16 MB default limit.
            procs.append(start_edge(root / "edge", spec, root / "edge.yml",
                                    extra_args=["-promscrape.maxScrapeSize=1GB"]))
            vmalert = start_vmalert(root / "vmalert", spec, str(rules / "*.yml"))
            procs.append(vmalert)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(min(15, max(0.0, deadline - time.monotonic())))
                print(f"  t={time.time() - started:5.0f}s series in the store {vm.series()}", flush=True)
            text = requests.get(f"{vmalert.url}/metrics", timeout=30).text
            # vmalert's summary covers its last 5 minutes: with a run longer than the rate window plus those
            # 5 minutes, only evaluations over full windows are in it.
            quantiles: dict[str, dict[str, float]] = {}
            for m in re.finditer(r'^vmalert_iteration_duration_seconds\{group="([^"]+)", file="[^"]*",'
                                 r'quantile="([^"]+)"\} (\S+)$', text, re.M):
                quantiles.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
            durations = {g: (q["0.5"], q["1"]) for g, q in quantiles.items() if "0.5" in q and "1" in q}
            errors = sum(float(m.group(1)) for m in re.finditer(
                r'^vmalert_(?:recording_rules|alerts)_error\{[^}]*\} (\S+)$', text, re.M))
            series = vm.series()
        finally:
            for proc in reversed(procs):
                proc.stop()
    return durations, series, int(errors)


def report(name: str, figures: dict[str, tuple[float, float]], sampled: dict[str, int] | None = None,
           intervals: list[float] | None = None) -> dict:
    """Prints per-group (median, slowest) evaluation seconds; returns the figures judged against the budget.
    "All groups" is the per-interval total where `intervals` are given (see per_interval_sums), else the sum
    over groups of each one's median and slowest."""
    print(f"{name}: per-group evaluation time (median / slowest)")
    for group, (median, slowest) in sorted(figures.items(), key=lambda kv: -kv[1][1]):
        count = f"  ({sampled[group]} evaluations sampled)" if sampled else ""
        print(f"  {group:34s} {median * 1000:9.1f} ms {slowest * 1000:9.1f} ms{count}")
    worst = max(figures.items(), key=lambda kv: kv[1][1]) if figures else ("none", (0.0, 0.0))
    sum_of_slowest = round(sum(f[1] for f in figures.values()), 4)
    out = {"eval_seconds_max_group": round(worst[1][1], 4), "max_group": worst[0],
           "eval_seconds_all_groups": sum_of_slowest,
           "eval_seconds_max_group_median": round(max((f[0] for f in figures.values()), default=0.0), 4),
           "eval_seconds_all_groups_median": round(sum(f[0] for f in figures.values()), 4)}
    if intervals is not None:
        out.update(eval_seconds_all_groups=round(max(intervals), 4) if intervals else None,
                   eval_seconds_all_groups_median=round(statistics.median(intervals), 4) if intervals else None,
                   eval_seconds_all_groups_sum_of_slowest=sum_of_slowest)
    if sampled:
        out["evaluations_sampled"] = min(sampled.values(), default=0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--tiers", type=int, default=3, help="first N tiers of the spec (max 3 in inferwatch.yaml)")
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=600,
                    help="how long to let each store scrape and evaluate; evaluations are sampled after the "
                         "spec's rate window plus two evaluation intervals (default 600: 18 evaluations of each group)")
    ap.add_argument("--store", choices=("prometheus", "central", "both"), default="both",
                    help="Prometheus, the central store (VictoriaMetrics, vmagent, vmalert), or both in turn")
    args = ap.parse_args()

    base = load_spec(REPO / "inferwatch.yaml")
    tiers = list(base.tiers)[: args.tiers]
    started = time.time()
    bodies = {"triton": triton_body(args.models), "collector": collector_body(args.models),
              "gpu": gpu_body(args.gpus), "gateway": gateway_body(args.models, args.tenants, tiers)}
    servers = {name: serve(body, started) for name, body in bodies.items()}
    synthetic = sum(len(b) for b in bodies.values())
    print(f"synthetic series: {synthetic} ({', '.join(f'{k} {len(v)}' for k, v in bodies.items())})", flush=True)
    addr = {name: f"127.0.0.1:{port}" for name, (_, port) in servers.items()}
    data = {
        "targets": {"triton": [{"name": "triton-0", "url": "http://127.0.0.1:1",
                                "metrics_url": f"http://{addr['triton']}/metrics", "node": "node-a"}],
                    "triton_collectors": [addr["collector"]],
                    "gpu_exporters": [{"address": addr["gpu"], "node": "node-a"}],
                    "gateways": [{"address": addr["gateway"], "node": "node-a"}],
                    "notifiers": [f"127.0.0.1:{free_port()}"],
                    "alertmanager": f"http://127.0.0.1:{free_port()}"},
        "prometheus": {"scrape_interval": str(base.prometheus.scrape_interval),
                       "evaluation_interval": str(base.prometheus.evaluation_interval),
                       "rate_window": str(base.prometheus.rate_window)},
        # The repository spec's tiers, per-tenant quantiles where it asks for them.
        "tiers": {name: {"ttft_p95_seconds": base.tiers[name].ttft_p95_seconds,
                         "ttft_slo_seconds": base.tiers[name].ttft_slo_seconds,
                         "per_tenant_quantiles": base.tiers[name].per_tenant_quantiles} for name in tiers},
    }
    result: dict = {"models": args.models, "tenants": args.tenants, "tiers": len(tiers), "gpus": args.gpus,
                    "synthetic_series": synthetic, "budget_group_seconds": BUDGET_GROUP_SECONDS,
                    "budget_all_groups_seconds": BUDGET_ALL_SECONDS}
    try:
        if args.store in ("prometheus", "both"):
            spec = spec_from_dict(data)
            warmup = spec.prometheus.rate_window.seconds + 2 * spec.prometheus.evaluation_interval.seconds
            if args.seconds <= warmup:
                ap.error(f"--seconds must exceed the warm-up of {warmup:.0f} s (rate window + two intervals)")
            evaluations, series, unhealthy, missed = run_prometheus(spec, args.seconds, warmup, time.time())
            figures = {g: (statistics.median(v.values()), max(v.values())) for g, v in evaluations.items() if v}
            # "All groups" is the rule work of one evaluation interval: per interval, the sum of every group's
            # evaluation in it (each group evaluates once per interval at its own fixed offset).
            rounds, incomplete = per_interval_sums(evaluations, spec.prometheus.evaluation_interval.seconds)
            result.update(report("Prometheus", figures, {g: len(v) for g, v in evaluations.items() if v}, rounds),
                          series=series, unhealthy_rules=unhealthy, iterations_missed=missed,
                          intervals_sampled=len(rounds), intervals_incomplete=incomplete)
            if not rounds:
                print("no evaluation interval with every group sampled: nothing to judge", file=sys.stderr)
            else:
                print(f"all groups per {spec.prometheus.evaluation_interval} interval: median "
                      f"{statistics.median(rounds) * 1000:.1f} ms, slowest {max(rounds) * 1000:.1f} ms "
                      f"({len(rounds)} intervals with every group sampled, {incomplete} without)")
            # Nothing sampled, a missed or unsampled evaluation, or a failing rule is not a pass.
            result["within_budget"] = bool(
                rounds and not incomplete and not missed and not unhealthy
                and result["eval_seconds_max_group"] <= BUDGET_GROUP_SECONDS
                and result["eval_seconds_all_groups"] <= BUDGET_ALL_SECONDS)
        if args.store in ("central", "both"):
            central = {**data, "cluster": {"name": "bench"},
                       "central_store": {"url": "http://127.0.0.1:1", "edge": "vmagent"}}
            per_group, series, errors = run_central(spec_from_dict(central), args.seconds, started)
            result["central"] = {**report("central store (vmalert over VictoriaMetrics)", per_group),
                                 "series": series, "rule_errors": errors}
    finally:
        for server, _ in servers.values():
            server.shutdown()
    # Other work on the machine inflates every group's time: the load says how quiet the run was.
    result["load_average_1m_5m"] = [round(x, 2) for x in os.getloadavg()[:2]]
    print(json.dumps(result))
    return 0


def _metric(text: str, name: str) -> str:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return match.group(1) if match else "nan"


if __name__ == "__main__":
    sys.exit(main())
