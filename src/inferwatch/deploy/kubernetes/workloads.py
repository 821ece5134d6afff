"""The inferwatch workloads as Kubernetes objects: GPU exporter DaemonSet, gateway Deployment (Service,
HorizontalPodAutoscaler, PodDisruptionBudget), Triton collector Deployment, notifier StatefulSet with a
PersistentVolumeClaim per replica for its outbox.

Every container runs from one image (the Dockerfile's, entrypoint `inferwatch`) with a read-only root
filesystem, no capabilities, no privilege escalation, requests and limits, and the spec from the
`inferwatch-spec` ConfigMap; secrets come from Secrets that are referenced, never generated. The one
exception to non-root is the GPU exporter with pod attribution on: the kubelet's pod-resources socket
is root's (0755 on the host), so connecting to it needs uid 0 (still without any capability).
"""

from __future__ import annotations

import hashlib
from typing import Any

from inferwatch.deploy.kubernetes.specfile import NOTIFIER_PORT, OUTBOX_DIR, SPEC_DIR, SPEC_PATH, SecretRefs
from inferwatch.spec import Spec

PART_OF = "inferwatch"
UID = 10001  # the Dockerfile's user
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
SPEC_CONFIGMAP = "inferwatch-spec"
# component -> (object name, metrics port, source: the spec selector its series are picked by)
COMPONENTS = {
    "gpu-exporter": ("inferwatch-gpu-exporter", 9400, "gpu"),
    "gateway": ("inferwatch-gateway", 9402, "gateway"),
    "triton-collector": ("inferwatch-triton-collector", 9401, "triton_collector"),
    "notifier": ("inferwatch-notifier", NOTIFIER_PORT, "notifier"),
}
GATEWAY_PORT = 8080
# Secrets the user creates (docs/kubernetes.md, step 4): one per pod that needs any, so each pod sees only its own.
NOTIFIER_SECRET = "inferwatch-notifier"  # noqa: S105 - Secret objects' names
COLLECTOR_SECRET = "inferwatch-triton-collector"  # noqa: S105


def name_of(component: str) -> str:
    return COMPONENTS[component][0]


def selector_labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "inferwatch", "app.kubernetes.io/component": component}


def metadata(spec: Spec, name: str, component: str, labels: dict[str, str] | None = None) -> dict:
    return {"name": name, "namespace": spec.prometheus.kubernetes_namespace,
            "labels": {**selector_labels(component), "app.kubernetes.io/part-of": PART_OF, **(labels or {})}}


def spec_checksum(spec_text: str) -> str:
    return hashlib.sha256(spec_text.encode("utf-8")).hexdigest()


def _probe(port: int, path: str | None = None) -> dict:
    action = {"httpGet": {"path": path, "port": port}} if path else {"tcpSocket": {"port": port}}
    return {**action, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}


def _secret_env(secret: str, refs: SecretRefs) -> list[dict]:
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var}}} for var in refs.env]


def _secret_mounts(refs: SecretRefs) -> list[dict]:
    # One subPath mount per file, at the exact path the spec names (the rest of that directory stays empty).
    return [{"name": "secrets", "mountPath": path, "subPath": key, "readOnly": True} for path, key in refs.files]


