"""The inferwatch spec: one YAML file (`inferwatch.yaml`) holding targets, thresholds, SLOs, tenants and
tiers, routes and channels. Everything generated (rules, dashboards, Prometheus and Alertmanager config) and
every service (exporters, notifier) reads it through `load_spec()`.

Every field has a default and says when to change it; defaults for thresholds come from the platform's
operating experience noted in the issues (e.g. GPU temperature 85 °C, Triton P95 queue 500 ms, TTFT P95
300 ms for real-time) and from the Google SRE Workbook for burn rates.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from inferwatch.billing import Billing, validate_billing
from inferwatch.redaction import address
from inferwatch.specload import Duration, Secret, SpecError, build, field, load_yaml
from inferwatch.upstreams import Upstream, validate_upstreams

__all__ = ["Spec", "SpecError", "ClusterSettings", "CentralStore", "Duration", "Secret", "load_spec",
           "DEFAULT_SPEC_PATH"]

DEFAULT_SPEC_PATH = "inferwatch.yaml"
LAYERS = ("L1", "L2", "L3")
SEVERITIES = ("critical", "warning", "info")
OTHER = "other"  # the label value every undeclared tenant/tier/model folds into


def _d(text: str) -> Duration:
    return Duration.parse(text)


# --------------------------------------------------------------------------------------------- targets
@dataclasses.dataclass
class TritonTarget:
    """One Triton server. `name` becomes the `triton` label; `node` the `node` label alerts name."""

    name: str
    url: str = field(doc="HTTP API base, e.g. http://triton-0:8000")
    metrics_url: str = field("", doc="Triton's own /metrics; default: the url's host on port 8002")
    node: str = field("", doc="node (host) the server runs on; used by L2 alerts and inhibition")
    headers: dict[str, Secret] = field({}, doc="extra request headers, e.g. triton-access-token: ${TOKEN}")
    metrics_interval_ms: int = field(2000, doc="Triton's --metrics-interval-ms (its default is 2000)")
    max_answer_bytes: int = field(16 * 1024 * 1024, doc="largest answer the Triton collector reads from this "
                                  "server's API (index, statistics, config, /metrics); above it the call fails "
                                  "with cause too_large. Raise it for repositories of thousands of models")

    def _validate(self, path: str) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise SpecError(f"{path}.url", f"expected an http(s) URL, got {self.url!r}")
        if self.max_answer_bytes < 1024:
            raise SpecError(f"{path}.max_answer_bytes", f"expected at least 1024, got {self.max_answer_bytes}")

    @property
    def metrics_address(self) -> str:
        """host:port of Triton's own metrics endpoint (for Prometheus scrape targets), never its user-info."""
        from urllib.parse import urlparse

        if self.metrics_url:
            return address(self.metrics_url)
        parsed = urlparse(self.url)
        return f"{parsed.hostname}:8002"


@dataclasses.dataclass
class ExporterTarget:
    """One exporter address with the node it watches. A plain 'host:port' string in the spec means
    {address: host:port, node: host}."""

    address: str = field(doc="host:port Prometheus scrapes")
    node: str = field("", doc="the `node` label alerts name; default: the address's host")

    def __post_init__(self) -> None:
        if not self.node:
            self.node = self.address.rsplit(":", 1)[0]


@dataclasses.dataclass
class Targets:
    """Where the running parts are. Addresses are host:port as Prometheus scrape targets take them."""

    prometheus: str = field("http://127.0.0.1:9090", doc="Prometheus base URL (triage, demo)")
    alertmanager: str = field("http://127.0.0.1:9093", doc="Alertmanager base URL (triage --firing)")
    notifier: str = field("http://127.0.0.1:9410", doc="notifier base URL Alertmanager posts to")
    triton: list[TritonTarget] = field([], doc="Triton servers to scrape and poll")
    gpu_exporters: list[str | ExporterTarget] = field(["127.0.0.1:9400"],
                                                      doc="inferwatch GPU exporters or dcgm-exporters: "
                                                          "'host:port' or {address, node}")
    triton_collectors: list[str] = field(["127.0.0.1:9401"], doc="inferwatch Triton collectors")
    gateways: list[str | ExporterTarget] = field(["127.0.0.1:9402"],
                                                 doc="gateway exporters' metrics ports: 'host:port' or {address, node}")
    notifiers: list[str | ExporterTarget] = field([], doc="notifier /metrics addresses ('host:port' or "
                                                          "{address, node}); default: the notifier URL's host:port")

    def exporter_targets(self, kind: str) -> list[ExporterTarget]:
        """`gpu_exporters`, `gateways` or `notifiers` as ExporterTargets (plain strings get node = their host)."""
        entries: list = list(getattr(self, kind))
        if kind == "notifiers" and not entries:
            from urllib.parse import urlparse

            entries = [urlparse(self.notifier).netloc]
        return [e if isinstance(e, ExporterTarget) else ExporterTarget(e) for e in entries]


@dataclasses.dataclass
class PrometheusSettings:
    scrape_interval: Duration = field(_d("15s"), doc="raise for large fleets; must be >= Triton metrics interval")
    evaluation_interval: Duration = field(_d("15s"), doc="rule evaluation interval")
    external_labels: dict[str, str] = field({}, doc="labels Prometheus adds to what it sends, e.g. region: eu; "
                                                    "the cluster's name goes in `cluster`")
    rate_window: Duration = field(_d("5m"), doc="rate() window of the recording rules and L1/L2/L3 alerts; "
                                                "at least 4 scrape intervals (shorten only with the scrape interval)")
    rule_files: list[str] = field(["../../rules/generated/*.yml"],
                                  doc="rule_files in the generated prometheus.yml (relative to its folder)")
    kubernetes_namespace: str = field("monitoring", doc="namespace of the generated Kubernetes manifests "
                                                        "(the PrometheusRule and deploy/kubernetes)")
    kubernetes_labels: dict[str, str] = field({"app.kubernetes.io/part-of": "inferwatch"},
                                              doc="labels of the PrometheusRule, monitors and AlertmanagerConfig; "
                                                  "match your operator's selectors (kube-prometheus-stack: "
                                                  "release: <its release name>)")


# ---------------------------------------------------------------------------------------- several clusters
# Labels the rules and scrape configuration already give a meaning: a cluster label may not reuse them.
_TAKEN_LABELS = ("job", "instance", "node", "triton", "model", "version", "tenant", "tier", "gpu", "UUID",
                 "alertname", "layer", "severity", "le", "quantile", "slo_window", "window")


@dataclasses.dataclass
class ClusterSettings:
    """Which cluster this spec's targets are in (docs/several-clusters.md). With a `name`, Prometheus (or the
    edge agent writing to the central store) adds `<label>: <name>` to every series it sends and every alert,
    every recording rule and alert keeps the label through its aggregations, each alert's description names
    the cluster, dashboards gain a `cluster` variable and Alertmanager never groups or inhibits across two
    clusters. Without a name nothing changes."""

    name: str = field("", doc="this cluster's name, e.g. prod-eu-1; set it when several clusters are watched")
    label: str = field("cluster", doc="the label carrying the name (kube-prometheus-stack's mixins use cluster)")
    lookback: Duration = field(_d("1h"), doc="a source whose targets vanished from one cluster while it reported "
                                             "in the last `lookback` is down there (its exporter-down alert, "
                                             "labelled with the cluster) until the lookback passes")

    @property
    def enabled(self) -> bool:
        return bool(self.name)

    def _validate(self, path: str) -> None:
        import re

        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.label) or self.label.startswith("__"):
            raise SpecError(f"{path}.label", f"expected a Prometheus label name (not starting with __), "
                                             f"got {self.label!r}")
        if self.label in _TAKEN_LABELS:
            raise SpecError(f"{path}.label", f"{self.label!r} already means something in inferwatch's series and "
                                             f"alerts: pick another name, such as cluster")
        # Two clusters in one store are told apart by this value alone: one that only looks like a name (blank,
        # ' eu-1' beside 'eu-1', a control character) would mix or split their series invisibly.
        if self.name and (self.name != self.name.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in self.name)):
            raise SpecError(f"{path}.name", f"expected a name without surrounding spaces or control characters, "
                                            f"got {self.name!r}")


