"""The central-store configuration `inferwatch generate` writes (inferwatch.deploy.central), checked by the real tools:
Prometheus in agent mode starts on edge-prometheus.yml and promtool accepts it, vmagent accepts
edge-scrape.yml, vmalert accepts every generated rule file (with and without the cluster label) — the same
files promtool accepts for a plain Prometheus (tests/test_rules.py) — and the spec refuses a central store
without a cluster name. The end-to-end run is tests/test_central_store.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.deploy.central import COMMANDS, EDGE_PROMETHEUS, EDGE_SCRAPE, WATCH_PROMETHEUS, outputs
from inferwatch.generate import render_all
from inferwatch.rules.generate import RULES_DIR
from inferwatch.spec import SpecError, spec_from_dict
from inferwatch.testing.process import ManagedProcess, free_port, http_ok

REPO = Path(__file__).resolve().parents[1]


def tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found; install it with: apt-get install -y victoria-metrics prometheus "
                    f"(or make test)", pytrace=False)
    return path


def spec(edge: str = "vmagent", **extra):
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    return spec_from_dict({**raw, "cluster": {"name": "eu-1"},
                           "central_store": {"url": "http://victoria-metrics:8428", "edge": edge}, **extra})


def write(files: dict[str, str], root: Path) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_nothing_without_a_central_store_and_a_cluster_name_is_required():
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    assert outputs(spec_from_dict(raw)) == {}
    with pytest.raises(SpecError) as exc:
        spec_from_dict({**raw, "central_store": {"url": "http://vm:8428"}})
    assert exc.value.path == "cluster.name"
    with pytest.raises(SpecError) as exc:
        spec_from_dict({**raw, "cluster": {"name": "a"}, "central_store": {"url": "http://vm:8428", "edge": "x"}})
    assert exc.value.path == "central_store.edge"


def test_vmagent_edge_config_and_command(tmp_path):
    files = outputs(spec("vmagent"))
    assert set(files) == {EDGE_SCRAPE, COMMANDS, WATCH_PROMETHEUS}
    commands = yaml.safe_load(files[COMMANDS])
    assert "-remoteWrite.url=http://victoria-metrics:8428/api/v1/write" in commands["edge"]
    assert "-remoteWrite.label=cluster=eu-1" in commands["edge"]
    assert commands["vmalert"][:2] == ["vmalert", "-rule=rules/generated/*.yml"]
    root = write(files, tmp_path)
    out = subprocess.run([tool("vmagent"), f"-promscrape.config={root / EDGE_SCRAPE}", "-dryRun",
                          "-loggerLevel=ERROR"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_agent_mode_prometheus_runs_the_edge_config(tmp_path):
    files = outputs(spec("prometheus-agent"))
    assert set(files) == {EDGE_PROMETHEUS, COMMANDS, WATCH_PROMETHEUS}
    config = yaml.safe_load(files[EDGE_PROMETHEUS])
    assert config["global"]["external_labels"] == {"cluster": "eu-1"}
    assert config["remote_write"] == [{"url": "http://victoria-metrics:8428/api/v1/write"}]
    root = write(files, tmp_path)
    check = subprocess.run([tool("promtool"), "check", "config", "--agent", str(root / EDGE_PROMETHEUS)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    argv = yaml.safe_load(files[COMMANDS])["edge"]
    argv = [tool("prometheus"), *argv[1:]]
    argv = [a.replace(EDGE_PROMETHEUS, str(root / EDGE_PROMETHEUS)).replace("/var/lib/", f"{tmp_path}/") for a in argv]
    proc = ManagedProcess("prometheus-agent", [*argv, f"--web.listen-address=127.0.0.1:{port}"],
                          tmp_path / "agent.log", ready=lambda: http_ok(f"http://127.0.0.1:{port}/-/ready"))
    with proc:
        assert proc.running


@pytest.mark.parametrize("cluster", [None, "eu-1"])
def test_vmalert_accepts_the_generated_rule_files(tmp_path, cluster):
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    if cluster:
        raw["cluster"] = {"name": cluster}
    files = {k: v for k, v in render_all(spec_from_dict(raw)).items() if k.startswith(RULES_DIR)}
    root = write(files, tmp_path)
    out = subprocess.run([tool("vmalert"), f"-rule={root / RULES_DIR}/*.yml", "-dryRun", "-loggerLevel=ERROR"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_kubernetes_prometheus_patch_and_vmalert(tmp_path):
    """The Prometheus custom resource gets the cluster as an external label (and, with a central store, the
    store as remote write): kube-prometheus-stack's Prometheus `spec.externalLabels` / `spec.remoteWrite`;
    vmalert's Deployment and rules ConfigMap validate against the Kubernetes schemas."""
    import kubernetes_validate

    from inferwatch.deploy.kubernetes.clusters import CENTRAL, PROMETHEUS_PATCH

    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    only_cluster = render_all(spec_from_dict({**raw, "cluster": {"name": "eu-1"}}))
    assert yaml.safe_load(only_cluster[PROMETHEUS_PATCH]) == {"spec": {"externalLabels": {"cluster": "eu-1"}}}
    assert CENTRAL not in only_cluster
    assert PROMETHEUS_PATCH not in render_all(spec_from_dict(raw))
    files = render_all(spec("vmagent"))
    assert yaml.safe_load(files[PROMETHEUS_PATCH]) == {"spec": {
        "externalLabels": {"cluster": "eu-1"}, "remoteWrite": [{"url": "http://victoria-metrics:8428/api/v1/write"}]}}
    docs = list(yaml.safe_load_all(files[CENTRAL]))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service", "ConfigMap", "Deployment"]
    for doc in docs:
        for version in ("1.30", "1.37"):
            kubernetes_validate.validate(doc, version, strict=True)
    rules = {k.rsplit("/", 1)[-1]: v for k, v in files.items() if k.startswith(RULES_DIR)}
    assert docs[0]["data"] == rules
    args = docs[1]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "-rule=/etc/vmalert/rules/*.yml" in args and "-datasource.url=http://victoria-metrics:8428" in args
    assert "-notifier.url=http://alertmanager-operated.monitoring.svc:9093" in args


