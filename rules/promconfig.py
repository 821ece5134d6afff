"""deploy/prometheus/prometheus.yml: scrape jobs for Triton and the three exporters and the notifier, rule
files and Alertmanager, from the spec.

Job names are fixed (CONVENTIONS.md): triton and inferwatch-triton come from the Triton collector's
`scrape_configs(spec)`; inferwatch-gpu, inferwatch-gateway and inferwatch-notifier are built here. Every
target carries a `node` label (spec `{address, node}`, or the address's host for a plain 'host:port').
"""

from __future__ import annotations

from urllib.parse import urlparse

from inferwatch.exporters.triton.scrape import scrape_configs as triton_scrape_configs
from inferwatch.spec import Spec

JOBS = (("inferwatch-gpu", "gpu_exporters"), ("inferwatch-gateway", "gateways"), ("inferwatch-notifier", "notifiers"))


def exporter_job(spec: Spec, job: str, kind: str) -> dict | None:
    """One static scrape job for `spec.targets.<kind>`; None when it lists no target."""
    targets = spec.targets.exporter_targets(kind)
    if not targets:
        return None
    return {"job_name": job, "metrics_path": "/metrics",
            "static_configs": [{"targets": [t.address], "labels": {"node": t.node}} for t in targets]}


def prometheus_config(spec: Spec) -> dict:
    """The whole prometheus.yml as a dict (ready for YAML)."""
    p = spec.prometheus
    config: dict = {"global": {"scrape_interval": str(p.scrape_interval),
                               "evaluation_interval": str(p.evaluation_interval)}}
    if p.external_labels:
        config["global"]["external_labels"] = dict(p.external_labels)
    config["rule_files"] = list(p.rule_files)
    am = urlparse(spec.targets.alertmanager)
    alertmanager: dict = {"static_configs": [{"targets": [am.netloc]}]}
    if am.scheme == "https":
        alertmanager["scheme"] = "https"
    if am.path.strip("/"):
        alertmanager["path_prefix"] = am.path
    config["alerting"] = {"alertmanagers": [alertmanager]}
    jobs = list(triton_scrape_configs(spec))
    for job, kind in JOBS:
        built = exporter_job(spec, job, kind)
        if built:
            jobs.append(built)
    config["scrape_configs"] = jobs
    return config