@dataclasses.dataclass
class CentralStore:
    """A central metrics store several clusters write to (docs/several-clusters.md): each cluster's edge
    (vmagent, or Prometheus in agent mode) scrapes the cluster's targets and remote-writes to VictoriaMetrics;
    vmalert evaluates the generated rule files there and notifies Alertmanager. `inferwatch generate` writes
    that configuration under deploy/central/."""

    url: str = field("", doc="VictoriaMetrics base URL the edges write to and vmalert queries, e.g. "
                             "http://victoria-metrics:8428; empty: no central store")
    edge: str = field("vmagent", doc="what scrapes each cluster and writes to the store: vmagent or "
                                     "prometheus-agent (Prometheus with --enable-feature=agent)")
    vmalert: str = field("vmalert:8880", doc="host:port of vmalert's own /metrics, scraped by the store's watcher "
                                         "(deploy/central/watch-prometheus.yml)")
    edge_address: str = field("vmagent:8429", doc="host:port of this cluster's vmagent's own /metrics, scraped by "
                                                  "the watcher (edge vmagent only)")
    min_free_disk_ratio: float = field(0.2, doc="VictoriaMetricsDiskSpaceLow below this share of free space in the "
                                                "store's space (free / (free + data)); VictoriaMetrics' capacity "
                                                "planning asks for 20% free for background merges")
    queue_pending_bytes: int = field(64 * 2**20, doc="VmagentRemoteWriteFailing (queue_growing) above this many bytes "
                                                     "waiting in vmagent's queue for the store and still growing")

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    @property
    def write_url(self) -> str:
        """The store's Prometheus remote-write endpoint."""
        return self.url.rstrip("/") + "/api/v1/write"

    def _validate(self, path: str) -> None:
        if self.url and not self.url.startswith(("http://", "https://")):
            raise SpecError(f"{path}.url", f"expected an http(s) URL, got {self.url!r}")
        if self.edge not in ("vmagent", "prometheus-agent"):
            raise SpecError(f"{path}.edge", f"expected vmagent or prometheus-agent, got {self.edge!r}")
        if not 0 < self.min_free_disk_ratio < 1:
            raise SpecError(f"{path}.min_free_disk_ratio", f"expected a ratio between 0 and 1, got "
                                                           f"{self.min_free_disk_ratio!r}")


# -------------------------------------------------------------------------------------------- selectors
def _selector(source: str) -> Any:
    from inferwatch.selectors import SOURCES, default_selector

    return field(default_selector(source), doc=f"PromQL label selector of the {SOURCES[source]}'s series")


@dataclasses.dataclass
class Selectors:
    """How this Prometheus tells each source's series apart, as a monitoring mixin's config: one PromQL label
    selector per source (the text between a vector selector's braces). Every rule, recording rule, dashboard
    query, runbook evidence query and triage query selects a source's series with it. The defaults are the jobs
    of the generated Prometheus configuration, which writes the labels an `=` matcher asks for (as do the
    Kubernetes monitors). Change them for a Prometheus that names jobs otherwise, e.g. the Prometheus
    Operator: `gpu: 'job="nvidia-dcgm-exporter"'` (the GPU Operator's dcgm-exporter ServiceMonitor),
    `triton: 'namespace="triton", service="triton-metrics"'`."""

    gpu: str = _selector("gpu")
    triton: str = _selector("triton")
    triton_collector: str = _selector("triton_collector")
    gateway: str = _selector("gateway")
    notifier: str = _selector("notifier")
    alertmanager: str = _selector("alertmanager")
    prometheus: str = _selector("prometheus")
    prometheus_alerts: str = _selector("prometheus_alerts")
    # The engines' families wherever they are served: Triton's :8002 or a vLLM server's own job.
    engine: str = _selector("engine")
    victoriametrics: str = _selector("victoriametrics")
    vmagent: str = _selector("vmagent")
    vmalert: str = _selector("vmalert")

    def of(self, source: str):
        """The parsed Selector of `source` (a key of inferwatch.selectors.SOURCES)."""
        from inferwatch.selectors import parse

        return parse(getattr(self, source))

    def _validate(self, path: str) -> None:
        from inferwatch.selectors import SOURCES, SelectorError, parse

        seen: dict = {}
        for source in SOURCES:
            try:
                selector = parse(getattr(self, source))
            except SelectorError as exc:
                raise SpecError(f"{path}.{source}", f"expected a PromQL label selector such as "
                                                    f"'job=\"triton\"': {exc}") from None
            key = frozenset(selector.matchers)
            if source == "engine":
                # The engines' families are told apart by name and may be served on Triton's port only:
                # `engine` may share the Triton selector.
                continue
            if key in seen:
                raise SpecError(f"{path}.{source}", f"selects the same series as {path}.{seen[key]} "
                                                    f"({selector}): each source needs its own")
            seen[key] = source


def _label_name(path: str, value: str) -> None:
    import re

    if not isinstance(value, str) or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", value) or value.startswith("__"):
        raise SpecError(path, f"expected a Prometheus label name such as 'pod', got {value!r}")


@dataclasses.dataclass
class TritonIdentity:
    """Which labels of Triton's own series (selectors.triton) name one Triton server, its replica and its
    node: every L2 rule, join, inhibition and dashboard keys on them (rules/identity.py). The defaults are the
    labels the generated scrape configuration and Kubernetes monitors write. With your own ServiceMonitor the
    Prometheus Operator writes `namespace`, `service`, `endpoint`, `pod`, `container`: `server: service`,
    `replica: pod`, and `node` the label your relabelling gives (docs/selectors.md). The Triton collector's
    series carry `triton` (and `address` per pod of a headless Service); rules rename `triton` to `server`
    and take `replica` and `node` from Triton's own `up` at the same pod IP (rules/replicas.py)."""

    server: str = field("triton", doc="label naming one Triton server (in Kubernetes its Service)")
    replica: str = field("pod", doc="label telling replicas behind one server apart (absent outside Kubernetes)")
    node: str = field("node", doc="label naming the node a replica runs on")

    def _validate(self, path: str) -> None:
        for name in ("server", "replica", "node"):
            _label_name(f"{path}.{name}", getattr(self, name))
        if len({self.server, self.replica, self.node}) < 3:
            raise SpecError(path, f"server, replica and node must be three different labels, got "
                                  f"{self.server!r}, {self.replica!r}, {self.node!r}")


@dataclasses.dataclass
class GpuIdentity:
    """Which label of the GPU source's series (selectors.gpu) names the node a GPU is in: GPU alerts, the GPU
    dashboard's node variable and the GPU-to-Triton inhibitions key on it. dcgm-exporter under the GPU
    Operator writes `Hostname`; inferwatch's scrape configuration writes `node`. The GPU itself stays `gpu`
    and `UUID` (both exporters' names)."""

    node: str = field("node", doc="label naming a GPU's node")

    def _validate(self, path: str) -> None:
        from inferwatch.rules.identity import GPU

        _label_name(f"{path}.node", self.node)
        if self.node not in GPU:
            # GPU rules reduce device-wide fields to the GPU's labels (rules/identity.py GPU): any other label
            # would be dropped from every GPU alert.
            raise SpecError(f"{path}.node", f"expected one of the GPU identity labels {', '.join(GPU)}, "
                                            f"got {self.node!r}")


@dataclasses.dataclass
class Identity:
    """The labels that make one incident, per source (docs/selectors.md "Identity labels"); defaults are the
    generated configuration's."""

    triton: TritonIdentity = field(TritonIdentity, doc="Triton server, replica and node labels")
    gpu: GpuIdentity = field(GpuIdentity, doc="a GPU's node label")


