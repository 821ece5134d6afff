"""Generator for the docker-compose stack (docker-compose.yml): Prometheus and Alertmanager configuration and
the Triton collector's targets, from the spec with every address replaced by a compose service name.

Only `targets` (and the paths containers see) differ from the spec: thresholds, windows, routes and grouping
are the spec's own, so the compose stack alerts exactly as `inferwatch generate` says, and `--check` fails
when a spec change is not regenerated here too. The service names and ports below are docker-compose.yml's;
tests/test_dashboards_compose.py checks they agree with what `docker compose config` reports.

With replicas in the spec's `ha` section, the same topology as a compose override,
deploy/compose/docker-compose.ha.yml (`docker compose -f docker-compose.yml -f deploy/compose/docker-compose.ha.yml
up`): Prometheus replicas `prometheus` (the first) and `prometheus-<name>`, each with its own configuration
file and data; Alertmanager peers `alertmanager`, `alertmanager-1`, ... clustered on port 9094 with the same
configuration; notifier replicas `notifier`, `notifier-1`, ..., all answering the network alias
`notifier-webhook`, which Alertmanager posts to (Docker's DNS returns every live replica), and all sharing the
user's PostgreSQL outbox (`notifier.outbox.url`, docs/ha.md): the URL as the spec gives it, the password never
inline, from the environment variable the spec names (passed through to every replica) or from the compose
secret `notifier-outbox-password` (a `password_file` in the spec; an inline password becomes
${INFERWATCH_NOTIFIER_OUTBOX_PASSWORD}).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import yaml

from inferwatch.deploy import alertmanager as alertmanager_config
from inferwatch.deploy.kubernetes.specfile import to_data, with_references
from inferwatch.deploy.prometheus import config_path, prometheus_configs
from inferwatch.rules.generate import HEADER, dump
from inferwatch.spec import AlertmanagerPeer, ExporterTarget, HighAvailability, PrometheusReplica, Spec, TritonTarget
from inferwatch.specload import Secret

OUT_DIR = "deploy/compose"
NODE = "compose"  # the single Docker host: every target's `node` label
# service -> port, as docker-compose.yml declares them (container ports, reached on the compose network).
SERVICES = {"triton": 8000, "prometheus": 9090, "alertmanager": 9093, "notifier": 9410, "gpu-exporter": 9400,
            "triton-collector": 9401, "gateway": 9402, "grafana": 3000}
TRITON_NAME = "triton-0"
HA_FILE = f"{OUT_DIR}/docker-compose.ha.yml"
NOTIFIER_SPEC = f"{OUT_DIR}/notifier-spec.yaml"
WEBHOOK_ALIAS = "notifier-webhook"   # every notifier replica answers it (HA)
CLUSTER_PORT = 9094
PROMETHEUS_IMAGE = "prom/prometheus:v2.53.0"      # docker-compose.yml's images
ALERTMANAGER_IMAGE = "prom/alertmanager:v0.27.0"
BIND = "${INFERWATCH_BIND:-127.0.0.1}"
# Where docker-compose.yml mounts things inside the containers.
RULES_IN_CONTAINER = "/etc/prometheus/rules/*.yml"
SECRETS_IN_CONTAINER = "/run/secrets"
OUTBOX_PASSWORD_SECRET = "notifier-outbox-password"  # noqa: S105 - a compose secret's name (password_file)
SECRETS_DIR = "${INFERWATCH_SECRETS:-./deploy/compose/secrets}"  # docker-compose.yml's secret files


def _addr(service: str) -> str:
    return f"{service}:{SERVICES[service]}"


def prometheus_service(spec: Spec, index: int) -> str:
    return "prometheus" if index == 0 else f"prometheus-{spec.ha.prometheus_replicas()[index].name}"


def replica_service(base: str, index: int) -> str:
    """`alertmanager`, `alertmanager-1`, ...; `notifier`, `notifier-1`, ..."""
    return base if index == 0 else f"{base}-{index}"


def _ha(spec: Spec) -> HighAvailability:
    """The spec's replicas at their compose addresses."""
    h = spec.ha
    prometheus: list[str | PrometheusReplica] = [
        PrometheusReplica(f"{prometheus_service(spec, i)}:{SERVICES['prometheus']}", r.name)
        for i, r in enumerate(h.prometheus_replicas())]
    names = [replica_service("alertmanager", i) for i in range(len(h.alertmanager))]
    peers: list[str | AlertmanagerPeer] = [AlertmanagerPeer(f"{n}:{SERVICES['alertmanager']}", f"{n}:{CLUSTER_PORT}")
                                           for n in names]
    return dataclasses.replace(h, prometheus=prometheus, alertmanager=peers)


