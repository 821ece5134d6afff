"""A central store for several clusters (spec `central_store`, docs/several-clusters.md): each cluster's edge
scrapes the cluster's targets and remote-writes the samples, labelled with the cluster's name, to
VictoriaMetrics; vmalert evaluates the generated rule files there, writes the recorded series (and `ALERTS`)
back, and notifies Alertmanager. Grafana reads VictoriaMetrics as a Prometheus data source.

    edge (per cluster)                      central
    vmagent -promscrape.config=edge-scrape.yml ─┐
      or                                        ├─ remote write ─> victoria-metrics <── vmalert -rule=rules/*.yml
    prometheus --enable-feature=agent ──────────┘                                          │
      --config.file=edge-prometheus.yml                                               Alertmanager

The edge writes `<cluster.label>=<cluster.name>` on every sample (vmagent `-remoteWrite.label`, Prometheus
`external_labels`), so the store's series carry it and the rules, which keep it through every aggregation
(`inferwatch.rules.cluster`), alert per cluster. The scrape jobs are the ones deploy/prometheus/prometheus.yml
holds (`inferwatch.deploy.prometheus.scrape_jobs`). Generated only when `central_store.url` is set:
deploy/central/edge-scrape.yml (vmagent) or edge-prometheus.yml (Prometheus in agent mode) and
commands.yaml, the command line of each process; `edge_command`/`vmalert_command` give the same argument
lists to the compose and Kubernetes outputs and to the test launchers (inferwatch/testing/victoriametrics.py).

The store cannot watch itself: `watch-prometheus.yml` is the store's watcher, a small Prometheus beside it that
scrapes VictoriaMetrics, vmalert and the edge vmagent and evaluates only their alerts
(rules/generated/centralstore.yml, inferwatch.rules.centralstore), sending to Alertmanager directly, so a
store outage pages (docs/central-store-selfwatch.md).
"""

from __future__ import annotations

from urllib.parse import urlparse

from inferwatch.deploy.prometheus import alertmanager_addresses, scrape_jobs, with_selector
from inferwatch.rules.generate import HEADER, dump
from inferwatch.spec import Spec

OUT_DIR = "deploy/central"
EDGE_SCRAPE = f"{OUT_DIR}/edge-scrape.yml"
EDGE_PROMETHEUS = f"{OUT_DIR}/edge-prometheus.yml"
COMMANDS = f"{OUT_DIR}/commands.yaml"
WATCH_PROMETHEUS = f"{OUT_DIR}/watch-prometheus.yml"
# The watcher's only rule file, relative to its configuration file (Prometheus resolves rule_files so).
WATCH_RULES = "../../rules/generated/centralstore.yml"
# The sources (spec `selectors`) the watcher scrapes, not the cluster's Prometheus.
WATCH_SOURCES = ("victoriametrics", "vmalert", "vmagent")


def edge_scrape_config(spec: Spec) -> dict:
    """vmagent's -promscrape.config: the cluster's scrape jobs (labels are added by -remoteWrite.label)."""
    return {"global": {"scrape_interval": str(spec.prometheus.scrape_interval)},
            "scrape_configs": [job for _source, job in scrape_jobs(spec)]}


def edge_prometheus_config(spec: Spec) -> dict:
    """Prometheus in agent mode (`--enable-feature=agent`): scrape the cluster, write everything to the store
    with the cluster's external labels. The same file with `rule_files` added is a full Prometheus of the
    cluster (the rules evaluate there too); the agent itself evaluates nothing."""
    return {"global": {"scrape_interval": str(spec.prometheus.scrape_interval),
                       "external_labels": spec.external_labels},
            "scrape_configs": [job for _source, job in scrape_jobs(spec)],
            "remote_write": [{"url": spec.central_store.write_url}]}


def edge_command(spec: Spec, config_path: str, data_path: str) -> list[str]:
    """The edge's command line (`central_store.edge`) reading `config_path` (edge-scrape.yml for vmagent,
    edge-prometheus.yml for Prometheus); `data_path` holds its write-ahead buffer."""
    if spec.central_store.edge == "prometheus-agent":
        return ["prometheus", "--enable-feature=agent", f"--config.file={config_path}",
                f"--storage.agent.path={data_path}"]
    labels = [f"-remoteWrite.label={k}={v}" for k, v in sorted(spec.external_labels.items())]
    return ["vmagent", f"-promscrape.config={config_path}", f"-remoteWrite.url={spec.central_store.write_url}",
            *labels, f"-remoteWrite.tmpDataPath={data_path}"]


