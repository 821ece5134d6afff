"""L2 rules: Triton's own metrics (job `triton`) and the inferwatch Triton collector (job `inferwatch-triton`).

Triton's latency metrics are cumulative µs counters, not histograms (Triton docs "Metrics"): averages are
rate(sum_us) / rate(success); P95 comes from `nv_inference_queue_summary_us{quantile="0.95"}`, which exists only
with `--metrics-config summary_latencies=true`, is computed per process over a sliding 60 s window and so is
combined with `max by`, never averaged; the fallback mean comes from whichever source Triton exports: the
`_us` counters, or with `--metrics-config counter_latencies=false` the summaries' own `_sum / _count`.

Failures carry `reason` (REJECTED|CANCELED|BACKEND|OTHER, Triton ≥ 24.07; none before). Server errors are
BACKEND and OTHER (and a failure without reason, older Triton): the error ratio. REJECTED (queue full or
timed out in it) has its own alert; CANCELED (the client hung up) is judged apart, a cancellation ratio and
at most a warning, as the gateway judges cancellations apart from errors.

Every series is per replica (`rules/identity.py`: `node`, `triton`, `pod`), so two pods behind one Service
give two results and no join matches many to many. A canary's baseline is the older busy version(s) of the
same model by version number, whatever the traffic split.

Ensembles, BLS and decoupled models are counted as clients see them (the collector labels them from each
model's configuration: `inferwatch_triton_model_step_info`, `inferwatch_triton_model_decoupled`):
- a step of an ensemble (or of a BLS model) is its parent's work, not traffic: request and error figures are
  per entry point, a step shows as executions per parent request (a per-token postprocessing step: ~ the
  output length), and no error-ratio alert judges a step;
- a decoupled model's request duration is the execute call, not what a client waits for, so no average
  request time is recorded for it (its latency comes from the gateway's TTFT);
- Triton counts a decoupled model's request as a success when the model sends an error mid-stream or the
  client cancels, so where the gateway meters a decoupled entry point its error ratio comes from the gateway.
"""

from __future__ import annotations

import dataclasses

from inferwatch.rules import identity, replicas
from inferwatch.rules.builders import (
    MODEL_VERSION,
    absent_targets,
    by,
    exporter_down,
    indent,
    num,
    over_threshold_by_model,
    ratio,
    ratio_or_zero,
    regex_alternation,
    with_min_rate,
)
from inferwatch.rules.llm import CANCELLED_RATE as LLM_CANCELLED_RATE
from inferwatch.rules.llm import ERROR_RATE as LLM_ERROR_RATE
from inferwatch.rules.llm import REQUESTS as LLM_REQUESTS
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.selectors import Selector, go_string, label_arg
from inferwatch.spec import Spec
from inferwatch.upstreams import triton_models

MV = by(MODEL_VERSION)
# A model on one replica (the canary's scope: versions of one model on one server compared).
REPLICA_MODEL = by(identity.TRITON + ("model",))
# Server errors: BACKEND, OTHER, and a failure without reason (Triton before 24.07 had no label).
SERVER_ERRORS = 'reason=~"BACKEND|OTHER|"'
CANCELED = 'reason="CANCELED"'
SUCCESS = "model_version:nv_inference_request_success:rate"
FAILURE = "model_version_reason:nv_inference_request_failure:rate"
REQUESTS = "model_version:nv_inference_requests:rate"
ERROR_RATIO = "model_version:nv_inference_request_error:ratio"
CANCELLED_RATIO = "model_version:nv_inference_request_cancelled:ratio"
VERSION_NUMBER = "model_version:nv_inference_version:number"
VERSION_RANK = "model_version:nv_inference_version:newest_rank"
# Version numbers are read from the `version` label digit by digit (PromQL has no label-to-number function):
# up to this many digits (99999999; date-like versions such as 20240601 fit). A longer one records nothing
# and is neither judged as a canary nor part of a baseline.
VERSION_DIGITS = 8
# How many of the newest busy versions of a model are each judged against the older ones.
CANARY_RANKS = 3
REQUEST_AVG = "model_version:nv_inference_request_duration:avg_seconds"
QUEUE_AVG = "model_version:nv_inference_queue_duration:avg_seconds"
COMPUTE_AVG = "model_version:nv_inference_compute_duration:avg_seconds"
QUEUE_P95 = "model_version:nv_inference_queue_duration:p95_seconds"
BATCH_AVG = "model_version:nv_inference_batch_size:avg"
ENTRY_REQUESTS = "model:nv_inference_entry_point_requests:rate"
ENTRY_ERROR_RATIO = "model:nv_inference_entry_point_error:ratio"
STEP_PER_REQUEST = "parent_model:nv_inference_step_requests:per_parent_request"
GATEWAY_REQUESTS = "model:gateway_requests:rate"
GATEWAY_ERRORS = "model:gateway_requests_errors:ratio"
GATEWAY_CANCELLED = "model:gateway_requests_cancelled:ratio"
# Triton's reason in an annotation, at most this many characters (the collector caps the label at 200 too).
REASON_CHARS = 200
MODEL = ("{{ $labels.model }} version {{ $labels.version }} on {{ $labels.triton }}"
         "{{ with $labels.pod }} pod {{ . }}{{ end }} (node {{ $labels.node }})")


