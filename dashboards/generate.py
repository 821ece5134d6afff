"""The dashboards generator registered in `inferwatch generate`: dashboards/generated/<uid>.json, one per
module in DASHBOARDS, for Grafana 11 or newer (builders.GRAFANA_VERSION).

Provisioning (dashboards/provisioning/) is static: it points Grafana at this folder and at a Prometheus.
"""

from __future__ import annotations

from types import ModuleType

from inferwatch.dashboards import gpu, llm, overview, triton
from inferwatch.dashboards.builders import UIDS, finish, render
from inferwatch.spec import Spec

OUT_DIR = "dashboards/generated"
# key (builders.UIDS) -> module with build(spec) and MAIN_PANEL (the panel an on-call reads first).
DASHBOARDS: dict[str, ModuleType] = {"overview": overview, "gpu": gpu, "triton": triton, "llm": llm}


def dashboards(spec: Spec) -> dict[str, dict]:
    """{key: dashboard JSON data} for every dashboard."""
    return {key: finish(module.build(spec)) for key, module in DASHBOARDS.items()}


def outputs(spec: Spec) -> dict[str, str]:
    """{relative path: JSON text} for `inferwatch generate`."""
    return {f"{OUT_DIR}/{UIDS[key]}.json": render(data) for key, data in dashboards(spec).items()}
