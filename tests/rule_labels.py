"""Test support: the labels each alert of the generated rule files carries, per branch of its expression,
from the rule files themselves, the generated prometheus.yml (scrape labels per job) and the labels each
exporter writes (below; the exporters' own tests and tests/test_rules_live_names.py pin their names)."""

from __future__ import annotations

import dataclasses

import yaml

from inferwatch.rules.generate import PROMETHEUS_CONFIG, RULES_DIR, outputs
from promql_labels import Branch, LabelFlow

# Metric name prefix -> Prometheus job (fixed job names of the generated prometheus.yml).
JOB_OF_PREFIX = (("nv_", "triton"), ("DCGM_", "inferwatch-gpu"), ("inferwatch_gpu_", "inferwatch-gpu"),
                 ("inferwatch_triton_", "inferwatch-triton"), ("gateway_", "inferwatch-gateway"),
                 ("inferwatch_notifier_", "inferwatch-notifier"), ("alertmanager_", "inferwatch-alertmanager"),
                 ("process_", "inferwatch-prometheus"), ("prometheus_", "inferwatch-prometheus"),
                 ("ALERTS", "inferwatch-prometheus-alerts"),
                 # the central store's programs (rules/centralstore.py), scraped by the store's watcher
                 ("vmagent_", "inferwatch-vmagent"), ("vm_persistentqueue_", "inferwatch-vmagent"),
                 ("vmalert_", "inferwatch-vmalert"), ("vm_", "inferwatch-victoriametrics"),
                 ("vllm:", "triton"))  # the vLLM backend's families, re-exported on Triton's :8002
# GPU series as either exporter writes them: the device labels both always write; the host label is
# `Hostname` (inferwatch, dcgm-exporter up to 4.8.2) or `hostname` (dcgm-exporter from 4.8.3); the driver
# version is a label row of dcgm-exporter's field list; namespace/pod/container name the pod holding the GPU.
_DEVICE = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
_POD = ("namespace", "pod", "container")
_DCGM_MAYBE = ("Hostname", "hostname", "DCGM_FI_DRIVER_VERSION") + _POD
_GPU = ("gpu", "UUID", "Hostname")
_TMT = ("tenant", "model", "tier")
# A Triton replica behind a Service: `pod` on Triton's own series (the operator's target label); absent
# outside Kubernetes. The collector's series of a replica carry `address` (polled through a headless Service)
# or the `pod` of a scrape beside each Triton (rules/identity.py, rules/replicas.py).
_REPLICA = ("pod",)
_POLLED = ("pod", "address")
# Metric name (or prefix, first match wins) -> (labels the exporter always writes, labels it may write).
EXPORTER_LABELS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("DCGM_FI_DEV_FB_", _DEVICE, _DCGM_MAYBE + ("GPU_I_PROFILE", "GPU_I_ID")),  # MIG instances' framebuffer
    ("DCGM_FI_DEV_XID_ERRORS", _DEVICE, _DCGM_MAYBE + ("err_code", "err_msg")),  # dcgm-exporter: the code
    ("DCGM_EXP_XID_ERRORS_COUNT", _DEVICE + ("window_size_in_ms",), _DCGM_MAYBE + ("xid",)),
    ("DCGM_", _DEVICE, _DCGM_MAYBE),
    ("inferwatch_gpu_up", _GPU, _POD),
    ("inferwatch_gpu_xid_errors_total", _GPU + ("xid",), ()),
    ("inferwatch_gpu_clocks_event_active", _GPU + ("reason",), _POD),
    ("inferwatch_gpu_", (), ()),  # the exporter's own: nvml_up, devices, collection_*
    ("nv_inference_request_failure", ("model", "version", "reason"), _REPLICA),
    ("nv_inference_queue_summary_us", ("model", "version", "quantile"), _REPLICA),
    ("nv_inference_", ("model", "version"), _REPLICA),
    # LLM engine backends (docs/sources.md#llm-engines): per model and version, plus the family's kind label.
    ("nv_trt_llm_request_metrics", ("model", "version", "request_type"), _REPLICA),
    ("nv_trt_llm_kv_cache_block_metrics", ("model", "version", "kv_cache_block_type"), _REPLICA),
    ("nv_trt_llm_runtime_memory_metrics", ("model", "version", "memory_type"), _REPLICA),
    ("vllm:", ("model", "version"), _REPLICA),  # Triton's vLLM backend; a vLLM server: VLLM_SERVER below
    ("inferwatch_triton_model_ready", ("triton", "model", "version"), _POLLED),
    ("inferwatch_triton_model_state", ("triton", "model", "version", "state"), _POLLED),
    ("inferwatch_triton_model_", ("triton", "model"), _POLLED),
    ("inferwatch_triton_", ("triton",), _POLLED),
    ("gateway_requests_total", _TMT + ("code", "outcome"), ()),
    ("gateway_tokens_total", _TMT + ("type",), ()),
    ("gateway_cost_total", _TMT + ("currency",), ()),  # the spec's billing.currency
    ("gateway_token_details_total", _TMT + ("type",), ()),
    ("gateway_", _TMT, ()),
    ("inferwatch_notifier_notifications_total", ("channel", "outcome"), ()),
    ("inferwatch_notifier_dead_letters_total", ("channel", "reason"), ()),
    ("inferwatch_notifier_", (), ()),
    ("alertmanager_", (), ()),
    ("process_", (), ()),
    ("prometheus_rule_evaluation_failures_total", ("rule_group",), ()),
    ("ALERTS", ("alertname", "alertstate", "replica"), ()),  # federated copies (plus the alert's own labels)
    # VictoriaMetrics, vmagent and vmalert's own /metrics (Debian victoria-metrics 1.79)
    ("vm_free_disk_space_bytes", ("path",), ()),
    ("vm_data_size_bytes", ("type",), ()),
    ("vm_rows_inserted_total", ("type",), ()),
    ("vm_persistentqueue_bytes_dropped_total", ("path",), ()),
    ("vm_", (), ()),
    ("vmagent_remotewrite_pending_data_bytes", ("path", "url"), ()),
    ("vmagent_remotewrite_", ("url",), ()),
    ("vmalert_alerts_send_errors_total", ("addr",), ()),
    ("vmalert_", (), ()),
)