# ---------------------------------------------------------------------------------------------- layers
@dataclasses.dataclass
class GpuLayer:
    """L1 thresholds."""

    temperature_critical_celsius: float = field(85.0, doc="most datacenter GPUs slow down from ~87 °C")
    memory_used_warning_ratio: float = field(0.90)
    memory_used_critical_ratio: float = field(0.95)
    critical_xids: list[int] = field([48, 63, 64, 74, 79, 94, 95, 119, 120],
                                     doc="XIDs that mean hardware/driver trouble; never 13, 31, 43 (app faults)")
    throttle_reasons: list[str] = field(["hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"],
                                        doc="clocks-event reasons (NVML names) that GpuThrottling pages on; "
                                            "never gpu_idle or applications_clocks_setting (normal operation)")
    for_: Duration = field(_d("2m"), key="for", doc="default `for` of L1 alerts")
    event_for: Duration = field(_d("0s"), doc="`for` of the event alerts GpuLost, GpuXidCritical and "
                                             "GpuUncorrectableMemoryError: a lost or corrupting GPU pages at once")
    exporter_down_for: Duration = field(_d("5m"), doc="`for` of GpuExporterDown (rides out a restart)")
    vanished_gpu_lookback: Duration = field(
        _d("1h"), doc="dcgm-exporter has no per-GPU `up`: a GPU whose series stopped for `for` while its exporter "
                      "answers is GpuLost, for at most this long after it last reported")

    def _validate(self, path: str) -> None:
        if self.vanished_gpu_lookback <= self.for_:
            raise SpecError(f"{path}.vanished_gpu_lookback",
                            f"expected longer than {path}.for ({self.for_}), got {self.vanished_gpu_lookback}")
        for name in ("memory_used_warning_ratio", "memory_used_critical_ratio"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise SpecError(f"{path}.{name}", f"expected a ratio in (0, 1], got {getattr(self, name)}")
        if self.memory_used_warning_ratio > self.memory_used_critical_ratio:
            raise SpecError(f"{path}.memory_used_warning_ratio",
                            f"expected at most memory_used_critical_ratio ({self.memory_used_critical_ratio}), "
                            f"got {self.memory_used_warning_ratio}")
        app_faults = sorted({13, 31, 43} & set(self.critical_xids))
        if app_faults:
            raise SpecError(f"{path}.critical_xids", f"XIDs {app_faults} are application faults, not GPU faults")


@dataclasses.dataclass
class ModelOverride:
    error_ratio: float | None = None
    queue_p95_seconds: float | None = None
    pending_requests: float | None = None


@dataclasses.dataclass
class EngineThresholds:
    """L2 thresholds of the LLM engines behind Triton (TensorRT-LLM and vLLM backends, rules/engine.py): their
    KV cache, waiting and running requests, preemptions. A full KV cache alone is a busy, healthy engine; it
    matters when requests wait behind it."""

    kv_cache_warning_ratio: float = field(0.90, doc="KV cache used fraction from which waiting requests are "
                                                     "blamed on it (vLLM schedules no new sequence without a "
                                                     "free block; at ~90 % a long prompt no longer fits)")
    kv_cache_critical_ratio: float = field(0.98, doc="KV cache used fraction that leaves no room for a new "
                                                      "sequence: every new request waits or preempts another")
    min_waiting_requests: float = field(1.0, doc="waiting requests from which users feel a full KV cache")
    critical_for: Duration = field(_d("10m"), doc="`for` of EngineKvCacheFull critical: a full cache with a "
                                                  "queue that long is no burst")
    preemption_rate: float = field(0.1, doc="preemptions/s over the rate window: each one recomputes (or "
                                            "swaps) a running request's work; an occasional one is normal")
    waiting_growth_for: Duration = field(_d("15m"), doc="`for` of EngineWaitingRequestsGrowing: the queue grows "
                                                        "for longer than the rate window (the engine is "
                                                        "saturated, not riding out a burst)")
    fill_horizon: Duration = field(_d("1h"), doc="EngineKvCacheFillPredicted / EngineGpuMemoryFillPredicted: "
                                                 "fire when the trend reaches full within this horizon")
    fill_lookback: Duration | None = field(None, doc="range predict_linear fits the trend over; unset: 12 x "
                                                     "prometheus.rate_window (1h with the default 5m; node-mixin "
                                                     "fits 6h for a 24h disk forecast, too slow for a KV cache)")
    for_: Duration = field(_d("5m"), key="for", doc="`for` of the other engine alerts")

    def _validate(self, path: str) -> None:
        for name in ("kv_cache_warning_ratio", "kv_cache_critical_ratio"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise SpecError(f"{path}.{name}", f"expected a ratio in (0, 1], got {getattr(self, name)}")
        if self.kv_cache_warning_ratio > self.kv_cache_critical_ratio:
            raise SpecError(f"{path}.kv_cache_warning_ratio",
                            f"expected at most kv_cache_critical_ratio ({self.kv_cache_critical_ratio}), "
                            f"got {self.kv_cache_warning_ratio}")
        if self.min_waiting_requests <= 0:
            raise SpecError(f"{path}.min_waiting_requests", f"expected a positive number, got "
                                                             f"{self.min_waiting_requests}")


@dataclasses.dataclass
class TritonLayer:
    """L2 thresholds; `models` overrides them per model name."""

    error_ratio: float = field(0.01, doc="failed / all requests over 5m")
    min_request_rate: float = field(0.1, doc="req/s below which error ratios are not judged (low-traffic guard)")
    queue_p95_seconds: float = field(0.5)
    pending_requests: float = field(100.0)
    batching_efficiency_ratio: float = field(0.5, doc="achieved/preferred batch size below this is ineffective")
    canary_regression_ratio: float = field(0.05, doc="newer version worse than older by more than 5 %")
    canary_min_error_ratio_delta: float = field(0.001, doc="and worse by at least this much absolute error ratio, "
                                                          "so 0.01 % vs 0.0105 % is not a regression")
    batching_min_queue_seconds: float = field(0.05, doc="average queue time above which ineffective batching "
                                                        "matters (requests wait for batches that never fill)")
    cancellation_ratio: float = field(0.2, doc="requests cancelled by their client (reason CANCELED) / all "
                                               "requests above this is TritonCancellationRatioHigh (a warning)")
    for_: Duration = field(_d("5m"), key="for")
    exporter_down_for: Duration = field(_d("5m"), doc="`for` of TritonServerDown and TritonCollectorDown")
    models: dict[str, ModelOverride] = field({})
    engine: EngineThresholds = field(EngineThresholds, doc="the LLM engines' KV cache and scheduler (rules/engine.py)")


@dataclasses.dataclass
class BurnRateWindow:
    """One burn-rate alert: fire when the error ratio over BOTH `long` and `short` exceeds
    `factor` × (1 − objective). `name` becomes the alert's `window` label (for inhibition)."""

    name: str
    long: Duration
    short: Duration
    factor: float
    severity: str = field("critical", doc="critical pages, warning makes a ticket")
    for_: Duration = field(_d("0s"), key="for")

    def _validate(self, path: str) -> None:
        if self.short >= self.long:
            raise SpecError(f"{path}.short", f"expected shorter than long ({self.long}), got {self.short}")
        if self.severity not in SEVERITIES:
            raise SpecError(f"{path}.severity", f"expected one of {', '.join(SEVERITIES)}, got {self.severity!r}")
        if self.factor <= 0:
            raise SpecError(f"{path}.factor", f"expected a positive number, got {self.factor}")


@dataclasses.dataclass
class NotifierAlerts:
    """Thresholds of the notifier's self-alerts (NotifierDeliveryFailing, NotifierDeadLetters, NotifierDown)."""

    delivery_failure_ratio: float = field(0.5, doc="failed / all delivery attempts over the rate window")
    min_attempt_rate: float = field(0.0, doc="attempts/s below which the failure ratio is not judged")
    oldest_pending_seconds: float = field(900.0, doc="a notification still undelivered after this is failing")
    for_: Duration = field(_d("5m"), key="for")
    down_for: Duration = field(_d("2m"), doc="`for` of NotifierDown: without the notifier nobody gets paged")


@dataclasses.dataclass
class LlmLayer:
    """L3 thresholds (per-tier targets live under `tiers`)."""

    cancellation_ratio: float = field(0.2)
    throughput_collapse_ratio: float = field(0.5, doc="tokens/s below this fraction of the same hour yesterday")
    throughput_baseline_offset: Duration = field(_d("1d"), doc="'yesterday' for the collapse alert (shorten in demos)")
    throughput_min_tokens_per_second: float = field(1.0, doc="baseline below this is too quiet to judge a collapse")
    min_request_rate: float = field(0.05)
    for_: Duration = field(_d("5m"), key="for")
    exporter_down_for: Duration = field(_d("5m"), doc="`for` of GatewayExporterDown")
    burn_rate_windows: list[BurnRateWindow] = field(
        [BurnRateWindow("fast-1h", _d("1h"), _d("5m"), 14.4, "critical", _d("2m")),
         BurnRateWindow("slow-6h", _d("6h"), _d("30m"), 6.0, "critical", _d("15m")),
         BurnRateWindow("fast-1d", _d("1d"), _d("2h"), 3.0, "warning", _d("1h")),
         BurnRateWindow("slow-3d", _d("3d"), _d("6h"), 1.0, "warning", _d("3h"))],
        doc="multi-window multi-burn-rate pairs for a 30-day SLO (Google SRE Workbook ch. 5); "
            "scale all windows down together for short demos")


@dataclasses.dataclass
class Layers:
    L1: GpuLayer = field(GpuLayer)
    L2: TritonLayer = field(TritonLayer)
    L3: LlmLayer = field(LlmLayer)
    notifier: NotifierAlerts = field(NotifierAlerts, doc="notifier self-alerts (layer L1, component notifier)")


# ------------------------------------------------------------------------------------- tenants / tiers
@dataclasses.dataclass
class Tier:
    """An SLA class. `services` are the X-Service-Name values that map to it."""

    services: list[str] = field([])
    ttft_p95_seconds: float = field(0.3, doc="TTFT P95 target; 300 ms suits interactive chat")
    availability_objective: float = field(0.999, doc="fraction of requests that must succeed over 30d")
    ttft_objective: float = field(0.99, doc="fraction of streamed requests whose TTFT is under ttft_slo_seconds")
    ttft_slo_seconds: float = field(0.5, doc="TTFT threshold for the SLO; must be a histogram bucket edge and "
                                             "not below ttft_p95_seconds (`inferwatch check` refuses it)")
    per_tenant_quantiles: bool = field(False, doc="judge TTFT P95 per tenant: one LlmTtftP95High per tenant, model "
                                                  "and tier; otherwise one per model and tier, every tenant's "
                                                  "requests together (a slow tenant then shows in the dashboards "
                                                  "and triage, not as its own page)")

    def _validate(self, path: str) -> None:
        for name in ("availability_objective", "ttft_objective"):
            v = getattr(self, name)
            if not 0.0 < v < 1.0:
                raise SpecError(f"{path}.{name}", f"expected a ratio between 0 and 1 (exclusive), got {v}")


@dataclasses.dataclass
class GatewayOtlp:
    """An OpenTelemetry export of the gateway's metrics under the GenAI semantic conventions, beside /metrics
    (docs/gateway-otlp.md): OTLP/HTTP protobuf to a collector, cumulative, from the same meter as gateway_*."""

    endpoint: str = field("", doc="OTLP/HTTP metrics URL of a collector, with its path, e.g. "
                                  "http://otel-collector:4318/v1/metrics; empty: no export (the default)")
    headers: dict[str, Secret] = field({}, doc="headers of every export request, secrets by reference, e.g. "
                                               "authorization: ${OTLP_AUTHORIZATION}")
    interval: Duration = field(_d("60s"), doc="time between two exports (the SDK's default), 1s to 1h")
    timeout: Duration = field(_d("10s"), doc="deadline of one export, retries included (the SDK's default); "
                                             "a longer one than the interval is cut to the interval")
    provider_name: str = field("", doc="gen_ai.provider.name of every point; empty: by each request's API "
                                       "(openai for the OpenAI APIs, anthropic for Messages, triton for Triton's)")
    service_name: str = field("inferwatch-gateway", doc="the resource's service.name")
    max_attribute_sets: int = field(2000, doc="distinct attribute sets per metric (the SDK's default limit), "
                                              "1-100000; beyond it, points go to one set "
                                              "otel.metric.overflow=true (raise it for tenants x models x tiers "
                                              "x APIs x error types above it)")

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)

    def _validate(self, path: str) -> None:
        import re
        from urllib.parse import urlsplit

        if self.endpoint:
            try:
                parts = urlsplit(self.endpoint)
                host, _port = parts.hostname, parts.port
            except ValueError as exc:
                raise SpecError(f"{path}.endpoint", f"expected an http(s) URL ({exc})") from None
            if parts.scheme not in ("http", "https") or not host:
                raise SpecError(f"{path}.endpoint", "expected an http(s) URL with a host, such as "
                                                    "http://otel-collector:4318/v1/metrics")
            if parts.username is not None or parts.password is not None:
                # A URL lands in log lines; credentials belong in `headers`, by reference.
                raise SpecError(f"{path}.endpoint", "expected a URL without user:password@ (put credentials in "
                                                    "headers, by reference; the value is not shown)")
        for name in self.headers:
            if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
                raise SpecError(f"{path}.headers", f"expected HTTP header names, got {name!r}")
        if not 1000 <= self.interval.ms <= 3_600_000:
            raise SpecError(f"{path}.interval", f"expected 1s to 1h, got {self.interval}")
        if self.timeout.ms <= 0:
            raise SpecError(f"{path}.timeout", f"expected more than 0s, got {self.timeout}")
        if not 1 <= self.max_attribute_sets <= 100_000:
            raise SpecError(f"{path}.max_attribute_sets", f"expected 1-100000, got {self.max_attribute_sets}")
        if not self.service_name:
            raise SpecError(f"{path}.service_name", "expected a service name, got ''")


@dataclasses.dataclass
class GatewaySettings:
    """The L3 gateway proxy: label headers, limits, and which Triton models are LLMs (metered)."""

    tenant_header: str = field("X-Tenant-ID")
    service_header: str = field("X-Service-Name")
    max_body_bytes: int = field(8 * 1024 * 1024, doc="largest request body forwarded; above it: 413")
    upstream_timeout: Duration = field(_d("5m"), doc="connect, response headers and each gap between reads; "
                                                     "above it: 504 (or the stream is cut)")
    max_answer_bytes: int = field(
        16 * 1024 * 1024,
        doc="most bytes of one non-streamed answer (or of one stream event, decompressed) the gateway holds to "
            "meter it; a larger answer is forwarded unmetered as it arrives (counted in "
            "gateway_unmetered_responses_total{reason=\"too_large\"}, logged once)")
    llm_models: list[str] | None = field(
        None, doc="Triton models metered as LLM traffic on generate, generate_stream and infer; unset: "
                  "generate and generate_stream of every model (Triton's LLM endpoints) and infer of none. "
                  "OpenAI-compatible /v1/chat/completions and /v1/completions are always metered")
    routes: dict[str, str] = field(
        {}, doc="more metered POST paths, path -> protocol (openai: chat or completions, responses, messages, "
                "embeddings), added to the defaults /v1/chat/completions, /v1/completions (openai), /v1/responses, "
                "/v1/messages, /v1/embeddings (docs/gateway-apis.md); a default path given here takes this protocol")
    max_connections: int = field(4096, doc="open client connections; beyond, the ones idle longest are closed "
                                           "(lowered to stay below the file-descriptor limit)")
    header_timeout: Duration = field(_d("10s"), doc="a connection must send a complete request head within this "
                                                    "(of opening, or of the request's first byte); else closed")
    body_timeout: Duration = field(_d("60s"), doc="a request body must arrive within this of its head (else 408)")
    idle_timeout: Duration = field(_d("75s"), doc="a kept-alive connection without a request this long is closed")
    send_timeout: Duration = field(_d("60s"), doc="a client that takes nothing of its answer this long (its buffer "
                                                  "full) is cut off; the upstream request is closed")
    grpc_certificate_file: str = field("", doc="PEM certificate chain of the gRPC listener (--grpc-upstream); with "
                                               "grpc_private_key_file it speaks TLS, else h2c (cleartext HTTP/2)")
    grpc_private_key_file: str = field("", doc="PEM private key of grpc_certificate_file (a file path, never the key)")
    tenant_trusted_proxies: list[str] = field(
        ["127.0.0.1/32", "::1/128"],
        doc="addresses or CIDR networks whose tenant_header is believed (the authenticating proxy in front); "
            "from any other peer the header is removed and the request billed to `other` "
            "(exporters/gateway/tenancy.py)")
    tenant_api_keys: Secret | None = field(
        None, doc="secret reference to lines `<api key> <tenant>`: a request with `Authorization: Bearer <key>` "
                  "is billed to that tenant whatever header it sent")
    upstream_authorization: Secret | None = field(
        None, doc="secret reference to the whole Authorization value sent upstream (e.g. `Bearer <token>`): set, "
                  "every client credential header (Authorization, X-Api-Key, Api-Key) is removed from every "
                  "forwarded request and call and this sent instead (over --upstream URL credentials); unset, "
                  "the client's own are forwarded as sent (exporters/gateway/credentials.py)")
    otlp: GatewayOtlp = field(GatewayOtlp, doc="OpenTelemetry export of the gateway's metrics under the GenAI "
                                               "semantic conventions (docs/gateway-otlp.md); off unless an endpoint "
                                               "is set")

    def _validate(self, path: str) -> None:
        for name in ("max_body_bytes", "max_answer_bytes"):
            if getattr(self, name) < 1024:
                raise SpecError(f"{path}.{name}", f"expected at least 1024, got {getattr(self, name)}")
        if self.max_connections < 16:
            raise SpecError(f"{path}.max_connections", f"expected at least 16, got {self.max_connections}")
        if bool(self.grpc_certificate_file) != bool(self.grpc_private_key_file):
            raise SpecError(f"{path}.grpc_certificate_file", "grpc_certificate_file and grpc_private_key_file "
                            "go together (TLS needs both)")
        from inferwatch.networks import parse_networks  # host bits refused (inferwatch/networks.py)

        parse_networks(self.tenant_trusted_proxies, f"{path}.tenant_trusted_proxies")
        from inferwatch.exporters.gateway.routes import PROTOCOLS  # the gateway's table, not the spec's

        for route, protocol in self.routes.items():
            if not route.startswith("/"):
                raise SpecError(f"{path}.routes", f"expected a path starting with /, got {route!r}")
            if protocol not in PROTOCOLS:
                raise SpecError(f"{path}.routes.{route}", f"expected one of {', '.join(PROTOCOLS)}, got {protocol!r}")


# ------------------------------------------------------------------------------------ notifier routing
@dataclasses.dataclass
class Channel:
    """A delivery destination. `type`: pagerduty | voice | slack | wecom. Secrets by reference only."""

    type: str
    url: Secret | None = field(None, doc="webhook or API URL (Slack/WeCom webhook, voice endpoint)")
    routing_key: Secret | None = field(None, doc="PagerDuty integration key")
    mentions: list[str] = field([], doc="WeCom @mentions (user ids or mobile numbers)")
    template: str = field("", doc="message template overriding the channel default "
                                  "(string.Template: per-alert line for chat, request body for voice)")
    headers: dict[str, Secret] = field({})
    timeout: Duration = field(_d("10s"), doc="deadline of a whole send (connect, request, answer); a slower "
                                            "provider counts as a retryable failure (timeout)")
    rate_limit: int = field(0, doc="max messages per rate_window to this destination; 0 = the provider's limit "
                                   "(WeCom robot 20/min, Slack ~1/s, PagerDuty ~120/min, voice 10/min)")
    rate_window: Duration = field(_d("1m"), doc="window rate_limit counts over")

    def _validate(self, path: str) -> None:
        kinds = ("pagerduty", "voice", "slack", "wecom")
        if self.type not in kinds:
            raise SpecError(f"{path}.type", f"expected one of {', '.join(kinds)}, got {self.type!r}")
        if self.type == "pagerduty" and self.routing_key is None:
            raise SpecError(f"{path}.routing_key", "required for a pagerduty channel")
        if self.type in ("voice", "slack", "wecom") and self.url is None:
            raise SpecError(f"{path}.url", f"required for a {self.type} channel")


@dataclasses.dataclass
class Route:
    """Send alerts whose labels equal every `match` entry to `receivers` (channel names).

    Routes are tried in order; the first match stops the walk unless it says `continue: true`.
    """

    receivers: list[str]
    match: dict[str, str] = field({})
    match_re: dict[str, str] = field({}, doc="label → regular expression the whole value must match")
    continue_: bool = field(False, key="continue")
    escalate_after: Duration | None = field(None, doc="still firing after this → also to escalate_to")
    escalate_to: list[str] = field([])
    enrich: str = field("", doc="'module:function' called with the notification; its text (e.g. the top "
                                "triage finding) is added to the message when it returns within enrich_timeout")
    enrich_timeout: Duration = field(_d("2s"), doc="never delays delivery longer than this")

    def _validate(self, path: str) -> None:
        import re

        for label, pattern in self.match_re.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SpecError(f"{path}.match_re.{label}",
                                f"expected a regular expression, got {pattern!r} ({exc})") from None
        if self.enrich and ":" not in self.enrich:
            raise SpecError(f"{path}.enrich", f"expected 'module:function', got {self.enrich!r}")


@dataclasses.dataclass
class LayerGrouping:
    """Alertmanager `group_by`/`group_wait`/`group_interval`/`repeat_interval` for one layer's route."""

    group_by: list[str] = field(["alertname"])
    group_wait: Duration = field(_d("30s"), doc="wait before the first message of a new group")
    group_interval: Duration = field(_d("5m"), doc="minimum time between messages for a changed group")
    repeat_interval: Duration = field(_d("4h"), doc="re-send an unchanged firing group; keep above dedup_window")


@dataclasses.dataclass
class NotifierOutbox:
    """Where the notifier keeps its outbox: SQLite in `data_dir` (no url, the default: one notifier), or a
    shared PostgreSQL every replica writes and reads (docs/notifier-postgresql.md)."""

    url: str = field("", doc="postgresql://user@host:port/database of a shared PostgreSQL outbox (no password "
                             "in it: see password); empty: SQLite in data_dir")
    password: Secret | None = field(None, doc="the PostgreSQL user's password, by reference (`${ENV_VAR}` or "
                                              "password_file); unset: the server's own (peer, .pgpass)")
    lease: Duration = field(_d("2m"), doc="a replica's claim on a delivery it is sending; a replica killed "
                                          "mid-send leaves it to another after this (longer than any send)")
    connect_timeout: Duration = field(_d("5s"), doc="longest wait for a PostgreSQL connection (else 503)")

    def _validate(self, path: str) -> None:
        if not self.url:
            if self.password is not None:
                raise SpecError(f"{path}.password", "set only with url (a PostgreSQL outbox)")
            return
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as exc:
            raise SpecError(f"{path}.url", f"expected postgresql://user@host:port/database, got an invalid "
                            f"URL ({exc})") from None
        if parts.scheme not in ("postgresql", "postgres"):
            raise SpecError(f"{path}.url", f"expected a postgresql:// URL, got scheme {parts.scheme!r}")
        if parts.password is not None:
            raise SpecError(f"{path}.url", "the URL holds a password: give it by reference in "
                            f"{path}.password (`${{ENV_VAR}}` or password_file) instead")
        if not parts.hostname:
            raise SpecError(f"{path}.url", "expected a host: postgresql://user@host:port/database")
        if not parts.path.strip("/"):
            raise SpecError(f"{path}.url", "expected a database name: postgresql://user@host:port/database")
        if self.lease.seconds < 10:
            raise SpecError(f"{path}.lease", f"expected at least 10s (longer than a send), got {self.lease}")
        if not 0 < self.connect_timeout.seconds <= 60:
            raise SpecError(f"{path}.connect_timeout", f"expected more than 0s and at most 60s, "
                            f"got {self.connect_timeout}")


@dataclasses.dataclass
class NotifierSettings:
    bearer_token: Secret | None = field(None, doc="require Authorization: Bearer on POST /alerts")
    basic_auth_user: str = field("")
    basic_auth_password: Secret | None = None
    max_body_bytes: int = field(8 * 1024 * 1024, doc="largest webhook body accepted (413 above); the generated "
                                "Alertmanager configuration sends at most as many alerts as always fit (max_alerts)")
    max_connections: int = field(512, doc="open client connections to the intake; beyond, the oldest idle are "
                                          "closed (lowered to stay below the file-descriptor limit)")
    header_timeout: Duration = field(_d("10s"), doc="a new connection must send its request head within this")
    idle_timeout: Duration = field(_d("60s"), doc="a kept-alive connection idle this long is closed")
    body_timeout: Duration = field(_d("30s"), doc="a webhook body must arrive within this (else 408)")
    send_processes: int = field(2, doc="run channel sends in this many processes, so a storm's deliveries use "
                                       "more than one core (0: in the notifier's own threads)")
    max_delivery_age: Duration = field(_d("6h"), doc="retry transient failures this long, then dead-letter")
    data_dir: str = field(".inferwatch-notifier", doc="where the SQLite outbox lives (--data-dir overrides)")
    outbox: NotifierOutbox = field(NotifierOutbox, doc="the outbox: SQLite in data_dir, or a shared PostgreSQL "
                                                       "for replicas (url, password)")
    retry_initial: Duration = field(_d("5s"), doc="first retry delay; doubles per attempt, with jitter")
    retry_max: Duration = field(_d("5m"), doc="longest delay between two attempts")
    dedup_window: Duration = field(_d("30m"), doc="a webhook identical to one received this recently is a "
                                                  "redelivery (AM retry, HA peer); keep below repeat_interval")
    unrouted_receivers: list[str] | None = field(
        None, doc="channels for alerts no route matches (never dropped); unset = the receivers an L2 alert "
                  "reaches (Slack/on-call), else every chat channel; [] = keep them as `unrouted` dead letters")
    # Alertmanager config generated from the spec (deploy/alertmanager/alertmanager.yml) ---------------
    token_file: str = field("/etc/alertmanager/secrets/notifier-token",
                            doc="file Alertmanager reads the bearer token from (same value as bearer_token)")
    fallback_routing_key_file: str = field("/etc/alertmanager/secrets/pagerduty-fallback-key",
                                           doc="PagerDuty key file for notifier self-alerts (bypass the notifier)")
    fallback_pagerduty_url: str = field("https://events.pagerduty.com/v2/enqueue",
                                        doc="Events API v2 URL of the fallback receiver")
    heartbeat_url: str = field("", doc="dead man's switch the always-firing InferwatchHeartbeat alert is sent to "
                                       "every heartbeat_interval (a healthchecks-style URL that pages when the pings "
                                       "stop); empty: the heartbeat goes nowhere (set it: nothing else proves the "
                                       "alerting path alive)")
    heartbeat_token_file: str = field("/etc/alertmanager/secrets/heartbeat-token",
                                      doc="file Alertmanager reads the heartbeat receiver's bearer token from")
    heartbeat_interval: Duration = field(_d("1m"), doc="how often Alertmanager sends the heartbeat")
    grouping: dict[str, "LayerGrouping"] = field(
        {"L1": LayerGrouping(["alertname", "node", "gpu"], _d("10s"), _d("1m"), _d("1h")),
         "L2": LayerGrouping(["alertname", "node", "triton", "model"], _d("30s"), _d("5m"), _d("4h")),
         "L3": LayerGrouping(["alertname", "tenant", "model", "tier"], _d("30s"), _d("5m"), _d("4h"))},
        doc="Alertmanager grouping per layer: L1 pages fast and per GPU, L2/L3 batch a storm into few messages")

    def _validate(self, path: str) -> None:
        if self.basic_auth_user and self.basic_auth_password is None:
            raise SpecError(f"{path}.basic_auth_password", "required when basic_auth_user is set")
        if self.max_body_bytes < 1024:
            raise SpecError(f"{path}.max_body_bytes", f"expected at least 1024, got {self.max_body_bytes}")
        if not 0 <= self.send_processes <= 64:
            raise SpecError(f"{path}.send_processes", f"expected 0 to 64, got {self.send_processes}")
        if self.max_connections < 16:
            raise SpecError(f"{path}.max_connections", f"expected at least 16, got {self.max_connections}")


# ------------------------------------------------------------------------------------------ kubernetes
@dataclasses.dataclass
class KubernetesWorkload:
    """Replicas and container resources of one inferwatch workload in deploy/kubernetes; what is left out
    keeps the default of KUBERNETES_WORKLOADS."""

    replicas: int | None = field(None, doc="pods (the gateway's is its autoscaler's minimum; "
                                           "not used for the GPU exporter DaemonSet)")
    resources: dict[str, dict[str, str]] = field({}, doc="container requests/limits, e.g. "
                                                         "{requests: {cpu: 100m, memory: 128Mi}, limits: {...}}; "
                                                         "each value given replaces its default")

    def _validate(self, path: str) -> None:
        if self.replicas is not None and self.replicas < 1:
            raise SpecError(f"{path}.replicas", f"expected at least 1, got {self.replicas}")
        unknown = sorted(set(self.resources) - {"requests", "limits"})
        if unknown:
            raise SpecError(f"{path}.resources", f"expected only requests and limits, got {', '.join(unknown)}")


def _workload(replicas: int, cpu_request: str, memory_request: str, cpu_limit: str,
              memory_limit: str) -> KubernetesWorkload:
    return KubernetesWorkload(replicas, {"requests": {"cpu": cpu_request, "memory": memory_request},
                                         "limits": {"cpu": cpu_limit, "memory": memory_limit}})


# Defaults per workload: CPU requests sized for a small fleet; memory limits leave room for the answers each
# reads whole (the collector's repository index, the notifier's outbox batches).
KUBERNETES_WORKLOADS = {
    "gpu-exporter": _workload(1, "50m", "64Mi", "500m", "256Mi"),
    "gateway": _workload(2, "250m", "256Mi", "2", "1Gi"),
    "triton-collector": _workload(1, "50m", "128Mi", "500m", "512Mi"),
    "notifier": _workload(1, "50m", "128Mi", "500m", "512Mi"),
}


@dataclasses.dataclass
class KubernetesTriton:
    """Your Triton in the cluster: the Service the Triton collector polls, the gateway forwards to and the
    `triton` ServiceMonitor scrapes (Triton's own /metrics)."""

    namespace: str = field("triton", doc="namespace of Triton's Service")
    service: str = field("triton", doc="Service name; also the `triton` label of Triton's and the collector's series")
    http_port: int = field(8000, doc="Service port of Triton's HTTP API")
    metrics_port_name: str = field("metrics", doc="name of the Service port serving Triton's :8002/metrics")
    selector: dict[str, str] = field({"app.kubernetes.io/name": "triton"}, doc="labels of Triton's Service")
    headers: dict[str, Secret] = field({}, doc="request headers for the collector, e.g. "
                                               "triton-access-token: ${TRITON_ACCESS_TOKEN}")
    monitor: bool = field(True, doc="generate the ServiceMonitor scraping Triton's metrics; false where your "
                                    "own monitor scrapes them already (no second scrape of the same pods): "
                                    "selectors.triton then defaults to its Service's namespace and service "
                                    "labels (docs/own-stack.md)")
    pods_service: str = field("", doc="a headless Service (clusterIP: None, publishNotReadyAddresses: true) in "
                                      "`namespace` selecting Triton's pods on `http_port`: the Triton collector "
                                      "polls every pod behind it (label address). Empty: it polls `service`, and "
                                      "one that spreads over several pods is reported load-balanced, its "
                                      "statistics withheld")

    def _validate(self, path: str) -> None:
        for name in ("namespace", "service", "metrics_port_name", "pods_service"):
            if name == "pods_service" and not self.pods_service:
                continue
            _kubernetes_name(f"{path}.{name}", getattr(self, name))


def _kubernetes_name(path: str, value: str) -> None:
    """SpecError unless `value` is a Kubernetes DNS label (RFC 1123: the names of namespaces and Services)."""
    import re

    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", value):
        raise SpecError(path, f"expected a Kubernetes name (lower-case letters, digits, '-'), got {value!r}")


@dataclasses.dataclass
class KubernetesSettings:
    """deploy/kubernetes/ (a kustomize base) written by `inferwatch generate`. Namespace and the labels the
    Prometheus Operator selects on are `prometheus.kubernetes_namespace` and `prometheus.kubernetes_labels`."""

    image: str = field("inferwatch:0.1.0", doc="image built from the Dockerfile; point it at your registry "
                                               "here or with a kustomize overlay's `images:`")
    image_pull_policy: str = field("IfNotPresent")
    prometheus_url: str = field("", doc="Prometheus the notifier's triage hook asks; "
                                        "default http://prometheus-operated.<namespace>.svc:9090")
    alertmanager_url: str = field("", doc="default http://alertmanager-operated.<namespace>.svc:9093")
    triton: KubernetesTriton = field(KubernetesTriton)
    gpu_node_selector: dict[str, str] = field({"nvidia.com/gpu.present": "true"},
                                              doc="nodes the GPU exporter runs on (the GPU Operator's node label)")
    gpu_tolerations: list[dict[str, str]] = field(
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        doc="tolerations for tainted GPU nodes")
    gpu_runtime_class: str = field("nvidia", doc="RuntimeClass giving the GPU exporter NVML ('' = the node default)")
    pod_resources: bool = field(True, doc="mount the kubelet pod-resources socket (GPU → pod labels); the "
                                          "socket is root's, so the GPU exporter then runs as uid 0")
    gpu_exporter: bool = field(True, doc="deploy inferwatch's GPU exporter (DaemonSet and PodMonitor); false where "
                                         "dcgm-exporter (the GPU Operator's) is the GPU source, selectors.gpu "
                                         "picking its series")
    prometheus_replica_label: str = field(
        "prometheus_replica", doc="the external label your kube-prometheus-stack names each Prometheus replica "
                                  "with (its replicaExternalLabelName; the chart's default), kept in the generated "
                                  "values so applying them changes no label of the alerts it already sends")
    gateway_max_replicas: int = field(10, doc="autoscaler maximum (minimum: workloads.gateway.replicas)")
    gateway_target_cpu_percent: int = field(70, doc="autoscaler target: average CPU use / request")
    notifier_storage: str = field("1Gi", doc="PersistentVolumeClaim size of each notifier's outbox")
    storage_class: str = field("", doc="StorageClass of the outbox claim ('' = the cluster default)")
    workloads: dict[str, KubernetesWorkload] = field(
        {}, doc="overrides per workload (gpu-exporter, gateway, triton-collector, notifier): replicas, resources")
    tenant_trusted_proxies: list[str] = field(
        [], doc="CIDR networks of the ingress controller's pods (the pod network, e.g. 10.244.0.0/16), whose "
                "gateway.tenant_header the generated gateway believes besides gateway.tenant_trusted_proxies; "
                "empty: only those (loopback by default: every tenant billed `other` behind an ingress, "
                "`inferwatch check` warns)")

    def workload(self, name: str) -> KubernetesWorkload:
        """The effective replicas and resources of workload `name` (spec overrides over the defaults)."""
        default = KUBERNETES_WORKLOADS[name]
        given = self.workloads.get(name, KubernetesWorkload())
        resources = {kind: {**default.resources.get(kind, {}), **given.resources.get(kind, {})}
                     for kind in ("requests", "limits")}
        return KubernetesWorkload(given.replicas or default.replicas, resources)

    def _validate(self, path: str) -> None:
        import re

        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.prometheus_replica_label) \
                or self.prometheus_replica_label.startswith("__"):
            raise SpecError(f"{path}.prometheus_replica_label",
                            f"expected a label name, got {self.prometheus_replica_label!r}")
        from inferwatch.networks import parse_networks  # host bits refused (inferwatch/networks.py)

        parse_networks(self.tenant_trusted_proxies, f"{path}.tenant_trusted_proxies")
        unknown = sorted(set(self.workloads) - set(KUBERNETES_WORKLOADS))
        if unknown:
            raise SpecError(f"{path}.workloads.{unknown[0]}",
                            f"unknown workload (expected one of: {', '.join(KUBERNETES_WORKLOADS)})")
        replicas = self.workload("gateway").replicas or 1
        if replicas > self.gateway_max_replicas:
            raise SpecError(f"{path}.gateway_max_replicas",
                            f"expected at least workloads.gateway.replicas ({replicas}), "
                            f"got {self.gateway_max_replicas}")


