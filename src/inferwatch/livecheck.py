"""`inferwatch check --prometheus URL [--alertmanager URL]`: does the spec fit the user's live Prometheus?

Read-only, over Prometheus' HTTP API (`/api/v1/query`, `/api/v1/targets`, `/api/v1/rules`,
`/api/v1/alertmanagers`) and Alertmanager's `/-/ready`. One line per problem found, each naming the spec
field or the Prometheus object to change:

- per source (the spec's `selectors`, the sources the layers' rules read): its selector matches no series;
  some of its targets are down; its series lack the identity labels rules, inhibitions and dashboards key on
  (`IDENTITY`, with the spec's `identity` names);
- LLM engine series (nv_trt_llm_*, vllm:*) that `selectors.engine` selects none of;
- metrics the rules read that no series of their source has, with the exporter flag or dcgm-exporter field
  that enables them (`NEEDED`, e.g. the ECC fields dcgm-exporter's default CSV leaves out);
- Triton targets scraped more often than Triton refreshes its metrics (`targets.triton[].metrics_interval_ms`,
  Triton's `--metrics-interval-ms`): repeated samples, rates of zero between refreshes;
- one scrape URL scraped by two targets (the same pod under two monitors: every series twice, two alerts for
  one fault);
- rules whose last evaluation failed (a rule group loaded but not working);
- with an Alertmanager URL: it does not answer, or Prometheus does not send alerts to it.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlsplit

import requests

from inferwatch.selectors import Selector
from inferwatch.spec import Spec

__all__ = ["Problem", "live_problems", "IDENTITY", "identity", "NEEDED", "LiveCheckError"]

# The sources the three layers' rules read (the alerting path's own sources are checked by the HA tests).
SOURCES = ("gpu", "triton", "triton_collector", "gateway")

# Labels each source's series must carry, as (alternatives, metric whose series must carry them; None: every
# series of the source). dcgm-exporter names the host `Hostname` (from 4.8.3 `hostname`) where a relabeling
# gives no `node`; per-GPU and per-server labels are checked on a per-GPU and a per-server series. Rules
# aggregate by them and inhibitions match on them (docs/conventions.md "The alert contract").
IDENTITY: dict[str, tuple[tuple[tuple[str, ...], str | None], ...]] = {
    "gpu": ((("node", "Hostname", "hostname"), None), (("gpu",), "DCGM_FI_DEV_GPU_TEMP"),
            (("UUID",), "DCGM_FI_DEV_GPU_TEMP")),
    "triton": ((("node",), None), (("triton",), None)),
    "triton_collector": ((("node",), None), (("triton",), "inferwatch_triton_up")),
    "gateway": ((("node",), None),),
}


def identity(spec: Spec) -> dict[str, tuple[tuple[tuple[str, ...], str | None], ...]]:
    """IDENTITY with the spec's identity labels (spec `identity`): Triton's node and server as the spec names
    them, a GPU's node as `identity.gpu.node` or any host label dcgm-exporter writes."""
    ids = spec.identity
    gpu_node = tuple(dict.fromkeys((ids.gpu.node, "node", "Hostname", "hostname")))
    out = dict(IDENTITY)
    out["gpu"] = ((gpu_node, None),) + IDENTITY["gpu"][1:]
    out["triton"] = (((ids.triton.node,), None), ((ids.triton.server,), None))
    return out


# The LLM engines' families (rules/engine.py): on Triton's port or a vLLM server's own job. A Prometheus with
# none has no engine and nothing to check; one with some that selectors.engine selects none of is blind.
ENGINE_FAMILIES = '__name__=~"nv_trt_llm_.+|vllm:.+"'

# Series Prometheus writes itself carry a source's labels too (ALERTS of an absent() alert, recorded
# series): only scraped series count.
SCRAPED = '__name__!~"ALERTS|ALERTS_FOR_STATE|.+:.+"'

