"""Triage of the burn-rate alerts (runbooks/LlmTtftBurnRate.md, LlmAvailabilityBurnRate.md) weighs the long
window by the same history factor the rules use (rules/llm.py: `slo_window:gateway_scrapes:history_ratio`,
docs/paging-defaults.md "Burn-rate windows on a fresh Prometheus"), shown as `long_window_history_ratio`:

- the condition is judged on `long x history` as the rule is: a fresh Prometheus holding a tenth of the hour
  does not "hold" an alert the rule could not have fired (the issue's case);
- the page's query, resolved for each window of the spec, selects the series of that window's long span, as
  the generated alert expression does, and promtool evaluates it to the recorded factor, or 1 where the rule
  has none (no gateway `up`, so the window is judged as it is)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.generate import render_all
from inferwatch.rules.llm import SLO_HISTORY
from inferwatch.spec import load_spec
from inferwatch.triage.engine import BUILTIN_UNITS, judge, query_params, resolve_thresholds
from inferwatch.triage.evidence import load_runbooks
from inferwatch.triage.scope import scoped
from inferwatch.triage.thresholds import condition_value

ROOT = Path(__file__).resolve().parents[1]
SPEC = load_spec(ROOT / "inferwatch.yaml")
RUNBOOKS = load_runbooks()
QUERY = "long_window_history_ratio"
# alert → (its SLO label, the long-window ratio the page reads)
ALERTS = {"LlmTtftBurnRate": ("ttft", "slo_miss_long"), "LlmAvailabilityBurnRate": ("availability", "error_ratio_long")}


def labels(alert: str, window: str) -> dict:
    return {"tier": "realtime", "window": window, "slo": ALERTS[alert][0]}


def judged(alert: str, window: str, long_ratio: float, history: float | None):
    rb = RUNBOOKS[alert]
    lab = labels(alert, window)
    values: dict = {name: None for name in rb.queries}
    values |= {t.name: condition_value(t.value) for t in resolve_thresholds(rb, SPEC, lab, 0.0)}
    short = "slo_miss_short" if alert == "LlmTtftBurnRate" else "error_ratio_short"
    values |= {ALERTS[alert][1]: long_ratio, short: 0.9, "short_window_request_rate": 5, QUERY: history}
    units = {**{q.name: q.unit for q in rb.queries.values()}, **{n: r.unit for n, r in rb.thresholds.items()},
             **BUILTIN_UNITS}
    return judge(rb, lab, values, units).condition


# (alert, window, long-window ratio, history factor, held). Thresholds of the shipped spec's realtime tier:
# TTFT 14.4 x (1 - 0.99) = 0.144 (fast-1h), 6 x 0.01 = 0.06 (slow-6h); availability 14.4 x 0.001 = 0.0144.
ROWS = [
    ("LlmTtftBurnRate", "fast-1h", 0.3, 1.0, True),       # a whole hour held: judged as before
    ("LlmTtftBurnRate", "fast-1h", 0.3, 0.1, False),      # the case: 6 of 60 minutes held, 0.03 < 0.144
    ("LlmTtftBurnRate", "fast-1h", 0.3, 0.5, True),       # 0.15 > 0.144
    ("LlmTtftBurnRate", "fast-1h", 0.3, 0.0, False),      # the first 5 minutes: nothing pages
    ("LlmTtftBurnRate", "slow-6h", 0.3, 0.1, False),      # 0.03 < 0.06
    ("LlmTtftBurnRate", "slow-6h", 0.3, 0.25, True),      # 0.075 > 0.06
    ("LlmTtftBurnRate", "fast-1h", 0.3, None, None),      # the factor unreadable: not judged, named missing
    ("LlmAvailabilityBurnRate", "fast-1h", 0.05, 1.0, True),
    ("LlmAvailabilityBurnRate", "fast-1h", 0.05, 0.2, False),  # 0.01 < 0.0144
    ("LlmAvailabilityBurnRate", "fast-1h", 0.05, 0.5, True),   # 0.025 > 0.0144
    ("LlmAvailabilityBurnRate", "fast-1h", 0.01, 1.0, False),  # the long window alone below
]


@pytest.mark.parametrize("alert, window, long_ratio, history, held", ROWS)
def test_the_condition_weighs_the_long_window_as_the_rule_does(alert, window, long_ratio, history, held):
    verdict = judged(alert, window, long_ratio, history)
    assert verdict.holds is held, verdict
    if held is None:
        assert verdict.missing == [QUERY]
    else:
        assert f"{history * 100:.1f} % of it watched" in verdict.summary, verdict.summary


def _alert_exprs(alert: str) -> dict[str, str]:
    """window → the generated expression of `alert` for the realtime tier."""
    files = render_all(SPEC)
    groups = yaml.safe_load(files["rules/generated/llm.yml"])["groups"]
    return {r["labels"]["window"]: r["expr"] for g in groups for r in g["rules"]
            if r.get("alert") == alert and r["labels"].get("tier") == "realtime"}


def _page_query(alert: str, window: str) -> str:
    rb = RUNBOOKS[alert]
    lab = labels(alert, window)
    return scoped(rb.queries[QUERY].expr, lab, query_params(resolve_thresholds(rb, SPEC, lab, 0.0), SPEC))


WINDOWS = [(alert, pair.name, str(pair.long)) for alert in ALERTS for pair in SPEC.layers.L3.burn_rate_windows]


@pytest.mark.parametrize("alert, window, long", WINDOWS)
def test_the_page_reads_the_factor_of_the_rules_own_long_window(alert, window, long):
    series = f'{SLO_HISTORY}{{slo_window="{long}"}}'
    assert series in _alert_exprs(alert)[window]
    assert _page_query(alert, window) == f"max({series}) or vector(1)"


def _promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found; install it with: apt-get install -y prometheus", pytrace=False)
    return path


# (recorded series present, value triage shows for fast-1h)
EVAL_ROWS = [
    ({'slo_window="1h"': "0.25", 'slo_window="6h"': "0.05"}, 0.25),   # the 1h factor, not another window's
    ({'slo_window="6h"': "0.05"}, 1),                                 # no 1h factor: the rule judges as is
    ({}, 1),
]


@pytest.mark.parametrize("present, shown", EVAL_ROWS)
def test_promtool_evaluates_the_page_query_to_the_rules_factor(tmp_path, present, shown):
    expr = _page_query("LlmTtftBurnRate", "fast-1h")
    series = [{"series": f"{SLO_HISTORY}{{{m}}}", "values": f"{v}x5"} for m, v in present.items()]
    test = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series or
                       [{"series": 'up{job="unrelated"}', "values": "1x5"}],
                       "promql_expr_test": [{"expr": expr, "eval_time": "2m",
                                             "exp_samples": [{"labels": "{}", "value": shown}]}]}]}
    path = tmp_path / "history.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