# ----------------------------------------------------------------------------------- high availability
@dataclasses.dataclass
class PrometheusReplica:
    """One Prometheus of an HA pair (or more): every replica scrapes the same targets and evaluates the same
    rules; its `replica` external label tells their series apart and is dropped from the alerts it sends."""

    address: str = field(doc="host:port of this replica's web API (the replicas scrape each other's /federate)")
    name: str = field("", doc="value of the replica label; default a, b, c ... by position")


@dataclasses.dataclass
class AlertmanagerPeer:
    """One Alertmanager of the cluster: every Prometheus replica sends to every peer; the peers gossip
    silences and the notification log, so one of them sends each notification."""

    address: str = field(doc="host:port of this peer's web API (Prometheus sends alerts here)")
    cluster_address: str = field("", doc="host:port this peer gossips on (--cluster.listen-address); "
                                         "default: the address's host, port 9094")

    def __post_init__(self) -> None:
        if not self.cluster_address:
            self.cluster_address = f"{self.address.rsplit(':', 1)[0]}:9094"


REPLICA_NAMES = "abcdefghijklmnopqrstuvwxyz"
_REPLICA_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"  # a label value that is also safe in a file name


@dataclasses.dataclass
class HighAvailability:
    """Replicas of the alerting path (docs/ha.md): Prometheus replicas evaluating the same rules, an
    Alertmanager cluster, notifier replicas behind one webhook address. Empty lists mean one of each
    (`targets.prometheus`, `targets.alertmanager`, clustering off), as without this section. The static
    configuration (deploy/prometheus, deploy/alertmanager) uses the addresses; the compose and Kubernetes
    outputs use only how many there are."""

    replica_label: str = field("replica", doc="external label naming each Prometheus replica; dropped from "
                                              "alerts (alert_relabel_configs) so Alertmanager sees one alert")
    prometheus: list[str | PrometheusReplica] = field(
        [], doc="the Prometheus replicas: 'host:port' or {address, name}; none = one Prometheus")
    alertmanager: list[str | AlertmanagerPeer] = field(
        [], doc="the Alertmanager peers: 'host:port' or {address, cluster_address}; none = one Alertmanager")
    notifier_replicas: int = field(1, doc="notifier processes receiving webhooks at targets.notifier (one "
                                          "address: a Service, a DNS name of all of them, or a port they share "
                                          "on one host with --shared-port); above 1 they need one shared "
                                          "outbox, notifier.outbox.url (PostgreSQL), else a warning")
    peer_timeout: Duration = field(_d("15s"), doc="Alertmanager --cluster.peer-timeout: each peer waits its "
                                                  "position × this before sending what a peer before it should "
                                                  "have sent (the longest failover delay of a dead peer)")
    gossip_interval: Duration = field(_d("200ms"), doc="Alertmanager --cluster.gossip-interval")
    pushpull_interval: Duration = field(_d("1m"), doc="Alertmanager --cluster.pushpull-interval (full state sync)")
    settle_timeout: Duration = field(_d("1m"), doc="Alertmanager --cluster.settle-timeout: a (re)started peer "
                                                   "waits at most this for the cluster's state before it sends")
    answer_wait: Duration = field(_d("0s"), doc="the notifier holds a webhook's 2xx up to this long while its "
                                                "messages are sent, so a 2xx usually means 'at the channel', not "
                                                "only 'on this replica's disk' (docs/ha.md); 0: answer once stored")
    outbox_due_rows: int = field(100, doc="NotifierOutboxGrowing: a replica's due, unsent notifications above "
                                          "this and still growing over the rate window")
    members_for: Duration = field(_d("5m"), doc="`for` of AlertmanagerClusterDegraded (rides out a restart)")
    disagreement_for: Duration | None = field(None, doc="`for` of PrometheusReplicasDisagree; default 5 "
                                                        "evaluation intervals")

    def prometheus_replicas(self) -> list[PrometheusReplica]:
        """The replicas with their names filled in (a, b, c ... where not given)."""
        out = []
        for i, r in enumerate(self.prometheus):
            r = r if isinstance(r, PrometheusReplica) else PrometheusReplica(r)
            out.append(dataclasses.replace(r, name=r.name or REPLICA_NAMES[i]))
        return out

    def alertmanager_peers(self) -> list[AlertmanagerPeer]:
        return [p if isinstance(p, AlertmanagerPeer) else AlertmanagerPeer(p) for p in self.alertmanager]

    @property
    def alertmanager_count(self) -> int:
        return max(1, len(self.alertmanager))

    @property
    def prometheus_count(self) -> int:
        return max(1, len(self.prometheus))

    def _validate(self, path: str) -> None:
        import re

        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.replica_label) or self.replica_label.startswith("__"):
            raise SpecError(f"{path}.replica_label", f"expected a label name, got {self.replica_label!r}")
        if len(self.prometheus) > len(REPLICA_NAMES):
            raise SpecError(f"{path}.prometheus", f"expected at most {len(REPLICA_NAMES)} replicas")
        names: set[str] = set()
        for i, r in enumerate(self.prometheus_replicas()):
            if not re.fullmatch(_REPLICA_NAME, r.name):
                raise SpecError(f"{path}.prometheus[{i}].name", f"expected letters, digits, '_', '.', '-', got "
                                                                f"{r.name!r}")
            if r.name in names:
                raise SpecError(f"{path}.prometheus[{i}].name", f"{r.name!r} names two replicas")
            names.add(r.name)
        addresses = [r.address for r in self.prometheus_replicas()]
        peers = self.alertmanager_peers()
        for what, field_, seen in (("prometheus", "address", addresses),
                                   ("alertmanager", "address", [p.address for p in peers]),
                                   ("alertmanager", "cluster_address", [p.cluster_address for p in peers])):
            for i, host_port in enumerate(seen):
                if not re.fullmatch(r"[^\s:/]+:[0-9]{1,5}", host_port):
                    raise SpecError(f"{path}.{what}[{i}].{field_}", f"expected host:port, got {host_port!r}")
                if seen.index(host_port) != i:
                    raise SpecError(f"{path}.{what}[{i}].{field_}",
                                    f"{host_port} is also {what}[{seen.index(host_port)}]'s")
        if not 1 <= self.notifier_replicas <= 16:
            raise SpecError(f"{path}.notifier_replicas", f"expected 1 to 16, got {self.notifier_replicas}")
        if self.outbox_due_rows < 1:
            raise SpecError(f"{path}.outbox_due_rows", f"expected at least 1, got {self.outbox_due_rows}")
        # A webhook held longer than a peer's wait would make the next peer send it too (a duplicate).
        if self.answer_wait.seconds > min(10.0, self.peer_timeout.seconds / 2):
            raise SpecError(f"{path}.answer_wait", f"expected at most half of peer_timeout ({self.peer_timeout}) "
                                                   f"and at most 10s, got {self.answer_wait}")


