"""Several clusters on Kubernetes (spec `cluster`, `central_store`; docs/several-clusters.md), written beside
the kustomize base, not into it (they change objects inferwatch does not own, or run centrally):

- prometheus-patch.yaml: a merge patch for kube-prometheus-stack's Prometheus custom resource, setting
  `spec.externalLabels` to the cluster's name (the operator writes it into Prometheus' external labels) and,
  with a central store, `spec.remoteWrite` to it:
  `kubectl -n <ns> patch prometheus <name> --type merge --patch-file deploy/kubernetes/prometheus-patch.yaml`
  (or the chart's `prometheus.prometheusSpec.externalLabels` / `remoteWrite` values, the same fields);
- with a central store, deploy/central/kubernetes.yaml: vmalert (Deployment, the generated rule files as a
  ConfigMap) evaluating the rules on VictoriaMetrics (`central_store.url`, run by its own chart or operator)
  and notifying Alertmanager, with the command line of inferwatch.deploy.central, and the store's watcher
  (inferwatch.deploy.kubernetes.storewatch).
"""

from __future__ import annotations

from inferwatch.deploy.central import vmalert_command
from inferwatch.deploy.kubernetes.specfile import cluster_spec
from inferwatch.deploy.kubernetes.workloads import metadata
from inferwatch.rules.generate import RULES_DIR
from inferwatch.spec import Spec

PROMETHEUS_PATCH = "deploy/kubernetes/prometheus-patch.yaml"
CENTRAL = "deploy/central/kubernetes.yaml"
VMALERT_IMAGE = "victoriametrics/vmalert:v1.79.5"  # the Debian package's release, which the tests run
RULES_MOUNT = "/etc/vmalert/rules"


def prometheus_patch(spec: Spec) -> dict:
    """The Prometheus custom resource's fields for this cluster (monitoring.coreos.com/v1 Prometheus)."""
    patch: dict = {"externalLabels": spec.external_labels}
    if spec.central_store.enabled:
        patch["remoteWrite"] = [{"url": spec.central_store.write_url}]
    return {"spec": patch}


def vmalert_objects(spec: Spec, rule_files: dict[str, str]) -> list[dict]:
    """ConfigMap of the rule files and vmalert's Deployment (in-cluster Alertmanager address)."""
    cs = cluster_spec(spec)
    rules = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(spec, "inferwatch-vmalert-rules", "vmalert"),
             "data": {name.rsplit("/", 1)[-1]: text for name, text in sorted(rule_files.items())}}
    args = vmalert_command(cs, f"{RULES_MOUNT}/*.yml")[1:]
    container = {
        "name": "vmalert", "image": VMALERT_IMAGE, "args": args + ["-httpListenAddr=:8880"],
        "ports": [{"name": "http", "containerPort": 8880}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": 8880}},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "rules", "mountPath": RULES_MOUNT, "readOnly": True}],
    }
    labels = {"app.kubernetes.io/name": "inferwatch", "app.kubernetes.io/component": "vmalert"}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": metadata(spec, "inferwatch-vmalert", "vmalert"),
                  "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                           "template": {"metadata": {"labels": labels},
                                        "spec": {"containers": [container],
                                                 "volumes": [{"name": "rules", "configMap": {
                                                     "name": "inferwatch-vmalert-rules"}}]}}}}
    from inferwatch.deploy.kubernetes.storewatch import RULES_FILE, store_watch_objects

    watched = next(text for name, text in rule_files.items() if name.rsplit("/", 1)[-1] == RULES_FILE)
    return [rules, deployment, *store_watch_objects(spec, cs, watched)]


def outputs(spec: Spec, rule_files: dict[str, str]) -> dict[str, list[dict]]:
    """{path: objects}; nothing without a cluster name. `rule_files`: {rules/generated/<f>.yml: text}."""
    if not spec.cluster.enabled:
        return {}
    out = {PROMETHEUS_PATCH: [prometheus_patch(spec)]}
    if spec.central_store.enabled:
        out[CENTRAL] = vmalert_objects(spec, {k: v for k, v in rule_files.items() if k.startswith(RULES_DIR)})
    return out


def generated(spec: Spec) -> dict[str, str]:
    """{relative path: text} for `inferwatch generate` (registered on its own, beside the kustomize base)."""
    import json

    from inferwatch.rules.generate import HEADER, dump
    from inferwatch.rules.generate import outputs as rule_outputs

    files = {}
    for path, docs in outputs(spec, rule_outputs(spec)).items():
        # Through JSON first: shared objects would otherwise become YAML anchors/aliases.
        files[path] = HEADER + "---\n".join(dump(json.loads(json.dumps(doc))) for doc in docs)
    return files
