"""The gate and scaler objects (plain dicts, as the Kubernetes API takes them) from the queries of
`inferwatch.deploy.gates.queries`:

- Argo Rollouts `AnalysisTemplate` (argoproj.io/v1alpha1), one per way a canary exists: `versions` (args
  `model`, `canary-version`, `stable-version`) and `pods` (args `model`, `canary-hash`, `stable-hash`, which a
  Rollout fills with `valueFrom.podTemplateHashValue: Latest` / `Stable`). Each metric measures every
  `gates.interval`, `gates.count` times; `successCondition` `len(result) == 1 && result[0] <= 0`,
  `failureCondition` `... > 0`, so no sample (too little traffic) matches neither: Inconclusive
  (Argo's `EvaluateResult`), counted against `inconclusiveLimit`.
- Flagger `MetricTemplate` (flagger.app/v1beta1) per signal, for Flagger's primary/canary workloads (pods
  `{{ target }}-primary-...` and `{{ target }}-...`, the model in `templateVariables.model`), and the
  `analysis` block of a `Canary` that uses them (`thresholdRange.max: 0`, `threshold` = failure_limit + 1).
- KEDA `ScaledObject` (keda.sh/v1alpha1) scaling Triton's Deployment on each model's queue-time and
  pending-requests triggers; or, for prometheus-adapter, its external rules and an `autoscaling/v2` HPA on
  the same signals.
"""

from __future__ import annotations

import re

from inferwatch.deploy.gates import queries
from inferwatch.deploy.gates.queries import POD_TAIL
from inferwatch.deploy.kubernetes.specfile import cluster_spec
from inferwatch.rules.builders import num
from inferwatch.spec import Duration, Spec

SUCCESS_CONDITION = "len(result) == 1 && result[0] <= 0"
FAILURE_CONDITION = "len(result) == 1 && result[0] > 0"
ARGO_TEMPLATES = {"versions": "inferwatch-triton-canary-versions", "pods": "inferwatch-triton-canary-pods"}
FLAGGER_TEMPLATE = "inferwatch-triton-canary-{}"
SCALED_OBJECT = "inferwatch-triton-queue"


def go_duration(d: Duration) -> str:
    """`d` as Go's time.ParseDuration reads it (Argo Rollouts and Flagger parse `interval` so): hours at most,
    never the `d`/`w` units a Prometheus duration may use. Sub-second parts are written in ms."""
    ms = d.ms
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    sec, msec = divmod(rest, 1000)
    text = "".join(f"{v}{unit}" for v, unit in ((h, "h"), (m, "m"), (sec, "s"), (msec, "ms")) if v)
    return text or "0s"


def namespace(spec: Spec) -> str:
    return spec.gates.namespace or spec.kubernetes.triton.namespace


def prometheus_address(spec: Spec) -> str:
    """The in-cluster Prometheus the controllers ask (the spec's `kubernetes.prometheus_url`, else the
    Prometheus Operator's `prometheus-operated` Service of the monitoring namespace)."""
    return cluster_spec(spec).targets.prometheus


def _metadata(spec: Spec, name: str) -> dict:
    labels = {**spec.prometheus.kubernetes_labels, "app.kubernetes.io/component": "gates"}
    return {"name": name, "namespace": namespace(spec), "labels": labels}


def argo_sides(mode: str) -> tuple[str, str, list[str]]:
    """(canary matcher, stable matcher, argument names) of an AnalysisTemplate."""
    if mode == "versions":
        return 'version="{{args.canary-version}}"', 'version="{{args.stable-version}}"', [
            "model", "canary-version", "stable-version"]
    return ('pod=~".+-{{args.canary-hash}}-[a-z0-9]+"', 'pod=~".+-{{args.stable-hash}}-[a-z0-9]+"',
            ["model", "canary-hash", "stable-hash"])


def analysis_template(spec: Spec, mode: str) -> dict:
    g = spec.gates
    canary, stable, args = argo_sides(mode)
    metrics = []
    for signal in queries.signals(spec):
        metrics.append({
            "name": signal.name,
            "interval": go_duration(g.interval),
            "count": g.count,
            "failureLimit": g.failure_limit,
            "inconclusiveLimit": g.inconclusive_limit,
            "successCondition": SUCCESS_CONDITION,
            "failureCondition": FAILURE_CONDITION,
            "provider": {"prometheus": {
                "address": prometheus_address(spec),
                "query": queries.gate_query(spec, signal, 'model="{{args.model}}"', canary, stable)}},
        })
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
            "metadata": _metadata(spec, ARGO_TEMPLATES[mode]),
            "spec": {"args": [{"name": a} for a in args], "metrics": metrics}}


