"""Small builders every dashboard shares: the `$datasource` reference, variables, panel shapes, runbook links
and the whole-output pass (`finish`) that numbers panels and stamps uid, tags and datasource everywhere.

Built on grafana-foundation-sdk (types generated from Grafana's own schema, branch 11.6): grafanalib 0.7.1
writes schemaVersion 12 and string datasources, which Grafana 11 migrates on load (README "Dashboards").
Every query names `${datasource}` (dashboard-linter's panel-datasource-rule), so one JSON file works against
any Prometheus a site picks in the variable.
"""

from __future__ import annotations

import json
from typing import Iterable

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef, DashboardCursorSync, DataTransformerConfig, Threshold, ThresholdsMode, VariableOption, VariableRefresh, VariableSort,
)
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from inferwatch.rules.generate import runbook_url
from inferwatch.spec import Spec

# Grafana 11.6 is the schema the SDK branch was generated from; 11.0 is the oldest we claim (no Angular).
GRAFANA_VERSION = "11.6"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["inferwatch"]
UIDS = {"overview": "inferwatch-overview", "gpu": "inferwatch-gpu", "triton": "inferwatch-triton",
        "llm": "inferwatch-llm"}
TITLES = {"overview": "inferwatch / Overview", "gpu": "inferwatch / L1 GPU fleet",
          "triton": "inferwatch / L2 Triton models", "llm": "inferwatch / L3 LLM experience"}
# Panels that show a whole-dashboard time window on purpose, not a rate; the linter's rate-interval rule
# skips these windows (like a dashboard-linter `.lint` exclusion).
FIXED_WINDOWS = ("[7d]", "[$__range]")


def dashboard(key: str, description: str) -> db.Dashboard:
    return (db.Dashboard(TITLES[key]).uid(UIDS[key]).description(description).tags(TAGS)
            .refresh("30s").time("now-3h", "now").timezone("browser")
            .tooltip(DashboardCursorSync.CROSSHAIR)
            .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
            .link(db.DashboardLink("inferwatch").type("dashboards").tags(TAGS).as_dropdown(True)
                  .include_vars(True).keep_time(True)))


def variable(name: str, label: str, query: str, *, all_value: str = ".*") -> db.QueryVariable:
    """A multi-value label variable; `All` means the regex `.*` so `label=~"$var"` keeps every series."""
    return (db.QueryVariable(name).label(label).datasource(DATASOURCE).query(query).multi(True)
            .include_all(True).all_value(all_value).refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .current(VariableOption(selected=True, text="All", value="$__all")))


def query(expr: str, legend: str = "__auto", *, instant: bool = False, fmt: PromQueryFormat | None = None,
          ) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)
    if instant:
        q = q.instant()
    if fmt is not None:
        q = q.format(fmt)
    return q


def runbook_links(spec: Spec, alerts: Iterable[str]) -> list[db.DashboardLink]:
    return [db.DashboardLink(f"Runbook: {a}").url(runbook_url(spec, a)).target_blank(True) for a in alerts]


def runbook_data_link(spec: Spec) -> db.DashboardLink:
    """A data link for tables of ALERTS: the row's `alertname` column opens that alert's runbook."""
    return (db.DashboardLink("Runbook").url(runbook_url(spec, "${__data.fields.alertname}"))
            .target_blank(True))


def dashboard_link(key: str, title: str | None = None) -> db.DashboardLink:
    """Link to another inferwatch dashboard keeping the time range and the chosen data source."""
    return (db.DashboardLink(title or f"Open {TITLES[key]}")
            .url(f"/d/{UIDS[key]}?${{__url_time_range}}&${{datasource:queryparam}}"))


def _thresholds(steps: Iterable[tuple[float, str]]) -> db.ThresholdsConfig:
    return (db.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(None, "green")] + [Threshold(v, c) for v, c in steps]))


def _common(panel, title: str, description: str, unit: str, queries, links, w: int, h: int):
    panel = panel.title(title).description(description).unit(unit).datasource(DATASOURCE).span(w).height(h)
    for q in queries:
        panel = panel.with_target(q)
    if links:
        panel = panel.links(list(links))
    return panel


def timeseries_panel(title: str, description: str, unit: str, queries: list[prometheus.Dataquery], *,
                     links=(), thresholds: Iterable[tuple[float, str]] = (), stacked: bool = False,
                     w: int = 12, h: int = 8, min_val: float | None = None, max_val: float | None = None,
                     ) -> timeseries.Panel:
    """A timeseries panel; `thresholds` [(value, colour)] draw as dashed lines (the alert thresholds)."""
    panel = _common(timeseries.Panel(), title, description, unit, queries, links, w, h)
    panel = (panel.line_width(1).fill_opacity(10).show_points(common.VisibilityMode.NEVER)
             .legend(cb.VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
             .tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                      .sort(common.SortOrder.DESCENDING)))
    steps = list(thresholds)
    if steps:
        panel = panel.thresholds(_thresholds(steps)).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED))
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(40)
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    return panel


def stat_panel(title: str, description: str, unit: str, queries: list[prometheus.Dataquery], *, links=(),
               thresholds: Iterable[tuple[float, str]] = (), w: int = 6, h: int = 5,
               no_value: str = "no data") -> stat.Panel:
    """A stat panel showing the last value; thresholds colour the background."""
    panel = _common(stat.Panel(), title, description, unit, queries, links, w, h)
    return (panel.reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .graph_mode(common.BigValueGraphMode.AREA).color_mode(common.BigValueColorMode.BACKGROUND)
            .thresholds(_thresholds(thresholds)).no_value(no_value))


def table_panel(title: str, description: str, unit: str, queries: list[prometheus.Dataquery], *, links=(),
                w: int = 12, h: int = 8) -> table.Panel:
    """A table of instant queries in table format: one row per series, labels as columns, value last."""
    panel = _common(table.Panel(), title, description, unit, queries, links, w, h)
    # The sample time is the same on every row of an instant query: hide it.
    return panel.with_transformation(DataTransformerConfig(id_val="organize",
                                                           options={"excludeByName": {"Time": True}}))


def table_query(expr: str) -> prometheus.Dataquery:
    return query(expr, instant=True, fmt=PromQueryFormat.TABLE)


def heatmap_panel(title: str, description: str, unit: str, bucket_expr: str, *, links=(), w: int = 12,
                  h: int = 8) -> heatmap.Panel:
    """A heatmap of a Prometheus histogram: `bucket_expr` is `sum by (le) (rate(x_bucket[...]))`."""
    q = query(bucket_expr, "{{le}}", fmt=PromQueryFormat.HEATMAP)
    panel = _common(heatmap.Panel(), title, description, unit, [q], links, w, h)
    # The buckets are already counted by Prometheus: calculate=False keeps Grafana from re-bucketing them.
    return (panel.calculate(False)
            .color(heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges"))
            .y_axis(heatmap.YAxisConfig().unit(unit)))


def finish(board: db.Dashboard) -> dict:
    """Whole-output pass: unique panel ids in layout order, refIds A, B, ... per panel. Returns plain JSON
    data (dicts), ready for `render`."""
    data = json.loads(JSONEncoder().encode(board.build()))
    next_id = 1
    for panel in data.get("panels", []):
        panel["id"] = next_id
        next_id += 1
        for i, target in enumerate(panel.get("targets", [])):
            target["refId"] = chr(ord("A") + i)
    return data


def render(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
