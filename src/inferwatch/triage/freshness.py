"""Is each source a triage reads still reporting? Checked before any evidence is used, so no cause is named
from data that stopped arriving.

A source (the spec's `selectors`: gpu, triton, gateway, ...) is read by every evidence query that names its
`$<source>_selector`. For each one, three queries at the evaluation time over the scrape's own `up` series
(Prometheus writes it at every scrape, 1 or 0, whether the target answers or not):

- `max(up{<selector>, <scope>})`: 0 means no target of that source answers its scrape (an exporter down);
- `time() - max(timestamp(up{<selector>, <scope>}) or max_over_time(timestamp(up{...})[1h:<scrape interval>]))`:
  the age of the newest scrape within the last hour;

and the source's own scrape interval: the median spacing of the stored `up` samples of its newest target over
the same hour (a dcgm-exporter scraped every 60 s, a central store fed every 30 s), or the spec's
`prometheus.scrape_interval` when fewer than three samples are stored. A source is stale when its `up` is 0,
when its newest scrape is older than STALE_SCRAPES of its own intervals (a Prometheus scrapes each target once
per interval, so two missed scrapes in a row are no jitter; a store that still answers an instant query from
samples minutes old, as within Prometheus's 5-minute lookback or VictoriaMetrics' own, serves values that
stopped arriving), or when Prometheus no longer returns its instant `up` although it was scraped within the
hour (it wrote the series' staleness marker: the target left service discovery).

`<scope>` is the alert's node for the node-local sources (the GPU exporter and Triton on the alert's node;
not checked for an alert without a node), nothing for the others (a gateway or collector anywhere).
A stale source's queries are not run (except those on `up` itself): their values are unknown, never the
averages of samples taken before it stopped (a 10-minute `avg_over_time` still answers minutes after an
exporter died). Without any `up` series for a source its freshness is unknown and the evidence is used as it
is (an unknown is not a failure).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from inferwatch.selectors import SOURCES
from inferwatch.spec import Spec
from inferwatch.triage.scope import scoped
from inferwatch.triage.sources import PrometheusSource

__all__ = ["SourceState", "sources_read", "check_sources", "scrape_interval", "STALE_SCRAPES"]

STALE_SCRAPES = 2   # newest scrape older than this many of the source's scrape intervals: it stopped reporting
MIN_SPACINGS = 2    # stored spacings needed to take the interval from the samples (else the spec's)
AGE_LOOKBACK = "1h"  # how far back the newest scrape is looked for; none in it: freshness unknown
NODE_LOCAL = ("gpu", "triton", "engine")  # engine: on Triton's port or a vLLM server, one per node or more
_SELECTOR_REF = re.compile(r"\$([a-z][a-z0-9_]*)_selector\b")
_UP_BEFORE = re.compile(r"\bup\{\s*$")


@dataclasses.dataclass(frozen=True)
class SourceState:
    """One source's freshness at the evaluation time. `up`: the largest `up` of its targets in scope (None: no
    `up` series); `age_s`: seconds since its newest scrape (None: unknown); `stale` with `reason` (a sentence
    naming the source, where, and what was measured); `interval_s`: the scrape interval its age was judged
    against, `interval_from` "samples" (observed) or "spec" (prometheus.scrape_interval)."""

    source: str
    up: float | None
    age_s: float | None
    stale: bool
    reason: str
    interval_s: float | None = None
    interval_from: str = "spec"


def sources_read(exprs, data_only: bool = False) -> list[str]:
    """The sources (spec `selectors` names) the query texts `exprs` read, in SOURCES order. `data_only`: only
    those read through their own series, not through `up` (a query on `up` measures the freshness itself, so
    it runs whatever the source's state: TritonServerDown's evidence is that `up` is 0)."""
    named = {m.group(1) for expr in exprs for m in _SELECTOR_REF.finditer(expr)
             if not (data_only and _UP_BEFORE.search(expr[:m.start()]))}
    return [s for s in SOURCES if s in named]


def scrape_interval(samples: list[tuple[dict, list[tuple[float, float]]]] | None,
                    default_s: float) -> tuple[float, str]:
    """(seconds, "samples" | "spec"): the median spacing of the stored samples of the series whose newest
    sample is the newest (`samples`: PrometheusSource.raw_samples of a range selector), or `default_s` when
    that series holds fewer than MIN_SPACINGS + 1 samples (or the query failed)."""
    if samples:
        newest = max(samples, key=lambda s: s[1][-1][0] if s[1] else float("-inf"))[1]
        gaps = sorted(b[0] - a[0] for a, b in zip(newest, newest[1:], strict=False) if b[0] > a[0])
        if len(gaps) >= MIN_SPACINGS:
            mid = len(gaps) // 2
            return (gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) / 2), "samples"
    return default_s, "spec"


def check_sources(source: PrometheusSource, names: list[str], labels: Mapping[str, str],
                  params: Mapping[str, str], spec: Spec) -> dict[str, SourceState]:
    """The state of each source of `names` (see the module docstring). A failing freshness query leaves that
    source's freshness unknown (not stale): the evidence queries then report their own errors."""
    out = {}
    for name in names:
        # The source's node label as the spec names it (spec `identity`): the GPU source's, or Triton's.
        node_name = spec.identity.gpu.node if name == "gpu" else spec.identity.triton.node
        node = labels.get(node_name) if name in NODE_LOCAL else None
        if name in NODE_LOCAL and not node:
            # An alert without a node (an L3 alert on a model) reads the servers of every node; one node's
            # exporter down says nothing about the others', so freshness stays unknown here.
            continue
        scope = f', {node_name}=~"{{{{ $labels.{node_name} }}}}"' if node else ""
        up_sel = f"up{{${name}_selector{scope}}}"
        up = source.query(f"{name}_up", scoped(f"max({up_sel})", labels, params, spec.cluster.label))
        # The instant `up`'s own timestamp where Prometheus still returns it; beyond its 5-minute lookback a
        # subquery, each of whose steps finds the newest sample before it (the steps are aligned to the step,
        # so alone it would miss a sample newer than the last step and read the one before).
        newest = (f"max(timestamp({up_sel}) or "
                  f"max_over_time(timestamp({up_sel})[{AGE_LOOKBACK}:{spec.prometheus.scrape_interval}]))")
        age = source.query(f"{name}_age", scoped(f"time() - {newest}", labels, params, spec.cluster.label))
        where = f" on node {node}" if node else ""
        what = SOURCES[name]
        if up.value is not None and up.value < 1:
            reason = (f"{what}{where} is down: up = 0 (Prometheus's scrape of it fails), so its last values "
                      f"are not used")
            out[name] = SourceState(name, up.value, age.value, True, reason)
            continue
        if age.value is None:
            out[name] = SourceState(name, up.value, None, False, "")
            continue
        raw = source.raw_samples(scoped(f"{up_sel}[{AGE_LOOKBACK}]", labels, params, spec.cluster.label))
        interval, origin = scrape_interval(raw, spec.prometheus.scrape_interval.seconds)
        limit = STALE_SCRAPES * interval
        held_stale = up.value is None   # scraped within the hour, no instant `up`: its staleness marker
        if age.value > limit or held_stale:
            how = "observed from its samples" if origin == "samples" else "the spec's prometheus.scrape_interval"
            late = (f", more than {STALE_SCRAPES} scrape intervals ({limit:g} s; one every {interval:g} s, "
                    f"{how})") if age.value > limit else ""
            marker = " and Prometheus holds its series stale" if held_stale else ""
            reason = (f"{what}{where} stopped reporting: its newest scrape is {age.value:.0f} s old{late}{marker}, "
                      f"so its last values are not used")
            out[name] = SourceState(name, up.value, age.value, True, reason, interval, origin)
        else:
            out[name] = SourceState(name, up.value, age.value, False, "", interval, origin)
    return out
