"""Generator for the docker-compose stack (docker-compose.yml): Prometheus and Alertmanager configuration and
the Triton collector's targets, from the spec with every address replaced by a compose service name.

Only `targets` (and the paths containers see) differ from the spec: thresholds, windows, routes and grouping
are the spec's own, so the compose stack alerts exactly as `inferwatch generate` says, and `--check` fails
when a spec change is not regenerated here too. The service names and ports below are docker-compose.yml's;
tests/test_dashboards_compose.py checks they agree with what `docker compose config` reports.
"""

from __future__ import annotations

import dataclasses

import yaml

from inferwatch.notifier import alertmanager_config
from inferwatch.rules.generate import HEADER, dump
from inferwatch.rules.promconfig import prometheus_config
from inferwatch.spec import ExporterTarget, Spec, TritonTarget

OUT_DIR = "deploy/compose"
NODE = "compose"  # the single Docker host: every target's `node` label
# service -> port, as docker-compose.yml declares them (container ports, reached on the compose network).
SERVICES = {"triton": 8000, "prometheus": 9090, "alertmanager": 9093, "notifier": 9410, "gpu-exporter": 9400,
            "triton-collector": 9401, "gateway": 9402, "grafana": 3000}
TRITON_NAME = "triton-0"
# Where docker-compose.yml mounts things inside the containers.
RULES_IN_CONTAINER = "/etc/prometheus/rules/*.yml"
SECRETS_IN_CONTAINER = "/run/secrets"


def _addr(service: str) -> str:
    return f"{service}:{SERVICES[service]}"


def compose_spec(spec: Spec) -> Spec:
    """`spec` with compose addresses and container paths; everything else untouched."""
    targets = dataclasses.replace(
        spec.targets,
        prometheus=f"http://{_addr('prometheus')}", alertmanager=f"http://{_addr('alertmanager')}",
        notifier=f"http://{_addr('notifier')}",
        triton=[TritonTarget(name=TRITON_NAME, url="http://triton:8000", metrics_url="http://triton:8002/metrics",
                             node=NODE)],
        gpu_exporters=[ExporterTarget(_addr("gpu-exporter"), NODE)],
        triton_collectors=[_addr("triton-collector")],
        gateways=[ExporterTarget(_addr("gateway"), NODE)],
        notifiers=[ExporterTarget(_addr("notifier"), NODE)])
    prometheus = dataclasses.replace(spec.prometheus, rule_files=[RULES_IN_CONTAINER])
    notifier = dataclasses.replace(
        spec.notifier, token_file=f"{SECRETS_IN_CONTAINER}/notifier-token",
        fallback_routing_key_file=f"{SECRETS_IN_CONTAINER}/pagerduty-fallback-key")
    return dataclasses.replace(spec, targets=targets, prometheus=prometheus, notifier=notifier)


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
    vmalert (the rules, notifying the compose Alertmanager), with inferwatch.central's command lines:
    `docker compose -f docker-compose.yml -f deploy/compose/central.yml up`. Grafana can then use
    http://victoria-metrics:8428 as its Prometheus data source."""
    from inferwatch.central import edge_command, edge_scrape_config, vmalert_command

    if not spec.central_store.enabled:
        return {}
    store = "http://victoria-metrics:8428"
    cs = compose_spec(spec)
    cs = dataclasses.replace(cs, central_store=dataclasses.replace(cs.central_store, url=store, edge="vmagent"))
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
    }
    head = HEADER.replace("from the spec", "from the spec (central store, inferwatch/compose.py)")
    override = {"services": services, "volumes": {"victoria-metrics-data": {}}}
    return {f"{OUT_DIR}/central.yml": head + dump(override),
            f"{OUT_DIR}/edge-scrape.yml": head + dump(edge_scrape_config(cs))}


def outputs(spec: Spec) -> dict[str, str]:
    """{relative path: text} for `inferwatch generate`."""
    cs = compose_spec(spec)
    head = HEADER.replace("from the spec", "from the spec (compose addresses, inferwatch/compose.py)")
    return {**central_outputs(spec),
        f"{OUT_DIR}/prometheus.yml": head + dump(prometheus_config(cs)),
        f"{OUT_DIR}/alertmanager.yml": alertmanager_config.render(cs),
        f"{OUT_DIR}/collector-targets.yaml": head + yaml.safe_dump(collector_targets(spec), sort_keys=False),
    }
