"""What the OpenTelemetry export (spec gateway.otlp, docs/gateway-otlp.md) adds to each request's metering.

In process, no sockets on the request path: --requests requests through the in-process API (Gateway.request:
three token events, an exact usage, the finish that writes every family), with the export off and on (a
local OTLP/HTTP receiver on loopback, exporting every second, so the export thread's CPU is inside the
figure too). CPU time per request (time.process_time, the whole process), the median of --rounds rounds,
the two modes alternating so a load that comes and goes weighs on both. Prints a final JSON line.

    .venv/bin/python benchmarks/gateway_otlp.py [--requests 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from inferwatch.exporters.gateway.api import Gateway  # noqa: E402
from inferwatch.spec import spec_from_dict  # noqa: E402
from otlp_support import OtlpReceiver  # noqa: E402

SPEC = {"tenants": ["acme"], "models": ["m"]}


def one_round(gateway: Gateway, requests: int) -> float:
    """CPU microseconds per request."""
    start = time.process_time()
    for _ in range(requests):
        with gateway.request(tenant="acme", model="m") as req:
            req.tokens(1)
            req.tokens(1)
            req.tokens(1)
            req.usage(output_tokens=3, input_tokens=7)
    return (time.process_time() - start) / requests * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000, help="requests per round (default 20000)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per mode; the median is reported (default 7)")
    args = ap.parse_args()
    receiver = OtlpReceiver()
    off = Gateway(spec_from_dict(SPEC))
    on = Gateway(spec_from_dict({**SPEC, "gateway": {"otlp": {"endpoint": receiver.url, "interval": "1s"}}}))
    figures: dict[str, list[float]] = {"off": [], "on": []}
    try:
        one_round(off, 1000)
        one_round(on, 1000)  # warm: the series and attribute sets exist
        for _ in range(args.rounds):
            figures["off"].append(one_round(off, args.requests))
            figures["on"].append(one_round(on, args.requests))
    finally:
        on.close()
        receiver.stop()
    result = {mode: round(statistics.median(values), 1) for mode, values in figures.items()}
    result["added_us_per_request"] = round(result["on"] - result["off"], 1)
    result["exports_received"] = len(receiver.received())
    print(f"CPU per request, median of {args.rounds} rounds of {args.requests}: export off {result['off']} µs, "
          f"on {result['on']} µs, added {result['added_us_per_request']} µs")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
