"""L2 rules of the LLM engines behind Triton: the KV cache, the in-flight batcher's running and waiting
requests, preemptions and prefix-cache hits of the TensorRT-LLM and vLLM backends (docs/engine-signals.md).

The families are read through the `engine` selector (spec `selectors.engine`; default: Triton's jobs and
jobs named `vllm...`), wherever they are served: both backends export through Triton's own `:8002/metrics`,
one series per model and version (labels `model`, `version`; the scrape adds `node`, `triton`); a vLLM server
of its own (not on Triton) labels its series `model_name` (the served model name) and `engine` (the engine
core's index, one per data-parallel rank), which the recordings read as `model` and keep. One engine is one
`IDENTITY`: `node, triton, pod, model, version` (a Triton replica's model version) plus `instance` (the
scraped server: two vLLM replicas under one job, with neither `triton` nor `pod`, are two engines) and
`engine`. Families and versions read are in docs/sources.md#llm-engines:

- TensorRT-LLM backend (`tensorrtllm_backend` / TensorRT-LLM `triton_backend`, custom_metrics_reporter.cc):
  gauges `nv_trt_llm_request_metrics{request_type=active|max|scheduled|context|waiting}` (requests; `waiting`
  from the 25.x backends on, absent before) and `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=
  max|free|used|tokens_per|reused|fraction}` (blocks; the used fraction is computed here from used / max,
  which every release has). It has no preemption counter and no prefix-cache query count, so those
  recordings have no TensorRT-LLM series: unknown, not 0.
- vLLM backend (`vllm_backend`, src/utils/metrics.py) re-exports vLLM's `vllm:*` families under Triton's
  labels; vLLM renamed some between releases and both names are read, the newer preferred where a
  release writes both: `vllm:kv_cache_usage_perc` (from vLLM 0.10) or `vllm:gpu_cache_usage_perc` (a
  fraction 0-1 despite the name), `vllm:prefix_cache_{hits,queries}_total` or their older
  `vllm:gpu_prefix_cache_*` names (tokens), `vllm:num_requests_{running,waiting}`,
  `vllm:num_preemptions_total`. vLLM reports no maximum of running requests, so "running at the maximum"
  is known for TensorRT-LLM only.

Every recording carries `backend` (`tensorrt_llm` | `vllm`). Impossible readings (a used fraction outside
0-1, used blocks above the maximum, a negative count) record nothing.
"""

from __future__ import annotations

from inferwatch.rules import identity
from inferwatch.rules.builders import MODEL_VERSION, by, num, ratio
from inferwatch.rules.gpu import MEMORY_RATIO
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.selectors import Selector, label_arg
from inferwatch.spec import Duration, Spec, SpecError

# One engine: a Triton replica's model version, or a vLLM server's engine core (module doc).
IDENTITY = MODEL_VERSION + ("instance", "engine")
EV = by(IDENTITY)
TRT_REQUESTS = "nv_trt_llm_request_metrics"
TRT_KV = "nv_trt_llm_kv_cache_block_metrics"
TRT_MEMORY = "nv_trt_llm_runtime_memory_metrics"
# vLLM's families, newest name first (vLLM renamed them; a release in between writes both).
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
VLLM_PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
VLLM_PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
TRT, VLLM = {"backend": "tensorrt_llm"}, {"backend": "vllm"}

KV_USED = "model_version:engine_kv_cache_used:ratio"
KV_PREDICTED = "model_version:engine_kv_cache_used:predicted_ratio"
WAITING = "model_version:engine_requests_waiting:count"
RUNNING = "model_version:engine_requests_running:count"
RUNNING_MAX = "model_version:engine_requests_max:count"
RUNNING_OF_MAX = "model_version:engine_requests_running:ratio_of_max"
PREEMPTIONS = "model_version:engine_preemptions:rate"
PREFIX_HITS = "model_version:engine_prefix_cache_hits:ratio"
GPU_MEMORY_PREDICTED = "gpu:DCGM_FI_DEV_FB_USED:predicted_ratio"
# A vLLM server of its own has no `version`, `triton` or `node`: it is named by its scraped address.
MODEL = ("{{ $labels.model }}{{ with $labels.version }} version {{ . }}{{ end }} ({{ $labels.backend }}) on "
         "{{ with $labels.triton }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"
         "{{ with $labels.engine }} engine {{ . }}{{ end }}{{ with $labels.node }} (node {{ . }}){{ end }}")