# (source, metrics any of which is enough, what the rules lose, how to enable it).
DCGM_CSV = "dcgm-exporter's collectors CSV (-f / DCGM_EXPORTER_COLLECTORS)"
NEEDED: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("gpu", ("DCGM_FI_DEV_GPU_TEMP",), "GpuTemperatureCritical",
     f"the field DCGM_FI_DEV_GPU_TEMP in {DCGM_CSV}"),
    ("gpu", ("DCGM_FI_DEV_FB_USED",), "GpuMemoryUsageHigh/Critical",
     f"the fields DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE in {DCGM_CSV}"),
    ("gpu", ("inferwatch_gpu_xid_errors_total", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_XID_ERRORS"),
     "GpuXidCritical", f"the field DCGM_FI_DEV_XID_ERRORS in {DCGM_CSV}"),
    ("gpu", ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), "GpuUncorrectableMemoryError (ECC)",
     f"add `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, ...` to {DCGM_CSV}: its default CSV leaves the ECC fields "
     "out"),
    ("gpu", ("DCGM_FI_DEV_ROW_REMAP_FAILURE",), "GpuUncorrectableMemoryError (row remapping)",
     f"the field DCGM_FI_DEV_ROW_REMAP_FAILURE in {DCGM_CSV} (GPUs with row remapping: A100 and later)"),
    ("gpu", ("inferwatch_gpu_clocks_event_active", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"), "GpuThrottling",
     f"the field DCGM_FI_DEV_CLOCKS_EVENT_REASONS in {DCGM_CSV}"),
    ("triton", ("nv_inference_request_success",), "every L2 rule", "Triton's --allow-metrics=true (the default)"),
    ("triton", ("nv_inference_queue_summary_us",), "TritonQueueTimeP95High (falls back to the average)",
     "Triton's --metrics-config summary_latencies=true"),
    ("triton", ("nv_inference_pending_request_count",), "TritonPendingRequestsHigh",
     "Triton 23.04 or later (pending request count on by default)"),
    ("triton_collector", ("inferwatch_triton_up",), "TritonServerDown, TritonModelNotReady/NotLoaded",
     "`inferwatch exporter triton --spec ...` scraped under selectors.triton_collector"),
)


class LiveCheckError(Exception):
    """The Prometheus given cannot be read at all (the message says why; exit 1)."""


@dataclasses.dataclass(frozen=True)
class Problem:
    what: str  # the field or object to change: `selectors.gateway`, `target http://...`, `rule X`
    message: str

    def __str__(self) -> str:
        return f"{self.what}: {self.message}"


class _Api:
    def __init__(self, url: str, timeout: float):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, **params: str) -> Any:
        try:
            resp = requests.get(self.url + path, params=params or None, timeout=self.timeout)
        except requests.RequestException as exc:
            raise LiveCheckError(f"cannot reach Prometheus at {self.url}: {exc.__class__.__name__}") from None
        try:
            body = resp.json()
        except ValueError:
            raise LiveCheckError(f"{self.url}{path} answered HTTP {resp.status_code}, not Prometheus' JSON API "
                                 "(is this a Prometheus URL?)") from None
        if body.get("status") != "success":
            raise LiveCheckError(f"{self.url}{path}: {body.get('error') or resp.status_code}")
        return body["data"]

    def count(self, expr: str) -> int:
        result = self.get("/api/v1/query", query=f"count({expr})")["result"]
        return int(float(result[0]["value"][1])) if result else 0


def live_problems(spec: Spec, prometheus_url: str, alertmanager_url: str | None = None,
                  timeout: float = 10.0) -> list[Problem]:
    """Every problem found, in the order of the module docstring; [] when the spec fits. Raises
    LiveCheckError when Prometheus cannot be read at all."""
    api = _Api(prometheus_url, timeout)
    targets = api.get("/api/v1/targets", state="active")["activeTargets"]
    out: list[Problem] = []
    present: dict[str, bool] = {}
    labels_of = identity(spec)
    for source in SOURCES:
        selector = spec.selectors.of(source)
        field_ = f"selectors.{source}"
        if api.count(f"{{{selector}, {SCRAPED}}}") == 0:
            present[source] = False
            out.append(Problem(field_, f"{{{selector}}} matches no series in {api.url}: the {source} rules and "
                                       "dashboards see nothing (is its job named otherwise?)"))
            continue
        present[source] = True
        down = [t for t in targets if selector.matches(t["labels"]) and t.get("health") == "down"]
        for t in down:
            reason = t.get("lastError") or "no answer"
            out.append(Problem(f"target {t['scrapeUrl']}", f"{source} target down: {reason}"))
        for alternatives, metric in labels_of[source]:
            # Series without any of the alternatives (set operators match label sets, not metric names).
            matchers = f"{selector}, {SCRAPED}" if metric is None else f'{selector}, __name__="{metric}"'
            having = " unless ".join(f'{{{matchers}, {label}!=""}}' for label in alternatives)
            lacking = api.count(f"{{{matchers}}} unless {having}")
            if lacking:
                names = " or ".join(alternatives)
                of = f"{metric} " if metric else ""
                out.append(Problem(field_, f"{lacking} {of}series lack the label {names}, which alerts and "
                                           "inhibitions key on: add it in the scrape job's relabelling"))
    for source, metrics, loses, enable in NEEDED:
        if not present.get(source):
            continue
        selector = spec.selectors.of(source)
        if not any(api.count(selector(m)) for m in metrics):
            out.append(Problem(f"metric {metrics[-1]}", f"no {source} series ({' or '.join(metrics)}): {loses} "
                                                        f"cannot fire; enable {enable}"))
    out += _engine(spec, api)
    out += _triton_intervals(spec, targets)
    out += _duplicates(targets)
    out += _failing_rules(api)
    if alertmanager_url:
        out += _alertmanager(api, alertmanager_url, timeout)
    return out