def compose_spec(spec: Spec) -> Spec:
    """`spec` with compose addresses and container paths; everything else untouched."""
    notifiers: list[str | ExporterTarget] = [ExporterTarget(f"{replica_service('notifier', i)}:{SERVICES['notifier']}",
                                                            NODE) for i in range(spec.ha.notifier_replicas)]
    webhook = f"{WEBHOOK_ALIAS}:{SERVICES['notifier']}" if spec.ha.notifier_replicas > 1 else _addr("notifier")
    kept_interval: dict[str, Any] = ({"metrics_interval_ms": spec.targets.triton[0].metrics_interval_ms}
                                     if spec.targets.triton else {})
    targets = dataclasses.replace(
        spec.targets,
        prometheus=f"http://{_addr('prometheus')}", alertmanager=f"http://{_addr('alertmanager')}",
        notifier=f"http://{webhook}",
        # The user's Triton runs with its own --metrics-interval-ms: keep it, or `check` would judge the
        # scrape interval against Triton's default instead.
        triton=[TritonTarget(name=TRITON_NAME, url="http://triton:8000", metrics_url="http://triton:8002/metrics",
                             node=NODE, **kept_interval)],
        gpu_exporters=[ExporterTarget(_addr("gpu-exporter"), NODE)],
        triton_collectors=[_addr("triton-collector")],
        gateways=[ExporterTarget(_addr("gateway"), NODE)],
        notifiers=notifiers)
    prometheus = dataclasses.replace(spec.prometheus, rule_files=[RULES_IN_CONTAINER])
    notifier = dataclasses.replace(
        spec.notifier, token_file=f"{SECRETS_IN_CONTAINER}/notifier-token",
        fallback_routing_key_file=f"{SECRETS_IN_CONTAINER}/pagerduty-fallback-key", outbox=_outbox(spec))
    return dataclasses.replace(spec, targets=targets, prometheus=prometheus, notifier=notifier, ha=_ha(spec))


def _outbox(spec: Spec):
    """The spec's outbox as the containers read it: a password file is the compose secret's."""
    o = spec.notifier.outbox
    if o.password is None or o.password.file is None:
        return o
    return dataclasses.replace(o, password=Secret(file=f"{SECRETS_IN_CONTAINER}/{OUTBOX_PASSWORD_SECRET}",
                                                  path=o.password.path))


def outbox_password_env(spec: Spec) -> dict[str, str]:
    """{variable: compose interpolation} passing the outbox password's environment variable to the notifier
    replicas ({} when it is a file or unset); a missing variable stops `docker compose up` with its name."""
    password = with_references(compose_spec(spec)).notifier.outbox.password
    if password is None or password.env is None:
        return {}
    return {password.env: f"${{{password.env}:?the notifier's PostgreSQL outbox password (notifier.outbox.password)}}"}


def collector_targets(spec: Spec) -> dict:
    """A spec fragment naming the compose Triton, for `inferwatch exporter triton --spec` in the container
    (so its series carry triton="triton-0", the label the compose Prometheus relabels to a node)."""
    t = compose_spec(spec).targets.triton[0]
    return {"version": 1, "targets": {"triton": [{
        "name": t.name, "url": t.url, "metrics_url": t.metrics_url, "node": t.node,
        "metrics_interval_ms": spec.targets.triton[0].metrics_interval_ms if spec.targets.triton else 2000}]}}


VM_VERSION = "v1.79.5"  # the Debian package's release, which the tests run


