"""The PromQL of every canary gate and scaler trigger, built from the recording rules the alerts read
(`rules/triton.py`: TritonCanaryRegression, TritonQueueTimeP95High) and the same spec limits, so a gate and
its alert cannot drift: change `layers.L2.canary_regression_ratio` and both change in one `generate`.

A gate compares two sides of one model, each named by label matchers holding the controller's placeholders
(Argo `{{args.x}}`, Flagger `{{ target }}` / `{{ variables.x }}`):
- versions: two versions of the model on the same servers (Triton's `version` label);
- pods: two sets of pods serving the model (the `pod` label of the recording rules: Argo's pod-template-hash
  or Flagger's primary/canary workloads are part of the pod name).

The query's value is the canary's excess over its limit, in the signal's unit (a ratio 0-1 or seconds):
`canary - ((1 + canary_regression_ratio) x stable + absolute)`, the alert's comparison (`rules/triton.py`
`_canary`). At most 0: the canary passes; above 0: it regressed. Each side is its replicas' and versions'
value weighted as the alert weights its baseline (requests for the error ratio, successful requests for
the mean request time). Too little traffic to judge (either side at most `min_request_rate` req/s summed
over its replicas; the alert asks it per replica) gives no sample: the controller's Inconclusive (Argo) or
"no values found" (Flagger), never a pass.
"""

from __future__ import annotations

import dataclasses
import re

from inferwatch.rules.builders import MODEL_VERSION, by, indent, num
from inferwatch.rules.triton import ERROR_RATIO, QUEUE_P95, REQUEST_AVG, REQUESTS, SUCCESS, Sources
from inferwatch.selectors import go_string
from inferwatch.spec import Spec
from inferwatch.upstreams import triton_models

MV = by(MODEL_VERSION)
ALERT = "TritonCanaryRegression"
QUEUE_ALERT = "TritonQueueTimeP95High"
PENDING_ALERT = "TritonPendingRequestsHigh"
# The pod name's tail after a workload's name: `<pod-template-hash>-<suffix>` (a Deployment's or a
# Rollout's ReplicaSet); RE2 matchers are anchored, so `<name>-primary-...` never matches `<name>-<hash>-...`.
POD_TAIL = "[a-z0-9]+-[a-z0-9]+"


@dataclasses.dataclass(frozen=True)
class Signal:
    """One compared signal: `name` (the metric name in the gate objects), the alert's `signal` label, the
    per-series value and the weight that averages it over replicas and versions, and the absolute margin."""

    name: str
    alert_signal: str
    value: str
    weight: str
    absolute: float
    unit: str


def signals(spec: Spec) -> list[Signal]:
    """The signals TritonCanaryRegression judges, with its limits: the server-error ratio (no sample where a
    version has requests and no failure series counts as 0, as in the alert) and the mean request time."""
    l2 = spec.layers.L2
    return [
        Signal("error-ratio", "error_ratio", f"({ERROR_RATIO}{{S}} or on ({MV}) 0 * {REQUESTS}{{S}})", REQUESTS,
               l2.canary_min_error_ratio_delta, "ratio"),
        Signal("latency", "latency", f"{REQUEST_AVG}{{S}}", SUCCESS, 0.0, "seconds"),
    ]


def _matchers(spec: Spec, *extra: str) -> str:
    cluster = f'{spec.cluster.label}="{spec.cluster.name}"' if spec.cluster.enabled else ""
    return "{" + ", ".join(m for m in (cluster, *extra) if m) + "}"


def side(signal: Signal, matchers: str) -> str:
    """The signal of one side (all its replicas and versions), weighted; `matchers` a `{...}` selector."""
    value = signal.value.replace("{S}", matchers)
    return f"sum(\n  {value}\n  * on ({MV})\n  {signal.weight}{matchers}\n)\n/\nsum({signal.weight}{matchers})"


def gate_query(spec: Spec, signal: Signal, model: str, canary: str, stable: str) -> str:
    """The gate's PromQL: the canary's excess over its limit (see module doc). `model`, `canary`, `stable`:
    matcher texts (`model="{{args.model}}"`, `version="{{args.canary-version}}"`)."""
    l2 = spec.layers.L2
    c, s = _matchers(spec, model, canary), _matchers(spec, model, stable)
    extra = f" + {num(signal.absolute)}" if signal.absolute else ""
    busy = num(l2.min_request_rate)
    return (f"(\n{indent(side(signal, c))}\n)\n"
            f"- (\n  {num(1 + l2.canary_regression_ratio)} * (\n{indent(side(signal, s), 4)}\n  ){extra}\n)\n"
            f"and on ()\nsum({REQUESTS}{c}) > {busy}\n"
            f"and on ()\nsum({REQUESTS}{s}) > {busy}")