def container(spec: Spec, component: str, args: list[str], ports: dict[str, int], *,
              env: list[dict] | None = None, mounts: list[dict] | None = None, probe: dict,
              run_as_root: bool = False) -> dict:
    """The inferwatch container of `component`: hardened, resourced, the spec mounted at SPEC_DIR."""
    k = spec.kubernetes
    security = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]}}
    if run_as_root:
        security.update(runAsNonRoot=False, runAsUser=0)
    return {
        "name": component,
        "image": k.image,
        "imagePullPolicy": k.image_pull_policy,
        "args": args,
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports.items()],
        "env": list(env or []),
        "resources": k.workload(component).resources,
        "securityContext": security,
        "readinessProbe": probe,
        "livenessProbe": {**probe, "initialDelaySeconds": 10},
        "volumeMounts": [{"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}, *(mounts or [])],
    }


def pod_template(spec: Spec, spec_text: str, component: str, main: dict, *, volumes: list[dict] | None = None,
                 secret: str | None = None, **extra) -> dict:
    """Pod template around `main`: non-root pod security context, no service-account token, spec volume."""
    security = {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                "seccompProfile": {"type": "RuntimeDefault"}}
    if main["securityContext"].get("runAsUser") == 0:
        security = {"seccompProfile": {"type": "RuntimeDefault"}}
    vols = [{"name": "spec", "configMap": {"name": SPEC_CONFIGMAP}}, {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    if secret is not None:
        vols.append({"name": "secrets", "secret": {"secretName": secret}})
    return {
        "metadata": {"labels": selector_labels(component),
                     # A changed spec changes this annotation, so `kubectl apply` rolls the pods onto it.
                     "annotations": {"inferwatch.io/spec-sha256": spec_checksum(spec_text)}},
        "spec": {"automountServiceAccountToken": False, "securityContext": security,
                 "containers": [main], "volumes": vols + list(volumes or []), **extra},
    }


def service(spec: Spec, component: str, ports: dict[str, int], *, name: str | None = None,
            headless: bool = False) -> dict:
    body: dict = {"selector": selector_labels(component),
                  "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports.items()]}
    if headless:
        body["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(spec, name or name_of(component), component), "spec": body}


# ---------------------------------------------------------------------------------------------- workloads
def gpu_exporter(spec: Spec, spec_text: str) -> list[dict]:
    k = spec.kubernetes
    component, (name, port, _source) = "gpu-exporter", COMPONENTS["gpu-exporter"]
    env: list[dict] = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           # The NVIDIA container runtime then injects NVML and every GPU's device node without the pod
           # reserving a GPU (a monitoring pod must not take a GPU away from Triton).
           {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
           {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}]
    mounts, volumes = [], []
    if k.pod_resources:
        mounts.append({"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True})
        volumes.append({"name": "pod-resources", "hostPath": {"path": POD_RESOURCES_DIR, "type": "Directory"}})
    main = container(spec, component, ["exporter", "gpu", "--spec", SPEC_PATH, "--host", "0.0.0.0", "--port", str(port),
                                       "--nvml", "real"],
                     {"metrics": port}, env=env, mounts=mounts, probe=_probe(port), run_as_root=k.pod_resources)
    extra: dict = {"nodeSelector": dict(k.gpu_node_selector), "tolerations": [dict(t) for t in k.gpu_tolerations]}
    if k.gpu_runtime_class:
        extra["runtimeClassName"] = k.gpu_runtime_class
    return [{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": metadata(spec, name, component),
        "spec": {"selector": {"matchLabels": selector_labels(component)},
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                 "template": pod_template(spec, spec_text, component, main, volumes=volumes, **extra)},
    }]


def gateway(spec: Spec, spec_text: str, upstream: str) -> list[dict]:
    k = spec.kubernetes
    component, (name, port, _source) = "gateway", COMPONENTS["gateway"]
    replicas = k.workload(component).replicas
    main = container(spec, component, ["exporter", "gateway", "--upstream", upstream, "--host", "0.0.0.0",
                                       "--port", str(GATEWAY_PORT), "--metrics-port", str(port), "--spec", SPEC_PATH],
                     {"http": GATEWAY_PORT, "metrics": port}, probe=_probe(GATEWAY_PORT))
    spread = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": selector_labels(component)}}]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(spec, name, component),
        # No `replicas`: the autoscaler owns it (a value here would be reset by every `kubectl apply`).
        "spec": {"selector": {"matchLabels": selector_labels(component)},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                 "template": pod_template(spec, spec_text, component, main, topologySpreadConstraints=spread)},
    }
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": metadata(spec, name, component),
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                 "minReplicas": replicas, "maxReplicas": k.gateway_max_replicas,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                     "type": "Utilization", "averageUtilization": k.gateway_target_cpu_percent}}}]},
    }
    pdb = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata(spec, name, component),
        # A drain takes one gateway at a time; with a single replica it may still take that one.
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(component)}},
    }
    return [deployment, service(spec, component, {"http": GATEWAY_PORT, "metrics": port}), hpa, pdb]