def central_outputs(spec: Spec) -> dict[str, str]:
    """With a central store (spec `central_store`): deploy/compose/central.yml, an override adding
    VictoriaMetrics, this cluster's vmagent (scraping the compose targets, deploy/compose/edge-scrape.yml) and
    vmalert (the rules, notifying the compose Alertmanager), and the store's watcher (store-watcher, a
    Prometheus from deploy/compose/watch-prometheus.yml paging on the store's own faults), with
    inferwatch.deploy.central's command lines:
    `docker compose -f docker-compose.yml -f deploy/compose/central.yml up`. Grafana can then use
    http://victoria-metrics:8428 as its Prometheus data source."""
    from inferwatch.deploy.central import edge_command, edge_scrape_config, vmalert_command, watch_prometheus_config

    if not spec.central_store.enabled:
        return {}
    store = "http://victoria-metrics:8428"
    cs = compose_spec(spec)
    cs = dataclasses.replace(cs, central_store=dataclasses.replace(cs.central_store, url=store, edge="vmagent",
                                                                   vmalert="vmalert:8880", edge_address="vmagent:8429"))
    images = {name: f"victoriametrics/{name}:{VM_VERSION}" for name in ("victoria-metrics", "vmagent", "vmalert")}
    services = {
        "victoria-metrics": {"image": images["victoria-metrics"], "restart": "unless-stopped",
                             "command": ["-storageDataPath=/storage", "-retentionPeriod=30d"],
                             "volumes": ["victoria-metrics-data:/storage"],
                             "ports": ["${INFERWATCH_BIND:-127.0.0.1}:8428:8428"]},
        "vmagent": {"image": images["vmagent"], "restart": "unless-stopped",
                    "command": edge_command(cs, "/etc/vmagent/edge-scrape.yml", "/tmp/vmagent")[1:],
                    "volumes": [f"./{OUT_DIR}/edge-scrape.yml:/etc/vmagent/edge-scrape.yml:ro"],
                    "depends_on": ["victoria-metrics"]},
        "vmalert": {"image": images["vmalert"], "restart": "unless-stopped",
                    "command": vmalert_command(cs, "/etc/vmalert/rules/*.yml")[1:],
                    "volumes": ["./rules/generated:/etc/vmalert/rules:ro"],
                    "depends_on": ["victoria-metrics", "alertmanager"]},
        # The store's watcher (inferwatch.deploy.central): pages when the store, vmagent or vmalert fails.
        "store-watcher": {"image": PROMETHEUS_IMAGE, "restart": "unless-stopped",
                          "command": ["--config.file=/etc/prometheus/watch-prometheus.yml",
                                      "--storage.tsdb.path=/prometheus", "--storage.tsdb.retention.time=1d"],
                          "volumes": [f"./{OUT_DIR}/watch-prometheus.yml:/etc/prometheus/watch-prometheus.yml:ro",
                                      "./rules/generated:/etc/prometheus/rules:ro"],
                          "depends_on": ["victoria-metrics", "vmagent", "vmalert", "alertmanager"]},
    }
    head = HEADER.replace("from the spec", "from the spec (central store, deploy/compose.py)")
    override = {"services": services, "volumes": {"victoria-metrics-data": {}}}
    return {f"{OUT_DIR}/central.yml": head + dump(override),
            f"{OUT_DIR}/edge-scrape.yml": head + dump(edge_scrape_config(cs)),
            f"{OUT_DIR}/watch-prometheus.yml": head + dump(
                watch_prometheus_config(cs, "/etc/prometheus/rules/centralstore.yml"))}
def _replicated(spec: Spec) -> bool:
    h = spec.ha
    return len(h.prometheus) > 1 or len(h.alertmanager) > 1 or h.notifier_replicas > 1


