"""Test support: selectors as the Prometheus Operator labels series (a PodMonitor's job is
`<namespace>/<name>`; a ServiceMonitor's targets carry `namespace` and `service`), and the repository's spec
with a given `selectors` section."""

from __future__ import annotations

from pathlib import Path

import yaml

from inferwatch.spec import Spec, spec_from_dict

REPO = Path(__file__).resolve().parents[1]
# The GPU Operator's dcgm-exporter and a Triton Service (the two examples) first.
OPERATOR = {
    "gpu": 'job="gpu-operator/nvidia-dcgm-exporter"',
    "triton": 'namespace="triton", service="triton-metrics"',
    "triton_collector": 'namespace="monitoring", service="inferwatch-triton-collector"',
    "gateway": 'namespace="monitoring", service="inferwatch-gateway"',
    "notifier": 'namespace="monitoring", service="inferwatch-notifier"',
    # kube-prometheus-stack's own Services in front of its Alertmanager and Prometheus pods.
    "alertmanager": 'namespace="monitoring", service="kube-prometheus-stack-alertmanager"',
    "prometheus": 'namespace="monitoring", service="kube-prometheus-stack-prometheus"',
    "prometheus_alerts": 'job="monitoring/prometheus-federated-alerts"',
    # Triton's Service and a vLLM Deployment's Service in the llm namespace.
    "engine": 'namespace=~"triton|llm", service=~"triton-metrics|vllm-.*"',
    # The central store's programs as VictoriaMetrics' operator names their Services.
    "victoriametrics": 'namespace="monitoring", service="vmsingle-inferwatch"',
    "vmagent": 'namespace="monitoring", service="vmagent-inferwatch"',
    "vmalert": 'namespace="monitoring", service="vmalert-inferwatch"',
}


def spec_with(selectors: dict | None, raw: dict | None = None) -> Spec:
    """The repository's inferwatch.yaml (or `raw`) with `selectors` as its selectors section."""
    data = raw if raw is not None else yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    if selectors:
        data = {**data, "selectors": dict(selectors)}
    return spec_from_dict(data)
