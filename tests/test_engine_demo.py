"""The demo's spec on a CPU Triton (no engine backend): the Triton dashboard generated from
examples/demo/inferwatch.demo.yaml has the "LLM engines" row, and every query of that row, like the engine
rule groups, evaluates without error on a real Prometheus scraping the real Triton, with an empty result:
no engine series there, so nothing is drawn (unknown is absent, never 0).
"""

from __future__ import annotations

import time

import requests
import yaml

from engine_support import ENGINE_PANELS, concrete, engine_row, write_engine_prometheus
from inferwatch.dashboards.generate import dashboards
from inferwatch.demo.config import DEMO_SPEC
from inferwatch.spec import load_spec, spec_from_dict

DEADLINE = 60.0
ENGINE_GROUPS = {"inferwatch-engine.rules", "inferwatch-engine.alerts"}


def test_the_demo_dashboards_have_the_engine_row():
    panels = engine_row(dashboards(load_spec(DEMO_SPEC))["triton"])
    assert [p["title"] for p in panels] == ENGINE_PANELS
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in panels)


def test_the_engine_row_is_empty_but_valid_on_the_demo_cpu_triton(triton, prometheus_factory, tmp_path):
    raw = yaml.safe_load(DEMO_SPEC.read_text())
    raw["targets"] = {"triton": [{**raw["targets"]["triton"][0], "url": triton.url,
                                  "metrics_url": triton.metrics_url}],
                      "triton_collectors": [], "gpu_exporters": [], "gateways": []}
    raw["prometheus"] = {**raw["prometheus"], "scrape_interval": "1s", "evaluation_interval": "1s"}
    spec = spec_from_dict(raw)
    prom = prometheus_factory(write_engine_prometheus(spec, tmp_path))

    # Triton is scraped (its nv_* series are there), and it has no engine family.
    prom.wait_for('count({__name__=~"nv_inference_.*"}) > 0', timeout=DEADLINE)
    assert prom.query('{__name__=~"nv_trt_llm_.*|vllm:.*"}') == []
    # Both engine groups have evaluated at least once, without error.
    deadline = time.monotonic() + DEADLINE
    groups: dict = {}
    while time.monotonic() < deadline:
        body = requests.get(f"{prom.url}/api/v1/rules", timeout=10).json()
        groups = {g["name"]: g for g in body["data"]["groups"] if g["name"] in ENGINE_GROUPS}
        if len(groups) == 2 and all(r.get("lastEvaluation", "").startswith("2") and
                                    not r["lastEvaluation"].startswith("0001")
                                    for g in groups.values() for r in g["rules"]):
            break
        time.sleep(0.5)
    assert set(groups) == ENGINE_GROUPS
    bad = [(r["name"], r.get("lastError")) for g in groups.values() for r in g["rules"] if r["health"] != "ok"]
    assert not bad, bad
    # Every query of the row runs (prom.query raises on a query error) and is empty.
    panels = engine_row(dashboards(spec)["triton"])
    assert [p["title"] for p in panels] == ENGINE_PANELS
    for panel in panels:
        for target in panel["targets"]:
            assert prom.query(concrete(target["expr"])) == [], (panel["title"], target["expr"])
