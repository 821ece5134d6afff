"""Plain data one poll of one Triton yields (`TritonSnapshot`), and pure parsers from Triton's JSON answers.

Shapes of the answers (KServe v2 + Triton's extensions, server docs/protocol/):
  POST /v2/repository/index  -> [{"name", "version"?, "state"?, "reason"?}, ...]
  GET  /v2/models/<m>/config -> the model configuration as JSON (max_batch_size, dynamic_batching,
                                instance_group, model_transaction_policy, ensemble_scheduling)
  GET  /v2/models/stats      -> see stats.py
Parsers raise `ValueError` on an answer of the wrong shape; the reader counts that as cause `bad_response`.
"""

from __future__ import annotations

import dataclasses

from inferwatch.exporters.triton.stats import ModelStats, field

# The state set the collector exposes. Triton also knows UNKNOWN (core model_lifecycle.cc),
# which is none of these: all four series are then 0.
STATES = ("READY", "UNAVAILABLE", "LOADING", "UNLOADING")
# Reason Triton's index gives a version after an explicit unload: a deliberate act, not a fault.
UNLOADED_REASON = "unloaded"

# Closed sets for the poll-error counter (created at zero, so rates work from the first error).
ENDPOINTS = ("live", "ready", "index", "config", "stats", "metrics")
CAUSES = ("timeout", "connection", "forbidden", "http_error", "bad_response", "too_large", "other")


@dataclasses.dataclass(frozen=True)
class ModelVersionState:
    """One loaded (or failed) model version as the repository index lists it."""

    name: str
    version: str
    state: str
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class ModelConfigFigures:
    """The figures of a model configuration that batching alerts and the ensemble view need.

    `preferred_batch_size_max` is the largest preferred_batch_size, or max_batch_size when dynamic batching
    is on without preferred sizes (Triton's batcher then forms batches as large as it can, up to
    max_batch_size: docs/user_guide/model_configuration.md "Preferred Batch Sizes"); None without dynamic
    batching. `instances` maps instance-group kind (KIND_CPU, KIND_GPU, ...) to the instance count.
    `decoupled`: model_transaction_policy.decoupled (any number of responses per request, e.g. streamed
    tokens). `ensemble_steps`: for an ensemble, the model names of its ensemble_scheduling steps in step
    order, each once.
    """

    max_batch_size: int
    dynamic_batching: bool
    preferred_batch_size_max: int | None
    max_queue_delay_seconds: float | None
    instances: dict[str, int]
    decoupled: bool = False
    ensemble_steps: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class PollError:
    """One failed call or malformed part of an answer. `subject`: the model it concerns, `entry`: True for
    one entry of an answer (the rest was used), False for the whole call; both key its log lines. `detail`
    may quote Triton's text (escaped when logged)."""

    endpoint: str
    cause: str
    detail: str = ""
    subject: str = ""
    entry: bool = False


@dataclasses.dataclass
class TritonSnapshot:
    """Everything one poll of one Triton learned. Absent parts (None / empty) were not learned this poll.

    - `up`: the collector got an HTTP answer from /v2/health/live.
    - `live`/`ready`: those endpoints answered 200 (None when `up` is False, or when the call was refused:
      a restricted health API without its header, cause `forbidden`).
    - `models`: loaded or failed versions (deliberately unloaded and never-loaded ones are left out).
    - `configs`: per model name (the last configuration read; see configcache.py).
    - `stats`: per (model, version) its statistics (None: the statistics call failed this poll).
    - `summaries_enabled`: Triton's /metrics carries nv_inference_*_summary_us (None: not read).
    - `config_fetches`: model configurations requested this poll (the others came from the cache).
    """

    triton: str
    up: bool
    live: bool | None = None
    ready: bool | None = None
    models: list[ModelVersionState] | None = None
    configs: dict[str, ModelConfigFigures] = dataclasses.field(default_factory=dict)
    stats: dict[tuple[str, str], ModelStats] | None = None
    summaries_enabled: bool | None = None
    config_fetches: int = 0
    errors: list[PollError] = dataclasses.field(default_factory=list)
    duration_seconds: float = 0.0
    timestamp: float = 0.0


def parse_index(answer: object) -> tuple[list[ModelVersionState], list[tuple[str, str]]]:
    """Repository index → (the versions to report, problems as (model, text)).

    Entries without a state (in the repository, never loaded: explicit model control) and entries
    UNAVAILABLE with reason "unloaded" (explicitly unloaded; Triton keeps listing them) are left out, so the
    series of an unloaded model disappear at the next poll instead of looking like a failed model.
    An entry with an empty name is left out as a problem: a Triton model is named by its directory in the
    model repository, which cannot have an empty name, and `model=""` would read as no label at all in
    Prometheus. Raises ValueError when the answer is not a list of named entries.
    """
    if not isinstance(answer, list):
        raise ValueError(f"repository index: expected a list, got {type(answer).__name__}")
    out = []
    problems: list[tuple[str, str]] = []
    for entry in answer:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError("repository index: entry without a name")
        if not entry["name"]:
            problems.append(("", "repository index: entry with an empty model name left out"))
            continue
        state = str(entry.get("state") or "")
        reason = str(entry.get("reason") or "")
        if not state or (state == "UNAVAILABLE" and reason == UNLOADED_REASON):
            continue
        out.append(ModelVersionState(entry["name"], str(entry.get("version") or ""), state, reason))
    return out, problems


def parse_config(answer: object) -> ModelConfigFigures:
    """Model configuration JSON → ModelConfigFigures. Raises ValueError on a malformed answer."""
    if not isinstance(answer, dict):
        raise ValueError("model config: expected an object")
    try:
        max_batch = int(answer.get("max_batch_size", 0))
        dyn = answer.get("dynamic_batching")
        enabled = isinstance(dyn, dict)
        preferred = delay = None
        if isinstance(dyn, dict):  # enabled
            sizes = [int(s) for s in dyn.get("preferred_batch_size", [])]
            preferred = max(sizes) if sizes else max_batch
            delay = int(dyn.get("max_queue_delay_microseconds", 0)) / 1e6
        instances: dict[str, int] = {}
        for group in answer.get("instance_group", []):
            kind = str(group.get("kind") or "KIND_AUTO")
            count = int(group.get("count", 1))
            # For KIND_GPU, `count` instances are created on *each* listed GPU (model_configuration.md).
            gpus = group.get("gpus") or []
            if kind == "KIND_GPU" and gpus:
                count *= len(gpus)
            instances[kind] = instances.get(kind, 0) + count
        decoupled = bool((field(answer, "model_transaction_policy") or {}).get("decoupled", False))
        steps: list[str] = []
        for step in field(field(answer, "ensemble_scheduling") or {}, "step") or []:
            name = field(step, "model_name")
            if not isinstance(name, str) or not name:
                raise ValueError("model config: ensemble step without a model_name")
            if name not in steps:
                steps.append(name)
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"model config: {exc}") from None
    return ModelConfigFigures(max_batch, enabled, preferred, delay, instances, decoupled, tuple(steps))
