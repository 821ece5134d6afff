"""Generated dashboards: committed and fresh, clean under the dashboard linter, and the linter itself catches
what it claims to (each rule is shown failing on a broken copy)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from inferwatch.dashboards.builders import GRAFANA_VERSION, UIDS
from inferwatch.dashboards.generate import DASHBOARDS, dashboards, outputs
from inferwatch.dashboards.lint import lint
from inferwatch.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def boards():
    return dashboards(load_spec(ROOT / "inferwatch.yaml"))


def test_generated_dashboards_are_committed_and_fresh():
    files = outputs(load_spec(ROOT / "inferwatch.yaml"))
    assert sorted(files) == sorted(f"dashboards/generated/{uid}.json" for uid in UIDS.values())
    for rel, text in files.items():
        assert (ROOT / rel).read_text(encoding="utf-8") == text, f"{rel} is stale: run `inferwatch generate`"


@pytest.mark.parametrize("key", list(DASHBOARDS))
def test_dashboard_is_lint_clean(boards, key):
    assert lint(boards[key]) == []


@pytest.mark.parametrize("key", list(DASHBOARDS))
def test_main_panel_exists_and_is_not_a_row(boards, key):
    titles = {p["title"]: p for p in boards[key]["panels"]}
    assert titles[DASHBOARDS[key].MAIN_PANEL]["type"] != "row"


def test_targets_grafana_11(boards):
    assert GRAFANA_VERSION.startswith("11.")
    for data in boards.values():
        assert data["schemaVersion"] >= 39
        assert not [p for p in data["panels"] if p["type"] in ("graph", "singlestat", "table-old")]


def _panel(data, title):
    return next(p for p in data["panels"] if p.get("title") == title)


BREAKAGES = {
    "no unit": (lambda p: p["fieldConfig"]["defaults"].pop("unit"), "no unit"),
    "no description": (lambda p: p.pop("description"), "no description"),
    "fixed rate window": (lambda p: p["targets"][0].update(expr="rate(x[5m])"), "should be [$__rate_interval]"),
    "hard-coded datasource": (lambda p: p.update(datasource={"type": "prometheus", "uid": "abc"}),
                              "datasource is not"),
    "angular panel": (lambda p: p.update(type="graph"), "Angular"),
    "runbook link missing": (lambda p: p.pop("links"), "no link to its runbook"),
    "no targets": (lambda p: p.update(targets=[]), "no targets"),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_linter_catches(boards, breakage):
    data = copy.deepcopy(boards["gpu"])
    mutate, expected = BREAKAGES[breakage]
    mutate(_panel(data, "GPU temperature"))
    assert any(expected in problem for problem in lint(data)), lint(data)


def test_linter_catches_duplicate_ids_and_missing_datasource_variable(boards):
    data = copy.deepcopy(boards["llm"])
    data["panels"][2]["id"] = data["panels"][1]["id"]
    data["templating"]["list"] = [v for v in data["templating"]["list"] if v["name"] != "datasource"]
    problems = lint(data)
    assert any("not unique" in p for p in problems)
    assert any("no `datasource` variable" in p for p in problems)


def test_every_alert_panel_links_its_runbook_under_the_spec_base_url(boards):
    spec = load_spec(ROOT / "inferwatch.yaml")
    urls = [link["url"] for data in boards.values() for p in data["panels"] for link in p.get("links", [])
            if link["title"].startswith("Runbook: ")]
    assert urls and all(u.startswith(spec.runbook_base_url) for u in urls)
    for url in urls:  # every linked runbook exists in the repository
        assert (ROOT / "runbooks" / url.rsplit("/", 1)[1]).exists(), url


def test_json_is_stable_text():
    text = (ROOT / "dashboards/generated/inferwatch-overview.json").read_text(encoding="utf-8")
    assert json.loads(text)["uid"] == "inferwatch-overview" and text.endswith("}\n")