def _label(name: str) -> str:
    """An alert's label in a Go template: `$labels.name` for the default identity names (the text rules had
    before identity labels were the spec's), `(index $labels "name")` for any other name."""
    return f"$labels.{name}" if name in ("triton", "pod", "node") else label_arg(name)


def model_text(ids: identity.TritonLabels) -> str:
    """MODEL with the spec's identity labels."""
    return (f"{{{{ $labels.model }}}} version {{{{ $labels.version }}}} on {{{{ {_label(ids.server)} }}}}"
            f"{{{{ with {_label(ids.replica)} }}}} pod {{{{ . }}}}{{{{ end }}}} (node {{{{ {_label(ids.node)} }}}})")


@dataclasses.dataclass(frozen=True)
class Sources:
    """The selectors of the sources L2 rules read (spec `selectors`): Triton's own metrics, the collector, and
    the gateway (errors of decoupled models as clients see them)."""

    triton: Selector
    collector: Selector
    gateway: Selector
    # The spec's identity labels of a Triton replica (spec `identity.triton`; rules/identity.py).
    ids: identity.TritonLabels = identity.TritonLabels()

    @classmethod
    def of(cls, spec: Spec) -> "Sources":
        s = spec.selectors
        return cls(s.of("triton"), s.of("triton_collector"), s.of("gateway"), identity.TritonLabels.of(spec))

    @property
    def mv(self) -> str:
        """A model version on one replica, as `by (...)` text."""
        return by(self.ids.model_version)

    @property
    def replica_model(self) -> str:
        """A model on one replica (the canary's scope)."""
        return by(self.ids.ident + ("model",))

    @property
    def server_model(self) -> str:
        """`server, model`: a model on one server (the collector's configuration-derived series)."""
        return f"{self.ids.server}, model"

    def collected(self, metric: str, *matchers: str) -> str:
        """The collector's `metric` with its server/replica/node labels under the spec's names."""
        return self.ids.from_collector(self.collector(metric, *matchers))

    def per_replica(self, expr: str) -> str:
        """`expr` (collector series of one replica each, spec names) with the replica and node of Triton's
        own scrape where a series names a Triton target, the others unchanged (rules/replicas.py)."""
        return replicas.view(self.ids, self.triton("up"), expr)

    @property
    def steps(self) -> str:
        """Models that run as a step of an ensemble or BLS model (from the collector)."""
        return f"max by ({self.server_model}) ({self.collected('inferwatch_triton_model_step_info')})"

    @property
    def decoupled(self) -> str:
        """Decoupled (streaming) models, from their configuration."""
        return f"max by ({self.server_model}) ({self.collected('inferwatch_triton_model_decoupled')}) == 1"

    @property
    def decoupled_at_gateway(self) -> str:
        """Decoupled models whose errors the gateway sees: their error ratio is taken from the gateway."""
        return f"(\n  {self.decoupled}\n  and on (model)\n  {GATEWAY_ERRORS}\n)"

    def rate(self, metric: str, window: str, keep: str = "") -> str:
        """`sum by (keep) (rate(<Triton's metric>[window]))`; `keep` defaults to the model version (mv)."""
        return f"sum by ({keep or self.mv}) (rate({self.triton(metric)}[{window}]))"


