"""Prepared Prometheus data: write series as OpenMetrics text and turn it into TSDB blocks with
`promtool tsdb create-blocks-from openmetrics`, so a real Prometheus can serve them (start_prometheus's
`storage_path`). Used by tests and benchmarks that need a known past, e.g. triage scenarios.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Callable, Iterable

from inferwatch.testing.process import StackError, require_binary
from inferwatch.testing.prometheus import PrometheusServer, start_prometheus, write_config

__all__ = ["Series", "counter", "gauge", "write_openmetrics", "create_blocks", "serve_series"]

INSTALL_HINT = "apt-get update && apt-get install -y prometheus  (ships promtool)"


@dataclasses.dataclass
class Series:
    """One time series: metric name, labels, samples as (unix seconds, value), oldest first."""

    name: str
    labels: dict[str, str]
    samples: list[tuple[float, float]]


def _times(start: float, end: float, step: float) -> list[float]:
    n = int((end - start) // step)
    return [start + i * step for i in range(n + 1)]


def counter(name: str, labels: dict[str, str], per_second: float, start: float, end: float,
            step: float = 15.0) -> Series:
    """A counter growing at `per_second` from 0 at `start`, sampled every `step` seconds."""
    return Series(name, labels, [(t, per_second * (t - start)) for t in _times(start, end, step)])


def gauge(name: str, labels: dict[str, str], value: float | Callable[[float], float], start: float, end: float,
          step: float = 15.0) -> Series:
    """A gauge holding `value` (a number, or a function of the sample time)."""
    fn = value if callable(value) else (lambda _t: value)
    return Series(name, labels, [(t, float(fn(t))) for t in _times(start, end, step)])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_openmetrics(series: Iterable[Series], path: Path) -> Path:
    """Write `series` as OpenMetrics text (untyped families, timestamps in seconds) ending in `# EOF`.

    Lines of one metric name are kept together, as OpenMetrics requires of a family."""
    by_name: dict[str, list[Series]] = {}
    for s in series:
        by_name.setdefault(s.name, []).append(s)
    lines: list[str] = []
    for name, group in by_name.items():
        for s in group:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
            head = f"{name}{{{labels}}}" if labels else name
            lines.extend(f"{head} {v!r} {t:.3f}" for t, v in s.samples)
    path = Path(path)
    path.write_text("\n".join(lines) + "\n# EOF\n", encoding="utf-8")
    return path


def create_blocks(openmetrics_path: Path, data_dir: Path, timeout: float = 120.0) -> Path:
    """Run promtool to write TSDB blocks for `openmetrics_path` into `data_dir`. Raises StackError."""
    promtool = require_binary("promtool", INSTALL_HINT)
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics_path),
                           str(data_dir)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise StackError(f"promtool create-blocks-from openmetrics failed: {proc.stderr.strip()[-2000:]}")
    return data_dir


def serve_series(series: Iterable[Series], workdir: Path, name: str = "data") -> PrometheusServer:
    """A real Prometheus (scraping nothing) serving `series` from TSDB blocks built under `workdir`
    (`<name>.om`, `tsdb/`, `prometheus.yml`). Raises StackError as create_blocks and start_prometheus do."""
    data = create_blocks(write_openmetrics(series, workdir / f"{name}.om"), workdir / "tsdb")
    return start_prometheus(workdir, write_config(workdir / "prometheus.yml", []), storage_path=data)
