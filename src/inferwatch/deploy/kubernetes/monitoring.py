"""Prometheus Operator objects for inferwatch: a PodMonitor or ServiceMonitor per scrape job, an
AlertmanagerConfig routing to the notifier, and Grafana dashboards as ConfigMaps for the dashboard sidecar.

Selectors: the rules and dashboards pick each source's series with the spec's selector for it (`selectors`,
default `job="inferwatch-gpu"`, `job="triton"`, ...). The operator would name a ServiceMonitor's job after the
Service and a PodMonitor's after `<namespace>/<name>`, so every endpoint writes the `=` labels of its source's
selector in its relabelings (which the operator applies after its own): `job` always (the selector's, else the
source's default job), any other `=` label as given. Every target also gets `node` (the pod's node, the label
alerts and inhibition use); Triton's series get `triton` = the Service name, the same name the collector's
series carry (rules join the two on it).
"""

from __future__ import annotations

import json
import re

from inferwatch.deploy import alertmanager as alertmanager_config
from inferwatch.deploy.kubernetes.specfile import cluster_spec, notifier_url, secret_refs
from inferwatch.deploy.kubernetes.workloads import COMPONENTS, NOTIFIER_SECRET, metadata, selector_labels
from inferwatch.deploy.prometheus import FEDERATED_ALERTS, FEDERATION_INSTANCE, job_name
from inferwatch.deploy.webhook_size import scrape_limits
from inferwatch.spec import Spec

MONITORING = "monitoring.coreos.com/v1"
ALERTMANAGER_SECRET = "inferwatch-alertmanager"  # noqa: S105 - a Secret object's name
FALLBACK_KEY = "pagerduty-fallback-key"
DASHBOARD_LABEL = {"grafana_dashboard": "1"}  # the Grafana sidecar's default label (kube-prometheus-stack)


def _selected(spec: Spec, source: str) -> list[dict]:
    """Relabelings writing the `=` labels of `source`'s selector, `job` first (deploy/prometheus.job_name)."""
    selector = spec.selectors.of(source)
    labels = {"job": job_name(selector, source), **{k: v for k, v in selector.labels.items() if k != "job"}}
    return [{"action": "replace", "targetLabel": label, "replacement": value} for label, value in labels.items()]


NODE = {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}


def _monitor_labels(spec: Spec, name: str, component: str) -> dict:
    return metadata(spec, name, component, dict(spec.prometheus.kubernetes_labels))


def _endpoint(spec: Spec, port: str, relabelings: list[dict], **extra) -> dict:
    # The spec's scrape interval: rate windows and `for` durations were validated against it.
    return {"port": port, "path": "/metrics", "interval": str(spec.prometheus.scrape_interval),
            "relabelings": relabelings, **extra}


def gpu_pod_monitor(spec: Spec) -> dict:
    name, _port, source = COMPONENTS["gpu-exporter"]
    # The exporter labels each GPU with the namespace/pod/container of the pod holding it (dcgm-exporter's
    # names); the target's own namespace/pod/container would clash (Prometheus renames the exported ones to
    # exported_*), so they are dropped: a GPU with no pod has no pod labels, not the exporter's.
    relabel = [*_selected(spec, source), NODE, {"action": "labeldrop", "regex": "namespace|pod|container"}]
    return {"apiVersion": MONITORING, "kind": "PodMonitor", "metadata": _monitor_labels(spec, name, "gpu-exporter"),
            "spec": {"selector": {"matchLabels": selector_labels("gpu-exporter")},
                     "podMetricsEndpoints": [_endpoint(spec, "metrics", relabel)]}}


def service_monitor(spec: Spec, component: str, port: str) -> dict:
    name, _port, source = COMPONENTS[component]
    return {"apiVersion": MONITORING, "kind": "ServiceMonitor", "metadata": _monitor_labels(spec, name, component),
            "spec": {"selector": {"matchLabels": selector_labels(component)},
                     "endpoints": [_endpoint(spec, port, [*_selected(spec, source), NODE])]}}


