"""deploy/prometheus/prometheus.yml: scrape jobs for Triton and the three exporters and the notifier, rule
files and Alertmanager, from the spec.

Job names are fixed (CONVENTIONS.md): triton and inferwatch-triton come from the Triton collector's
`scrape_configs(spec)`; inferwatch-gpu, inferwatch-gateway and inferwatch-notifier are built here. Every
target carries a `node` label (spec `{address, node}`, or the address's host for a plain 'host:port').

The alerting path watches itself (rules/ha.py): job inferwatch-alertmanager scrapes every Alertmanager
peer, inferwatch-prometheus every Prometheus replica. With replicas (spec `ha.prometheus`), each replica
gets its own file (`prometheus_configs`): the same jobs and rules, external label `<ha.replica_label>:
<name>`, which `alert_relabel_configs` drops again so that Alertmanager sees one alert from the pair, every
Alertmanager peer as a target (Prometheus sends to each; they deduplicate by gossip, never behind a load
balancer), and job inferwatch-prometheus-alerts: every replica's firing alerts through its /federate
endpoint, which adds the replica label, so each replica can compare the pair's verdicts.
"""

from __future__ import annotations

from urllib.parse import urlparse

from inferwatch.exporters.triton.scrape import scrape_configs as triton_scrape_configs
from inferwatch.notifier.webhook_size import scrape_limits
from inferwatch.spec import Spec

JOBS = (("inferwatch-gpu", "gpu_exporters"), ("inferwatch-gateway", "gateways"), ("inferwatch-notifier", "notifiers"))
JOB_ALERTMANAGER = "inferwatch-alertmanager"
JOB_PROMETHEUS = "inferwatch-prometheus"
JOB_PROMETHEUS_ALERTS = "inferwatch-prometheus-alerts"
FEDERATED_ALERTS = 'ALERTS{alertstate="firing"}'
FEDERATION_INSTANCE = "prometheus-replicas"


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
    alertmanager: dict = {"static_configs": [{"targets": alertmanager_addresses(spec)}]}
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
    config["scrape_configs"] = [with_limits(job) for job in jobs + self_monitoring_jobs(spec)]
    return config


def with_limits(job: dict) -> dict:
    """`job` with the label limits that bound every alert's size (notifier/webhook_size.py): Prometheus fails
    a scrape whose series exceed them instead of storing labels no webhook could carry."""
    return {**job, **scrape_limits(federation=job["job_name"] == JOB_PROMETHEUS_ALERTS)}


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


def self_monitoring_jobs(spec: Spec) -> list[dict]:
    """Jobs inferwatch-alertmanager and inferwatch-prometheus, and with replicas inferwatch-prometheus-alerts
    (each replica's firing alerts, `replica` label and all, from /federate; honor_labels keeps the alerts'
    own labels)."""
    label = spec.ha.replica_label
    prometheus = prometheus_addresses(spec)
    jobs = [{"job_name": JOB_ALERTMANAGER, "metrics_path": "/metrics",
             "static_configs": [_static(a) for a in alertmanager_addresses(spec)]},
            {"job_name": JOB_PROMETHEUS, "metrics_path": "/metrics",
             "static_configs": [_static(a, **({label: name} if name else {})) for name, a in prometheus]}]
    if len(prometheus) > 1:
        # The replicas' copies of one alert must carry the same labels but `replica`: a label the alert lacks
        # is filled from the target, so the targets carry no `node` and one `instance` for all.
        jobs.append({"job_name": JOB_PROMETHEUS_ALERTS, "honor_labels": True, "metrics_path": "/federate",
                     "params": {"match[]": [FEDERATED_ALERTS]},
                     "static_configs": [{"targets": [a], "labels": {label: name}} for name, a in prometheus],
                     "relabel_configs": [{"target_label": "instance", "replacement": FEDERATION_INSTANCE}]})
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
