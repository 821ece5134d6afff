"""Prometheus scrape configuration for Triton's own metrics (job `triton` by default) and the collector
(job `inferwatch-triton` by default; deploy/prometheus.py names the jobs after the spec's selectors), built
from the spec.

Every target carries a `node` label so L2 alerts can name the node (CONVENTIONS: fixed names). Triton
targets also carry `triton` (the spec target name). The collector serves series for many Tritons, so its
own target `node` is the collector's host; a metric relabel copies each series' Triton `node` from the spec
by its `triton` label, so collector-based alerts (TritonModelNotReady ...) name the node that serves the model.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from inferwatch.selectors import DEFAULT_JOBS

JOB_TRITON = DEFAULT_JOBS["triton"]
JOB_COLLECTOR = DEFAULT_JOBS["triton_collector"]


def _triton_static_config(target: Any) -> dict:
    labels = {"triton": target.name, "node": target.node or target.name}
    if target.metrics_url:
        parsed = urlparse(target.metrics_url)
        # Per-target path/scheme via the reserved labels, so one job covers targets that differ.
        if parsed.path and parsed.path != "/metrics":
            labels["__metrics_path__"] = parsed.path
        if parsed.scheme == "https":
            labels["__scheme__"] = "https"
    return {"targets": [target.metrics_address], "labels": labels}


def scrape_configs(spec: Any) -> list[dict]:
    """Scrape configs for jobs `triton` and `inferwatch-triton`.

    Shape: a list of Prometheus `scrape_configs` entries (dicts ready for YAML). A job with no targets in
    the spec is left out. `node` falls back to the target name when the spec leaves it empty, so the label
    is never missing. Raises nothing; the spec was validated when loaded.
    """
    configs: list[dict] = []
    tritons = list(spec.targets.triton)
    if tritons:
        configs.append({
            "job_name": JOB_TRITON,
            "metrics_path": "/metrics",
            "static_configs": [_triton_static_config(t) for t in tritons],
        })
    collectors = list(spec.targets.triton_collectors)
    if collectors:
        metric_relabel = [
            {
                "source_labels": ["triton"],
                "regex": _re_escape(t.name),
                "target_label": "node",
                "replacement": t.node or t.name,
            }
            for t in tritons
        ]
        job: dict = {
            "job_name": JOB_COLLECTOR,
            "metrics_path": "/metrics",
            "static_configs": [
                {"targets": [address], "labels": {"node": address.rsplit(":", 1)[0]}}
                for address in collectors
            ],
        }
        if metric_relabel:
            job["metric_relabel_configs"] = metric_relabel
        configs.append(job)
    return configs


def _re_escape(text: str) -> str:
    # Relabel regexes are RE2 and fully anchored: escape only RE2 metacharacters (Python's re.escape would
    # also escape '-', which is legal but makes the generated config harder to read).
    return "".join("\\" + c if c in _RE2_META else c for c in text)


_RE2_META = set(".+*?()|[]{}^$\\")