def identity_of(spec: Spec) -> tuple[str, ...]:
    """IDENTITY with the spec's Triton labels (spec `identity.triton`): an engine on Triton's port carries them."""
    return identity.TritonLabels.of(spec).model_version + ("instance", "engine")


def model_text(spec: Spec) -> str:
    """MODEL naming the server and node by the spec's labels."""
    ids = identity.TritonLabels.of(spec)
    server, node = (f"$labels.{n}" if n in ("triton", "node") else label_arg(n) for n in (ids.server, ids.node))
    return ("{{ $labels.model }}{{ with $labels.version }} version {{ . }}{{ end }} ({{ $labels.backend }}) on "
            f"{{{{ with {server} }}}}{{{{ . }}}}{{{{ else }}}}{{{{ $labels.instance }}}}{{{{ end }}}}"
            f"{{{{ with $labels.engine }}}} engine {{{{ . }}}}{{{{ end }}}}{{{{ with {node} }}}} (node {{{{ . }}}})"
            "{{ end }}")


# vLLM's own label for the served model (a vLLM server); Triton's vLLM backend writes `model` instead.
VLLM_MODEL_LABEL = "model_name"


def as_model(expr: str) -> str:
    """`expr` with a vLLM server's `model_name` copied to `model` (unchanged where `model_name` is absent or
    empty: Triton's vLLM backend writes `model`)."""
    return f'label_replace({expr}, "model", "$1", "{VLLM_MODEL_LABEL}", "(.+)")'


def _gauge(sel: Selector, metric: str, *matchers: str, ident: tuple[str, ...] = IDENTITY) -> str:
    # One series per engine: `max by` drops job (one engine scraped by two jobs is one) and model_name.
    expr = sel(metric, *matchers)
    return f"max by ({by(ident)}) ({as_model(expr) if metric.startswith('vllm:') else expr})"


def _trt(sel: Selector, metric: str, kind_label: str, kind: str, ident: tuple[str, ...] = IDENTITY) -> str:
    return _gauge(sel, metric, f'{kind_label}="{kind}"', ident=ident)