def _gateway_ratio(per_tenant_rate: str) -> str:
    """A model's ratio at the gateway from the recorded per tenant, model and tier rate
    (inferwatch-llm-outcomes.rules, same window; read as of its last evaluation, so the gateway's counters are
    rated once): the model's sum of it over the model's requests; 0 for a model with requests and no such
    series, and no sample (not NaN) for a model without requests."""
    return ratio_or_zero(f"sum by (model) ({per_tenant_rate})", GATEWAY_REQUESTS, ("model",))


def ensemble_rules(src: Sources, window: str) -> list[Recording]:
    """Entry points, steps per parent request, and the gateway's per-model view of errors (see module doc)."""
    entry_mv = src.replica_model
    decoupled = src.collected("inferwatch_triton_model_decoupled")
    server = by(src.ids.server_ident)
    on_server_model = src.server_model
    return [
        Recording(ENTRY_REQUESTS, f"sum by ({entry_mv}) ({REQUESTS})\nunless on ({on_server_model})\n{src.steps}"),
        Recording(GATEWAY_REQUESTS, f"sum by (model) ({LLM_REQUESTS})"),
        Recording(GATEWAY_ERRORS, _gateway_ratio(LLM_ERROR_RATE)),
        Recording(GATEWAY_CANCELLED, _gateway_ratio(LLM_CANCELLED_RATE)),
        # Decoupled entry points the gateway meters: errors as clients saw them (mid-stream errors included).
        Recording(ENTRY_ERROR_RATIO,
                  f"(\n  max by ({entry_mv}) ({decoupled} == 1) * 0\n"
                  f"  unless on ({on_server_model})\n  {src.steps}\n)\n+ on (model) group_left ()\n{GATEWAY_ERRORS}",
                  {"source": "gateway"}),
        # Every other entry point: Triton's own server errors over all versions.
        Recording(ENTRY_ERROR_RATIO,
                  f"(\n  sum by ({entry_mv}) ({FAILURE}{{{SERVER_ERRORS}}})\n  / on ({entry_mv})\n"
                  f"  ({ENTRY_REQUESTS} > 0)\n)\n"
                  f"unless on ({on_server_model})\n{src.decoupled_at_gateway}",
                  {"source": "triton"}),
        # A step's executions per request to its parent (postprocessing per streamed token: the output
        # length), per replica: the collector's step info of each replica (label `pod`) meets that replica's
        # requests, so two pods behind one Service give two results, never a many-to-many error. A step
        # whose counters stay 0 (some decoupled LLM backends report none) records nothing.
        Recording(STEP_PER_REQUEST,
                  f"(\n  max by ({server}, model, parent) ({src.collected('inferwatch_triton_model_step_info')})\n"
                  f"  * on ({server}, model) group_left ({src.ids.node})\n  (sum by ({entry_mv}) ({REQUESTS}) > 0)\n)\n"
                  f"/ on ({server}, parent) group_left ()\n"
                  f'label_replace(sum by ({entry_mv}) ({REQUESTS}) > 0, "parent", "$1", "model", "(.+)")'),
    ]