def _engine(spec: Spec, api: _Api) -> list[Problem]:
    """selectors.engine selecting none of the engine families this Prometheus has (ENGINE_FAMILIES)."""
    everywhere = api.count(f"{{{ENGINE_FAMILIES}}}")
    if not everywhere:
        return []
    selector = spec.selectors.of("engine")
    if api.count(f"{{{selector}, {ENGINE_FAMILIES}}}"):
        return []
    jobs = api.get("/api/v1/query", query=f"count by (job) ({{{ENGINE_FAMILIES}}})")["result"]
    names = ", ".join(sorted(r["metric"].get("job", "") for r in jobs))
    return [Problem("selectors.engine", f"{{{selector}}} selects none of the {everywhere} LLM engine series "
                                        f"(nv_trt_llm_*, vllm:*) in {api.url} (their jobs: {names}): the engine "
                                        f"rules and dashboard row see nothing; select those jobs")]


def _seconds(text: str) -> float:
    from inferwatch.specload import Duration

    return Duration.parse(text).seconds


def _triton_intervals(spec: Spec, targets: list[dict]) -> list[Problem]:
    selector: Selector = spec.selectors.of("triton")
    interval_ms = max((t.metrics_interval_ms for t in spec.targets.triton), default=2000)
    out = []
    for t in targets:
        if not selector.matches(t["labels"]) or "scrapeInterval" not in t:
            continue
        every = _seconds(t["scrapeInterval"])
        if every * 1000 < interval_ms:
            out.append(Problem(f"target {t['scrapeUrl']}",
                               f"Triton scraped every {t['scrapeInterval']}, more often than it refreshes its "
                               f"metrics ({interval_ms} ms, targets.triton[].metrics_interval_ms): repeated samples; "
                               "scrape at least that far apart"))
    return out


def _duplicates(targets: list[dict]) -> list[Problem]:
    by_url: dict[str, list[str]] = {}
    for t in targets:
        by_url.setdefault(t["scrapeUrl"], []).append(t.get("scrapePool") or t["labels"].get("job", "?"))
    return [Problem(f"target {url}", f"scraped {len(pools)} times (scrape pools {', '.join(sorted(pools))}): "
                                     "every series twice, two alerts for one fault; keep one monitor")
            for url, pools in sorted(by_url.items()) if len(pools) > 1]


def _failing_rules(api: _Api) -> list[Problem]:
    out = []
    for group in api.get("/api/v1/rules")["groups"]:
        for rule in group.get("rules", []):
            if rule.get("health") == "err":
                out.append(Problem(f"rule {rule.get('name')} (group {group.get('name')})",
                                   f"fails to evaluate: {rule.get('lastError', '')}"))
    return out


def _alertmanager(api: _Api, url: str, timeout: float) -> list[Problem]:
    url = url.rstrip("/")
    try:
        ok = requests.get(url + "/-/ready", timeout=timeout).status_code == 200
    except requests.RequestException:
        ok = False
    out = [] if ok else [Problem(f"alertmanager {url}", "does not answer /-/ready")]
    wanted = urlsplit(url).netloc
    active = api.get("/api/v1/alertmanagers")["activeAlertmanagers"]
    if not any(urlsplit(a["url"]).netloc == wanted for a in active):
        sent_to = ", ".join(a["url"] for a in active) or "none"
        out.append(Problem(f"alertmanager {url}", f"Prometheus does not send alerts to it (it sends to: {sent_to}): "
                                                  "add it to the configuration's alerting.alertmanagers"))
    return out