def recording_rules(sel: Selector, window: str, horizon_s: int, lookback: str, ident: tuple[str, ...] = IDENTITY,
                    gpu_node: str = "node") -> list[Recording | Alert]:
    """The engine recordings (names in rules/names.py), each per engine (ident) plus
    `backend`: ratios 0-1, counts of requests, preemptions/s over `window`, forecasts `horizon_s` seconds
    ahead fitted over `lookback` (a PromQL range), each per IDENTITY. `sel`: the `engine` selector."""
    ev, triton_node = by(ident), ident[0]

    def rate(name: str) -> str:
        return f"sum by ({ev}) ({as_model(f'rate({sel(name)}[{window}])')})"

    kv_vllm = "\nor\n".join(_gauge(sel, name, ident=ident) for name in VLLM_KV_USAGE)
    prefix = "\nor\n".join(f"(\n{ratio(rate(hits), rate(queries), ident)}\n)"
                           for hits, queries in zip(VLLM_PREFIX_HITS, VLLM_PREFIX_QUERIES, strict=True))
    used = _trt(sel, TRT_KV, "kv_cache_block_type", "used", ident)
    blocks = _trt(sel, TRT_KV, "kv_cache_block_type", "max", ident)
    return [
        Recording(KV_USED, f"(\n{ratio(used, blocks, ident)}\n) <= 1", TRT),
        Recording(KV_USED, f"(\n{kv_vllm}\n) >= 0 <= 1", VLLM),
        Recording(WAITING, f"{_trt(sel, TRT_REQUESTS, 'request_type', 'waiting', ident)} >= 0", TRT),
        Recording(WAITING, f"{_gauge(sel, VLLM_WAITING, ident=ident)} >= 0", VLLM),
        Recording(RUNNING, f"{_trt(sel, TRT_REQUESTS, 'request_type', 'active', ident)} >= 0", TRT),
        Recording(RUNNING, f"{_gauge(sel, VLLM_RUNNING, ident=ident)} >= 0", VLLM),
        Recording(RUNNING_MAX, f"{_trt(sel, TRT_REQUESTS, 'request_type', 'max', ident)} > 0", TRT),
        Recording(RUNNING_OF_MAX, ratio(RUNNING, RUNNING_MAX, ident), TRT),
        Recording(PREEMPTIONS, rate(VLLM_PREEMPTIONS), VLLM),
        Recording(PREFIX_HITS, prefix, VLLM),
        # node-mixin's NodeFilesystemSpaceFillingUp: predict_linear over a lookback, reaching full within
        # the horizon.
        Recording(KV_PREDICTED, f"predict_linear({KV_USED}[{lookback}], {horizon_s})"),
        # Only the GPUs of nodes that run an engine: the framebuffer of an engine node fills with KV cache
        # and activations, elsewhere the GPU alerts speak for it.
        # Per MIG instance (per GPU without MIG), as the framebuffer is: pods are no part of a GPU's identity.
        Recording(GPU_MEMORY_PREDICTED,
                  identity.per_instance(f"predict_linear({MEMORY_RATIO}[{lookback}], {horizon_s})")
                  + f"\nand on ({gpu_node})\ngroup by ({gpu_node}) ({_node_as(KV_USED, triton_node, gpu_node)})"),
    ]


def _node_as(expr: str, theirs: str, ours: str) -> str:
    """`expr` with its `theirs` node label copied to `ours` (unchanged where both are one name)."""
    return expr if theirs == ours else f'label_replace({expr}, "{ours}", "$1", "{theirs}", "(.*)")'


def _waiting_query(spec: Spec) -> tuple[str, str]:
    """(printf format, arguments) of the query naming an alert's waiting requests (its engine's: every
    IDENTITY label, an absent one as "", which matches only series without it), in its cluster."""
    ident = identity_of(spec)
    matchers = [f"{label}=%q" for label in ident]
    args = "".join(f" {label_arg(label)}" for label in ident)
    if spec.cluster.enabled:
        matchers.insert(0, f"{spec.cluster.label}=%q")
        args = f" {label_arg(spec.cluster.label)}" + args
    return f"{WAITING}{{{','.join(matchers)}}}", args


# The trend's range where the spec leaves fill_lookback unset, in rate windows (5m -> 1h).
LOOKBACK_WINDOWS = 12


def lookback(spec: Spec) -> Duration:
    """The range predict_linear fits over: layers.L2.engine.fill_lookback, else 12 rate windows."""
    e = spec.layers.L2.engine
    return e.fill_lookback or Duration(LOOKBACK_WINDOWS * spec.prometheus.rate_window.ms)


def validate(spec: Spec, window_ms: int) -> None:
    """Raise SpecError for engine windows the rules cannot honour (growth `for` not longer than the rate
    window, a lookback shorter than it, no horizon)."""
    e = spec.layers.L2.engine
    if e.waiting_growth_for.ms <= window_ms:
        raise SpecError("layers.L2.engine.waiting_growth_for",
                        f"expected longer than prometheus.rate_window ({spec.prometheus.rate_window}), "
                        f"got {e.waiting_growth_for}")
    if e.fill_lookback is not None and e.fill_lookback.ms < window_ms:
        raise SpecError("layers.L2.engine.fill_lookback",
                        f"expected at least prometheus.rate_window ({spec.prometheus.rate_window}), "
                        f"got {e.fill_lookback}")
    if e.fill_horizon.ms <= 0:
        raise SpecError("layers.L2.engine.fill_horizon", "expected a positive duration, got 0s")


