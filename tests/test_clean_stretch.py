"""The demo's clean stretch, replayed for 10 minutes of data through `promtool test rules` with every generated
rule of the shipped spec, sends nothing: tiers at their targets (TTFT under or exactly at each tier's P95
target, no request over its SLO threshold, no errors), GPUs normal, Triton serving.

promtool evaluates every recording and alerting rule every 15 s over the series (tests/clean_stretch_support.py
builds them in the demo's shape from the exporters' own families). Each row asserts, at the end of the
replay, that no alert other than `InferwatchHeartbeat` was firing at any evaluation (`ALERTS` over the whole
replay) and that none was even pending (a slow window whose `for` is longer than the replay would otherwise
pass unseen); and that the one alert firing, the heartbeat, goes to the dead man's switch receiver of the
generated Alertmanager configuration (real amtool), which sends nothing to the notifier: the notifier is fed
no webhook, so no channel receives a message. Control rows (a tier over its target, errors burning the budget)
fire the alert they should, so the quiet rows' silence is the data's, not a series the rules never read.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from clean_stretch_support import Stretch, Ttft, all_series
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow

RULES = sorted((REPO_ROOT / "rules" / "generated").glob("*.yml"))
ALERTMANAGER = REPO_ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
EVAL_S = 15   # the shipped spec's evaluation and scrape interval

# Shipped spec (inferwatch.yaml): tier -> (ttft_p95_seconds, ttft_slo_seconds).
TARGETS = {"realtime": (0.3, 0.5), "standard": (1.0, 2.0), "batch": (10.0, 20.0)}
# One TTFT bucket edge below each target (exporters/gateway/metrics.py TTFT_BUCKETS).
JUST_UNDER = {"realtime": 0.25, "standard": 0.75, "batch": 7.5}


def _every(tier_values) -> dict[str, Ttft]:
    return {tier: Ttft(tuple(values)) for tier, values in tier_values.items()}


AT_TARGET = _every({t: [p95] for t, (p95, _) in TARGETS.items()})
# 19 of 20 at the target, 1 at the SLO threshold: P95 exactly the target, the share over it exactly 5 %.
TAIL_AT_TARGET = _every({t: [p95] * 19 + [slo] for t, (p95, slo) in TARGETS.items()})
JUST_UNDER_TTFT = _every({t: [JUST_UNDER[t]] * 24 + [slo] for t, (_, slo) in TARGETS.items()})
OVER_TARGET = _every({t: [p95] * 9 + [slo] for t, (p95, slo) in TARGETS.items()})   # 10 % over the target

# row id -> (stretch, alerts that must fire (besides the heartbeat) at the end)
ROWS = {
    "every-first-token-exactly-at-its-target": (Stretch(AT_TARGET), set()),
    "p95-exactly-at-target-5pct-at-slo-threshold": (Stretch(TAIL_AT_TARGET, per_step=20), set()),
    "just-under-target": (Stretch(JUST_UNDER_TTFT), set()),
    # Prometheus started 5 minutes ago beside a gateway and Triton that have served for 3 hours: the long
    # burn-rate windows hold only 5 minutes of data.
    "fresh-prometheus-5min-of-data": (Stretch(AT_TARGET, minutes=5, start_counts_s=3 * 3600.0), set()),
    "fresh-prometheus-and-fresh-gateway": (Stretch(TAIL_AT_TARGET, minutes=5, per_step=20), set()),
    # Both fresh, and the first 20 requests of every flow fail (17 to 40 s of a model still loading): with an
    # hour of history that is 0.6 % of realtime's hour, no burn; judged by the few minutes held it paged.
    "fresh-prometheus-start-up-burst": (Stretch(AT_TARGET, failed_first=20), set()),
    # Controls: the same series with a fault fire what they should.
    "control-10pct-over-target": (Stretch(OVER_TARGET, per_step=20), {"LlmTtftP95High"}),
    # Half the requests failing from the first minute pages within the 10 minutes; 5 % would not, as it would
    # not with an hour of clean history before it (5 % over 10 of 60 minutes is 0.8 % of the hour, < 1.44 %).
    "control-half-the-requests-fail": (Stretch(AT_TARGET, failed_every=2), {"LlmAvailabilityBurnRate"}),
    # A fresh Prometheus still pages a real outage: the first 200 requests of every flow fail (3 to 7 min).
    "control-fresh-prometheus-outage": (Stretch(AT_TARGET, failed_first=200), {"LlmAvailabilityBurnRate"}),
}
# Rows whose share of first tokens within each tier's target is exact in every 5m window (per mille).
EXACT_SHARE = {"every-first-token-exactly-at-its-target": 1000, "p95-exactly-at-target-5pct-at-slo-threshold": 950}


def _promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found: apt-get install -y prometheus (make system-deps)", pytrace=False)
    return path


def _heartbeat_annotations() -> dict[str, str]:
    rule = next(r for g in yaml.safe_load((REPO_ROOT / "rules" / "generated" / "notifier.yml").read_text())["groups"]
                for r in g["rules"] if r.get("alert") == "InferwatchHeartbeat")
    return {k: v.replace("{{ $value }}", "1") for k, v in rule["annotations"].items()}


def _test_file(tmp_path: Path, stretch: Stretch, must_fire: set[str], row: str = "") -> Path:
    series = all_series(stretch)
    end = f"{stretch.minutes}m"
    replay = f"[{stretch.minutes}m]"
    others = 'ALERTS{alertname!="InferwatchHeartbeat"}'
    quiet = not must_fire
    tests = [{
        "interval": f"{stretch.step_s}s",
        "input_series": [{"series": k, "values": " ".join(v)} for k, v in sorted(series.items())],
        "alert_rule_test": [{"eval_time": end, "alertname": "InferwatchHeartbeat", "exp_alerts": [
            {"exp_labels": {"component": "heartbeat", "layer": "L1", "severity": "info"},
             "exp_annotations": _heartbeat_annotations()}]}],
        "promql_expr_test": [
            # No alert but the heartbeat firing, nor pending, at any evaluation of the replay.
            {"expr": f'count by (alertname, alertstate) (count_over_time({others}{replay}))',
             "eval_time": end, "exp_samples": [] if quiet else [
                 {"labels": f'{{alertname="{name}", alertstate="firing"}}', "value": 0} for name in must_fire]},
        ],
    }]
    checks = tests[0]["promql_expr_test"]
    if quiet:
        # The burn-rate inputs were computed (the silence is not missing data): no first token over any tier's
        # SLO threshold over the 1h window, and the share of that window Prometheus holds, counted from one
        # shortest window (5m) on: each `up` sample stands for one 15 s scrape.
        scrapes = stretch.minutes * 60 // stretch.step_s + 1
        checks.append({"expr": 'tier_slo_window:gateway_time_to_first_token_seconds:ratio_over_slo{slo_window="1h"}',
                       "eval_time": end, "exp_samples": [
                           {"labels": f'tier_slo_window:gateway_time_to_first_token_seconds:ratio_over_slo'
                                      f'{{slo_window="1h", tier="{t}"}}', "value": 0} for t in TARGETS]})
        checks.append({"expr": 'round(slo_window:gateway_scrapes:history_ratio{slo_window="1h"} * 3300)',
                       "eval_time": end, "exp_samples": [
                           {"labels": '{slo_window="1h"}', "value": max(0, scrapes * 15 - 300)}]})
    share = EXACT_SHARE.get(row)
    if share is not None:
        for tier, (p95, _) in TARGETS.items():
            le = f"{p95:.1f}" if p95 >= 1 else f"{p95:g}"
            within = f'sum(rate(gateway_time_to_first_token_seconds_bucket{{tier="{tier}", le="{le}"}}[5m]))'
            every = f'sum(rate(gateway_time_to_first_token_seconds_bucket{{tier="{tier}", le="+Inf"}}[5m]))'
            checks.append({"expr": f"round({within} / {every} * 1000)", "eval_time": end,
                           "exp_samples": [{"labels": "{}", "value": share}]})
    if not quiet:
        # A control: only which alerts fired matters, not for how many evaluations.
        tests[0]["promql_expr_test"] = [{
            "expr": f'0 * count by (alertname) (count_over_time(ALERTS{{alertstate="firing", '
                    f'alertname!="InferwatchHeartbeat"}}{replay}))',
            "eval_time": end,
            "exp_samples": [{"labels": f'{{alertname="{name}"}}', "value": 0} for name in sorted(must_fire)]}]
    for rule in RULES:
        shutil.copy(rule, tmp_path / rule.name)
    test = {"rule_files": [r.name for r in RULES], "evaluation_interval": f"{EVAL_S}s", "tests": tests}
    path = tmp_path / "clean_stretch_test.yml"
    path.write_text(yaml.safe_dump(test, width=10**9, sort_keys=False))
    return path


@pytest.mark.parametrize("row", list(ROWS))
def test_the_clean_stretch_fires_nothing_but_the_heartbeat(tmp_path, row):
    stretch, must_fire = ROWS[row]
    path = _test_file(tmp_path, stretch, must_fire, row)
    out = subprocess.run([_promtool(), "test", "rules", path.name], capture_output=True, text=True, cwd=tmp_path,
                         timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]


def test_the_heartbeat_reaches_no_channel():
    """What Alertmanager sends for the one alert of the clean stretch: the generated configuration routes the
    heartbeat to the `heartbeat` receiver (amtool), whose integrations are not the notifier's webhook."""
    amtool = shutil.which("amtool")
    if not amtool:
        pytest.fail("amtool not found: apt-get install -y prometheus-alertmanager", pytrace=False)
    out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER}",
                          "alertname=InferwatchHeartbeat", "component=heartbeat", "layer=L1", "severity=info"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["heartbeat"], out.stdout
    config = yaml.safe_load(ALERTMANAGER.read_text())
    receiver = next(r for r in config["receivers"] if r["name"] == "heartbeat")
    assert set(receiver) == {"name"}, receiver   # the shipped spec names no dead man's switch URL: sends nothing
