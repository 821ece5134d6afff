"""The central store's watcher on Kubernetes (docs/central-store-selfwatch.md), written into
deploy/central/kubernetes.yaml beside vmalert: the same watcher compose runs as `store-watcher`.

The rules on the store cannot report the store (inferwatch.deploy.central), so a small Prometheus of its own scrapes
VictoriaMetrics (the host of `central_store.url`) and vmalert (through the Service written here), evaluates only
rules/generated/centralstore.yml (VictoriaMetricsDown, VmalertDown, VmalertFailing ...) and sends to
Alertmanager directly, writing nothing to the store. On Kubernetes the cluster's edge is its own Prometheus
(deploy/kubernetes/prometheus-patch.yaml's `remoteWrite`), not a vmagent, so no vmagent job is written and the
Vmagent* alerts stay silent here.

Objects: Service `inferwatch-vmalert` (vmalert's /metrics at a stable address), ConfigMap
`inferwatch-store-watch` (prometheus.yml and centralstore.yml), Deployment `inferwatch-store-watch` (one
Prometheus, data on an emptyDir: a day of its own scrapes, lost on a reschedule, which the `for` of its
alerts outlasts). Run it where the store's failures do not take it down too (another node than
VictoriaMetrics' volume).
"""

from __future__ import annotations

import dataclasses

from inferwatch.deploy.central import watch_command, watch_prometheus_config
from inferwatch.deploy.kubernetes.workloads import metadata, selector_labels
from inferwatch.spec import Spec

NAME = "inferwatch-store-watch"
VMALERT_SERVICE = "inferwatch-vmalert"
VMALERT_PORT = 8880
# docker-compose.yml's Prometheus release, which the compose watcher runs too.
PROMETHEUS_IMAGE = "prom/prometheus:v2.53.0"
CONFIG_DIR = "/etc/prometheus"
RULES_FILE = "centralstore.yml"
DATA_DIR = "/prometheus"
# The image's user (nobody), which owns nothing in the image but the emptyDir mounted for it.
UID = 65534


def watch_spec(cs: Spec) -> Spec:
    """`cs` (the in-cluster spec) with vmalert at its Service and the cluster's Prometheus as the edge."""
    vmalert = f"{VMALERT_SERVICE}.{cs.prometheus.kubernetes_namespace}.svc:{VMALERT_PORT}"
    store = dataclasses.replace(cs.central_store, vmalert=vmalert, edge="prometheus-agent")
    return dataclasses.replace(cs, central_store=store)


def watch_config(cs: Spec) -> dict:
    """The watcher's prometheus.yml (inferwatch.deploy.central.watch_prometheus_config at in-cluster addresses)."""
    return watch_prometheus_config(watch_spec(cs), f"{CONFIG_DIR}/rules/{RULES_FILE}")


def store_watch_objects(spec: Spec, cs: Spec, centralstore_rules: str) -> list[dict]:
    """Service for vmalert, the watcher's ConfigMap and Deployment. `cs`: the spec as the pods see it
    (inferwatch.deploy.kubernetes.specfile.cluster_spec); `centralstore_rules`: rules/generated/centralstore.yml."""
    from inferwatch.rules.generate import dump

    vmalert_labels = selector_labels("vmalert")
    service = {"apiVersion": "v1", "kind": "Service", "metadata": metadata(spec, VMALERT_SERVICE, "vmalert"),
               "spec": {"selector": vmalert_labels,
                        "ports": [{"name": "http", "port": VMALERT_PORT, "targetPort": "http"}]}}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(spec, NAME, "store-watch"),
              "data": {"prometheus.yml": dump(watch_config(cs)), RULES_FILE: centralstore_rules}}
    args = watch_command(f"{CONFIG_DIR}/prometheus.yml", DATA_DIR)[1:]
    container = {
        "name": "prometheus", "image": PROMETHEUS_IMAGE, "args": args,
        "ports": [{"name": "http", "containerPort": 9090}],
        "readinessProbe": {"httpGet": {"path": "/-/ready", "port": 9090}},
        "livenessProbe": {"httpGet": {"path": "/-/healthy", "port": 9090}},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        # The whole directory, not subPath files: the kubelet then refreshes them when the ConfigMap changes.
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "data", "mountPath": DATA_DIR}],
    }
    labels = selector_labels("store-watch")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(spec, NAME, "store-watch"),
                  "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                           "template": {"metadata": {"labels": labels},
                                        "spec": {"automountServiceAccountToken": False,
                                                 "securityContext": {"fsGroup": UID},
                                                 "containers": [container],
                                                 "volumes": [{"name": "config", "configMap": {"name": NAME, "items": [
                                                     {"key": "prometheus.yml", "path": "prometheus.yml"},
                                                     {"key": RULES_FILE, "path": f"rules/{RULES_FILE}"}]}},
                                                             {"name": "data", "emptyDir": {}}]}}}}
    return [service, config, deployment]