def ha_override(spec: Spec) -> dict:
    """docker-compose.ha.yml: the replicas beside docker-compose.yml's one of each (see the module doc)."""
    cs = compose_spec(spec)
    services: dict = {}
    volumes: dict = {}
    deps = ["triton", "gateway", "triton-collector", "gpu-exporter", "notifier", "alertmanager"]
    for i, r in enumerate(cs.ha.prometheus_replicas()):
        config = f"./{config_path(OUT_DIR, r.name)}:/etc/prometheus/prometheus.yml:ro"
        name = prometheus_service(spec, i)
        if i == 0:
            services[name] = {"volumes": [config]}
            continue
        volumes[f"{name}-data"] = {}
        services[name] = {"image": PROMETHEUS_IMAGE, "volumes": [config, "./rules/generated:/etc/prometheus/rules:ro",
                                                                  f"{name}-data:/prometheus"],
                          "ports": [f"{BIND}:{9090 + i}:9090"], "depends_on": deps, "restart": "unless-stopped"}
    peers = [p.cluster_address for p in cs.ha.alertmanager_peers()]
    for i, _ in enumerate(cs.ha.alertmanager_peers()):
        name = replica_service("alertmanager", i)
        command = ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager",
                   *alertmanager_config.cluster_flags(cs, f"0.0.0.0:{CLUSTER_PORT}", peers)]
        if i == 0:
            services[name] = {"command": command}
            continue
        services[name] = {"image": ALERTMANAGER_IMAGE, "command": command,
                          "volumes": ["./deploy/compose/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro"],
                          "secrets": ["notifier-token", "pagerduty-fallback-key"],
                          "ports": [f"{BIND}:{9093 + 100 * i}:9093"], "depends_on": ["notifier"],
                          "restart": "unless-stopped"}
    secrets: dict = {}
    if spec.ha.notifier_replicas > 1:
        # Every replica answers the webhook alias and reads the spec with compose addresses and the shared
        # outbox's URL; its password comes from the environment or a compose secret, never the file.
        shared: dict = {"networks": {"default": {"aliases": [WEBHOOK_ALIAS]}},
                        "volumes": [f"./{NOTIFIER_SPEC}:/etc/inferwatch/inferwatch.yaml:ro"]}
        password_env = outbox_password_env(spec)
        if password_env:
            shared["environment"] = password_env
        if spec.notifier.outbox.password is not None and spec.notifier.outbox.password.file is not None:
            shared["secrets"] = ["notifier-token", OUTBOX_PASSWORD_SECRET]
            secrets[OUTBOX_PASSWORD_SECRET] = {"file": f"{SECRETS_DIR}/{OUTBOX_PASSWORD_SECRET}"}
        services["notifier"] = shared
        for i in range(1, spec.ha.notifier_replicas):
            name = replica_service("notifier", i)
            volumes[f"{name}-outbox"] = {}  # the data folder (the integrity check's); the outbox is PostgreSQL
            service = notifier_service(f"{name}-outbox")
            services[name] = {**service, **shared, "volumes": [*shared["volumes"], *service["volumes"][1:]],
                              "environment": {**service["environment"], **password_env}}
    override: dict = {"services": services}
    if volumes:
        override["volumes"] = volumes
    if secrets:
        override["secrets"] = secrets
    return json.loads(json.dumps(override))  # no YAML anchors for the shared parts


def notifier_service(outbox_volume: str) -> dict:
    """One notifier replica as docker-compose.yml runs the first (image, entrypoint, channels' environment,
    token secret), with its own outbox volume and no published port."""
    return {
        "image": "inferwatch:local", "restart": "unless-stopped",
        "entrypoint": ["sh", "-c", 'NOTIFIER_TOKEN="$$(cat /run/secrets/notifier-token)" exec inferwatch notifier '
                                   "--spec /etc/inferwatch/inferwatch.yaml --host 0.0.0.0 --port 9410 "
                                   "--data-dir /var/lib/inferwatch/outbox"],
        "environment": {"PAGERDUTY_ROUTING_KEY": "${PAGERDUTY_ROUTING_KEY:-}",
                        "SLACK_WEBHOOK_URL": "${SLACK_WEBHOOK_URL:-}", "WECOM_WEBHOOK_URL": "${WECOM_WEBHOOK_URL:-}"},
        "secrets": ["notifier-token"],
        "volumes": ["./inferwatch.yaml:/etc/inferwatch/inferwatch.yaml:ro",
                    f"{outbox_volume}:/var/lib/inferwatch/outbox"],
    }


def outputs(spec: Spec) -> dict[str, str]:
    """{relative path: text} for `inferwatch generate`."""
    cs = compose_spec(spec)
    head = HEADER.replace("from the spec", "from the spec (compose addresses, deploy/compose.py)")
    files = {config_path(OUT_DIR, replica): head + dump(config) for replica, config in prometheus_configs(cs).items()}
    files.update(central_outputs(spec))
    files.update({
        f"{OUT_DIR}/alertmanager.yml": alertmanager_config.render(cs),
        f"{OUT_DIR}/collector-targets.yaml": head + yaml.safe_dump(collector_targets(spec), sort_keys=False),
    })
    if _replicated(spec):
        usage = (f"# The replicas of the spec's `ha` section beside docker-compose.yml's one of each:\n"
                 f"#   docker compose -f docker-compose.yml -f {HA_FILE} up --build\n")
        files[HA_FILE] = head + usage + dump(ha_override(spec))
        if spec.ha.notifier_replicas > 1:
            files[NOTIFIER_SPEC] = (HEADER.replace("from the spec", "from the spec (compose addresses)")
                                    + "# The spec as the compose notifier replicas read it: compose addresses, "
                                    "the shared PostgreSQL outbox, secrets by reference.\n"
                                    + yaml.safe_dump(to_data(with_references(cs)), sort_keys=False, allow_unicode=True,
                                                     width=120))
    return files
