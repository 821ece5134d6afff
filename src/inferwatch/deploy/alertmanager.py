"""Generator: `deploy/alertmanager/alertmanager.yml` from the spec (registered in inferwatch.generate).

Alertmanager keeps grouping, deduplication, silences and inhibition; the notifier gets every alert by
webhook and does routing by layer and delivery. Shape and semantics: Alertmanager's docs/configuration.md
(`<route>`, `<inhibit_rule>`, `<webhook_config>`; docs/sources.md#alertmanager).

- One route per layer, each with its own grouping (spec `notifier.grouping`): L1 pages fast, one group per
  GPU; L2/L3 batch a storm per model/tenant so chat channels get few, full messages. Each layer has its
  own receiver name (all pointing at the notifier) so `amtool config routes test` shows the layer route.
- `send_resolved: true`; the bearer token comes from a file (`credentials_file`), never inline.
- `max_alerts`: the most alerts whose webhook body always fits the notifier's `max_body_bytes`
  (webhook_size.py); the rest are counted in `truncatedAlerts`, which the notifier shows, instead of a
  body the notifier would refuse with 413 (which Alertmanager never retries).
- Alerts labelled `component="notifier"` (NotifierDown, NotifierDeliveryFailing, NotifierDeadLetters) go to
  a fallback receiver that does not pass through the notifier: Alertmanager's own PagerDuty integration
  with `routing_key_file` (a notifier that cannot deliver must still page someone).
- Every layer's alerts are grouped by `severity` too, so a group is all critical or all warning and the
  notifier's routes can send them apart (critical pages, warning goes to chat).
- Inhibition never crosses its scope. Alertmanager counts a label missing on BOTH alerts as equal, so
  `equal: [node]` between a `TritonServerDown` without `node` (from `absent(up{job="triton"})`, or a job
  relabelled without it) and an LLM alert (which has no node) would silence every LLM alert of the fleet.
  Each rule therefore requires every `equal` label on both sides (`node=~".+"`) and keys only on labels the
  registry (`inferwatch.rules.names.ALERTS[...].scope`) guarantees on its targets, plus the spec's
  Prometheus external labels (`spec.external_labels`: the cluster's name among them), which Prometheus
  attaches to every alert it sends and which a central store's series carry:
    - the critical variant of an alert inhibits its warning variant for the same object (burn rates: same
      tier and SLO); GpuMemoryUsageCritical inhibits GpuMemoryUsageHigh on the same GPU (MIG instance);
    - GpuNvmlLost (the node's NVML library is lost) inhibits GpuLost on the same node;
    - GpuLost and GpuNvmlLost inhibit the Triton server and model alerts of the same node, TritonServerDown
      those of the same Triton server (node and triton). LLM (L3) alerts are per tenant, model and tier
      across gateways and carry no node: nothing at node scope can explain them, so nothing inhibits them;
    - TritonModelNotReady inhibits TritonServerNotReady of the same Triton (node and triton): with strict
      readiness a model not READY is why the server is not ready, and the model alert says which and why.
"""

from __future__ import annotations

import yaml

from inferwatch.deploy import webhook_size
from inferwatch.rules.identity import MIG
from inferwatch.rules.names import ALERTS
from inferwatch.spec import LAYERS, Spec

PATH = "deploy/alertmanager/alertmanager.yml"
FALLBACK_RECEIVER = "notifier-fallback"
HEARTBEAT_RECEIVER = "heartbeat"  # notifier.heartbeat_url, the dead man's switch (no integration when unset)
HEARTBEAT_ALERT = "InferwatchHeartbeat"
DEFAULT_RECEIVER = "notifier-default"
# Labels that name which variant of an alert fired (the burn-rate window pair, a canary's signal), not the
# object it is about: critical inhibits warning across them.
VARIANT_LABELS = ("window", "signal")
GPU_ROOTS = ("GpuLost", "GpuNvmlLost")
TRITON_ROOT = "TritonServerDown"


def layer_receiver(layer: str) -> str:
    return f"notifier-{layer.lower()}"


def _webhook(spec: Spec, max_alerts: int) -> dict:
    return {"url": spec.targets.notifier.rstrip("/") + "/alerts", "send_resolved": True, "max_alerts": max_alerts,
            "http_config": {"authorization": {"type": "Bearer", "credentials_file": spec.notifier.token_file}}}


