"""Test support: a small exposition server for an LLM engine backend's families (tests/fixtures/engine/), whose
values a test changes over time, for the real Prometheus to scrape as it scrapes Triton's :8002/metrics.

A fixture is the backend's /metrics body as its source writes it (docs/sources.md#llm-engines). `set()`
replaces one sample's value; `ramp()` makes a sample grow at a rate (a counter), read at each scrape.
"""

from __future__ import annotations

import http.server
import re
import threading
import time
from pathlib import Path

import yaml

from inferwatch.deploy.prometheus import prometheus_config, scrape_jobs
from inferwatch.rules.generate import RULES_DIR, outputs

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "engine"
# The titles of the Triton dashboard's "LLM engines" row (dashboards/engine.py), in order.
ENGINE_PANELS = ["KV cache used", "KV cache blocks: used and free", "Waiting vs running vs maximum requests",
                 "Preemptions", "Prefix-cache hits"]
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})? (?P<value>\S+)$")


# A live engine test's Prometheus timing and engine thresholds, shrunk so forecasts and `for` pass in seconds.
FAST_ENGINE_SPEC = {
    "prometheus": {"scrape_interval": "1s", "evaluation_interval": "1s", "rate_window": "5s"},
    "layers": {"L2": {"engine": {"for": "0s", "critical_for": "3s", "waiting_growth_for": "6s",
                                 "fill_horizon": "60s", "fill_lookback": "10s"}}},
}


def write_engine_prometheus(spec, directory: Path, scrape_configs: list[dict] | None = None,
                            alerting: bool = False) -> Path:
    """Write the spec's engine and GPU rule files and a prometheus.yml evaluating them under `directory`;
    returns the config's path. `scrape_configs`: the jobs to scrape (default: the spec's Triton jobs);
    `alerting`: keep the generated Alertmanager section."""
    rules = directory / "rules"
    rules.mkdir()
    for rel, text in outputs(spec).items():
        if rel in (f"{RULES_DIR}/engine.yml", f"{RULES_DIR}/gpu.yml"):
            (rules / Path(rel).name).write_text(text)
    config = prometheus_config(spec)
    config["scrape_configs"] = (scrape_configs if scrape_configs is not None
                                else [job for source, job in scrape_jobs(spec) if source == "triton"])
    config["rule_files"] = [str(rules / "*.yml")]
    if not alerting:
        config.pop("alerting", None)
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _key(name: str, labels: dict[str, str]) -> tuple:
    return name, tuple(sorted(labels.items()))


def _labels(text: str | None) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', text or ""))


class EngineExposition:
    """Serves `fixture` (a file name under tests/fixtures/engine/) on 127.0.0.1:<port>/metrics."""

    def __init__(self, fixture: str):
        self.lines = (FIXTURES / fixture).read_text().splitlines()
        self.values: dict[tuple, tuple[float, float, float]] = {}  # key -> (value, per second, since)
        self.lock = threading.Lock()
        self.scrapes = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = server.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def set(self, name: str, value: float, **labels: str) -> None:
        self._put(name, labels, value, 0.0)

    def ramp(self, name: str, per_second: float, **labels: str) -> None:
        """The sample grows by `per_second` from its current value on (a counter's increase)."""
        self._put(name, labels, self._current(name, labels), per_second)

    def _current(self, name: str, labels: dict[str, str]) -> float:
        for line in self.lines:
            m = SAMPLE.match(line)
            if m and m["name"] == name and _labels(m["labels"]).items() >= labels.items():
                return self._value(m["name"], _labels(m["labels"]), float(m["value"]))
        raise KeyError(f"{name}{labels} is not in the fixture")

    def _put(self, name: str, labels: dict[str, str], value: float, per_second: float) -> None:
        matched = False
        with self.lock:
            for line in self.lines:
                m = SAMPLE.match(line)
                if m and m["name"] == name and _labels(m["labels"]).items() >= labels.items():
                    self.values[_key(name, _labels(m["labels"]))] = (value, per_second, time.monotonic())
                    matched = True
        if not matched:
            raise KeyError(f"{name}{labels} is not in the fixture")

    def _value(self, name: str, labels: dict[str, str], default: float) -> float:
        value, per_second, since = self.values.get(_key(name, labels), (default, 0.0, 0.0))
        return value + per_second * (time.monotonic() - since) if per_second else value

    def render(self) -> str:
        out = []
        with self.lock:
            self.scrapes += 1
            for line in self.lines:
                m = SAMPLE.match(line)
                if not m:
                    out.append(line)
                    continue
                value = self._value(m["name"], _labels(m["labels"]), float(m["value"]))
                out.append(f"{m['name']}{m['labels'] or ''} {value!r}")
        return "\n".join(out) + "\n"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def engine_row(board: dict) -> list[dict]:
    """The panels of a generated Triton dashboard's "LLM engines" row, in order (empty without the row)."""
    from inferwatch.dashboards.engine import ROW

    panels, in_row = [], False
    for panel in board["panels"]:
        if panel.get("type") == "row":
            in_row = panel.get("title") == ROW
            continue
        if in_row:
            panels.append(panel)
    return panels


def concrete(expr: str, rate_interval: str = "10s") -> str:
    """A panel query as Prometheus can run it: Grafana's `$__rate_interval` given, every dashboard variable
    (`$node`, `${model}`) matching anything."""
    return re.sub(r"\$\{?[a-z_]+\}?", ".*", expr.replace("$__rate_interval", rate_interval))
