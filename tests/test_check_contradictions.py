"""`inferwatch check` refuses thresholds that contradict each other and warns, with the figures, where the
combination is a choice; on the shipped and example specs it finds nothing and prints where every alert goes."""

from __future__ import annotations

import json

import pytest

from conftest import REPO_ROOT
from inferwatch.cli import main
from inferwatch.spec import load_spec, spec_from_dict
from inferwatch.speccheck import findings

CHANNELS = {"phone": {"type": "pagerduty", "routing_key": "${PD_KEY}"},
            "chat": {"type": "slack", "url": "${SLACK_URL}"},
            "owners": {"type": "wecom", "url": "${WECOM_URL}"}}
ROUTES = [{"match": {"layer": "L1", "severity": "warning"}, "receivers": ["chat"]},
          {"match": {"layer": "L1"}, "receivers": ["phone"]},
          {"match": {"layer": "L2", "severity": "critical"}, "receivers": ["chat"], "escalate_after": "30m",
           "escalate_to": ["phone"]},
          {"match": {"layer": "L2"}, "receivers": ["chat"]},
          {"match": {"layer": "L3", "severity": "critical"}, "receivers": ["phone", "owners"]},
          {"match": {"layer": "L3"}, "receivers": ["owners"]}]
SHIPPED = ["inferwatch.yaml", "examples/demo/inferwatch.demo.yaml", "examples/ha/inferwatch.ha.yaml"]


def spec_with(**extra):
    return spec_from_dict({"channels": CHANNELS, "routes": ROUTES, **extra})


def burn(name, long, short, factor, severity, for_):
    return {"name": name, "long": long, "short": short, "factor": factor, "severity": severity, "for": for_}


# (case, spec extras, refused?, path, words in the message)
CASES = [
    # The example: standard's P95 target 1 s, no ttft_slo_seconds, so the default 0.5 s at 99 %.
    ("SLO threshold inherited below the P95 target", {"tiers": {"standard": {"ttft_p95_seconds": 1.0}}},
     True, "tiers.standard.ttft_slo_seconds",
     ["0.5 s", "ttft_p95_seconds 1 s", "burns at 100x", "fast-1h (critical, 14.4x)", "at least 1 s", "e.g. 2"]),
    ("SLO threshold written below the P95 target",
     {"tiers": {"rt": {"ttft_p95_seconds": 0.5, "ttft_slo_seconds": 0.3, "ttft_objective": 0.999}}},
     True, "tiers.rt.ttft_slo_seconds", ["0.3 s", "99.9 %", "burns at 1000x"]),
    ("SLO threshold equal to the P95 target",
     {"tiers": {"standard": {"ttft_p95_seconds": 1.0, "ttft_slo_seconds": 1.0}}},
     False, "tiers.standard.ttft_slo_seconds",
     ["equals the P95 target (1 s)", "5 %", "at 5x", "fast-1d (warning, 3x)", "slow-3d (warning, 1x)"]),
    ("burn-rate for longer than its short window",
     {"layers": {"L3": {"burn_rate_windows": [burn("fast-1h", "1h", "5m", 14.4, "critical", "10m")]}}},
     True, "layers.L3.burn_rate_windows[0].for", ["10m is longer than", "short window (5m) of fast-1h"]),
    ("for shorter than two evaluation intervals", {"layers": {"L2": {"for": "20s"}}},
     True, "alert TritonQueueTimeP95High", ["for 20s", "2 x 15s = 30s"]),
    ("a severity no channel receives",
     {"routes": ROUTES[:4], "notifier": {"unrouted_receivers": []}},     # no L3 route, no catch-all
     True, "routes", ["LlmTtftP95High warning reaches no channel", "unrouted"]),
    ("a critical alert that pages nobody",
     {"routes": [*ROUTES[:4], {"match": {"layer": "L3"}, "receivers": ["owners"]}]},
     False, "routes", ["LlmTtftBurnRate critical (window fast-1h) pages nobody", "owners only", "(phone)"]),
    ("notifier replicas without a shared outbox", {"ha": {"notifier_replicas": 2}},
     False, "notifier.outbox.url", ["ha.notifier_replicas is 2", "own SQLite outbox", "postgresql://"]),
]


