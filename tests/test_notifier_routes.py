"""`inferwatch notifier routes test` walks the generated Alertmanager tree first, then the notifier's routes:
compared with `amtool config routes test` over a table of label sets, with the right final destination
for each (severity tiers within a layer, the fallback receiver that bypasses the notifier, the catch-all)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from conftest import REPO_ROOT
from inferwatch.cli import main
from inferwatch.deploy.alertmanager import config, render
from inferwatch.notifier import amtree
from inferwatch.spec import load_spec

SPEC = REPO_ROOT / "inferwatch.yaml"


def amtool_receivers(config_file, labels: list[str]) -> str:
    binary = shutil.which("amtool")
    if not binary:
        pytest.fail("amtool not found; install it with: apt-get install -y prometheus-alertmanager", pytrace=False)
    r = subprocess.run([binary, "config", "routes", "test", f"--config.file={config_file}", *labels],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    path = tmp_path_factory.mktemp("am") / "alertmanager.yml"
    path.write_text(render(load_spec(SPEC)))
    return path


# labels, Alertmanager receiver, where the alert ends up (first line of `routes test`)
TABLE = [
    (["component=notifier", "alertname=NotifierDown", "layer=L1", "severity=critical"],
     "notifier-fallback", "notifier-fallback"),
    (["component=notifier"], "notifier-fallback", "notifier-fallback"),
    (["component=notifier", "layer=L2", "severity=warning"], "notifier-fallback", "notifier-fallback"),
    (["alertname=GpuThrottling", "layer=L1", "severity=warning", "node=n1", "gpu=0"], "notifier-l1", "oncall-slack"),
    (["alertname=GpuMemoryUsageHigh", "layer=L1", "severity=warning"], "notifier-l1", "oncall-slack"),
    (["alertname=GpuLost", "layer=L1", "severity=critical", "node=n1"], "notifier-l1", "phone"),
    (["alertname=GpuNvmlLost", "layer=L1", "severity=critical"], "notifier-l1", "phone"),
    (["alertname=TritonModelErrorRatioHigh", "layer=L2", "severity=critical"], "notifier-l2", "oncall-slack"),
    (["alertname=TritonQueueTimeP95High", "layer=L2", "severity=warning"], "notifier-l2", "oncall-slack"),
    (["alertname=LlmTtftP95High", "layer=L3", "severity=warning", "tenant=acme", "tier=realtime"],
     "notifier-l3", "llm-owners-wecom"),
    (["alertname=LlmAvailabilityBurnRate", "layer=L3", "severity=critical", "tier=realtime"],
     "notifier-l3", "phone,llm-owners-wecom"),  # critical: pages, and the owners see it
    (["alertname=SomethingElse"], "notifier-default", "oncall-slack"),
    (["layer=l1", "severity=critical"], "notifier-default", "oncall-slack"),  # a lower-case layer matches nothing
]


@pytest.mark.parametrize("labels, am_receiver, final", TABLE, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_routes_test_agrees_with_amtool_and_ends_at_the_right_channel(generated, capsys, labels, am_receiver, final):
    assert amtool_receivers(generated, labels) == am_receiver
    parsed = dict(label.split("=", 1) for label in labels)
    assert amtree.receivers(config(load_spec(SPEC)), parsed) == [am_receiver]
    assert main(["notifier", "routes", "test", "--spec", str(SPEC), *labels, "--verify", final]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[0] == final
    assert f"alertmanager: {am_receiver} " in out
    if am_receiver == "notifier-fallback":
        assert "notifier never sees" in out and "notifier: route" not in out


def test_the_notifier_route_is_not_printed_for_alerts_alertmanager_sends_elsewhere(capsys):
    assert main(["notifier", "routes", "test", "--spec", str(SPEC), "component=notifier", "layer=L1",
                 "--verify", "phone"]) == 1  # the notifier's L1 route would say phone: Alertmanager decides first
    assert "expected receivers ['phone'], got ['notifier-fallback']" in capsys.readouterr().out


NESTED = {
    "route": {"receiver": "root", "routes": [
        {"receiver": "a", "matchers": ['team="db"'], "continue": True, "routes": [
            {"receiver": "a-crit", "matchers": ['severity=~"crit.*"']}]},
        {"receiver": "b", "matchers": ['team=~"db|web"', 'env!="dev"']},
        {"matchers": ['env="dev"'], "routes": [{"receiver": "dev-x", "matchers": ['x!~"1|2"']}]},
    ]},
    "receivers": [{"name": n} for n in ("root", "a", "a-crit", "b", "dev-x")],
}


@pytest.mark.parametrize("labels", [
    ["team=db"], ["team=db", "severity=critical"], ["team=db", "env=dev"], ["team=web"], ["env=dev"],
    ["env=dev", "x=1"], ["team=dba"], [],
])
def test_tree_walk_matches_amtool_on_nested_routes_and_continue(tmp_path, labels):
    path = tmp_path / "am.yml"
    path.write_text(yaml.safe_dump(NESTED))
    expected = amtool_receivers(path, labels or ["x="])
    parsed = dict(label.split("=", 1) for label in labels)
    assert ",".join(amtree.receivers(NESTED, parsed)) == expected


@pytest.mark.parametrize("text, name, op, value", [
    ('layer="L1"', "layer", "=", "L1"), ("layer=~L1|L2", "layer", "=~", "L1|L2"),
    ('node!=""', "node", "!=", ""), ('node=~".+"', "node", "=~", ".+"), ('a!~"x\\"y"', "a", "!~", 'x"y'),
])
def test_matchers_parse_like_alertmanager(text, name, op, value):
    assert amtree.parse_matcher(text) == amtree.Matcher(name, op, value)


def test_a_missing_label_is_the_empty_string():
    assert amtree.parse_matcher('node=~".*"').matches({})
    assert not amtree.parse_matcher('node=~".+"').matches({})
    assert amtree.parse_matcher('node!="a"').matches({})