# -------------------------------------------------------------------------------------------- gates
@dataclasses.dataclass
class GateSettings:
    """Canary gates and autoscaling signals (inferwatch/gates, docs/canary-gates.md): how often an Argo
    Rollouts or Flagger analysis measures, and how many measurements decide. The limits themselves are
    layers.L2's canary and queue thresholds, so a gate and its alert change together."""

    interval: Duration = field(_d("1m"), doc="time between two measurements of a canary gate (Argo `interval`, "
                                             "Flagger analysis `interval`)")
    count: int = field(5, doc="measurements of an Argo analysis; all taken without reaching a limit: Successful")
    failure_limit: int = field(1, doc="failed measurements tolerated (Argo `failureLimit`, Flagger "
                                      "`threshold` - 1): one more and the canary is rolled back")
    inconclusive_limit: int = field(2, doc="measurements with too little traffic to judge tolerated (Argo "
                                           "`inconclusiveLimit`): one more pauses the rollout for a person")
    activation_ratio: float = field(0.5, doc="a KEDA trigger is active above this share of its threshold "
                                             "(`activationThreshold`; scaling from zero needs it)")
    namespace: str = field("", doc="namespace of the generated gate objects; empty: kubernetes.triton.namespace")
    deployment: str = field("", doc="Triton's Deployment the ScaledObject scales; empty: "
                                    "kubernetes.triton.service")
    min_replicas: int = field(1, doc="ScaledObject minReplicaCount")
    max_replicas: int = field(10, doc="ScaledObject maxReplicaCount")

    def _validate(self, path: str) -> None:
        if self.interval.ms <= 0:
            raise SpecError(f"{path}.interval", f"expected a positive duration, got {self.interval}")
        for name in ("count", "failure_limit", "inconclusive_limit", "min_replicas"):
            if getattr(self, name) < 0 or (name == "count" and self.count < 1):
                raise SpecError(f"{path}.{name}", f"expected a {'positive' if name == 'count' else 'non-negative'} "
                                                  f"integer, got {getattr(self, name)}")
        if self.failure_limit >= self.count:
            raise SpecError(f"{path}.failure_limit", f"expected less than count ({self.count}), got "
                                                     f"{self.failure_limit}")
        if not 0.0 < self.activation_ratio <= 1.0:
            raise SpecError(f"{path}.activation_ratio", f"expected a ratio in (0, 1], got {self.activation_ratio}")
        for name in ("namespace", "deployment"):  # empty: taken from kubernetes.triton
            if getattr(self, name):
                _kubernetes_name(f"{path}.{name}", getattr(self, name))
        if self.max_replicas < max(1, self.min_replicas):
            raise SpecError(f"{path}.max_replicas", f"expected at least min_replicas ({self.min_replicas}) and 1, "
                                                    f"got {self.max_replicas}")


