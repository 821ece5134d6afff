"""The gateway's /metrics: prometheus-client's own aiohttp exposition (content negotiation, gzip), rendered in
a forked child off the proxy's loop, with process metrics that are the gateway's own, not the child's."""

from __future__ import annotations

import gzip
import os

import requests

from gateway_support import GatewayProcess, refused_port


def test_metrics_negotiate_format_gzip_and_report_the_gateway_process(tmp_path):
    with refused_port() as port:
        gw = GatewayProcess(f"http://127.0.0.1:{port}", {"tenants": ["acme"]}, tmp_path)
        try:
            plain = requests.get(gw.metrics_url, headers={"Accept-Encoding": "identity"}, timeout=10)
            assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert "Content-Encoding" not in plain.headers and "gateway_requests_in_flight" in plain.text
            om = requests.get(gw.metrics_url, headers={"Accept": "application/openmetrics-text; version=1.0.0"},
                              timeout=10)
            assert om.headers["Content-Type"].startswith("application/openmetrics-text")
            assert om.text.rstrip().endswith("# EOF")
            zipped = requests.get(gw.metrics_url, headers={"Accept-Encoding": "gzip"}, stream=True, timeout=10)
            assert zipped.headers["Content-Encoding"] == "gzip"
            assert b"gateway_requests_in_flight" in gzip.decompress(zipped.raw.read(decode_content=False))
            # Rendered in a child, but the process figures are the gateway's: its start time, not a child's.
            starts = {gw.value("process_start_time_seconds") for _ in range(3)}
            assert len(starts) == 1
            boot = float(open("/proc/stat").read().split("btime ")[1].split()[0])
            ticks = int(open(f"/proc/{gw.pid}/stat").read().rsplit(")", 1)[1].split()[19])
            assert abs(starts.pop() - (boot + ticks / os.sysconf("SC_CLK_TCK"))) < 1.0
            # No child is left behind by the renders.
            children = open(f"/proc/{gw.pid}/task/{gw.pid}/children").read().split()
            assert children == []
        finally:
            gw.stop()
