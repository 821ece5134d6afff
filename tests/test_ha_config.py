"""The HA configuration generated from a spec with replicas (examples/ha/inferwatch.ha.yaml): each Prometheus
replica's file, the Alertmanager cluster (same file, clustering flags), the compose override and the Kubernetes
objects carry the same topology and pass the real tools (promtool, amtool, Alertmanager itself, `docker
compose config`, the Kubernetes and Prometheus Operator schemas); bad `ha` settings name their field."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from ha_support import ENV, HA_SPEC, ha_spec
from inferwatch.deploy.alertmanager import peer_flags
from inferwatch.deploy.compose import HA_FILE, NOTIFIER_SPEC, WEBHOOK_ALIAS
from inferwatch.deploy.kubernetes.monitoring import VALUES_FILE
from inferwatch.generate import render_all
from inferwatch.spec import SpecError, spec_from_dict
from inferwatch.testing.alertmanager import start_alertmanager_cluster
from inferwatch.testing.process import free_port

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "tests/fixtures/kubernetes/crds"


@pytest.fixture(scope="module")
def spec():
    return ha_spec()


@pytest.fixture(scope="module")
def files(spec) -> dict[str, str]:
    return render_all(spec)


@pytest.fixture(scope="module")
def tree(files, tmp_path_factory) -> Path:
    """The generated files on disk, as `inferwatch generate --out` writes them, beside docker-compose.yml."""
    root = tmp_path_factory.mktemp("ha-out")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    shutil.copy(ROOT / "docker-compose.yml", root / "docker-compose.yml")
    (root / "inferwatch.yaml").write_text(HA_SPEC.read_text())
    return root


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} missing: make system-deps", pytrace=False)
    return path


# ------------------------------------------------------------------------------------------ Prometheus
def test_each_replica_has_its_own_file_with_its_label_dropped_from_alerts(spec, files, tree):
    names = [r.name for r in spec.ha.prometheus_replicas()]
    assert names == ["a", "b"]
    assert "deploy/prometheus/prometheus.yml" not in files
    configs = {n: yaml.safe_load(files[f"deploy/prometheus/prometheus-{n}.yml"]) for n in names}
    peers = [p.address for p in spec.ha.alertmanager_peers()]
    for name, config in configs.items():
        assert config["global"]["external_labels"] == {"replica": name}
        assert config["alerting"]["alert_relabel_configs"] == [{"action": "labeldrop", "regex": "replica"}]
        assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == peers
        jobs = {j["job_name"]: j for j in config["scrape_configs"]}
        federate = jobs["inferwatch-prometheus-alerts"]
        assert federate["honor_labels"] and federate["metrics_path"] == "/federate"
        assert [sc["labels"]["replica"] for sc in federate["static_configs"]] == names
        path = tree / f"deploy/prometheus/prometheus-{name}.yml"
        result = subprocess.run([_tool("promtool"), "check", "config", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    # The replicas differ only in their own label.
    a, b = configs["a"], configs["b"]
    b["global"]["external_labels"] = a["global"]["external_labels"]
    assert a == b


# ---------------------------------------------------------------------------------------- Alertmanager
def test_one_alertmanager_configuration_passes_amtool_and_its_peers_form_one_cluster(spec, files, tree, tmp_path):
    result = subprocess.run([_tool("amtool"), "check-config", str(tree / "deploy/alertmanager/alertmanager.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    flags = [peer_flags(spec, i) for i in range(3)]
    assert all(f"--cluster.peer={p.cluster_address}" in f for f in flags for p in spec.ha.alertmanager_peers())
    assert all("--cluster.peer-timeout=5s" in f for f in flags)
    assert [[line for line in files[f"deploy/alertmanager/cluster-flags-{i}.txt"].splitlines()
             if not line.startswith("#")] for i in range(3)] == flags
    # The real thing, on free loopback ports: three peers with the same file see each other.
    data = yaml.safe_load(HA_SPEC.read_text())
    data["ha"]["alertmanager"] = [{"address": f"127.0.0.1:{free_port()}", "cluster_address": f"127.0.0.1:{free_port()}"}
                                  for _ in range(3)]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        loopback = spec_from_dict(data)
    config = tmp_path / "alertmanager.yml"
    config.write_text((tree / "deploy/alertmanager/alertmanager.yml").read_text())
    peers = start_alertmanager_cluster(tmp_path, config, loopback, timeout=60)
    try:
        assert [p.cluster_members() for p in peers] == [3, 3, 3]
    finally:
        for p in peers:
            p.stop()


def test_notifier_webhook_sends_at_most_what_always_fits(files, spec):
    am = yaml.safe_load(files["deploy/alertmanager/alertmanager.yml"])
    hooks = [c for r in am["receivers"] for c in r.get("webhook_configs", [])]
    assert hooks and all(1 <= c["max_alerts"] < 1000 for c in hooks)
    assert {c["url"] for c in hooks} == {spec.targets.notifier + "/alerts"}


# ------------------------------------------------------------------------------------------------ compose
def _compose_cli() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor `docker-compose` is installed (make system-deps installs it)")


def test_compose_override_runs_the_same_topology(tree):
    secrets = tree / "secrets"
    secrets.mkdir(exist_ok=True)
    for name in ("notifier-token", "pagerduty-fallback-key", "grafana-admin-password"):
        (secrets / name).write_text("x\n")
    result = subprocess.run(_compose_cli() + ["-f", "docker-compose.yml", "-f", HA_FILE, "config"], cwd=tree,
                            capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin:/usr/local/bin", "INFERWATCH_SECRETS": str(secrets),
                                 "INFERWATCH_DEMO_OUTBOX_PASSWORD": "pw-from-env"})
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    peers = ["alertmanager", "alertmanager-1", "alertmanager-2"]
    assert {"prometheus", "prometheus-b", *peers, "notifier", "notifier-1"} <= set(services)
    for name in peers:
        command = services[name]["command"]
        assert "--cluster.listen-address=0.0.0.0:9094" in command
        assert {f"--cluster.peer={p}:9094" for p in peers} <= set(command)
    mounts = {n: json.dumps(services[n]["volumes"]) for n in ("prometheus", "prometheus-b")}
    assert "prometheus-a.yml" in mounts["prometheus"] and "prometheus-b.yml" in mounts["prometheus-b"]
    for name in ("notifier", "notifier-1"):
        assert WEBHOOK_ALIAS in json.dumps(services[name]["networks"])
        assert NOTIFIER_SPEC.rsplit("/", 1)[1] in json.dumps(services[name]["volumes"])
    assert services["notifier-1"]["entrypoint"] == services["notifier"]["entrypoint"]
    outboxes = [v for n in ("notifier", "notifier-1") for v in json.dumps(services[n]["volumes"]).split('"')
                if "outbox" in v and "source" not in v]
    assert len(set(outboxes)) >= 2, outboxes
    am = yaml.safe_load((tree / "deploy/compose/alertmanager.yml").read_text())
    urls = {c["url"] for r in am["receivers"] for c in r.get("webhook_configs", [])}
    assert urls == {f"http://{WEBHOOK_ALIAS}:9410/alerts"}
    notifier_spec = yaml.safe_load((tree / NOTIFIER_SPEC).read_text())
    assert [t["address"] for t in notifier_spec["targets"]["notifiers"]] == ["notifier:9410", "notifier-1:9410"]
    # One shared PostgreSQL outbox: the spec's URL, its password by reference, the value from the environment.
    assert notifier_spec["notifier"]["outbox"]["url"] == "postgresql://inferwatch@127.0.0.1:5432/inferwatch"
    assert notifier_spec["notifier"]["outbox"]["password"] == "${INFERWATCH_DEMO_OUTBOX_PASSWORD}"
    for name in ("notifier", "notifier-1"):
        assert services[name]["environment"]["INFERWATCH_DEMO_OUTBOX_PASSWORD"] == "pw-from-env"
    missing = subprocess.run(_compose_cli() + ["-f", "docker-compose.yml", "-f", HA_FILE, "config"], cwd=tree,
                             capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin:/usr/local/bin", "INFERWATCH_SECRETS": str(secrets)})
    assert missing.returncode != 0 and "INFERWATCH_DEMO_OUTBOX_PASSWORD" in missing.stderr


# --------------------------------------------------------------------------------------------- Kubernetes
def _crd(kind: str) -> dict:
    return json.loads((CRDS / f"{kind}-v1.json").read_text())


def test_kubernetes_objects_carry_the_same_topology(files, spec):
    base = {Path(rel).name: text for rel, text in files.items() if Path(rel).parent == Path("deploy/kubernetes")}
    docs = {(d["kind"], d["metadata"]["name"]): d for name in yaml.safe_load(base["kustomization.yaml"])["resources"]
            for d in yaml.safe_load_all(base[name]) if d}
    statefulset = docs[("StatefulSet", "inferwatch-notifier")]
    assert statefulset["spec"]["replicas"] == 2
    assert docs[("PodDisruptionBudget", "inferwatch-notifier")]["spec"]["maxUnavailable"] == 1
    assert statefulset["spec"]["template"]["spec"]["topologySpreadConstraints"]
    cluster_spec = yaml.safe_load(yaml.safe_load(base["spec.yaml"])["data"]["inferwatch.yaml"])
    assert cluster_spec["targets"]["notifiers"] == []  # the replicas share the outbox; they never address each other
    for name in ("inferwatch-alertmanager", "inferwatch-prometheus", "inferwatch-prometheus-alerts"):
        monitor = docs[("ServiceMonitor", name)]
        errors = list(jsonschema.Draft202012Validator(_crd("servicemonitor")).iter_errors(monitor))
        assert not errors, [e.message for e in errors]
        assert monitor["spec"]["labelValueLengthLimit"] == 1024
    federate = docs[("ServiceMonitor", "inferwatch-prometheus-alerts")]["spec"]["endpoints"][0]
    assert federate["honorLabels"] and federate["path"] == "/federate"
    values = yaml.safe_load(base[VALUES_FILE])
    prometheus, alertmanager = values["prometheus"]["prometheusSpec"], values["alertmanager"]["alertmanagerSpec"]
    assert (prometheus["replicas"], prometheus["replicaExternalLabelName"]) == (2, "prometheus_replica")
    assert (alertmanager["replicas"], alertmanager["clusterPeerTimeout"]) == (3, "5s")
    for kind, fragment in (("prometheus", prometheus), ("alertmanager", alertmanager)):
        schema = _crd(kind)
        spec_schema = {"$defs": schema["$defs"], "$ref": f"#/$defs/{kind.capitalize()}Spec"}
        errors = list(jsonschema.Draft202012Validator(spec_schema).iter_errors(fragment))
        assert not errors, [e.message for e in errors]


# ---------------------------------------------------------------------------------------- spec errors
@pytest.mark.parametrize("ha, extra, field", [
    ({"replica_label": "__replica__"}, {}, "ha.replica_label"),
    ({"prometheus": ["h:9090", "h:9090"]}, {}, "ha.prometheus[1].address"),
    ({"prometheus": ["h:9090", {"address": "g:9090", "name": "a"}]}, {}, "ha.prometheus[1].name"),
    ({"alertmanager": ["h:9093", "h:9193"]}, {}, "ha.alertmanager[1].cluster_address"),  # both default to h:9094
    ({"alertmanager": ["no-port"]}, {}, "ha.alertmanager[0].address"),
    ({"answer_wait": "10s"}, {}, "ha.answer_wait"),                                      # over half the peer timeout
    ({"notifier_replicas": 0}, {}, "ha.notifier_replicas"),
    ({"notifier_replicas": 2}, {"kubernetes": {"workloads": {"notifier": {"replicas": 3}}}},
     "kubernetes.workloads.notifier.replicas"),
    ({}, {"prometheus": {"external_labels": {"replica": "x"}}}, "ha.replica_label"),
])
def test_bad_ha_settings_name_their_field(ha, extra, field):
    with pytest.raises(SpecError) as err:
        spec_from_dict({"ha": ha, **extra})
    assert f"{field}:" in str(err.value), str(err.value)