def vmalert_command(spec: Spec, rule_files: str) -> list[str]:
    """vmalert over the store: the rule files (a glob), recorded series and `ALERTS` written back (and read
    on restart to restore the `for` state), alerts to Alertmanager, at the spec's evaluation interval. No
    external label: each alert's cluster comes from its series; no `alertgroup` label either (vmalert adds
    the group's name by default; Prometheus' alerts have none, and routing must not depend on which runs).

    `-datasource.queryStep` is the evaluation interval: vmalert sends it as each query's `step`, which
    VictoriaMetrics uses as the default step of a subquery (`changes((...)[5m:])` in GpuXidCritical) and as
    how far back a missing sample is looked for. At vmalert's default (5m) a subquery over 5m holds one
    point, `changes()` of it is 0 and an XID change is missed; Prometheus steps a subquery by its evaluation
    interval, so the same step gives the same answer in both."""
    url = spec.central_store.url.rstrip("/")
    interval = spec.prometheus.evaluation_interval
    return ["vmalert", f"-rule={rule_files}", f"-datasource.url={url}", f"-remoteWrite.url={url}",
            f"-remoteRead.url={url}", f"-notifier.url={spec.targets.alertmanager.rstrip('/')}",
            f"-evaluationInterval={interval}", f"-datasource.queryStep={interval}", "-disableAlertgroupLabel"]


def watch_jobs(spec: Spec) -> list[tuple[str, dict]]:
    """(source, scrape job) of the store's watcher: VictoriaMetrics (the host of `central_store.url`), vmalert
    (`central_store.vmalert`) and, with a vmagent edge, this cluster's vmagent (`central_store.edge_address`,
    labelled with the cluster's name so its alerts name the cluster). Each job is named and labelled so that
    the spec's selector of its source picks it (inferwatch.deploy.prometheus.with_selector)."""
    c = spec.central_store
    store = urlparse(c.url)

    def job(source: str, address: str, labels: dict[str, str] | None = None, scheme: str = "http") -> dict:
        built = {"job_name": source, "metrics_path": "/metrics",
                 "static_configs": [{"targets": [address], **({"labels": dict(labels)} if labels else {})}]}
        if scheme == "https":
            built["scheme"] = "https"
        return with_selector(built, spec.selectors.of(source), source)

    jobs = [("victoriametrics", job("victoriametrics", store.netloc, scheme=store.scheme)),
            ("vmalert", job("vmalert", c.vmalert))]
    if c.edge == "vmagent":
        jobs.append(("vmagent", job("vmagent", c.edge_address, dict(spec.external_labels))))
    return jobs


def watch_prometheus_config(spec: Spec, rule_file: str = WATCH_RULES) -> dict:
    """The store's watcher: a Prometheus (not agent mode) scraping the store's programs, evaluating their
    alerts and sending them to Alertmanager itself; it writes nothing to the store, so it works while the
    store is down. No external label: the store and vmalert serve every cluster (the edge's target carries
    its cluster)."""
    p = spec.prometheus
    return {"global": {"scrape_interval": str(p.scrape_interval), "evaluation_interval": str(p.evaluation_interval)},
            "rule_files": [rule_file],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": alertmanager_addresses(spec)}]}]},
            "scrape_configs": [j for _source, j in watch_jobs(spec)]}


def watch_command(config_path: str, data_path: str) -> list[str]:
    """The watcher's command line; a day of data is enough for its rate windows and a look back."""
    return ["prometheus", f"--config.file={config_path}", f"--storage.tsdb.path={data_path}",
            "--storage.tsdb.retention.time=1d"]


def outputs(spec: Spec) -> dict[str, str]:
    """{relative path: text} for `inferwatch generate`; nothing without `central_store.url`."""
    if not spec.central_store.enabled:
        return {}
    edge = spec.central_store.edge
    config_file = EDGE_PROMETHEUS if edge == "prometheus-agent" else EDGE_SCRAPE
    config = edge_prometheus_config(spec) if edge == "prometheus-agent" else edge_scrape_config(spec)
    commands = {
        "edge": edge_command(spec, config_file, f"/var/lib/{edge}"),
        "vmalert": vmalert_command(spec, "rules/generated/*.yml"),
        "victoria-metrics": ["victoria-metrics", "-storageDataPath=/var/lib/victoria-metrics",
                             "-retentionPeriod=30d"],
        "watch": watch_command(WATCH_PROMETHEUS, "/var/lib/inferwatch-watch"),
    }
    head = HEADER.replace("from the spec", f"from the spec (central store, cluster {spec.cluster.name})")
    return {config_file: head + dump(config),
            WATCH_PROMETHEUS: head + dump(watch_prometheus_config(spec)),
            COMMANDS: head + "# The command line of each process, paths relative to the repository root.\n"
                      + dump(commands)}
