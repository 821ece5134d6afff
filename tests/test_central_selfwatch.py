"""The central store watching itself, end to end with the real programs (Debian `victoria-metrics`,
`prometheus`, `prometheus-alertmanager`) on loopback: VictoriaMetrics, an edge vmagent from the generated
command line, vmalert over the store with the generated rules, and the store's watcher (a Prometheus from the
generated deploy/central/watch-prometheus.yml) evaluating rules/generated/centralstore.yml and sending to a
real Alertmanager.

A table of the issue's kind: each program stopped (SIGKILL) in turn. With all three up the watcher fires no
alert for a whole rate window plus `for`; after the kill, the row's alerts fire in the watcher and reach
Alertmanager without the store. The store killed is the issue's row: vmagent's remote write fails
(VmagentRemoteWriteFailing, signal errors, labelled with the edge's cluster), the store is down and vmalert's
evaluations fail.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
import yaml

from inferwatch.deploy.central import WATCH_PROMETHEUS, edge_scrape_config
from inferwatch.deploy.central import outputs as central_outputs
from inferwatch.rules.generate import RULES_DIR
from inferwatch.rules.generate import outputs as rule_outputs
from inferwatch.spec import spec_from_dict
from inferwatch.testing.alertmanager import start_alertmanager
from inferwatch.testing.prometheus import start_prometheus
from inferwatch.testing.victoriametrics import start_edge, start_victoria_metrics, start_vmalert

pytestmark = pytest.mark.slow

WINDOW_S = 10
FOR_S = 3
# Short windows so a fault shows in seconds (as the demo spec does); everything else is the default spec.
SHORT = {
    "prometheus": {"scrape_interval": "1s", "evaluation_interval": "1s", "rate_window": f"{WINDOW_S}s"},
    "targets": {"triton": [{"name": "t", "url": "http://127.0.0.1:1", "metrics_interval_ms": 1000}]},
    "layers": {"L1": {"for": f"{FOR_S}s", "vanished_gpu_lookback": "2m"}, "L2": {"for": "5s"}, "L3": {
        "for": "5s", "throughput_baseline_offset": "5m",
        "burn_rate_windows": [{"name": "fast-1h", "long": "2m", "short": "10s", "factor": 14.4, "for": "2s"},
                              {"name": "slow-3d", "long": "10m", "short": "1m", "factor": 1,
                               "severity": "warning"}]}},
    "cluster": {"name": "eu-1"},
}


def _spec(vm_url: str, am_url: str, vmalert: str = "127.0.0.1:1", edge: str = "127.0.0.1:1"):
    raw = {**SHORT, "targets": {**SHORT["targets"], "alertmanager": am_url},
           "central_store": {"url": vm_url, "edge": "vmagent", "vmalert": vmalert, "edge_address": edge}}
    return spec_from_dict(raw)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _alerts(prom_url: str, state: str = "firing") -> list[dict]:
    body = requests.get(f"{prom_url}/api/v1/alerts", timeout=10).json()
    return [a for a in body["data"]["alerts"] if a["state"] == state]


def _wait(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout:.0f}s (last: {last})")


# (program stopped, {alertname: labels the alert must carry}); the first row is the issue's.
ROWS = [
    ("victoria-metrics", {
        "VmagentRemoteWriteFailing": {"signal": "errors", "cluster": "eu-1", "job": "inferwatch-vmagent"},
        "VictoriaMetricsDown": {"job": "inferwatch-victoriametrics"},
        "VmalertFailing": {"signal": "evaluation", "job": "inferwatch-vmalert"}}),
    ("vmagent", {"VmagentDown": {"cluster": "eu-1", "job": "inferwatch-vmagent"}}),
    ("vmalert", {"VmalertDown": {"job": "inferwatch-vmalert"}}),
]


@pytest.mark.parametrize("stopped, expected", ROWS, ids=[r[0] for r in ROWS])
def test_a_stopped_program_of_the_central_store_pages_without_the_store(tmp_path, stopped, expected):
    am_config = tmp_path / "alertmanager.yml"
    am_config.write_text(yaml.safe_dump({"route": {"receiver": "none", "group_wait": "1s"},
                                         "receivers": [{"name": "none"}]}))
    am = start_alertmanager(tmp_path, am_config)
    vm = start_victoria_metrics(tmp_path)
    spec = _spec(vm.url, am.url)
    _write(tmp_path, rule_outputs(spec))
    edge_config = tmp_path / "edge-scrape.yml"
    edge_config.write_text(yaml.safe_dump(edge_scrape_config(spec)))
    edge = start_edge(tmp_path, spec, edge_config)
    vmalert = start_vmalert(tmp_path, spec, str(tmp_path / RULES_DIR / "*.yml"))
    # The watcher's configuration names the programs' real addresses; its rule file sits where the generated
    # configuration looks for it (relative to deploy/central/).
    spec = _spec(vm.url, am.url, vmalert=f"127.0.0.1:{vmalert.port}", edge=f"127.0.0.1:{edge.port}")
    files = central_outputs(spec)
    _write(tmp_path, {WATCH_PROMETHEUS: files[WATCH_PROMETHEUS]})
    watcher = start_prometheus(tmp_path, tmp_path / WATCH_PROMETHEUS, name="watcher")
    processes = {"victoria-metrics": vm, "vmagent": edge, "vmalert": vmalert}
    try:
        jobs = {"inferwatch-victoriametrics", "inferwatch-vmagent", "inferwatch-vmalert"}
        _wait("every program scraped by the watcher",
              lambda: {r["metric"]["job"] for r in watcher.query("up == 1")} >= jobs, 60)
        _wait("vmagent delivering to the store",
              lambda: watcher.query('increase(vmagent_remotewrite_requests_total{status_code="2XX"}[5s]) > 0'), 60)
        # Healthy for a whole window plus `for` once samples flow: nothing pending or firing at any evaluation
        # of that span (before the first write the store has inserted nothing, and says so). Samples flow once
        # the watcher has scraped the store's inserted-rows counter rising and its rules have evaluated that
        # (no alert pending): vmagent's 2XX alone can precede the watcher's next scrape of the store.
        _wait("the watcher seeing the store insert rows, with no alert pending",
              lambda: watcher.query(f'rate(vm_rows_inserted_total{{job="inferwatch-victoriametrics"}}[{WINDOW_S}s])'
                                    " > 0") and not watcher.query('ALERTS{component="alerting"}'), 60)
        span = WINDOW_S + FOR_S + 2
        flowing = time.time()
        _wait("a healthy span of history", lambda: watcher.query(f"vector(time()) > {flowing + span:.3f}"), 60)
        assert watcher.query(f'count_over_time(ALERTS{{component="alerting"}}[{span}s])') == []

        processes[stopped].process.kill()

        def fired() -> list[dict] | None:
            firing = {a["labels"]["alertname"]: a["labels"] for a in _alerts(watcher.url)}
            ok = all(name in firing and all(firing[name].get(k) == v for k, v in labels.items())
                     for name, labels in expected.items())
            return list(firing.values()) if ok else None

        firing = _wait(f"{sorted(expected)} firing in the watcher", fired, 120)
        assert all(a["layer"] == "L1" and a["component"] == "alerting" for a in firing
                   if a["alertname"] in expected)

        def in_alertmanager() -> set[str] | None:
            names = {a["labels"]["alertname"] for a in requests.get(f"{am.url}/api/v2/alerts", timeout=5).json()}
            return names if set(expected) <= names else None

        _wait("the alerts in Alertmanager", in_alertmanager, 60)
    finally:
        for p in (watcher, vmalert, edge, vm, am):
            p.stop()