def triton_service_monitor(spec: Spec) -> dict:
    t = spec.kubernetes.triton
    relabel = [*_selected(spec, "triton"), NODE,
               {"action": "replace", "targetLabel": "triton", "replacement": t.service}]
    return {"apiVersion": MONITORING, "kind": "ServiceMonitor",
            "metadata": _monitor_labels(spec, "inferwatch-triton-server", "triton"),
            "spec": {"namespaceSelector": {"matchNames": [t.namespace]},
                     "selector": {"matchLabels": dict(t.selector)},
                     "endpoints": [_endpoint(spec, t.metrics_port_name, relabel)]}}


def collector_service_monitor(spec: Spec) -> dict:
    monitor = service_monitor(spec, "triton-collector", "metrics")
    t = spec.kubernetes.triton
    # As in the static config: the collector's series name the Triton they describe, not the collector's
    # node; Triton is reached through its Service, so the Service stands for the node. (A Service name is a
    # DNS label: no regex metacharacter to escape.)
    endpoint = monitor["spec"]["endpoints"][0]
    # The operator labels each target with the collector pod's own `pod` and `container`. The rules read `pod`
    # on the collector's series as the Triton replica they describe (identity.TRITON_REPLICA): kept, every
    # TritonModelNotReady named the collector's pod as Triton's, and each collector rollout (its template
    # carries the spec's checksum) renamed every collector-sourced alert, which resolved and paged again.
    endpoint["relabelings"] = [{"action": "labeldrop", "regex": "pod|container"}, *endpoint["relabelings"]]
    endpoint["metricRelabelings"] = [
        {"action": "replace", "sourceLabels": ["triton"], "regex": t.service, "targetLabel": "node",
         "replacement": t.service}]
    return monitor


def monitors(spec: Spec) -> list[dict]:
    """A monitor per source, and the alerting components' own (alerting_monitors); none for the GPU when
    inferwatch's GPU exporter is not deployed (`kubernetes.gpu_exporter: false`: dcgm-exporter's own monitor
    scrapes the GPUs). Each carries the label limits that bound a webhook's size (with_label_limits)."""
    gpu = [gpu_pod_monitor(spec)] if spec.kubernetes.gpu_exporter else []
    # `kubernetes.triton.monitor: false`: the user's own monitor scrapes Triton; a second would scrape the same
    # pods again (every series twice under one selector, two alerts for one fault).
    triton = [triton_service_monitor(spec)] if spec.kubernetes.triton.monitor else []
    found = [*gpu, *triton, collector_service_monitor(spec),
             service_monitor(spec, "gateway", "metrics"), service_monitor(spec, "notifier", "http"),
             *alerting_monitors(spec)]
    return [with_label_limits(m) for m in found]


def with_label_limits(monitor: dict) -> dict:
    """The label limits of the static configuration (deploy/webhook_size.py) on a monitor: the bound that
    keeps every webhook body within the notifier's max_body_bytes."""
    limits = scrape_limits(federation=monitor["metadata"]["name"] == FEDERATION_MONITOR)
    monitor["spec"].update(labelLimit=limits["label_limit"], labelNameLengthLimit=limits["label_name_length_limit"],
                           labelValueLengthLimit=limits["label_value_length_limit"])
    return monitor


# The Services the Prometheus Operator puts in front of the pods of each Alertmanager and Prometheus it runs.
OPERATED = {"alertmanager": {"operated-alertmanager": "true"}, "prometheus": {"operated-prometheus": "true"}}
FEDERATION_MONITOR = "inferwatch-prometheus-alerts"


