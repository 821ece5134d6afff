"""The dashboards generator registered in `inferwatch generate`: dashboards/generated/<uid>.json, one per
module in DASHBOARDS, for Grafana 11 or newer (builders.GRAFANA_VERSION).

Provisioning (dashboards/provisioning/) is static: it points Grafana at this folder and at a Prometheus.

With several clusters (spec `cluster.name`) every dashboard gains a `cluster` variable (after the data source)
and every query selects `<label>=~"$cluster"` and keeps the label through its aggregations and matchings
(`inferwatch.rules.cluster`): one pass over the finished JSON, so no dashboard module repeats it. On a
Prometheus of one cluster its series carry no cluster label: the variable is empty and `All` (`.*`, which
matches the missing label) shows every series, as before.
"""

from __future__ import annotations

import json
import re
from types import ModuleType

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from inferwatch.dashboards import gpu, llm, overview, triton
from inferwatch.dashboards.builders import UIDS, finish, render, variable
from inferwatch.rules.cluster import keep_label, select
from inferwatch.spec import Spec

OUT_DIR = "dashboards/generated"
# key (builders.UIDS) -> module with build(spec) and MAIN_PANEL (the panel an on-call reads first).
DASHBOARDS: dict[str, ModuleType] = {"overview": overview, "gpu": gpu, "triton": triton, "llm": llm}


CLUSTER_VARIABLE = "cluster"
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$", re.S)


def dashboards(spec: Spec) -> dict[str, dict]:
    """{key: dashboard JSON data} for every dashboard."""
    boards = {key: finish(module.build(spec)) for key, module in DASHBOARDS.items()}
    if spec.cluster.enabled:
        for data in boards.values():
            with_cluster(data, spec.cluster.label)
    return boards


def with_cluster(data: dict, label: str) -> dict:
    """`data` (a finished dashboard) with the cluster variable and every query scoped to it (module doc)."""
    matcher = f'{label}=~"${CLUSTER_VARIABLE}"'

    def scope(expr: str) -> str:
        return select(keep_label(expr, label), matcher)

    for panel in data.get("panels", []):
        for target in panel.get("targets", []):
            target["expr"] = scope(target["expr"])
    variables = data["templating"]["list"]
    for var in variables:
        if var.get("type") == "query":
            m = _LABEL_VALUES.match(var["query"])
            if m is None:
                raise ValueError(f"dashboard variable {var.get('name')!r}: query is not label_values(...)")
            var["query"] = f"label_values({select(m.group(1), matcher)}, {m.group(2)})"
            if "definition" in var:
                var["definition"] = var["query"]
    cluster = json.loads(JSONEncoder().encode(variable(CLUSTER_VARIABLE, "Cluster", f"label_values(up, {label})")
                                              .build()))
    at = next((i + 1 for i, v in enumerate(variables) if v.get("type") == "datasource"), 0)
    variables.insert(at, cluster)
    return data


def outputs(spec: Spec) -> dict[str, str]:
    """{relative path: JSON text} for `inferwatch generate`."""
    return {f"{OUT_DIR}/{UIDS[key]}.json": render(data) for key, data in dashboards(spec).items()}