# A vLLM server of its own (spec `selectors.engine`, a job of its own, e.g. a ServiceMonitor's `vllm`): vLLM's
# labels model_name (the served model) and engine (the engine core's index; the V1 engine's, the only one
# from vLLM 0.11: vllm/v1/metrics/loggers.py labelnames), plus the operator's target labels in Kubernetes.
VLLM_SERVER = (("model_name", "engine"), ("namespace", "pod", "service", "endpoint", "container"))


@dataclasses.dataclass
class AlertRule:
    alert: str
    labels: dict[str, str]  # the rule's static labels (layer, severity, ...)
    branches: list[Branch]  # labels from its expression, per `or` branch (static labels added)


def _scrape_labels(prometheus_yml: dict) -> dict[str, Branch]:
    """job -> labels every target of it carries (guaranteed) or some target does (possible)."""
    out = {}
    for job in prometheus_yml["scrape_configs"]:
        sets = [{k for k in sc.get("labels", {}) if not k.startswith("__")} for sc in job["static_configs"]]
        relabelled = {r["target_label"] for r in job.get("metric_relabel_configs", [])}
        base = {"job", "instance"} | relabelled
        out[job["job_name"]] = Branch(frozenset(base | set.intersection(*sets)), frozenset(base | set.union(*sets)))
    return out


def alert_rules(spec, series_labels: tuple[str, ...] = ()) -> list[AlertRule]:
    """Every alerting rule of the spec's generated rule files with its label branches; `series_labels` are
    carried by every scraped series too (a central store's `cluster`)."""
    files = outputs(spec)
    scrape = {job: branch.add(series_labels)
              for job, branch in _scrape_labels(yaml.safe_load(files[PROMETHEUS_CONFIG])).items()}
    rules = [r for rel, text in files.items() if rel.startswith(RULES_DIR)
             for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    recorded: dict[str, list] = {}
    for r in rules:
        if "record" in r:
            recorded.setdefault(r["record"], []).append((r.get("labels") or {}, r["expr"]))

    def source(name: str, equal: dict[str, str]) -> list[Branch]:
        job = equal.get("job") if name == "up" else next((j for p, j in JOB_OF_PREFIX if name.startswith(p)), None)
        if job is None:
            raise AssertionError(f"no source known for metric {name}")
        base = scrape.get(job, Branch(frozenset({"job", "instance", *series_labels}),
                                      frozenset({"job", "instance", *series_labels})))
        if name == "up":
            return [base]
        sure, maybe = next((s, m) for p, s, m in EXPORTER_LABELS if name.startswith(p))
        if name.startswith("vllm:"):
            own = Branch(frozenset({"job", "instance", *series_labels}), frozenset({"job", "instance", *series_labels}))
            return [base.add(sure, maybe), own.add(*VLLM_SERVER)]
        return [base.add(sure, maybe)]

    flow = LabelFlow(source, recorded)
    return [AlertRule(r["alert"], dict(r.get("labels") or {}),
                      [b.add(r.get("labels") or {}) for b in flow.branches(r["expr"])])
            for r in rules if "alert" in r]
