"""deploy/prometheus/prometheus.yml: scrape jobs for Triton and the three exporters and the notifier, rule
files and Alertmanager, from the spec.

Each source's job is written so that the spec's selector for it (`selectors`) picks its series: the job is
named after the selector's `job="..."` matcher (default: inferwatch.selectors.DEFAULT_JOBS) and every other
`=` matcher becomes a static label of its targets (`namespace="triton", service="triton-metrics"` ->
labels namespace and service). A selector with another kind of matcher (`=~`, `!=`, `!~`) describes a
Prometheus of its own; `unmatched_selectors` says which targets it would miss. Every target carries a `node`
label (spec `{address, node}`, or the address's host for a plain 'host:port'); the Triton jobs come from the
Triton collector's `scrape_configs(spec)`.

The alerting path watches itself (rules/ha.py): source `alertmanager` (job inferwatch-alertmanager by
default) scrapes every Alertmanager peer, `prometheus` (inferwatch-prometheus) every Prometheus replica. With
replicas (spec `ha.prometheus`), each replica gets its own file (`prometheus_configs`): the same jobs and
rules, external label `<ha.replica_label>: <name>`, which `alert_relabel_configs` drops again so that
Alertmanager sees one alert from the pair, every Alertmanager peer as a target (Prometheus sends to each; they
deduplicate by gossip, never behind a load balancer), and source `prometheus_alerts`
(inferwatch-prometheus-alerts): every replica's firing alerts through its /federate endpoint, which adds the
replica label, so each replica can compare the pair's verdicts.
"""

from __future__ import annotations

from urllib.parse import urlparse

from inferwatch.deploy.webhook_size import scrape_limits
from inferwatch.exporters.triton.scrape import scrape_configs as triton_scrape_configs
from inferwatch.selectors import DEFAULT_JOBS, Selector
from inferwatch.spec import Spec, SpecError

# source -> spec.targets field of its exporter targets (the Triton jobs come from the collector's module).
EXPORTER_TARGETS = (("gpu", "gpu_exporters"), ("gateway", "gateways"), ("notifier", "notifiers"))
# job name the Triton collector's scrape_configs gives each Triton source.
TRITON_JOBS = {DEFAULT_JOBS["triton"]: "triton", DEFAULT_JOBS["triton_collector"]: "triton_collector"}
FEDERATED_ALERTS = 'ALERTS{alertstate="firing"}'
FEDERATION_INSTANCE = "prometheus-replicas"


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
    jobs += [(source, with_selector(job, spec.selectors.of(source), source))
             for source, job in self_monitoring_jobs(spec)]
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
    alertmanager: dict = {"static_configs": [{"targets": alertmanager_addresses(spec)}]}
    if am.scheme == "https":
        alertmanager["scheme"] = "https"
    if am.path.strip("/"):
        alertmanager["path_prefix"] = am.path
    config["alerting"] = {"alertmanagers": [alertmanager]}
    config["scrape_configs"] = [with_limits(source, job) for source, job in scrape_jobs(spec)]
    return config


def with_limits(source: str, job: dict) -> dict:
    """`job` (of `source`) with the label limits that bound every alert's size (deploy/webhook_size.py):
    Prometheus fails a scrape whose series exceed them instead of storing labels no webhook could carry."""
    return {**job, **scrape_limits(federation=source == "prometheus_alerts")}


def alertmanager_addresses(spec: Spec) -> list[str]:
    """host:port of every Alertmanager Prometheus sends to: each peer of `ha.alertmanager`, else the one of
    `targets.alertmanager`."""
    return [p.address for p in spec.ha.alertmanager_peers()] or [urlparse(spec.targets.alertmanager).netloc]


def prometheus_addresses(spec: Spec) -> list[tuple[str, str]]:
    """(replica name, host:port) of every Prometheus; one unnamed entry without replicas."""
    replicas = [(r.name, r.address) for r in spec.ha.prometheus_replicas()]
    return replicas or [("", urlparse(spec.targets.prometheus).netloc)]


def _static(address: str, **labels: str) -> dict:
    return {"targets": [address], "labels": {"node": address.rsplit(":", 1)[0], **labels}}


def self_monitoring_jobs(spec: Spec) -> list[tuple[str, dict]]:
    """(source, job) of the alerting path's own sources: alertmanager and prometheus, and with replicas
    prometheus_alerts (each replica's firing alerts, `replica` label and all, from /federate; honor_labels
    keeps the alerts' own labels), under their default job names (scrape_jobs applies the selectors)."""
    label = spec.ha.replica_label
    prometheus = prometheus_addresses(spec)
    jobs: list[tuple[str, dict]]
    jobs = [("alertmanager", {"job_name": DEFAULT_JOBS["alertmanager"], "metrics_path": "/metrics",
                              "static_configs": [_static(a) for a in alertmanager_addresses(spec)]}),
            ("prometheus", {"job_name": DEFAULT_JOBS["prometheus"], "metrics_path": "/metrics",
                            "static_configs": [_static(a, **({label: name} if name else {}))
                                               for name, a in prometheus]})]
    if len(prometheus) > 1:
        # The replicas' copies of one alert must carry the same labels but `replica`: a label the alert lacks
        # is filled from the target, so the targets carry no `node` and one `instance` for all.
        jobs.append(("prometheus_alerts", {
            "job_name": DEFAULT_JOBS["prometheus_alerts"], "honor_labels": True, "metrics_path": "/federate",
            "params": {"match[]": [FEDERATED_ALERTS]},
            "static_configs": [{"targets": [a], "labels": {label: name}} for name, a in prometheus],
            "relabel_configs": [{"target_label": "instance", "replacement": FEDERATION_INSTANCE}]}))
    return jobs


def prometheus_configs(spec: Spec) -> dict[str, dict]:
    """{replica name: its prometheus.yml as a dict}; {"": config} without replicas. A replica's file differs
    from the others only in its `replica` external label."""
    base = prometheus_config(spec)
    replicas = spec.ha.prometheus_replicas()
    if not replicas:
        return {"": base}
    label = spec.ha.replica_label
    out = {}
    for r in replicas:
        config = {**base, "global": {**base["global"],
                                     "external_labels": {**base["global"].get("external_labels", {}), label: r.name}}}
        config["alerting"] = {"alert_relabel_configs": [{"action": "labeldrop", "regex": label}],
                              **base["alerting"]}
        out[r.name] = config
    return out


def config_path(directory: str, replica: str) -> str:
    """Where a replica's configuration is written: `<dir>/prometheus.yml`, or `<dir>/prometheus-<name>.yml`."""
    return f"{directory}/prometheus-{replica}.yml" if replica else f"{directory}/prometheus.yml"
