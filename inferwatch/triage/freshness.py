"""Is each source a triage reads still reporting? Checked before any evidence is used, so no cause is named
from data that stopped arriving.

A source (the spec's `selectors`: gpu, triton, gateway, ...) is read by every evidence query that names its
`$<source>_selector`. For each one, two instant queries at the evaluation time, over the scrape's own `up`
series (Prometheus writes it at every scrape, 1 or 0, whether the target answers or not):

- `max(up{<selector>, <scope>})`: 0 means no target of that source answers its scrape (an exporter down);
- `time() - max(max_over_time(timestamp(up{<selector>, <scope>})[1h:<scrape interval>]))`: the age of the
  newest scrape within the last hour. A source scraped within the hour whose instant `up` Prometheus no longer
  returns stopped reporting: Prometheus wrote its staleness marker (the target left service discovery) or its
  newest scrape is older than the 5-minute lookback. The reason gives the age, and says when it is more than
  two scrape intervals (spec `prometheus.scrape_interval`). A live scrape that merely lags stays fresh: its
  values are those Prometheus itself serves.

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

__all__ = ["SourceState", "sources_read", "check_sources", "STALE_SCRAPES"]

STALE_SCRAPES = 2   # newest scrape older than this many scrape intervals: the source stopped reporting
AGE_LOOKBACK = "1h"  # how far back the newest scrape is looked for; none in it: freshness unknown
NODE_LOCAL = ("gpu", "triton", "engine")  # engine: on Triton's port or a vLLM server, one per node or more
_SELECTOR_REF = re.compile(r"\$([a-z][a-z0-9_]*)_selector\b")
_UP_BEFORE = re.compile(r"\bup\{\s*$")


@dataclasses.dataclass(frozen=True)
class SourceState:
    """One source's freshness at the evaluation time. `up`: the largest `up` of its targets in scope (None: no
    `up` series); `age_s`: seconds since its newest scrape (None: unknown); `stale` with `reason` (a sentence
    naming the source, where, and what was measured)."""

    source: str
    up: float | None
    age_s: float | None
    stale: bool
    reason: str


def sources_read(exprs, data_only: bool = False) -> list[str]:
    """The sources (spec `selectors` names) the query texts `exprs` read, in SOURCES order. `data_only`: only
    those read through their own series, not through `up` (a query on `up` measures the freshness itself, so
    it runs whatever the source's state: TritonServerDown's evidence is that `up` is 0)."""
    named = {m.group(1) for expr in exprs for m in _SELECTOR_REF.finditer(expr)
             if not (data_only and _UP_BEFORE.search(expr[:m.start()]))}
    return [s for s in SOURCES if s in named]


def check_sources(source: PrometheusSource, names: list[str], labels: Mapping[str, str],
                  params: Mapping[str, str], spec: Spec) -> dict[str, SourceState]:
    """The state of each source of `names` (see the module docstring). A failing freshness query leaves that
    source's freshness unknown (not stale): the evidence queries then report their own errors."""
    interval = spec.prometheus.scrape_interval.seconds
    out = {}
    for name in names:
        node = labels.get("node") if name in NODE_LOCAL else None
        if name in NODE_LOCAL and not node:
            # An alert without a node (an L3 alert on a model) reads the servers of every node; one node's
            # exporter down says nothing about the others', so freshness stays unknown here.
            continue
        scope = ', node=~"{{ $labels.node }}"' if node else ""
        up_sel = f"up{{${name}_selector{scope}}}"
        up = source.query(f"{name}_up", scoped(f"max({up_sel})", labels, params, spec.cluster.label))
        # A subquery: beyond Prometheus's 5-minute lookback an instant `up` is simply absent, and so would be
        # its timestamp; each step of the subquery finds the newest sample before it.
        newest = f"max(max_over_time(timestamp({up_sel})[{AGE_LOOKBACK}:{spec.prometheus.scrape_interval}]))"
        age = source.query(f"{name}_age", scoped(f"time() - {newest}", labels, params, spec.cluster.label))
        where = f" on node {node}" if node else ""
        what = SOURCES[name]
        if up.value is not None and up.value < 1:
            reason = (f"{what}{where} is down: up = 0 (Prometheus's scrape of it fails), so its last values "
                      f"are not used")
            out[name] = SourceState(name, up.value, age.value, True, reason)
        elif up.value is None and age.value is not None:
            # Scraped within the hour, but Prometheus no longer returns its `up`: it marked the series stale
            # (the target left service discovery) or the newest scrape is past the 5-minute lookback.
            late = f", more than {STALE_SCRAPES} scrape intervals ({STALE_SCRAPES * interval:g} s)" \
                if age.value > STALE_SCRAPES * interval else ""
            reason = (f"{what}{where} stopped reporting: its newest scrape is {age.value:.0f} s old{late} and "
                      f"Prometheus holds its series stale, so its last values are not used")
            out[name] = SourceState(name, up.value, age.value, True, reason)
        else:
            out[name] = SourceState(name, up.value, age.value, False, "")
    return out