def alerting_monitors(spec: Spec) -> list[dict]:
    """kube-prometheus-stack's Alertmanager peers (source `alertmanager`) and Prometheus replicas (source
    `prometheus`, and `prometheus_alerts`: each replica's firing alerts from /federate), labelled for the
    spec's selectors of those sources as the static configuration scrapes them, for the replica alerts (rules/ha.py).
    `replica` is the pod's name, the value the operator gives each replica's external label
    (`replicaExternalLabelName`)."""
    replica = {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"],
               "targetLabel": spec.ha.replica_label}
    out = []
    jobs = [
            ("inferwatch-alertmanager", "alertmanager", {}, [*_selected(spec, "alertmanager"), NODE]),
            ("inferwatch-prometheus", "prometheus", {}, [*_selected(spec, "prometheus"), NODE, replica]),
            (FEDERATION_MONITOR, "prometheus",
             {"path": "/federate", "honorLabels": True, "params": {"match[]": [FEDERATED_ALERTS]}},
             [*_selected(spec, "prometheus_alerts"), replica,
              {"action": "replace", "targetLabel": "instance", "replacement": FEDERATION_INSTANCE}])]
    stack_label = spec.kubernetes.prometheus_replica_label
    if stack_label != spec.ha.replica_label:
        # /federate adds each replica's external labels, the stack's replica label among them: dropped, so one
        # alert's copies differ only in `replica` (rules/ha.py counts them without it).
        jobs[2][2]["metricRelabelings"] = [{"action": "labeldrop", "regex": stack_label}]
    for name, kind, extra, relabel in (jobs if spec.ha.prometheus_count > 1 else jobs[:2]):
        endpoint = {**_endpoint(spec, "web", relabel), **extra}
        out.append({"apiVersion": MONITORING, "kind": "ServiceMonitor", "metadata": _monitor_labels(spec, name, kind),
                    "spec": {"selector": {"matchLabels": dict(OPERATED[kind])}, "endpoints": [endpoint]}})
    return out


# ---------------------------------------------------------------------------------- AlertmanagerConfig
_MATCHER = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)(=~|!~|!=|=)"(.*)"$')
_ROUTE_KEYS = {"receiver": "receiver", "group_by": "groupBy", "group_wait": "groupWait",
               "group_interval": "groupInterval", "repeat_interval": "repeatInterval", "continue": "continue"}


def matcher(text: str) -> dict:
    """'name="value"' (Alertmanager matcher syntax, as alertmanager_config writes it) as the CRD's
    {name, value, matchType}. Raises ValueError for any other form."""
    m = _MATCHER.match(text)
    if not m:
        raise ValueError(f"unsupported matcher {text!r}")
    return {"name": m.group(1), "value": m.group(3), "matchType": m.group(2)}


def _route(route: dict) -> dict:
    out: dict = {}
    for key, value in route.items():
        if key in _ROUTE_KEYS:
            out[_ROUTE_KEYS[key]] = value
        elif key == "matchers":
            out["matchers"] = [matcher(m) for m in value]
        elif key == "routes":
            out["routes"] = [_route(r) for r in value]
        else:
            raise ValueError(f"route key {key!r} has no AlertmanagerConfig equivalent here")
    return out


def _receiver(spec: Spec, receiver: dict) -> dict:
    out: dict = {"name": receiver["name"]}
    for webhook in receiver.get("webhook_configs", []):
        config = {"url": notifier_url(spec) + "/alerts", "sendResolved": webhook["send_resolved"],
                  "maxAlerts": webhook["max_alerts"]}
        auth = _notifier_auth(spec)
        if auth:
            config["httpConfig"] = auth
        out.setdefault("webhookConfigs", []).append(config)
    for pd in receiver.get("pagerduty_configs", []):
        out.setdefault("pagerdutyConfigs", []).append({
            "routingKey": {"name": ALERTMANAGER_SECRET, "key": FALLBACK_KEY}, "url": pd["url"],
            "sendResolved": pd["send_resolved"], "severity": pd["severity"], "client": pd["client"]})
    unknown = set(receiver) - {"name", "webhook_configs", "pagerduty_configs"}
    if unknown:
        raise ValueError(f"receiver keys {sorted(unknown)} have no AlertmanagerConfig equivalent here")
    return out