def recording_rules(src: Sources, window: str) -> list[Recording]:
    mv, model_version = src.mv, src.ids.model_version
    compute = "  " + "\n  + ".join(f"rate({src.triton(f'nv_inference_compute_{phase}_duration_us')}[{window}])"
                                   for phase in ("input", "infer", "output"))
    p95 = src.triton("nv_inference_queue_summary_us", 'quantile="0.95"')

    def summary_mean(*names: str) -> str:
        """The mean from Triton's summaries' own `_sum / _count` (per successful request, µs -> s): the
        fallback where Triton runs with `--metrics-config counter_latencies=false`. Several names: the sum
        of their means (compute = input + infer + output; each phase counts every request once)."""
        sums = "\n  + ".join(f"rate({src.triton(n + '_sum')}[{window}])" for n in names)
        return ratio(f"sum by ({mv}) (\n  {sums}\n) / 1e6", src.rate(names[0] + "_count", window), model_version)

    compute_summaries = [f"nv_inference_compute_{phase}_summary_us" for phase in ("input", "infer", "output")]
    return [
        Recording(SUCCESS, src.rate("nv_inference_request_success", window)),
        Recording(FAILURE, src.rate("nv_inference_request_failure", window, mv + ", reason")),
        Recording(REQUESTS, f"{SUCCESS}\n+ on ({mv})\nsum by ({mv}) ({FAILURE})"),
        # Ratios and means record nothing for a window without requests (0/0 would record NaN). Server
        # errors only: rejections and cancellations are judged apart.
        Recording(ERROR_RATIO, ratio(f"sum by ({mv}) ({FAILURE}{{{SERVER_ERRORS}}})", REQUESTS, model_version)),
        Recording(CANCELLED_RATIO, ratio(f"sum by ({mv}) ({FAILURE}{{{CANCELED}}})", REQUESTS, model_version)),
        # Not for decoupled models: their request duration is the execute call, not what a client waits for.
        Recording(REQUEST_AVG, "(\n" + indent(
            ratio(f"{src.rate('nv_inference_request_duration_us', window)} / 1e6", SUCCESS, model_version)
            + "\nor\n" + summary_mean("nv_inference_request_summary_us"))
            + f"\n)\nunless on ({src.server_model})\n{src.decoupled}"),
        Recording(QUEUE_AVG, ratio(f"{src.rate('nv_inference_queue_duration_us', window)} / 1e6", SUCCESS,
                                   model_version) + "\nor\n" + summary_mean("nv_inference_queue_summary_us")),
        Recording(COMPUTE_AVG, ratio(f"sum by ({mv}) (\n{compute}\n) / 1e6", SUCCESS, model_version)
                  + "\nor\n" + summary_mean(*compute_summaries)),
        # A summary with no observation in its 60 s window reports NaN; `>= 0` drops NaN so the average
        # takes over, exactly as it does where summaries are off.
        Recording(QUEUE_P95, f"(max by ({mv}) ({p95}) / 1e6) >= 0\nor\n{QUEUE_AVG}"),
        Recording(BATCH_AVG, ratio(src.rate("nv_inference_count", window), src.rate("nv_inference_exec_count", window),
                                   model_version)),
        Recording(VERSION_NUMBER, version_number(mv)),
    ] + ensemble_rules(src, window)


def version_number(mv: str = MV) -> str:
    """The `version` label of every version with requests as a number (the series' value), digit by digit: a
    version whose k-th digit from the right is d gets d * 10^k from the term matching it. At most
    VERSION_DIGITS digits (each term's regex allows no longer version); anything else records nothing."""
    terms = [f'0 * group by ({mv}) ({REQUESTS}{{version=~"[0-9]{{1,{VERSION_DIGITS}}}"}})']
    for k in range(VERSION_DIGITS):
        prefix = f"[0-9]{{0,{VERSION_DIGITS - 1 - k}}}" if VERSION_DIGITS - 1 - k else ""
        suffix = f"[0-9]{{{k}}}" if k else ""
        for d in range(1, 10):
            terms.append(f'label_replace({num(d * 10 ** k)} * group by ({mv}) '
                         f'({REQUESTS}{{version=~"{prefix}{d}{suffix}"}}), "digit", "{k}", "", "")')
    return f"sum by ({mv}) (\n" + indent("\nor\n".join(terms)) + "\n)"


def _ranks(upto: int) -> str:
    """The versions ranked 1..`upto`, each rank selected by an `=` matcher (one recording rule each)."""
    either = " or ".join(f'{VERSION_RANK}{{rank="{i}"}}' for i in range(1, upto + 1))
    return f"({either})" if upto > 1 else either


def version_ranks(l2, mv: str = MV, replica_model: str = REPLICA_MODEL) -> list[Recording]:
    """The newest busy versions of each model on each replica, rank 1 the newest (label `rank`, value the
    version number): busy = more requests/s than `min_request_rate`, so a canary is judged only where both
    it and its baseline have traffic. Each rank is the newest busy version not ranked above it (a group's
    rules run in order, so each reads the ranks recorded above it in the same evaluation)."""
    busy = f"{VERSION_NUMBER}\nand on ({mv})\n{REQUESTS} > {num(l2.min_request_rate)}"
    out = []
    for r in range(1, CANARY_RANKS + 1):
        pool = busy if r == 1 else f"(\n{indent(busy)}\n)\nunless on ({mv})\n{_ranks(r - 1)}"
        out.append(Recording(VERSION_RANK, f"topk by ({replica_model}) (1,\n{indent(pool)}\n)", {"rank": str(r)}))
    return out


def _overrides(spec: Spec, field: str) -> dict[str, float]:
    return {m: getattr(o, field) for m, o in spec.layers.L2.models.items() if getattr(o, field) is not None}