FLAGGER_CANARY = f'pod=~"{{{{ target }}}}-{POD_TAIL}"'
FLAGGER_PRIMARY = f'pod=~"{{{{ target }}}}-primary-{POD_TAIL}"'
FLAGGER_MODEL = 'model="{{ variables.model }}"'


def metric_templates(spec: Spec) -> list[dict]:
    return [{"apiVersion": "flagger.app/v1beta1", "kind": "MetricTemplate",
             "metadata": _metadata(spec, FLAGGER_TEMPLATE.format(signal.name)),
             "spec": {"provider": {"type": "prometheus", "address": prometheus_address(spec)},
                      "query": queries.gate_query(spec, signal, FLAGGER_MODEL, FLAGGER_CANARY, FLAGGER_PRIMARY)}}
            for signal in queries.signals(spec)]


def canary_analysis(spec: Spec, model: str = "MODEL") -> dict:
    """The `spec.analysis` block of a Flagger Canary using the MetricTemplates (`model`: the Triton model the
    canary serves; the generated example leaves a placeholder to replace)."""
    g = spec.gates
    return {"interval": go_duration(g.interval), "threshold": g.failure_limit + 1, "iterations": g.count,
            "metrics": [{"name": signal.name,
                         "templateRef": {"name": FLAGGER_TEMPLATE.format(signal.name), "namespace": namespace(spec)},
                         "templateVariables": {"model": model},
                         "thresholdRange": {"max": 0}, "interval": go_duration(g.interval)}
                        for signal in queries.signals(spec)]}


def scaled_object(spec: Spec) -> dict | None:
    """The ScaledObject on every Triton model's triggers (KEDA scales on the largest desired replica
    count of its triggers); None without a Triton model in the spec. `ignoreNullValues: true`: no sample (no
    traffic, so no queue time) is 0 to the scaler, which is what an idle model needs."""
    triggers = queries.triggers(spec)
    if not triggers:
        return None
    g = spec.gates
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": _metadata(spec, SCALED_OBJECT),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": g.deployment or spec.kubernetes.triton.service},
                     "minReplicaCount": g.min_replicas, "maxReplicaCount": g.max_replicas,
                     "triggers": [{"type": "prometheus", "name": t.name, "metricType": t.metric_type,
                                   "metadata": {"serverAddress": prometheus_address(spec), "query": t.query,
                                                "threshold": _number(t.threshold),
                                                "activationThreshold": _number(t.activation),
                                                "ignoreNullValues": "true"}}
                                  for t in triggers]}}


HPA = "inferwatch-triton-queue"


def adapter_config(spec: Spec) -> dict:
    """prometheus-adapter's configuration (its `--config` file; kubernetes-sigs/prometheus-adapter v0.12
    pkg/config): one external rule per signal, not namespaced (Triton's series carry no namespace label; the
    HPA's selector names the model)."""
    rules = []
    for r in queries.adapter_rules(spec):
        metric = r.series.split("{")[0]
        rules.append({"seriesQuery": r.series, "resources": {"namespaced": False},
                      "name": {"matches": f"^{re.escape(metric)}$", "as": r.name}, "metricsQuery": r.query})
    return {"externalRules": rules}


def hpa(spec: Spec) -> dict | None:
    """An `autoscaling/v2` HorizontalPodAutoscaler on the same signals as the ScaledObject, read through
    prometheus-adapter's external metrics: per Triton model, the queue time (`Value`) and the pending
    requests (`AverageValue`) against the alerts' thresholds. None without a Triton model. Use it or the
    ScaledObject, not both (KEDA makes its own HPA for the same Deployment)."""
    triggers = queries.triggers(spec)
    if not triggers:
        return None
    names = {r.kind: r for r in queries.adapter_rules(spec)}
    g = spec.gates
    metrics = []
    for t in triggers:
        rule = names["pending"] if t.name.startswith("pending-") else names["queue-p95"]
        target = ({"type": "Value", "value": _number(t.threshold)} if rule.metric_type == "Value"
                  else {"type": "AverageValue", "averageValue": _number(t.threshold)})
        metrics.append({"type": "External", "external": {
            "metric": {"name": rule.name, "selector": {"matchLabels": {"model": t.model}}}, "target": target}})
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": _metadata(spec, HPA),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": g.deployment or spec.kubernetes.triton.service},
                     "minReplicas": max(1, g.min_replicas), "maxReplicas": g.max_replicas, "metrics": metrics}}


def _number(value: float) -> str:
    """KEDA's trigger metadata are strings."""
    return num(value)