def _notifier_auth(spec: Spec) -> dict | None:
    """The notifier's credentials from its Secret: the same key the notifier pod reads (they cannot disagree)."""
    n = cluster_spec(spec).notifier
    if n.bearer_token is not None:
        (key,) = secret_refs(n.bearer_token).keys
        return {"authorization": {"type": "Bearer", "credentials": {"name": NOTIFIER_SECRET, "key": key}}}
    if n.basic_auth_password is not None:
        (key,) = secret_refs(n.basic_auth_password).keys
        return {"basicAuth": {"username": {"name": NOTIFIER_SECRET, "key": "basic-auth-user"},
                              "password": {"name": NOTIFIER_SECRET, "key": key}}}
    return None


def alertmanager_config_object(spec: Spec) -> dict:
    """The AlertmanagerConfig (v1alpha1): the routes, receivers and inhibition of deploy/alertmanager's
    configuration, under one route that takes the alerts carrying a `layer` (inferwatch's own)."""
    am = alertmanager_config.config(spec)
    route = {"matchers": [{"name": "layer", "value": "L1|L2|L3", "matchType": "=~"}], **_route(am["route"])}
    inhibit = [{"sourceMatch": [matcher(m) for m in rule["source_matchers"]],
                "targetMatch": [matcher(m) for m in rule["target_matchers"]], "equal": list(rule["equal"])}
               for rule in am["inhibit_rules"]]
    return {"apiVersion": "monitoring.coreos.com/v1alpha1", "kind": "AlertmanagerConfig",
            "metadata": _monitor_labels(spec, "inferwatch", "notifier"),
            "spec": {"route": route, "receivers": [_receiver(spec, r) for r in am["receivers"]],
                     "inhibitRules": inhibit}}


# ------------------------------------------------------------------------------- kube-prometheus-stack
VALUES_FILE = "kube-prometheus-stack-values.yaml"


def stack_values(spec: Spec) -> dict:
    """Helm values for kube-prometheus-stack: its Prometheus and Alertmanager as many and as clustered as the
    spec's `ha` section says (the operator drops the replica label from alerts and clusters the peers
    itself), taking inferwatch's AlertmanagerConfig without a namespace matcher, and Grafana loading the
    dashboards."""
    h = spec.ha
    alertmanager: dict = {"replicas": h.alertmanager_count,
                          "alertmanagerConfigSelector": {"matchLabels": dict(spec.prometheus.kubernetes_labels)},
                          "alertmanagerConfigMatcherStrategy": {"type": "None"}}
    if h.alertmanager_count > 1:
        alertmanager.update(clusterPeerTimeout=str(h.peer_timeout), clusterGossipInterval=str(h.gossip_interval),
                            clusterPushpullInterval=str(h.pushpull_interval))
    # The release's own replica label (the chart's default unless the spec says otherwise): renaming it would
    # change the labels of every alert the release already sends.
    prometheus = {"replicas": h.prometheus_count,
                  "replicaExternalLabelName": spec.kubernetes.prometheus_replica_label}
    return {"prometheus": {"prometheusSpec": prometheus},
            "alertmanager": {"alertmanagerSpec": alertmanager},
            "grafana": {"sidecar": {"dashboards": {"enabled": True, "label": next(iter(DASHBOARD_LABEL)),
                                                   "labelValue": DASHBOARD_LABEL[next(iter(DASHBOARD_LABEL))],
                                                   "searchNamespace": "ALL"}}}}


# ------------------------------------------------------------------------------------ dashboards
def dashboard_configmaps(spec: Spec, dashboards: dict[str, str]) -> list[dict]:
    """One ConfigMap per dashboard JSON ({file name: text}), labelled for the Grafana sidecar."""
    out = []
    for filename, text in sorted(dashboards.items()):
        uid = json.loads(text).get("uid") or filename.removesuffix(".json")
        meta = metadata(spec, f"{uid}-dashboard", "dashboards", DASHBOARD_LABEL)
        meta["annotations"] = {"grafana_folder": "inferwatch"}
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {filename: text}})
    return out

