"""Generator for deploy/kubernetes/: a kustomize base with inferwatch's workloads, their monitors, the
AlertmanagerConfig and the dashboards, for a cluster running the Prometheus Operator (kube-prometheus-stack)
and the NVIDIA GPU Operator. Registered in `inferwatch generate`, so `--check` fails when it is stale.

The files are plain manifests listed by kustomization.yaml (no generators or patches), so any kustomize,
`kubectl apply -k` included, renders them as written, and an overlay changes the image, namespace or
resources without touching them. rules/generate.py writes prometheusrule.yaml into the same folder.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

import yaml

from inferwatch.dashboards.generate import outputs as dashboard_outputs
from inferwatch.deploy.kubernetes import monitoring, workloads
from inferwatch.deploy.kubernetes.specfile import SPEC_PATH, cluster_spec, secret_refs, to_data, triton_url
from inferwatch.rules.generate import HEADER, PROMETHEUS_RULE, dump
from inferwatch.spec import Spec

OUT_DIR = "deploy/kubernetes"


def spec_text(spec: Spec) -> str:
    """The cluster spec as the YAML the pods read (ConfigMap inferwatch-spec)."""
    return ("# The spec as the inferwatch pods read it: in-cluster addresses, secrets by reference.\n"
            + yaml.safe_dump(to_data(cluster_spec(spec)), sort_keys=False, allow_unicode=True, width=120))


def required_secrets(spec: Spec) -> dict[str, list[str]]:
    """{Secret name: keys} the manifests reference; none is generated (docs/kubernetes.md: how to create them)."""
    cs = cluster_spec(spec)
    needed = {workloads.NOTIFIER_SECRET: secret_refs(cs.channels, cs.notifier).keys,
              workloads.COLLECTOR_SECRET: secret_refs(cs.targets.triton).keys,
              monitoring.ALERTMANAGER_SECRET: [monitoring.FALLBACK_KEY]}
    auth = monitoring.alertmanager_config_object(spec)["spec"]["receivers"]
    for receiver in auth:
        for webhook in receiver.get("webhookConfigs", []):
            basic = webhook.get("httpConfig", {}).get("basicAuth")
            if basic:
                needed[workloads.NOTIFIER_SECRET] = sorted({*needed[workloads.NOTIFIER_SECRET],
                                                            basic["username"]["key"]})
    return {name: keys for name, keys in needed.items() if keys}


def documents(spec: Spec) -> dict[str, list[dict]]:
    """{file name: Kubernetes objects} of the base, prometheusrule.yaml aside."""
    text = spec_text(spec)
    cs = cluster_spec(spec)
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": workloads.metadata(spec, workloads.SPEC_CONFIGMAP, "spec"),
                 "data": {PurePosixPath(SPEC_PATH).name: text}}
    dashboards = {PurePosixPath(path).name: body for path, body in dashboard_outputs(spec).items()}
    docs = {
        "spec.yaml": [configmap],
        "gpu-exporter.yaml": workloads.gpu_exporter(spec, text),
        "gateway.yaml": workloads.gateway(spec, text, triton_url(spec)),
        "triton-collector.yaml": workloads.triton_collector(spec, text, secret_refs(cs.targets.triton)),
        "notifier.yaml": workloads.notifier(spec, text, secret_refs(cs.channels, cs.notifier)),
        "monitors.yaml": monitoring.monitors(spec),
        "alertmanagerconfig.yaml": [monitoring.alertmanager_config_object(spec)],
        "dashboards.yaml": monitoring.dashboard_configmaps(spec, dashboards),
    }
    if not spec.kubernetes.gpu_exporter:
        # dcgm-exporter is the GPU source: it is scraped by its own monitor (the GPU Operator's ServiceMonitor).
        del docs["gpu-exporter.yaml"]
    return docs


def kustomization(spec: Spec, files: list[str]) -> str:
    secrets = required_secrets(spec)
    lines = [HEADER.rstrip("\n"),
             f"# A kustomize base: `kubectl apply --server-side -k {OUT_DIR}` (namespace "
             f"{spec.prometheus.kubernetes_namespace}).",
             "# Secrets it references and does not create (kubectl create secret generic NAME --from-literal=KEY=...):"]
    lines += [f"#   {name}: {', '.join(keys)}" for name, keys in secrets.items()]
    body = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": files}
    return "\n".join(lines) + "\n" + dump(body)


def outputs(spec: Spec) -> dict[str, str]:
    """{relative path: text} for `inferwatch generate`."""
    # Through JSON first: objects the builders share (a probe) would otherwise become YAML anchors/aliases.
    files = {f"{OUT_DIR}/{name}": HEADER + "---\n".join(dump(json.loads(json.dumps(doc))) for doc in docs)
             for name, docs in documents(spec).items()}
    resources = sorted(PurePosixPath(p).name for p in [*files, PROMETHEUS_RULE])
    files[f"{OUT_DIR}/kustomization.yaml"] = kustomization(spec, resources)
    # Not a resource of the base: the values of the chart that runs Prometheus and Alertmanager.
    files[f"{OUT_DIR}/{monitoring.VALUES_FILE}"] = (
        HEADER + f"# Values for kube-prometheus-stack (helm upgrade --install kube-prometheus-stack "
                 f"prometheus-community/kube-prometheus-stack\n#   -n {spec.prometheus.kubernetes_namespace} "
                 f"-f {OUT_DIR}/{monitoring.VALUES_FILE}): replicas and clustering from the spec's `ha` section.\n"
        + dump(monitoring.stack_values(spec)))
    return files