def _canary(l2, value: str, weight: str, *, relative: float, absolute: float, mv: str = MV,
            replica_model: str = REPLICA_MODEL) -> str:
    """Each of the CANARY_RANKS newest busy versions of a model on a replica (VERSION_RANK) whose `value` is
    worse than its baseline: the older busy versions (by version number, whatever the traffic split) of
    the same model on the same replica, their `value` averaged weighted by `weight` (requests for the error
    ratio, successes for the mean request time). Worse: above (1 + relative) x baseline + absolute. No
    older busy version: no baseline, nothing judged."""
    extra = f" + {num(absolute)}" if absolute else ""
    busy = f"{VERSION_NUMBER} and on ({mv}) {REQUESTS} > {num(l2.min_request_rate)}"
    parts = []
    for r in range(1, CANARY_RANKS + 1):
        older = f"({busy})\nunless on ({mv})\n{_ranks(r)}"
        weighted = f"{value} * on ({mv}) {weight}\nand on ({mv})\n({older})"
        total = f"{weight}\nand on ({mv})\n({older})"
        baseline = (f"sum by ({replica_model}) (\n{indent(weighted)}\n)\n/ on ({replica_model})\n"
                    f"(sum by ({replica_model}) (\n{indent(total)}\n) > 0)")
        parts.append(f'(\n  {value}\n  and on ({mv})\n  {VERSION_RANK}{{rank="{r}"}}\n)\n'
                     f"> on ({replica_model}) group_left ()\n"
                     f"(\n  {num(1 + relative)} * (\n{indent(baseline, 4)}\n  ){extra}\n)")
    return "\nor\n".join(f"(\n{indent(p)}\n)" for p in parts)


# printf arguments naming an alert's Triton replica and model (version) in its annotation queries; `pod` is
# "" outside Kubernetes (label_arg), which matches the series without it.
TRITON_MV_ARGS = " ".join(label_arg(n) for n in ("triton", "pod", "model", "version"))
TRITON_M_ARGS = " ".join(label_arg(n) for n in ("triton", "model"))


def _template_query(selector: Selector, metric: str, *matchers: str) -> str:
    """A selector inside an annotation's `printf "..."` (a Go string): its quotes and backslashes escaped."""
    return go_string(selector(metric, *matchers))


def _in_cluster(spec: Spec) -> tuple[str, str]:
    """(matcher, printf argument) scoping an annotation's query to the alert's cluster: `cluster=%q` with
    `$labels.cluster`, which is the empty string (series without the label) in a Prometheus of one cluster;
    ("", "") without several clusters."""
    if not spec.cluster.enabled:
        return "", ""
    return f"{spec.cluster.label}=%q", f" {label_arg(spec.cluster.label)}"


def not_loaded(spec: Spec, src: Sources) -> list[Alert]:
    """TritonModelNotLoaded: a model the spec lists as served (spec `models`) that no Triton of the cluster
    lists at all while at least one answers. The collector leaves out versions Triton reports UNAVAILABLE with
    reason "unloaded" (an explicit unload) and models it never loaded, so their series are gone and
    TritonModelNotReady cannot see them; a model Triton still lists but not READY (a failed load) is
    TritonModelNotReady's, so one fault pages once. A model the spec does not list may be unloaded silently.
    Labels: `model` (and the cluster's). Only models served by Triton (inferwatch.upstreams: a model of an
    OpenAI-compatible upstream is never in Triton's repository). No alert when the spec lists no Triton model
    or every Triton is down (TritonServerDown)."""
    models = triton_models(spec)
    if not models:
        return []
    answering = f"group by () ({src.collector('inferwatch_triton_up')} == 1)"
    listed = "\nor\n".join(f'label_replace({answering}, "model", "{go_string(m)}", "", "")' for m in models)
    names = f'model=~"{go_string(regex_alternation(models))}"'
    known = f'group by (model) ({src.collector("inferwatch_triton_model_ready", names)})'
    cluster, cluster_arg = _in_cluster(spec)
    rate = go_string(f"sum({GATEWAY_REQUESTS}{{{','.join(m for m in (cluster, 'model=%q') if m)}}}) > 0")
    return [Alert("TritonModelNotLoaded", f"(\n{indent(listed)}\n)\nunless on (model)\n{known}",
                  spec.layers.L2.for_, "critical",
                  "Model {{ $labels.model }} is in the spec's served models but no Triton has it loaded "
                  "(unloaded, or never loaded): every request to it fails with \"unknown model\"."
                  f'{{{{ with printf "{rate}"{cluster_arg} {label_arg("model")} | query }}}}{{{{ range . }}}} '
                  "Clients still send {{ .Value | printf \"%.3g\" }} req/s to it through the gateway."
                  "{{ end }}{{ end }}")]