def alerts(spec: Spec) -> list[Recording | Alert]:
    """The engine alerts (layer L2 from the registry), thresholds from `layers.L2.engine`. Identity labels:
    IDENTITY (`node, triton, pod, model, version, instance, engine`; absent ones left out) plus `backend`: one
    alert per engine. The GPU's labels for
    EngineGpuMemoryFillPredicted (GPUs of nodes running an engine, below GpuMemoryUsageHigh's threshold)."""
    e = spec.layers.L2.engine
    ev, model = by(identity_of(spec)), model_text(spec)
    gpu_node = spec.identity.gpu.node
    gpu_node_arg = "$labels.node" if gpu_node == "node" else label_arg(gpu_node)
    query, args = _waiting_query(spec)
    waiting = (f'{{{{ with printf "{query}"{args} | query }}}}{{{{ range . }}}} and '
               f'{{{{ .Value | printf "%.0f" }}}} requests wait{{{{ end }}}}{{{{ end }}}}')
    full = f"{KV_USED} >= {{}}\nand on ({ev})\n{WAITING} >= {num(e.min_waiting_requests)}"
    return [
        Alert("EngineKvCacheFull", full.format(num(e.kv_cache_warning_ratio)), e.for_, "warning",
              f"The KV cache of {model} is {{{{ $value | humanizePercentage }}}} used{waiting}: new requests "
              "queue until running ones free blocks, so first tokens slow down."),
        Alert("EngineKvCacheFull", full.format(num(e.kv_cache_critical_ratio)), e.critical_for, "critical",
              f"The KV cache of {model} is full ({{{{ $value | humanizePercentage }}}} used){waiting}: every new "
              "request waits for a running one to finish; users see first tokens late or time out."),
        Alert("EnginePreemptionsHigh", f"{PREEMPTIONS} > {num(e.preemption_rate)}", e.for_, "warning",
              f"{model} preempts {{{{ $value | printf \"%.3g\" }}}} running requests per second (KV cache "
              "exhausted): their work is recomputed, so those requests slow down and the engine does less."),
        Alert("EngineWaitingRequestsGrowing",
              f"deriv({WAITING}[{spec.prometheus.rate_window}]) > 0\nand on ({ev})\n"
              f"{WAITING} >= {num(e.min_waiting_requests)}", e.waiting_growth_for, "warning",
              f"The queue of {model} grows by {{{{ $value | printf \"%.3g\" }}}} waiting requests per second "
              "and has grown for longer than the rate window: the engine is saturated, arrivals outpace it."),
        Alert("EngineKvCacheFillPredicted",
              f"{KV_PREDICTED} >= 1\nand on ({ev})\n{KV_USED} < {num(e.kv_cache_warning_ratio)}", e.for_,
              "warning",
              f"At its growth over the last {lookback(spec)} the KV cache of {model} is full within "
              f"{e.fill_horizon} (predicted {{{{ $value | humanizePercentage }}}}): requests will start to wait."),
        Alert("EngineGpuMemoryFillPredicted",
              f"{GPU_MEMORY_PREDICTED} >= 1\nand\n{MEMORY_RATIO} < {num(spec.layers.L1.memory_used_warning_ratio)}",
              e.for_, "warning",
              f"At its growth over the last {lookback(spec)} the framebuffer of GPU {{{{ $labels.gpu }}}} "
              f"({{{{ $labels.UUID }}}}) on engine node {{{{ {gpu_node_arg} }}}} is full within {e.fill_horizon} "
              "(predicted {{ $value | humanizePercentage }}): the engine on it will fail allocations."),
    ]


def groups(spec: Spec) -> list[Group]:
    """`inferwatch-engine.rules` (recordings, above) and `inferwatch-engine.alerts`. Raises SpecError for a
    growth `for` not longer than the rate window or a lookback shorter than it."""
    window = spec.prometheus.rate_window
    validate(spec, window.ms)
    e = spec.layers.L2.engine
    return [Group("inferwatch-engine.rules",
                  recording_rules(spec.selectors.of("engine"), str(window), int(e.fill_horizon.seconds),
                                  str(lookback(spec)), identity_of(spec), spec.identity.gpu.node)),
            Group("inferwatch-engine.alerts", alerts(spec))]
