"""Kubernetes next to the monitors a kube-prometheus-stack user already runs:

- `kubernetes.triton.monitor: false`: no Triton ServiceMonitor is generated (the user's own scrapes the pods:
  a second would scrape them twice), and the Triton selector defaults to the Service's namespace and service
  labels the operator gives the user's monitor's targets, in rules as in the monitors' relabelings;
- the kube-prometheus-stack values keep the release's replica label (the chart's `prometheus_replica` unless
  the spec names another), and the replicas' federated alerts drop it so their copies differ only in
  `replica` (rules/ha.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ha_support import ha_spec
from inferwatch.deploy.kubernetes.monitoring import VALUES_FILE
from inferwatch.generate import render_all
from inferwatch.spec import SpecError, spec_from_dict

REPO = Path(__file__).resolve().parents[1]


def _raw(**kubernetes) -> dict:
    data = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    if kubernetes:
        data["kubernetes"] = {**data.get("kubernetes", {}), **kubernetes}
    return data


def _objects(files: dict[str, str]) -> dict[tuple[str, str], dict]:
    base = {Path(rel).name: text for rel, text in files.items() if Path(rel).parent == Path("deploy/kubernetes")}
    return {(d["kind"], d["metadata"]["name"]): d for name in yaml.safe_load(base["kustomization.yaml"])["resources"]
            for d in yaml.safe_load_all(base[name]) if d}


@pytest.mark.parametrize("monitor, selector, generated, want_selector", [
    (True, None, True, 'job="triton"'),                                       # as before: ours, our job
    (False, None, False, 'namespace="serving", service="triton-inference"'),  # the user's: its Service's labels
    (False, 'job="my-triton"', False, 'job="my-triton"'),                     # a selector given is kept
])
def test_own_triton_monitor_switch(monitor, selector, generated, want_selector):
    data = _raw(triton={"namespace": "serving", "service": "triton-inference", "monitor": monitor})
    if selector:
        data["selectors"] = {"triton": selector}
    spec = spec_from_dict(data)
    assert spec.selectors.triton == want_selector
    files = render_all(spec)
    objects = _objects(files)
    assert (("ServiceMonitor", "inferwatch-triton-server") in objects) is generated
    triton_rules = files["rules/generated/triton.yml"]
    assert f"up{{{want_selector}}}" in triton_rules, "TritonServerDown reads the user's job"


def test_stack_values_keep_the_release_replica_label():
    default = yaml.safe_load(render_all(spec_from_dict(_raw()))[f"deploy/kubernetes/{VALUES_FILE}"])
    assert default["prometheus"]["prometheusSpec"]["replicaExternalLabelName"] == "prometheus_replica"
    given = yaml.safe_load(render_all(spec_from_dict(_raw(prometheus_replica_label="cluster_replica")))
                           [f"deploy/kubernetes/{VALUES_FILE}"])
    assert given["prometheus"]["prometheusSpec"]["replicaExternalLabelName"] == "cluster_replica"
    with pytest.raises(SpecError) as err:
        spec_from_dict(_raw(prometheus_replica_label="prometheus-replica"), "s.yaml")
    assert "s.yaml: kubernetes.prometheus_replica_label: expected a label name" in str(err.value)


def test_federated_alerts_drop_the_stack_replica_label():
    federate = _objects(render_all(ha_spec()))[("ServiceMonitor", "inferwatch-prometheus-alerts")]
    endpoint = federate["spec"]["endpoints"][0]
    assert endpoint["metricRelabelings"] == [{"action": "labeldrop", "regex": "prometheus_replica"}]
    assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "replica"} \
        in endpoint["relabelings"]