@dataclasses.dataclass(frozen=True)
class Trigger:
    """One scaler trigger: `query` (a number per evaluation), `threshold` and `activation` in its unit, the
    HPA `metric_type`, and the alert reading the same recording rule."""

    name: str
    model: str
    query: str
    threshold: float
    activation: float
    metric_type: str
    alert: str


def _threshold(spec: Spec, model: str, name: str) -> float:
    """The model's layers.L2 threshold `name`, or its per-model override (as the alert reads it)."""
    override = spec.layers.L2.models.get(model)
    value = getattr(override, name) if override else None
    return float(value if value is not None else getattr(spec.layers.L2, name))


def triggers(spec: Spec) -> list[Trigger]:
    """Two triggers per Triton model the spec declares, each judged as its alert judges it:

    - queue time: the largest P95 queue time of the model over its replicas and versions (QUEUE_P95, the
      average where Triton runs without summaries) against the model's `queue_p95_seconds`
      (TritonQueueTimeP95High). `Value` metric type: the HPA scales the replicas by value / threshold (a
      time per request does not divide by pods as a queue length would).
    - pending requests: the model's requests waiting in Triton's queues, all replicas summed (Triton's
      `nv_inference_pending_request_count` through the spec's Triton selector, the series
      TritonPendingRequestsHigh reads; it records no rule), against `pending_requests`. `AverageValue`:
      the HPA keeps the pending requests per replica at most the alert's threshold per replica.

    `activation`: `gates.activation_ratio` of the threshold."""
    src = Sources.of(spec)
    ratio = spec.gates.activation_ratio
    out = []
    for model in triton_models(spec):
        name = _dns_name(model)
        queue = _threshold(spec, model, "queue_p95_seconds")
        out.append(Trigger(f"queue-p95-{name}", model, f"max({QUEUE_P95}{_matchers(spec, f'model={_quoted(model)}')})",
                           queue, queue * ratio, "Value", QUEUE_ALERT))
        pending = _threshold(spec, model, "pending_requests")
        cluster = _matchers(spec)[1:-1]
        selected = src.triton("nv_inference_pending_request_count", cluster, f"model={_quoted(model)}")
        out.append(Trigger(f"pending-{name}", model, f"sum({selected})", pending, pending * ratio, "AverageValue",
                           PENDING_ALERT))
    return out


@dataclasses.dataclass(frozen=True)
class AdapterRule:
    """One prometheus-adapter external metric: the `name` the HPA asks for, the series it is discovered by,
    and its `metricsQuery` template (`<<.Series>>`, `<<.LabelMatchers>>`: the HPA's selector, model=...), the
    same aggregation of the same series as the KEDA trigger of `kind`."""

    name: str
    series: str
    query: str
    metric_type: str
    kind: str


def adapter_rules(spec: Spec) -> list[AdapterRule]:
    """The external metrics an `autoscaling/v2` HPA reads through prometheus-adapter (see `triggers`)."""
    src = Sources.of(spec)
    cluster = _matchers(spec)[1:-1]
    pending = src.triton("nv_inference_pending_request_count", cluster)
    queue = f"{QUEUE_P95}{{{cluster}}}" if cluster else QUEUE_P95
    return [
        AdapterRule("inferwatch_triton_queue_p95_seconds", queue,
                    "max by (model) (<<.Series>>{" + ", ".join(m for m in (cluster, "<<.LabelMatchers>>") if m) + "})",
                    "Value", "queue-p95"),
        AdapterRule("inferwatch_triton_pending_requests", pending,
                    "sum by (model) (<<.Series>>{" + pending[pending.index("{") + 1:-1] + ", <<.LabelMatchers>>})",
                    "AverageValue", "pending"),
    ]


def _dns_name(model: str) -> str:
    """A model name as a trigger name (lower case, `-` for anything else than a letter or digit)."""
    return re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "model"


def _quoted(value: str) -> str:
    return f'"{go_string(value)}"'