def config(spec: Spec, max_alerts: int | None = None) -> dict:
    """The Alertmanager configuration as plain data. `max_alerts` of every webhook: default the most alerts
    whose body always fits `notifier.max_body_bytes` (webhook_size.max_alerts)."""
    if max_alerts is None:
        max_alerts = webhook_size.max_alerts(spec)
    s = spec.notifier
    beat = str(s.heartbeat_interval)
    routes = [{
        # First: the always-firing heartbeat goes to the dead man's switch only, every heartbeat_interval; the
        # switch pages when it stops (Prometheus, the rules or Alertmanager down, or the path between them).
        "receiver": HEARTBEAT_RECEIVER,
        "matchers": [f'alertname="{HEARTBEAT_ALERT}"'],
        "group_by": _in_cluster(spec, ["alertname"]),
        "group_wait": "0s", "group_interval": beat, "repeat_interval": beat,
    }, {
        "receiver": FALLBACK_RECEIVER,
        "matchers": ['component="notifier"'],
        "group_by": _in_cluster(spec, ["alertname"]),
        "group_wait": "10s", "group_interval": "1m", "repeat_interval": "1h",
    }]
    for layer in LAYERS:
        g = s.grouping.get(layer)
        route = {"receiver": layer_receiver(layer), "matchers": [f'layer="{layer}"']}
        if g is not None:
            route.update(group_by=_with_severity(_in_cluster(spec, g.group_by)), group_wait=str(g.group_wait),
                         group_interval=str(g.group_interval), repeat_interval=str(g.repeat_interval))
        routes.append(route)
    receivers = [{"name": DEFAULT_RECEIVER, "webhook_configs": [_webhook(spec, max_alerts)]}]
    receivers += [{"name": layer_receiver(layer), "webhook_configs": [_webhook(spec, max_alerts)]} for layer in LAYERS]
    receivers.append({"name": FALLBACK_RECEIVER, "pagerduty_configs": [{
        "routing_key_file": s.fallback_routing_key_file,
        "url": s.fallback_pagerduty_url,
        "send_resolved": True,
        "severity": "critical",
        "client": "inferwatch alertmanager (notifier fallback)",
    }]})
    heartbeat: dict = {"name": HEARTBEAT_RECEIVER}
    if s.heartbeat_url:
        heartbeat["webhook_configs"] = [{"url": s.heartbeat_url, "send_resolved": True, "http_config": {
            "authorization": {"type": "Bearer", "credentials_file": s.heartbeat_token_file}}}]
    receivers.append(heartbeat)
    inhibit = inhibit_rules(spec)
    return {
        "global": {"resolve_timeout": "5m"},
        "route": {"receiver": DEFAULT_RECEIVER, "group_by": _in_cluster(spec, ["alertname", "layer", "severity"]),
                  "group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h", "routes": routes},
        "receivers": receivers,
        "inhibit_rules": inhibit,
    }


def _in_cluster(spec: Spec, group_by: list[str]) -> list[str]:
    """`group_by` and the cluster label (spec `cluster`): no group holds two clusters' alerts, so one message
    never pages cluster a's on-call with cluster b's GPU."""
    if not spec.cluster.enabled or "..." in group_by or spec.cluster.label in group_by:
        return list(group_by)
    return [*group_by, spec.cluster.label]


def _with_severity(group_by: list[str]) -> list[str]:
    # A group mixing severities has no common `severity`, so the notifier could not route it by severity.
    return list(group_by) if "severity" in group_by or "..." in group_by else [*group_by, "severity"]


def _alternation(names) -> str:
    return "|".join(sorted(names))


def _inhibit(source: list[str], target: list[str], equal: list[str], refine: tuple[str, ...] = ()) -> dict:
    """One inhibit rule whose `equal` labels must be present (non-empty) on the source and the target.
    `refine`: labels also compared but not required, each naming a part within the object the required ones
    name (a MIG instance of one GPU): absent on both (a GPU without MIG), Alertmanager counts them equal."""
    present = [f'{label}=~".+"' for label in equal]
    return {"source_matchers": source + present, "target_matchers": target + present,
            "equal": [*equal, *refine]}


def identity_names(spec: Spec, layer: str) -> dict[str, str]:
    """The spec's names (spec `identity`) of the identity labels rules/names.py writes with their default
    names (`node`, `triton`, `pod`), for an alert of `layer`: L1 alerts' node is the GPU source's, every
    other layer's node, server and replica are Triton's."""
    if layer == "L1":
        return {"node": spec.identity.gpu.node}
    ident = spec.identity.triton
    return {"node": ident.node, "triton": ident.server, "pod": ident.replica}


def _named(labels, names: dict[str, str]) -> list[str]:
    return [names.get(label, label) for label in labels]