def server_down(src: Sources) -> str:
    """One series per Triton replica that does not answer, whichever source sees it: labels `node`, `triton`,
    `pod` (identity.TRITON; the cluster's added by generate), value 0. The Triton scrape's `up` (job/instance
    of Triton's metrics port) and the collector's `inferwatch_triton_up`/`inferwatch_triton_server_live` (job/
    instance of the collector) name one replica with different label sets, so a plain `or` keeps both: one
    dead Triton, two alerts. Each side is reduced to the replica, matched on `triton, pod`, the scrape first:
    - the collector's series that name a Triton target (rules/replicas.py: a headless Service's `address`
      against the pod IP of Triton's `instance`, or a server's only replica) take its `pod` and `node`;
    - the collector's own `pod` (no `address`) takes `node` from the replica's `up` series (one per replica:
      `topk`, so a pod moving nodes within the staleness window is not a duplicate match);
    - the rest keep the collector's `node` (absent if none) and `address` (one alert per polled address)."""
    ident = by(src.ids.ident)
    server = by(src.ids.server_ident)
    up = src.triton("up")

    def down(*matchers: str) -> str:
        return (f"{src.collected('inferwatch_triton_up', *matchers)} == 0\n"
                f"or\n{src.collected('inferwatch_triton_server_live', *matchers)} == 0")

    named = replicas.matched(src.ids, up, f"(\n{indent(down())}\n)")
    rest = replicas.unmatched(src.ids, up, f"(\n{indent(down())}\n)")
    own_pod = indent(down('address=""'), 4)   # no address: one address polled, its `pod` the collector's own
    return (f"max by ({ident}) ({up} == 0)\n"
            f"or on ({server})\n"
            f"max by ({ident}) (\n{indent(named)}\n)\n"
            f"or on ({server})\n"
            f"(\n  max by ({server}) (\n{own_pod}\n  )\n"
            f"  * on ({server}) group_left ({src.ids.node})\n"
            f"  topk by ({server}) (1, group by ({ident}) ({up}))\n)\n"
            f"or on ({server})\n"
            f"max by ({ident}, address) (\n{indent(rest)}\n)")