# -------------------------------------------------------------------------------------------- the spec
@dataclasses.dataclass
class Spec:
    """The whole spec. See inferwatch.yaml at the repository root for a commented example."""

    version: int = 1
    runbook_base_url: str = field("https://github.com/inferwatch/inferwatch/blob/main/runbooks/",
                                  doc="alerts link to <this>/<AlertName>.md")
    targets: Targets = field(Targets)
    prometheus: PrometheusSettings = field(PrometheusSettings)
    selectors: Selectors = field(Selectors, doc="PromQL label selector of each source's series")
    identity: Identity = field(Identity, doc="which of your labels identify a Triton server, its replica and "
                                                  "node, and a GPU's node (docs/selectors.md)")
    cluster: ClusterSettings = field(ClusterSettings, doc="this cluster's name, when several clusters are watched")
    central_store: CentralStore = field(CentralStore, doc="a central store (VictoriaMetrics) several clusters "
                                                          "write to, and vmalert evaluating the rules there")
    layers: Layers = field(Layers)
    tenants: list[str] = field([], doc="declared tenants; any other X-Tenant-ID folds into 'other'")
    models: list[str] = field([], doc="declared models for gateway labels; others fold into 'other'")
    upstreams: dict[str, Upstream] = field({}, doc="the servers behind the gateway and the models each serves "
                                                   "(upstreams.py); none: every model is Triton's")
    tiers: dict[str, Tier] = field({"realtime": Tier(), "standard": Tier(ttft_p95_seconds=1.0, ttft_slo_seconds=2.0),
                                    "batch": Tier(ttft_p95_seconds=10.0, ttft_slo_seconds=20.0)})
    gateway: GatewaySettings = field(GatewaySettings)
    channels: dict[str, Channel] = field({})
    routes: list[Route] = field([])
    notifier: NotifierSettings = field(NotifierSettings)
    kubernetes: KubernetesSettings = field(KubernetesSettings)
    ha: HighAvailability = field(HighAvailability, doc="replicas of Prometheus, Alertmanager and the notifier")
    gates: GateSettings = field(GateSettings, doc="canary gates and autoscaling signals generated from the "
                                                  "alerts' recording rules (docs/canary-gates.md)")
    billing: Billing = field(Billing, doc="prices per model and budgets per tenant (billing.py, "
                                          "docs/cost-and-budgets.md)")

    def _validate(self, path: str) -> None:
        if self.version != 1:
            raise SpecError("version", f"expected 1, got {self.version}")
        given = self.prometheus.external_labels.get(self.cluster.label)
        if given is not None:
            # An external label of that name (as specs wrote it before `cluster`) names the cluster too.
            if self.cluster.name and self.cluster.name != given:
                raise SpecError(f"prometheus.external_labels.{self.cluster.label}",
                                f"names the cluster {given!r} while cluster.name is {self.cluster.name!r}: "
                                f"keep one")
            self.cluster.name = given
        if self.central_store.enabled and not self.cluster.enabled:
            raise SpecError("cluster.name", "required with central_store.url: every cluster writing to the "
                                            "store needs its own name, or their series could not be told apart")
        seen: dict[str, str] = {}
        for tier_name, tier in self.tiers.items():
            for service in tier.services:
                if service in seen:
                    raise SpecError(f"tiers.{tier_name}.services",
                                    f"service {service!r} already belongs to tier {seen[service]!r}")
                seen[service] = tier_name
        for i, route in enumerate(self.routes):
            for name in route.receivers + route.escalate_to:
                if name not in self.channels:
                    raise SpecError(f"routes[{i}].receivers",
                                    f"unknown channel {name!r} (declared: {', '.join(self.channels) or 'none'})")
        workload = self.kubernetes.workloads.get("notifier")
        if workload is not None and workload.replicas and self.ha.notifier_replicas > 1 \
                and workload.replicas != self.ha.notifier_replicas:
            raise SpecError("kubernetes.workloads.notifier.replicas",
                            f"{workload.replicas} disagrees with ha.notifier_replicas ({self.ha.notifier_replicas})")
        if self.ha.replica_label in self.prometheus.external_labels:
            raise SpecError("ha.replica_label", f"{self.ha.replica_label!r} is also in prometheus.external_labels: "
                                                "each replica needs its own value")
        for name in self.notifier.unrouted_receivers or []:
            if name not in self.channels:
                raise SpecError("notifier.unrouted_receivers",
                                f"unknown channel {name!r} (declared: {', '.join(self.channels) or 'none'})")
        validate_upstreams(self)
        validate_billing(self)
        from inferwatch.selectors import default_selector

        triton = self.kubernetes.triton
        if not triton.monitor and self.selectors.triton == default_selector("triton"):
            # The user's ServiceMonitor: the operator labels its targets with the Service's namespace and name.
            self.selectors.triton = f'namespace="{triton.namespace}", service="{triton.service}"'

    # Helpers shared by the exporters and generators -------------------------------------------------
    @property
    def external_labels(self) -> dict[str, str]:
        """The labels Prometheus (or the edge agent) adds to every series and alert it sends: the spec's
        `prometheus.external_labels` and the cluster's name under its label."""
        labels = dict(self.prometheus.external_labels)
        if self.cluster.enabled:
            labels[self.cluster.label] = self.cluster.name
        return labels

    def tier_of_service(self, service: str | None) -> str:
        """Tier label for an X-Service-Name value; undeclared services fold into 'other'."""
        for tier_name, tier in self.tiers.items():
            if service in tier.services:
                return tier_name
        return OTHER


def load_spec(path: str | os.PathLike | None = None) -> Spec:
    """Load and validate a spec file.

    Raises SpecError with a one-line message `FILE: field.path: expected ..., got ...`.
    `path=None` reads ./inferwatch.yaml if present, else returns the defaults.
    """
    if path is None:
        if not Path(DEFAULT_SPEC_PATH).exists():
            return Spec()
        path = DEFAULT_SPEC_PATH
    file = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError("", f"cannot read spec: {exc.strerror}", file) from None
    data = load_yaml(raw, file)  # SpecError: not UTF-8, not YAML, duplicate key (with line)
    return spec_from_dict(data or {}, file)


def spec_from_dict(data: Any, file: str = "<spec>") -> Spec:
    try:
        return build(Spec, data, "")
    except SpecError as exc:
        raise exc.with_file(file) from None