# (edge, the watcher's targets). On Kubernetes the edge is the cluster's Prometheus (remoteWrite of
# prometheus-patch.yaml) whatever central_store.edge says, so no vmagent job is written there.
WATCH_ROWS = [
    ("vmagent", {"inferwatch-victoriametrics": "victoria-metrics:8428",
                 "inferwatch-vmalert": "inferwatch-vmalert.monitoring.svc:8880"}),
    ("prometheus-agent", {"inferwatch-victoriametrics": "victoria-metrics:8428",
                          "inferwatch-vmalert": "inferwatch-vmalert.monitoring.svc:8880"}),
]


@pytest.mark.parametrize("edge, targets", WATCH_ROWS)
def test_kubernetes_runs_the_store_watcher_compose_runs(tmp_path, edge, targets):
    """deploy/central/kubernetes.yaml holds the store's watcher (deploy/kubernetes/storewatch.py): a
    Prometheus scraping VictoriaMetrics and vmalert (through its new Service), evaluating centralstore.yml
    and sending to the in-cluster Alertmanager; promtool accepts its configuration and rules as mounted."""
    from inferwatch.deploy.kubernetes.clusters import CENTRAL

    files = render_all(spec(edge))
    docs = list(yaml.safe_load_all(files[CENTRAL]))
    vmalert_pods = docs[1]["spec"]["template"]["metadata"]["labels"]
    service, config, watcher = docs[2:]
    assert service["metadata"]["name"] == "inferwatch-vmalert"
    assert service["spec"]["selector"].items() <= vmalert_pods.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"  # vmalert's named container port
    assert "http" in {p["name"] for p in docs[1]["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert config["data"]["centralstore.yml"] == files[f"{RULES_DIR}/centralstore.yml"]
    prom = yaml.safe_load(config["data"]["prometheus.yml"])
    assert {j["job_name"]: j["static_configs"][0]["targets"][0] for j in prom["scrape_configs"]} == targets
    assert prom["rule_files"] == ["/etc/prometheus/rules/centralstore.yml"]
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager-operated.monitoring.svc:9093"]
    assert "remote_write" not in prom  # it writes nothing to the store it watches
    pod = watcher["spec"]["template"]["spec"]
    items = {i["key"]: i["path"] for i in pod["volumes"][0]["configMap"]["items"]}
    mount = pod["containers"][0]["volumeMounts"][0]["mountPath"]
    assert pod["volumes"][0]["configMap"]["name"] == config["metadata"]["name"]
    assert {f"{mount}/{path}" for path in items.values()} == {"/etc/prometheus/prometheus.yml",
                                                              "/etc/prometheus/rules/centralstore.yml"}
    assert "--config.file=/etc/prometheus/prometheus.yml" in pod["containers"][0]["args"]
    # promtool on the files as the pod mounts them (the rule path moved under tmp_path).
    for key, path in items.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(config["data"][key])
    prom["rule_files"] = [str(tmp_path / items["centralstore.yml"])]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))
    check = subprocess.run([tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    rules = yaml.safe_load(config["data"]["centralstore.yml"])
    names = {r.get("alert") for g in rules["groups"] for r in g["rules"]}
    assert {"VictoriaMetricsDown", "VmalertDown", "VmagentDown"} <= names


def test_compose_override_for_the_central_store(tmp_path):
    """deploy/compose/central.yml adds VictoriaMetrics, vmagent (scraping the compose services as the
    cluster) and vmalert; `docker-compose config` accepts it on top of docker-compose.yml."""
    from inferwatch.deploy.compose import OUT_DIR

    files = render_all(spec("vmagent"))
    override = yaml.safe_load(files[f"{OUT_DIR}/central.yml"])
    assert set(override["services"]) == {"victoria-metrics", "vmagent", "vmalert", "store-watcher"}
    watch = yaml.safe_load(files[f"{OUT_DIR}/watch-prometheus.yml"])
    assert {t for job in watch["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]} == {
        "victoria-metrics:8428", "vmalert:8880", "vmagent:8429"}
    assert watch["rule_files"] == ["/etc/prometheus/rules/centralstore.yml"]
    assert watch["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert "-remoteWrite.label=cluster=eu-1" in override["services"]["vmagent"]["command"]
    assert "-notifier.url=http://alertmanager:9093" in override["services"]["vmalert"]["command"]
    scrape = yaml.safe_load(files[f"{OUT_DIR}/edge-scrape.yml"])
    targets = {t for job in scrape["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert "gpu-exporter:9400" in targets and "triton:8002" in targets
    cli = shutil.which("docker-compose")
    if not cli:
        pytest.skip("docker-compose not installed (make system-deps installs it)")
    (tmp_path / "central.yml").write_text(files[f"{OUT_DIR}/central.yml"])
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for name in ("notifier-token", "pagerduty-fallback-key", "grafana-admin-password"):
        (secrets / name).write_text("x\n")
    out = subprocess.run([cli, "-f", str(REPO / "docker-compose.yml"), "-f", str(tmp_path / "central.yml"), "config"],
                         capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin:/usr/local/bin", "INFERWATCH_SECRETS": str(secrets)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"victoria-metrics", "vmagent", "vmalert", "prometheus"} <= set(yaml.safe_load(out.stdout)["services"])
