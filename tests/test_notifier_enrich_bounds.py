"""Triage enrichment must not slow pages down when Prometheus hangs, nor leave connections to it open.

The real notifier (in-process service) pages PagerDuty's simulator for N groups, its route enriched by
`inferwatch.triage.hook:top_finding` with `enrich_timeout` 1 s, against a Prometheus that: accepts
connections and never answers (the issue's case), answers its headers after 5 s, or refuses connections
(the control: enrichment fails at once). The N pages must all arrive within the control's time plus two
enrich_timeout and a margin (one per batch, not one per page), and every connection to the hung Prometheus
must be closed within an enrich_timeout and a margin of the last page, while the notifier still runs.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time

import pytest
import requests

from inferwatch.notifier.service import NotifierService
from inferwatch.spec import spec_from_dict
from inferwatch.testing.channels import ProviderSimulators
from inferwatch.testing.process import free_port
from inferwatch.triage import hook
from notifier_support import AUTH, spec_data, wait_for, webhook

N = 100
ENRICH_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


class FakePrometheus:
    """A TCP server that accepts and then never answers (`answer_after` None) or answers 200 with an empty
    result after `answer_after` seconds; counts connections the client has not closed yet."""

    def __init__(self, answer_after: float | None):
        self.answer_after = answer_after
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.open = 0
        self.accepted = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.open += 1
                self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        started = time.monotonic()
        conn.settimeout(0.1)
        try:
            while True:
                if self.answer_after is not None and time.monotonic() - started > self.answer_after:
                    body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(body), body))
                    started = float("inf")
                try:
                    if conn.recv(65536) == b"":
                        return  # the client closed it
                except socket.timeout:
                    continue
                except OSError:
                    return
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def close(self):
        self.sock.close()


def pages_take(sims, monkeypatch, prometheus_url: str, then=None) -> float:
    """Seconds from the first webhook until PagerDuty has all N pages; `then()` runs after, the notifier still
    running."""
    monkeypatch.setenv("INFERWATCH_PROMETHEUS_URL", prometheus_url)
    hook._state.clear()  # the hook reads its Prometheus once per process
    hook._configured()  # and its runbooks: loaded here, so the first page's deadline is not spent on them
    data = spec_data(sims)
    data["channels"]["phone"]["rate_limit"] = 100_000  # the simulator takes any rate: the time measured is ours
    data["routes"] = [{"match": {"layer": "L1"}, "receivers": ["phone"], "enrich": "inferwatch.triage.hook:top_finding",
                       "enrich_timeout": f"{ENRICH_TIMEOUT_S:g}s"}]
    with tempfile.TemporaryDirectory() as tmp:
        service = NotifierService(spec_from_dict(data), tmp, port=0).start()
        try:
            before = len(sims.pagerduty.received)
            t0 = time.monotonic()
            for i in range(N):
                body = webhook("NotifierOutboxUnwritable", "L1", group=f"enrich-{i}", extra={"node": f"n{i}"})
                assert requests.post(service.url + "/alerts", json=body, headers=AUTH, timeout=10).status_code == 200
            wait_for(lambda: len(sims.pagerduty.received) - before >= N, timeout=120, what=f"{N} pages")
            took = time.monotonic() - t0
            if then is not None:
                then()
            return took
        finally:
            service.stop()
            hook._state.clear()


@pytest.fixture(scope="module")
def control(sims):
    """Pages' time with a Prometheus that refuses connections (enrichment fails at once)."""
    mp = pytest.MonkeyPatch()
    try:
        return pages_take(sims, mp, f"http://127.0.0.1:{free_port()}")
    finally:
        mp.undo()


ROWS = [("hung", None), ("headers_after_5s", 5.0)]  # the case first


@pytest.mark.parametrize("row, answer_after", ROWS, ids=[r[0] for r in ROWS])
def test_a_hung_prometheus_does_not_slow_pages(sims, monkeypatch, control, row, answer_after):
    prometheus = FakePrometheus(answer_after)
    try:
        def closed():
            # While the notifier still runs: the hook's own deadline closed them, not the notifier's stop.
            wait_for(lambda: prometheus.open == 0, timeout=ENRICH_TIMEOUT_S + 1.0,
                     what="connections to Prometheus closed")

        took = pages_take(sims, monkeypatch, prometheus.url, then=closed)
        assert prometheus.accepted > 0, "the hook never reached Prometheus"
        # One enrich_timeout for the whole batch (the hooks running at its start), not one per page.
        assert took <= control + ENRICH_TIMEOUT_S + 1.5, (took, control)
    finally:
        prometheus.close()