def inhibit_rules(spec: Spec) -> list[dict]:
    """The inhibit rules (see the module docstring); every `equal` label is required on both sides. The
    identity labels are the spec's (`identity`); the GPU-to-Triton rule needs one node label on both (GPU
    and Triton `identity.*.node` equal; `inferwatch check` warns where they differ and the rule is left out)."""
    cluster = sorted(spec.external_labels)
    gpu_node, triton_ids = spec.identity.gpu.node, identity_names(spec, "L2")
    rules = []
    for name, info in ALERTS.items():
        if {"critical", "warning"} <= set(info.severities):
            # One rule per shape of the alert's object where its scope alone does not name one (an engine on
            # Triton's port, a vLLM server's engine core): each rule's labels are all present on that shape.
            for shape in info.shapes or (info.scope,):
                same = _named([label for label in shape if label not in VARIANT_LABELS],
                              identity_names(spec, info.layer))
                rules.append(_inhibit([f'alertname="{name}"', 'severity="critical"'],
                                      [f'alertname="{name}"', 'severity="warning"'], [*same, *cluster]))
    # Per MIG instance, as both alerts are (identity.GPU_INSTANCE): one full instance must not hide another
    # instance's warning, a workload of its own.
    rules.append(_inhibit(['alertname="GpuMemoryUsageCritical"'], ['alertname="GpuMemoryUsageHigh"'],
                          [gpu_node, "gpu", *cluster], refine=MIG))
    rules.append(_inhibit(['alertname="GpuNvmlLost"'], ['alertname="GpuLost"'], [gpu_node, *cluster]))
    # Alerts that carry node and triton in every shape, or in one of their shapes (an engine on Triton's port;
    # a vLLM server of its own has neither, and the rules below require both on the target).
    triton_alerts = [n for n, info in ALERTS.items()
                     if info.layer == "L2" and n != TRITON_ROOT
                     and any({"node", "triton"} <= set(shape) for shape in (info.scope, *info.shapes))]
    server = _named(["node", "triton"], triton_ids)
    if gpu_node == triton_ids["node"]:
        rules.append(_inhibit([f'alertname=~"{_alternation(GPU_ROOTS)}"'],
                              [f'alertname=~"{_alternation(triton_alerts)}"'], [gpu_node, *cluster]))
    rules.append(_inhibit([f'alertname="{TRITON_ROOT}"'], [f'alertname=~"{_alternation(triton_alerts)}"'],
                          [*server, *cluster]))
    # Strict readiness: a model that failed to load (or is loading) makes its Triton not ready. The model
    # alert names the model and Triton's reason; the server alert says nothing more, so it is held back.
    rules.append(_inhibit(['alertname="TritonModelNotReady"'], ['alertname="TritonServerNotReady"'],
                          [*server, *cluster]))
    return rules


def cluster_flags(spec: Spec, listen: str, peers: list[str], advertise: str | None = None) -> list[str]:
    """Alertmanager's clustering flags for one peer of `ha.alertmanager` (its half of the HA configuration;
    the configuration file is the same for every peer): gossip on `listen`, join every address of `peers`
    (its own may be among them), the spec's peer timeout and gossip intervals. With no peers configured:
    clustering off (`--cluster.listen-address=`)."""
    if len(spec.ha.alertmanager) < 2:
        return ["--cluster.listen-address="]
    h = spec.ha
    flags = [f"--cluster.listen-address={listen}"]
    if advertise:
        flags.append(f"--cluster.advertise-address={advertise}")
    flags += [f"--cluster.peer={p}" for p in peers]
    return flags + [f"--cluster.peer-timeout={h.peer_timeout}", f"--cluster.gossip-interval={h.gossip_interval}",
                    f"--cluster.pushpull-interval={h.pushpull_interval}",
                    f"--cluster.settle-timeout={h.settle_timeout}"]


def peer_flags(spec: Spec, index: int) -> list[str]:
    """Clustering flags of peer `index` as the static configuration runs it (addresses from `ha.alertmanager`)."""
    peers = spec.ha.alertmanager_peers()
    me = peers[index]
    return cluster_flags(spec, me.cluster_address, [p.cluster_address for p in peers], advertise=me.cluster_address)


def secret_files(spec: Spec) -> dict[str, tuple[str, str]]:
    """{spec field: (path, what it holds)} for every file the generated configuration makes Alertmanager read
    (tests check that no other `*_file` appears in it and that the own-stack steps name each:
    docs/own-stack.md#use-it-with-your-own-triton-and-prometheus)."""
    n = spec.notifier
    return {"notifier.token_file": (n.token_file, "the notifier's bearer token (the value of notifier.bearer_token)"),
            "notifier.fallback_routing_key_file": (n.fallback_routing_key_file,
                                                   "the PagerDuty routing key for the notifier's self-alerts")}


def render(spec: Spec) -> str:
    head = ("# Generated by `inferwatch generate` from the spec — do not edit by hand.\n"
            "# Secrets are files Alertmanager reads at send time: notifier.token_file (the notifier's bearer\n"
            "# token) and notifier.fallback_routing_key_file (PagerDuty key for notifier self-alerts).\n")
    return head + yaml.safe_dump(config(spec), sort_keys=False, default_flow_style=False, width=120)


def flags_path(index: int) -> str:
    return f"deploy/alertmanager/cluster-flags-{index}.txt"


# Alertmanager's command line (kingpin) reads arguments from `@file`, one a line, skipping `#` lines.
FLAGS_HEAD = ("# Generated by `inferwatch generate` from inferwatch.yaml — do not edit by hand.\n"
              "# Peer {index}'s clustering flags: prometheus-alertmanager --config.file=... @{path}\n")


def outputs(spec: Spec) -> dict[str, str]:
    """alertmanager.yml (the same for every peer) and, for a cluster, each peer's clustering flags, one a line
    after a comment header (`prometheus-alertmanager --config.file=... @cluster-flags-0.txt`)."""
    files = {PATH: render(spec)}
    if len(spec.ha.alertmanager) > 1:
        for i in range(len(spec.ha.alertmanager_peers())):
            files[flags_path(i)] = (FLAGS_HEAD.format(index=i, path=flags_path(i))
                                    + "\n".join(peer_flags(spec, i)) + "\n")
    return files
