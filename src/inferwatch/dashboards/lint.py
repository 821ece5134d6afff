"""A dashboard linter in the spirit of grafana/dashboard-linter (its rules: template-datasource-rule,
panel-datasource-rule, panel-title-description-rule, panel-units-rule, panel-no-targets, target-rate-interval-rule),
plus inferwatch's own: unique panel ids, no Angular panel types, and a runbook link on every panel whose
description names an alert.

`lint(data) -> [problem, ...]` on dashboard JSON data; an empty list means clean.
"""

from __future__ import annotations

import re

from inferwatch.dashboards.builders import FIXED_WINDOWS
from inferwatch.rules.names import ALERTS

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Core React panels of Grafana 11. Anything else (graph, singlestat, table-old, Angular plugins) is refused:
# Grafana 11 disables Angular by default (Grafana docs, "Angular support deprecation").
REACT_PANELS = {"row", "timeseries", "stat", "table", "heatmap", "bargauge", "gauge", "state-timeline",
                "status-history", "barchart", "histogram", "text", "piechart", "alertlist"}
MIN_SCHEMA_VERSION = 39  # Grafana 11.0
RANGE = re.compile(r"\[([^\]]+)\]")
ALERT_NAME = re.compile(r"\b(" + "|".join(sorted(ALERTS, key=len, reverse=True)) + r")\b")


def lint(data: dict) -> list[str]:
    problems: list[str] = []
    title = data.get("title", "?")
    if data.get("schemaVersion", 0) < MIN_SCHEMA_VERSION:
        problems.append(f"{title}: schemaVersion {data.get('schemaVersion')} < {MIN_SCHEMA_VERSION}")
    variables = data.get("templating", {}).get("list", [])
    if not any(v.get("name") == "datasource" and v.get("type") == "datasource" and v.get("query") == "prometheus"
               for v in variables):
        problems.append(f"{title}: no `datasource` variable of type datasource (prometheus)")
    for v in variables:
        if v.get("type") == "query" and v.get("datasource") != DATASOURCE:
            problems.append(f"{title}: variable {v.get('name')} does not use ${{datasource}}")
    seen: set = set()
    for panel in data.get("panels", []):
        where = f"{title} / {panel.get('title') or '(untitled)'}"
        pid = panel.get("id")
        if not isinstance(pid, int) or pid in seen:
            problems.append(f"{where}: panel id {pid!r} missing or not unique")
        seen.add(pid)
        kind = panel.get("type")
        if kind not in REACT_PANELS:
            problems.append(f"{where}: panel type {kind!r} is Angular or unknown")
        if kind == "row":
            continue
        if not panel.get("title"):
            problems.append(f"{where}: no title")
        if not panel.get("description"):
            problems.append(f"{where}: no description")
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append(f"{where}: no unit")
        if panel.get("datasource") != DATASOURCE:
            problems.append(f"{where}: datasource is not ${{datasource}}")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{where}: no targets")
        for t in targets:
            if t.get("datasource") != DATASOURCE:
                problems.append(f"{where}: target {t.get('refId')} datasource is not ${{datasource}}")
            for window in RANGE.findall(t.get("expr", "")):
                # A subquery `[$__rate_interval:]` (resolution left to Grafana's step) is a window too.
                if window.removesuffix(":") != "$__rate_interval" and f"[{window}]" not in FIXED_WINDOWS:
                    problems.append(f"{where}: range [{window}] should be [$__rate_interval]")
        links = " ".join(link.get("url", "") for link in panel.get("links") or [])
        for alert in sorted(set(ALERT_NAME.findall(panel.get("description", "")))):
            if f"/{alert}.md" not in links:
                problems.append(f"{where}: names alert {alert} but has no link to its runbook")
    return problems