def triton_collector(spec: Spec, spec_text: str, refs: SecretRefs) -> list[dict]:
    component, (name, port, _source) = "triton-collector", COMPONENTS["triton-collector"]
    main = container(spec, component, ["exporter", "triton", "--spec", SPEC_PATH, "--host", "0.0.0.0",
                                       "--port", str(port)],
                     {"metrics": port}, env=_secret_env(COLLECTOR_SECRET, refs), mounts=_secret_mounts(refs),
                     probe=_probe(port))
    secret = COLLECTOR_SECRET if refs.files else None
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(spec, name, component),
        "spec": {"replicas": spec.kubernetes.workload(component).replicas,
                 "selector": {"matchLabels": selector_labels(component)},
                 "template": pod_template(spec, spec_text, component, main, secret=secret)},
    }
    return [deployment, service(spec, component, {"metrics": port})]


def notifier_replicas(spec: Spec) -> int:
    """The notifier StatefulSet's replicas: `kubernetes.workloads.notifier.replicas` when set, else
    `ha.notifier_replicas` (Spec validation refuses the two set differently)."""
    given = spec.kubernetes.workloads.get("notifier")
    return given.replicas if given is not None and given.replicas else spec.ha.notifier_replicas


def notifier(spec: Spec, spec_text: str, refs: SecretRefs) -> list[dict]:
    k = spec.kubernetes
    component, (name, port, _source) = "notifier", COMPONENTS["notifier"]
    replicas = notifier_replicas(spec)
    env = [{"name": "INFERWATCH_SPEC", "value": SPEC_PATH}, *_secret_env(NOTIFIER_SECRET, refs)]
    main = container(spec, component, ["notifier", "--spec", SPEC_PATH, "--host", "0.0.0.0", "--port", str(port),
                                       "--data-dir", OUTBOX_DIR],
                     {"http": port}, env=env,
                     mounts=[{"name": "outbox", "mountPath": OUTBOX_DIR}, *_secret_mounts(refs)],
                     probe=_probe(port, "/-/ready"))
    main["livenessProbe"] = {**_probe(port, "/-/healthy"), "initialDelaySeconds": 10}
    secret = NOTIFIER_SECRET if refs.files else None
    claim: dict[str, Any] = {"metadata": {"name": "outbox"},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": k.notifier_storage}}}}
    if k.storage_class:
        claim["spec"]["storageClassName"] = k.storage_class
    extra: dict = {"terminationGracePeriodSeconds": 30}
    if replicas > 1:
        # Replicas on different nodes: a node's loss takes one outbox, not the webhook address.
        extra["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                               "whenUnsatisfiable": "ScheduleAnyway",
                                               "labelSelector": {"matchLabels": selector_labels(component)}}]
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata(spec, name, component),
        "spec": {"serviceName": f"{name}-headless", "replicas": replicas,
                 "selector": {"matchLabels": selector_labels(component)},
                 # Keep the outbox when the StatefulSet is scaled down or deleted: it may hold undelivered pages.
                 "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                 "template": pod_template(spec, spec_text, component, main, secret=secret, **extra),
                 "volumeClaimTemplates": [claim]},
    }
    out = [statefulset, service(spec, component, {"http": port}),
           service(spec, component, {"http": port}, name=f"{name}-headless", headless=True)]
    if replicas > 1:
        # A drain takes one replica at a time: the Service keeps answering Alertmanager through the others.
        out.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": metadata(spec, name, component),
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(component)}}})
    return out