@pytest.mark.parametrize("case, extra, refused, path, words", CASES, ids=[c[0] for c in CASES])
def test_each_contradiction_is_found_with_its_figures(case, extra, refused, path, words):
    found = [f for f in findings(spec_with(**extra)) if f.path == path]
    assert found, [str(f) for f in findings(spec_with(**extra))]
    text = " | ".join(f.message for f in found)
    assert all(f.refuse is refused for f in found), text
    for word in words:
        assert word in text, (word, text)


def test_the_consistent_base_has_no_finding():
    assert [str(f) for f in findings(spec_with())] == []


@pytest.mark.parametrize("extra", [
    {"tiers": {"standard": {"ttft_p95_seconds": 1.0, "ttft_slo_seconds": 2.0}}},
    {"tiers": {"standard": {"ttft_p95_seconds": 1.0, "ttft_slo_seconds": 1.0, "ttft_objective": 0.9}}},  # 0.5x
    {"layers": {"L3": {"burn_rate_windows": [burn("fast-1h", "1h", "5m", 14.4, "critical", "5m")]}}},  # = short
    {"layers": {"L2": {"for": "30s"}}},                  # exactly two evaluations
    {"layers": {"L2": {"for": "0s"}}},                   # fire on the first evaluation: a choice
    {"ha": {"notifier_replicas": 2}, "notifier": {"outbox": {"url": "postgresql://n@db:5432/inferwatch"}}},
])
def test_the_edges_of_each_check_pass(extra):
    assert [str(f) for f in findings(spec_with(**extra))] == []


@pytest.mark.parametrize("spec", SHIPPED)
def test_the_shipped_and_example_specs_have_no_finding(spec):
    assert [str(f) for f in findings(load_spec(REPO_ROOT / spec))] == []


def test_the_built_in_defaults_do_not_contradict_themselves():
    # Without a spec file: the default tiers, windows and evaluation interval (no channels: nothing to page).
    assert [str(f) for f in findings(spec_from_dict({}))] == []


def _check(tmp_path, capsys, data) -> tuple[int, str, str]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    code = main(["check", "--spec", str(path)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_refuses_a_contradiction_naming_file_field_and_figures(tmp_path, capsys):
    code, out, err = _check(tmp_path, capsys, {"channels": CHANNELS, "routes": ROUTES,
                                               "tiers": {"standard": {"ttft_p95_seconds": 1.0}}})
    assert code == 2, (out, err)
    assert f"{tmp_path / 'spec.json'}: tiers.standard.ttft_slo_seconds: 0.5 s" in err, err
    assert "OK" not in out and "Traceback" not in err


def test_check_warns_a_choice_and_still_passes(tmp_path, capsys):
    code, out, err = _check(tmp_path, capsys, {"channels": CHANNELS, "routes": ROUTES, "tiers": {
        "standard": {"ttft_p95_seconds": 1.0, "ttft_slo_seconds": 1.0}}})
    assert code == 0, err
    assert "warning: tiers.standard.ttft_slo_seconds: equals the P95 target (1 s)" in err, err


def test_check_on_the_shipped_spec_prints_the_table_and_no_contradiction(capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert main(["check"]) == 0
    out = capsys.readouterr()
    # Secrets unresolved here are warned about; no threshold or route is.
    assert [line for line in out.err.splitlines()
            if line.startswith("warning:") and ("routes:" in line or "tiers." in line or "layers." in line)] == []
    lines = out.out.splitlines()
    assert "inferwatch.yaml: OK" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.startswith("alert "))
    assert lines[header].split()[:4] == ["alert", "severity", "window", "channels"]
    rows = {tuple(line.split()[:3]): line for line in lines[header + 1:]}
    assert "phone, llm-owners-wecom" in rows[("LlmTtftBurnRate", "critical", "fast-1h")]
    assert "after 30m: phone" in rows[("TritonServerDown", "critical", "-")]
    memory_inhibition = "GpuMemoryUsageCritical (equal: node, gpu, GPU_I_ID, GPU_I_PROFILE)"
    assert memory_inhibition in rows[("GpuMemoryUsageHigh", "warning", "-")]