def groups(spec: Spec) -> list[Group]:
    l2 = spec.layers.L2
    src = Sources.of(spec)
    ids = src.ids
    mv, model_version, replica_model, model = src.mv, ids.model_version, src.replica_model, model_text(ids)
    on_server_model = src.server_model
    srv, nod = _label(ids.server), _label(ids.node)
    # Steps are their parent's work; decoupled models the gateway meters are judged there.
    not_steps = (f"\nunless on ({on_server_model})\n{src.steps}"
                 f"\nunless on ({on_server_model})\n{src.decoupled_at_gateway}")
    # printf arguments: the alert's own identity labels, matched against the collector's names (its series
    # keep them) or, for Triton's recorded FAILURE, against the spec's.
    mv_args = " ".join(label_arg(n) for n in (ids.server, ids.replica, "model", "version"))
    m_args = " ".join(label_arg(n) for n in (ids.server, "model"))
    window = str(spec.prometheus.rate_window)
    cluster, cluster_arg = _in_cluster(spec)
    # The collector's series of the alert's replica: `pod=%q address=%q`, "" (absent) matching series without
    # the label. Its `address` names a replica polled through a headless Service; the `pod` the alert took
    # from Triton's scrape (rules/replicas.py) is then not on the collector's series, so `$polled` is "".
    collector_replica = (f'{{{{ $polled := {label_arg(ids.replica)} }}}}'
                         f'{{{{ if {label_arg("address")} }}}}{{{{ $polled = "" }}}}{{{{ end }}}}')
    polled_args = " ".join((label_arg(ids.server), "$polled", label_arg("address"), label_arg("model"),
                            label_arg("version")))
    state = _template_query(src.collector, "inferwatch_triton_model_state", cluster, "triton=%q", "pod=%q",
                            "address=%q", "model=%q", "version=%q")
    step = _template_query(src.collector, "inferwatch_triton_model_step_info", cluster, "triton=%q", "model=%q")
    reason = _template_query(src.collector, "inferwatch_triton_model_state_reason_info", cluster, "triton=%q",
                             "pod=%q", "address=%q", "model=%q", "version=%q")
    # The replica in a server alert's text: its pod where known, else the address the collector polled.
    replica = (f"{{{{ with {_label(ids.replica)} }}}} pod {{{{ . }}}}{{{{ else }}}}"
               f'{{{{ with {label_arg("address")} }}}} at {{{{ . }}}}{{{{ end }}}}{{{{ end }}}}')
    failure = ",".join(m for m in (cluster, f"{ids.server}=%q", f"{ids.replica}=%q", "model=%q", "version=%q") if m)
    reasons = (f'{{{{ range $i, $s := printf "sort_desc({FAILURE}{{{failure}}} > 0)"{cluster_arg} '
               f'{mv_args} | query }}}}{{{{ if $i }}}}, {{{{ end }}}}'
               f'{{{{ $s.Labels.reason }}}} {{{{ $s.Value | printf "%.3g" }}}}/s{{{{ end }}}}')
    alerts = [
        Alert("TritonServerDown",
              server_down(src)
              + (f"\nor\n{absent_targets(src.triton, spec.cluster)}" if spec.targets.triton else ""),
              l2.exporter_down_for, "critical",
              f"Triton {{{{ with {srv} }}}}{{{{ . }}}}{{{{ else }}}}(every target of "
              + src.triton.describe().replace("{{", "{{ \"{{\" }}") + "){{ end }}"
              f"{replica}{{{{ with {nod} }}}} on node {{{{ . }}}}{{{{ end }}}} does not answer "
              "(metrics endpoint down or liveness failing): every model it serves is unavailable."),
        Alert("TritonServerNotReady", src.per_replica(f"{src.collected('inferwatch_triton_server_ready')} == 0"),
              l2.for_, "critical",
              f"Triton {{{{ {srv} }}}}{replica} on node {{{{ {nod} }}}} is live but not ready (strict readiness: "
              "a model failed to load or is loading); load balancers stop sending it traffic."),
        Alert("TritonModelNotReady", src.per_replica(f"{src.collected('inferwatch_triton_model_ready')} == 0"),
              l2.for_, "critical",
              f"{collector_replica}Model {model} is not READY"
              f'{{{{ with printf "{state} == 1"{cluster_arg} '
              f"{polled_args} | query }}}}"
              f"{{{{ range . }}}} (state {{{{ .Labels.state }}}}){{{{ end }}}}{{{{ end }}}}"
              f'{{{{ with printf "{step}"{cluster_arg} '
              f"{m_args} | query }}}}{{{{ range . }}}}, a step of {{{{ .Labels.kind }}}} "
              f"{{{{ .Labels.parent }}}}{{{{ end }}}}{{{{ end }}}}"
              f'{{{{ with printf "{reason}"{cluster_arg} '
              f"{polled_args} | query }}}}{{{{ range . }}}}; "
              f"Triton's reason: "
              f'{{{{ reReplaceAll "(?s)^(.{{{REASON_CHARS}}}).+$" "${{1}}…" .Labels.reason }}}}'
              f"{{{{ end }}}}{{{{ end }}}}"
              f": its requests fail."),
        *not_loaded(spec, src),
        Alert("TritonModelErrorRatioHigh",
              with_min_rate(over_threshold_by_model(ERROR_RATIO, l2.error_ratio, _overrides(spec, "error_ratio")),
                            REQUESTS, l2.min_request_rate, model_version)
              + not_steps,
              l2.for_, "critical",
              f"Model {model} fails {{{{ $value | humanizePercentage }}}} of its requests over {window} "
              f"(failures by reason: {reasons})."),
        Alert("TritonDecoupledModelErrorRatioHigh",
              with_min_rate(over_threshold_by_model(
                  lambda m: f'{ENTRY_ERROR_RATIO}{{source="gateway"{", " + m[1:-1] if m else ""}}}',
                  l2.error_ratio, _overrides(spec, "error_ratio")), GATEWAY_REQUESTS, l2.min_request_rate, ("model",)),
              l2.for_, "critical",
              f"Streaming (decoupled) model {{{{ $labels.model }}}} on {{{{ {srv} }}}} (node "
              f"{{{{ {nod} }}}}) fails {{{{ $value | humanizePercentage }}}} of its requests as clients see "
              f"them at the gateway over {window}; Triton counts errors sent mid-stream as successes, so its own "
              f"error ratio cannot show them."),
        Alert("TritonQueueTimeP95High",
              with_min_rate(over_threshold_by_model(QUEUE_P95, l2.queue_p95_seconds,
                                                    _overrides(spec, "queue_p95_seconds")),
                            REQUESTS, l2.min_request_rate, model_version),
              l2.for_, "warning",
              f"Requests to {model} wait {{{{ $value | humanizeDuration }}}} in the queue at P95 "
              f"(the average where Triton runs without summary_latencies)."),
        Alert("TritonRequestsRejected", f'{FAILURE}{{reason="REJECTED"}} > 0', l2.for_, "warning",
              f"Triton rejects {{{{ $value | printf \"%.3g\" }}}} requests/s for {model}: the scheduler's queue is "
              f"full or requests time out in it."),
        # A client hanging up is not a server error: judged apart, at most a warning. Steps are their parent's
        # work; decoupled models the gateway meters are judged there (LlmCancellationRatioHigh).
        Alert("TritonCancellationRatioHigh",
              with_min_rate(f"{CANCELLED_RATIO} > {num(l2.cancellation_ratio)}", REQUESTS, l2.min_request_rate,
                            model_version)
              + not_steps,
              l2.for_, "warning",
              f"Clients cancel {{{{ $value | humanizePercentage }}}} of their requests to {model} over {window} "
              f"(warning above {l2.cancellation_ratio:.0%}): not a server error, but often a sign clients time "
              f"out waiting."),
        Alert("TritonPendingRequestsHigh",
              over_threshold_by_model(
                  lambda m: f"sum by ({mv}) ({src.triton('nv_inference_pending_request_count', m[1:-1])})",
                                      l2.pending_requests, _overrides(spec, "pending_requests")),
              l2.for_, "warning",
              f"{{{{ $value }}}} requests are pending for {model}: instances cannot keep up."),
        Alert("TritonBatchingIneffective",
              with_min_rate(
                  f"{BATCH_AVG}\n< on ({on_server_model}) group_left ()\n"
                  f"{num(l2.batching_efficiency_ratio)} * max by ({on_server_model}) "
                  f"({src.collected('inferwatch_triton_model_preferred_batch_size_max')} > 1)\n"
                  f"and on ({mv})\n{QUEUE_AVG} > {num(l2.batching_min_queue_seconds)}",
                  REQUESTS, l2.min_request_rate, model_version),
              l2.for_, "warning",
              f"{model} executes batches of {{{{ $value | printf \"%.1f\" }}}} on average, under "
              f"{l2.batching_efficiency_ratio:.0%} of its largest preferred_batch_size, while requests queue "
              f"more than {num(l2.batching_min_queue_seconds)} s: a preferred size small requests never fill "
              f"makes the batcher wait for max_queue_delay."),
        Alert("TritonCanaryRegression",
              _canary(l2, f"({ERROR_RATIO} or on ({mv}) 0 * {REQUESTS})", REQUESTS,
                      relative=l2.canary_regression_ratio, absolute=l2.canary_min_error_ratio_delta, mv=mv,
                      replica_model=replica_model),
              l2.for_, "warning",
              f"Canary {model} fails {{{{ $value | humanizePercentage }}}} of its requests, more than "
              f"{l2.canary_regression_ratio:.0%} worse than the older version(s) still serving: roll it back.",
              labels={"signal": "error_ratio"}),
        Alert("TritonCanaryRegression",
              _canary(l2, REQUEST_AVG, SUCCESS, relative=l2.canary_regression_ratio, absolute=0, mv=mv,
                      replica_model=replica_model),
              l2.for_, "warning",
              f"Canary {model} takes {{{{ $value | humanizeDuration }}}} per request on average, more than "
              f"{l2.canary_regression_ratio:.0%} slower than the older version(s) still serving: roll it back.",
              labels={"signal": "latency"}),
        exporter_down("TritonCollectorDown", src.collector, for_=l2.exporter_down_for, severity="warning",
                      what="the inferwatch Triton collector", has_targets=bool(spec.targets.triton_collectors),
                      cluster=spec.cluster),
    ]
    return [Group("inferwatch-triton.rules", recording_rules(src, window) + version_ranks(l2, mv, replica_model)),
            Group("inferwatch-triton.alerts", alerts)]
