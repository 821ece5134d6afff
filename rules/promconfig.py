"""deploy/prometheus/prometheus.yml: scrape jobs for Triton and the three exporters and the notifier, rule
files and Alertmanager, from the spec.

Each source's job is written so that the spec's selector for it (`selectors`) picks its series: the job is
named after the selector's `job="..."` matcher (default: inferwatch.selectors.DEFAULT_JOBS) and every other
`=` matcher becomes a static label of its targets (`namespace="triton", service="triton-metrics"` ->
labels namespace and service). A selector with another kind of matcher (`=~`, `!=`, `!~`) describes a
Prometheus of its own; `unmatched_selectors` says which targets it would miss. Every target carries a `node`
label (spec `{address, node}`, or the address's host for a plain 'host:port'); the Triton jobs come from the
Triton collector's `scrape_configs(spec)`.
"""

from __future__ import annotations

from urllib.parse import urlparse

from inferwatch.exporters.triton.scrape import scrape_configs as triton_scrape_configs
from inferwatch.selectors import DEFAULT_JOBS, Selector
from inferwatch.spec import Spec, SpecError

# source -> spec.targets field of its exporter targets (the Triton jobs come from the collector's module).
EXPORTER_TARGETS = (("gpu", "gpu_exporters"), ("gateway", "gateways"), ("notifier", "notifiers"))
# job name the Triton collector's scrape_configs gives each Triton source.
TRITON_JOBS = {DEFAULT_JOBS["triton"]: "triton", DEFAULT_JOBS["triton_collector"]: "triton_collector"}


def job_name(selector: Selector, source: str) -> str:
    """The job a source's targets get: the selector's `job` value, else the default job of the source."""
    return selector.labels.get("job", DEFAULT_JOBS[source])


def with_selector(job: dict, selector: Selector, source: str) -> dict:
    """`job` renamed and labelled so that `selector` picks its series (its `=` matchers written)."""
    labels = {k: v for k, v in selector.labels.items() if k != "job"}
    statics = [{**sc, "labels": {**sc.get("labels", {}), **labels}} for sc in job["static_configs"]]
    return {**job, "job_name": job_name(selector, source), "static_configs": statics}


def exporter_job(spec: Spec, source: str, kind: str) -> dict | None:
    """One static scrape job for `spec.targets.<kind>`; None when it lists no target."""
    targets = spec.targets.exporter_targets(kind)
    if not targets:
        return None
    job = {"job_name": DEFAULT_JOBS[source], "metrics_path": "/metrics",
           "static_configs": [{"targets": [t.address], "labels": {"node": t.node}} for t in targets]}
    return with_selector(job, spec.selectors.of(source), source)


def scrape_jobs(spec: Spec) -> list[tuple[str, dict]]:
    """(source, scrape job) for every source with targets. Raises SpecError when two sources' selectors would
    give their targets the same job and labels (Prometheus refuses a job name twice)."""
    jobs = [(TRITON_JOBS[j["job_name"]], with_selector(j, spec.selectors.of(TRITON_JOBS[j["job_name"]]),
                                                        TRITON_JOBS[j["job_name"]]))
            for j in triton_scrape_configs(spec)]
    for source, kind in EXPORTER_TARGETS:
        built = exporter_job(spec, source, kind)
        if built:
            jobs.append((source, built))
    seen: dict[str, str] = {}
    for source, job in jobs:
        if job["job_name"] in seen:
            raise SpecError(f"selectors.{source}", f"gives the job name {job['job_name']!r} of selectors."
                                                   f"{seen[job['job_name']]} too: give each source its own job")
        seen[job["job_name"]] = source
    return jobs


def unmatched_selectors(spec: Spec) -> list[str]:
    """'selectors.<source>: ...' for every source whose generated targets its selector would not pick (a
    selector with `=~`, `!=` or `!~` matchers the generated configuration cannot write)."""
    out = []
    for source, job in scrape_jobs(spec):
        selector = spec.selectors.of(source)
        for sc in job["static_configs"]:
            labels = {"job": job["job_name"], "instance": sc["targets"][0], **sc.get("labels", {})}
            if not selector.matches(labels):
                out.append(f"selectors.{source}: {selector} does not pick the generated target "
                           f"{sc['targets'][0]} (labels {labels}); it only fits a Prometheus of your own")
                break
    return out


def prometheus_config(spec: Spec) -> dict:
    """The whole prometheus.yml as a dict (ready for YAML)."""
    p = spec.prometheus
    config: dict = {"global": {"scrape_interval": str(p.scrape_interval),
                               "evaluation_interval": str(p.evaluation_interval)}}
    if spec.external_labels:  # the cluster's name among them (spec `cluster`)
        config["global"]["external_labels"] = spec.external_labels
    config["rule_files"] = list(p.rule_files)
    am = urlparse(spec.targets.alertmanager)
    alertmanager: dict = {"static_configs": [{"targets": [am.netloc]}]}
    if am.scheme == "https":
        alertmanager["scheme"] = "https"
    if am.path.strip("/"):
        alertmanager["path_prefix"] = am.path
    config["alerting"] = {"alertmanagers": [alertmanager]}
    config["scrape_configs"] = [job for _source, job in scrape_jobs(spec)]
    return config
