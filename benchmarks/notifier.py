"""Notifier throughput and latency against healthy simulated providers (local HTTP servers).

Phase 1 — ingest: 8 client threads POST 2,000 Alertmanager webhooks (one alert each, L2) to /alerts;
ingest_per_s = accepted webhooks / wall time (each one committed to the SQLite outbox, fsynced, before 200).
Phase 2 — delivery: 300 webhooks, one every 20 ms, round-robin over Slack, WeCom and PagerDuty routes with
provider rate limits lifted (rate_limit 100000/min) so the pipeline is measured, not the quotas;
latency = provider received − POST sent, per notification; deliver_p99_ms is its 99th percentile.
Prints figures, then a final JSON line {"ingest_per_s": ..., "deliver_p99_ms": ...}.

Run: .venv/bin/python benchmarks/notifier.py [--ingest N] [--deliver N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators
from inferwatch.spec import spec_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from notifier_support import AUTH, spec_data, webhook  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ingest", type=int, default=2000, help="webhooks in the ingest phase (default 2000)")
    ap.add_argument("--deliver", type=int, default=300, help="webhooks in the delivery phase (default 300)")
    args = ap.parse_args()
    sims = ProviderSimulators().start()
    sims.wecom.LIMIT_PER_MINUTE = 10**6  # healthy, unthrottled providers: measure the notifier, not quotas
    data = spec_data(sims)
    for ch in data["channels"].values():
        ch.update(rate_limit=100_000, rate_window="1m")
    data["routes"] = [{"match": {"layer": "L1"}, "receivers": ["phone"]},
                      {"match": {"layer": "L2"}, "receivers": ["oncall-slack"]},
                      {"match": {"layer": "L3"}, "receivers": ["llm-wecom"]}]
    with tempfile.TemporaryDirectory() as tmp:
        svc = NotifierService(spec_from_dict(data), tmp, port=0).start()
        session = requests.Session()
        try:
            # ---- ingest
            bodies = [webhook("BenchIngest", "L2", group=f"ingest-{i}") for i in range(args.ingest)]

            def send(body):
                with requests.Session() as s:
                    return s.post(svc.url + "/alerts", json=body, headers=AUTH, timeout=30).status_code

            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(send, bodies))
            ingest_s = time.perf_counter() - t0
            ok = codes.count(200)
            ingest_per_s = ok / ingest_s
            print(f"ingest: {ok}/{len(bodies)} accepted in {ingest_s:.2f}s = {ingest_per_s:.0f} webhooks/s "
                  f"(8 clients, SQLite WAL synchronous=FULL)")
            while svc.outbox.counts()["pending"]:
                time.sleep(0.2)
            # ---- delivery latency
            sent: dict[str, float] = {}
            layers = ("L1", "L2", "L3")
            for i in range(args.deliver):
                layer = layers[i % 3]
                name = f"BenchDeliver{i}"
                sent[name] = time.time()
                r = session.post(svc.url + "/alerts", json=webhook(name, layer, group=f"d-{i}"), headers=AUTH)
                assert r.status_code == 200, r.text
                time.sleep(0.02)
            deadline = time.time() + 120
            got: dict[str, float] = {}
            while len(got) < len(sent) and time.time() < deadline:
                for p in (sims.pagerduty, sims.slack, sims.wecom):
                    for rec in list(p.received):
                        for m in re.findall(r"BenchDeliver\d+", rec.text):
                            got.setdefault(m, rec.at)
                time.sleep(0.2)
            lat_ms = sorted((got[n] - sent[n]) * 1000 for n in got)
            p50 = statistics.median(lat_ms)
            p99 = lat_ms[min(len(lat_ms) - 1, int(round(0.99 * len(lat_ms))) - 1)]
            print(f"delivery: {len(got)}/{len(sent)} delivered; latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
                  f"max {lat_ms[-1]:.1f} ms (PagerDuty, Slack, WeCom simulators)")
        finally:
            svc.stop()
            sims.stop()
    print(json.dumps({"ingest_per_s": round(ingest_per_s, 1), "deliver_p99_ms": round(p99, 1)}))
    return 0 if len(got) == len(sent) and ok == len(bodies) else 1


if __name__ == "__main__":
    sys.exit(main())
