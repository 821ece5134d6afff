"""vmalert with the generated command line (inferwatch.deploy.central.vmalert_command) fires the alerts Prometheus
fires: real VictoriaMetrics and vmalert, GpuXidCritical's `changes((max by (...) (DCGM_FI_DEV_XID_ERRORS))[5m:])`
on dcgm-exporter's last-XID gauge.

Two engine differences make vmalert miss an alert Prometheus fires:
- At vmalert's default `-datasource.queryStep` (5m) the subquery holds one point and an XID change fired in 1
  of 6 runs; the generated flags set the step to the evaluation interval.
- An annotation template's `printf "...%q..." $labels.x | query` where the alert lacks `x` (`cluster` on a
  series the edge did not label, `pod` outside Kubernetes): Prometheus renders the missing label as "",
  vmalert 1.79 (Debian's) as nil, so the query is `x=%!q(<nil>)`, fails, and vmalert drops the whole alert
  ("failed to create alert"), 0 of 10 changes fired. The rules pass labels as `(index $labels "x")`
  (inferwatch.selectors.label_arg), "" in both engines.

Each row of XID_CHANGES is one GPU whose last XID changes at a different phase of the evaluation interval:
every row that must fire fires, every row that must not never does."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from inferwatch.deploy.central import vmalert_command
from inferwatch.rules.generate import RULES_DIR
from inferwatch.rules.generate import outputs as rule_outputs
from inferwatch.spec import spec_from_dict
from inferwatch.testing.victoriametrics import start_victoria_metrics, start_vmalert

REPO = Path(__file__).resolve().parents[1]
EVAL = 2.0  # seconds
PHASE = 1.3  # seconds between two GPUs' changes: every phase of the 2 s evaluation interval is met
POD = ',namespace="llm",pod="vllm-0",container="vllm"'
# (row id, last XID before, after, extra labels on the gauge, fires): dcgm-exporter labels the gauge with the
# code (err_code), so a change ends one series and starts another; the rule takes the change per GPU.
XID_CHANGES = [
    ("0-to-48", 0, 48, "", True),          # the example
    ("0-to-63", 0, 63, "", True),
    ("0-to-64", 0, 64, "", True),
    ("0-to-74", 0, 74, "", True),
    ("0-to-94", 0, 94, "", True),
    ("0-to-95", 0, 95, "", True),
    ("0-to-119", 0, 119, "", True),
    ("0-to-120", 0, 120, "", True),
    ("13-to-48", 13, 48, "", True),        # a non-critical XID, then a critical one
    ("48-to-63", 48, 63, "", True),        # a critical XID, then another
    ("held-by-pod", 0, 48, POD, True),     # the GPU's series carry its pod's labels
    ("cluster-labelled", 0, 48, ',cluster="eu-1"', True),  # as the edge writes it
    ("0-to-13", 0, 13, "", False),         # not a critical code
    ("0-to-79", 0, 79, "", False),         # fallen off the bus: GpuLost's, not this alert's
    ("48-held", 48, 48, "", False),        # an old XID the gauge still holds is no new event
]


def _spec(vm_url: str):
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    raw["prometheus"] = {**raw.get("prometheus", {}), "evaluation_interval": f"{EVAL:g}s",
                         "scrape_interval": "2s", "rate_window": "5m"}
    return spec_from_dict({**raw, "cluster": {"name": "eu-1"}, "central_store": {"url": vm_url}})


def _firing(vmalert_url: str) -> set[str]:
    body = requests.get(f"{vmalert_url}/api/v1/alerts", timeout=10).json()
    return {a["labels"].get("gpu", "") for a in body["data"]["alerts"] or []
            if a["name"] == "GpuXidCritical" and a["state"] == "firing"}


@pytest.mark.slow
def test_xid_change_fires_gpu_xid_critical_every_time(tmp_path):
    vm = start_victoria_metrics(tmp_path)
    spec = _spec(vm.url)
    flags = [a for a in vmalert_command(spec, "x")
             if a.startswith("-datasource.queryStep=")]
    assert flags == [f"-datasource.queryStep={EVAL:g}s"]
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "gpu.yml").write_text(rule_outputs(spec)[f"{RULES_DIR}/gpu.yml"])
    start = time.time()
    rows = {str(i): (start + 10 + i * PHASE, *row[1:]) for i, row in enumerate(XID_CHANGES)}
    names = {str(i): row[0] for i, row in enumerate(XID_CHANGES)}
    must_fire = {gpu for gpu, row in rows.items() if row[4]}
    stop = threading.Event()
    errors: list[str] = []

    def scrape() -> None:
        # dcgm-exporter's gauge as a scrape of every second would write it: the last XID per GPU.
        while not stop.is_set():
            now = time.time()
            lines = []
            for gpu, (at, before, after, extra, _fires) in rows.items():
                value = after if now >= at else before
                lines.append(f'DCGM_FI_DEV_XID_ERRORS{{job="inferwatch-gpu",instance="10.0.0.1:9400",node="gpu-a",'
                             f'gpu="{gpu}",UUID="GPU-{gpu}",modelName="NVIDIA H100",err_code="{value}"{extra}}} '
                             f'{value} {int(now * 1000)}')
            try:
                requests.post(f"{vm.url}/api/v1/import/prometheus", data="\n".join(lines) + "\n", timeout=5)
            except requests.RequestException as exc:
                errors.append(str(exc))
            stop.wait(1.0)

    pusher = threading.Thread(target=scrape, daemon=True)
    pusher.start()
    vmalert = start_vmalert(tmp_path, spec, str(rules / "*.yml"))
    try:
        fired: dict[str, float] = {}
        deadline = max(row[0] for row in rows.values()) + 60
        while not must_fire <= fired.keys() and time.time() < deadline:
            for gpu in _firing(vmalert.url) - fired.keys():
                fired[gpu] = time.time()
            time.sleep(0.5)
        # The rows that must not fire had their change 15+ s before the last row's: long past any evaluation.
        for gpu in _firing(vmalert.url) - fired.keys():
            fired[gpu] = time.time()
        log = (tmp_path / "vmalert.log").read_text()
        assert "failed to execute" not in log, [line for line in log.splitlines() if "failed" in line][:2]
        assert sorted(names[g] for g in fired if g not in must_fire) == [], "fired without a critical XID change"
        assert sorted(names[g] for g in must_fire - fired.keys()) == [], \
            f"{len(must_fire & fired.keys())} of {len(must_fire)} XID changes fired GpuXidCritical"
        for gpu, at in fired.items():
            assert at >= rows[gpu][0], f"{names[gpu]} fired before its XID"
    finally:
        stop.set()
        pusher.join(timeout=10)
        vmalert.stop()
        vm.stop()
    assert not errors, errors[:3]


@pytest.mark.parametrize("interval", ["15s", "1m"])
def test_query_step_follows_the_evaluation_interval(interval):
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    raw["prometheus"] = {**raw.get("prometheus", {}), "evaluation_interval": interval}
    spec = spec_from_dict({**raw, "cluster": {"name": "eu-1"}, "central_store": {"url": "http://vm:8428"}})
    argv = vmalert_command(spec, "rules/*.yml")
    assert f"-datasource.queryStep={interval}" in argv and f"-evaluationInterval={interval}" in argv


def _template_queries(clustered: bool) -> list[tuple[str, str]]:
    """(alert, printf arguments) of every annotation query of the generated rules."""
    raw = yaml.safe_load((REPO / "inferwatch.yaml").read_text())
    if clustered:
        raw = {**raw, "cluster": {"name": "eu-1"}}
    found = []
    for path, text in rule_outputs(spec_from_dict(raw)).items():
        if not (path.startswith(f"{RULES_DIR}/") and path.endswith(".yml")):
            continue
        for group in yaml.safe_load(text).get("groups") or []:
            for rule in group["rules"]:
                for annotation in (rule.get("annotations") or {}).values():
                    # A variable set from a label (`{{ $polled := (index $labels "pod") }}`) stands for it.
                    variables = set(re.findall(r'\{\{ (\$\w+) := \(index \$labels "[A-Za-z_][A-Za-z0-9_]*"\) \}\}',
                                               annotation))
                    for args in re.findall(r'printf\s+"(?:[^"\\]|\\.)*"((?:\s+[^|}]+?)?)\s*\|\s*query', annotation):
                        for variable in variables:
                            args = re.sub(re.escape(variable) + r"(?!\w)", '(index $labels "_")', args)
                        found.append((rule.get("alert", rule.get("record")), args.strip()))
    return found


ARG = re.compile(r'\(index \$labels "[A-Za-z_][A-Za-z0-9_]*"\)')


@pytest.mark.parametrize("clustered", [False, True], ids=["one-cluster", "clustered"])
def test_template_query_arguments_are_never_nil(clustered):
    # Every label an annotation query is scoped by goes in as (index $labels "x"): "" where the alert lacks
    # it, in Prometheus and in vmalert alike, never nil (which vmalert turns into a failed alert).
    found = _template_queries(clustered)
    assert {alert for alert, _ in found} >= {"GpuXidCritical", "TritonModelNotReady", "TritonModelNotLoaded"}
    bad = [(alert, args) for alert, args in found if not args or ARG.sub("", args).strip()]
    assert bad == []
    if clustered:
        assert all('(index $labels "cluster")' in args for _, args in found)
