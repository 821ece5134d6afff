"""`inferwatch check` rejects a route matcher no alert can satisfy, naming the nearest valid label or value
(from the rules registry and the spec), and accepts the routes of the shipped specs."""

from __future__ import annotations

import json

import pytest

from conftest import REPO_ROOT
from inferwatch.cli import main

CHANNELS = {"phone": {"type": "pagerduty", "routing_key": "${PD_KEY}"}}


def check(tmp_path, capsys, routes: list[dict], **extra) -> tuple[int, str]:
    spec = tmp_path / "spec.json"
    # The catch-all takes what the one route leaves: a severity no channel receives is refused on its own
    # (tests/test_check_contradictions.py).
    spec.write_text(json.dumps({"channels": CHANNELS, "routes": routes,
                                "notifier": {"unrouted_receivers": ["phone"]}, **extra}))
    code = main(["check", "--spec", str(spec)])
    out = capsys.readouterr()
    return code, out.err + out.out


@pytest.mark.parametrize("route, field, words", [
    ({"match": {"layr": "L1"}}, "routes[0].match.layr", "did you mean 'layer'?"),
    ({"match": {"layer": "l1"}}, "routes[0].match.layer", "did you mean 'L1'?"),
    ({"match": {"layer": "L1", "severity": "warn"}}, "routes[0].match.severity", "did you mean 'warning'?"),
    ({"match": {"alertname": "GpuThrotling"}}, "routes[0].match.alertname", "did you mean 'GpuThrottling'?"),
    ({"match": {"tier": "realtme"}}, "routes[0].match.tier", "did you mean 'realtime'?"),
    ({"match": {"tenant": "acmee"}}, "routes[0].match.tenant", "did you mean 'acme'?"),
    ({"match": {"window": "fats-1h"}}, "routes[0].match.window", "did you mean 'fast-1h'?"),
    ({"match_re": {"layer": "l[12]"}}, "routes[0].match_re.layer", "values: L1, L2, L3"),
    ({"match_re": {"severty": "critical"}}, "routes[0].match_re.severty", "did you mean 'severity'?"),
    ({"match": {"layer": "L3", "component": "notifier"}}, "routes[0].match", "can never match"),
    ({"match": {"layer": "L1", "tier": "realtime"}}, "routes[0].match", "can never match"),
    ({"match": {"alertname": "GpuLost", "severity": "warning"}}, "routes[0].match", "can never match"),
])
def test_a_route_that_can_never_match_is_rejected(tmp_path, capsys, route, field, words):
    code, text = check(tmp_path, capsys, [{"receivers": ["phone"], **route}], tenants=["acme"])
    assert code == 2, text
    assert f"{field}: " in text and words in text, text


@pytest.mark.parametrize("route", [
    {"match": {"layer": "L1", "severity": "warning"}},
    {"match": {"layer": "L3", "model": "anything-the-fleet-serves"}},
    {"match": {"tier": "other"}},
    {"match_re": {"layer": "L[12]", "node": "gpu-.*"}},
    {"match": {"alertname": "LlmTtftBurnRate", "severity": "warning", "window": "fast-1d"}},
    {"match": {"cluster": "prod-a", "layer": "L2"}},
])
def test_routes_alerts_can_match_pass(tmp_path, capsys, route):
    code, text = check(tmp_path, capsys, [{"receivers": ["phone"], **route}],
                       prometheus={"external_labels": {"cluster": "prod-a"}})
    assert code == 0, text


@pytest.mark.parametrize("spec", ["inferwatch.yaml", "examples/demo/inferwatch.demo.yaml"])
def test_the_shipped_specs_pass(capsys, spec):
    assert main(["check", "--spec", str(REPO_ROOT / spec)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("route, extra", [
    # the cluster label, named by `cluster` (any cluster's value: a central store carries every cluster's)
    ({"match": {"cluster": "prod-b", "layer": "L1"}}, {"cluster": {"name": "prod-a"}}),
    ({"match_re": {"cluster": "prod-.*"}}, {"cluster": {"name": "prod-a"}}),
    ({"match": {"region": "eu", "cluster": "prod-a"}},
     {"cluster": {"name": "prod-a"}, "prometheus": {"external_labels": {"region": "eu"}}}),
    # a selector's `=` labels, carried by the series and the exporter-down alerts' absent() forms
    ({"match": {"service": "triton-metrics", "layer": "L2"}},
     {"selectors": {"triton": 'namespace="triton", service="triton-metrics"'}}),
    ({"match": {"namespace": "monitoring", "alertname": "GatewayExporterDown"}},
     {"selectors": {"gateway": 'namespace="monitoring", service="inferwatch-gateway"'}}),
])
def test_cluster_and_selector_labels_are_accepted_in_routes(tmp_path, capsys, route, extra):
    code, text = check(tmp_path, capsys, [{"receivers": ["phone"], **route}], **extra)
    assert code == 0, text


@pytest.mark.parametrize("route, extra, field, words", [
    ({"match": {"cluster": "prod-a"}}, {}, "routes[0].match.cluster", "no alert carries a label 'cluster'"),
    ({"match": {"service": "triton-metrics"}}, {}, "routes[0].match.service", "no alert carries a label 'service'"),
    ({"match": {"clustr": "prod-a"}}, {"cluster": {"name": "prod-a"}}, "routes[0].match.clustr",
     "did you mean 'cluster'?"),
    # a selector label rides on alerts about series, never on the burn-rate alerts (per tier, no job)
    ({"match": {"service": "triton-metrics", "alertname": "LlmTtftBurnRate"}},
     {"selectors": {"triton": 'namespace="triton", service="triton-metrics"'}}, "routes[0].match", "can never match"),
])
def test_cluster_and_selector_labels_only_where_the_spec_gives_them(tmp_path, capsys, route, extra, field, words):
    code, text = check(tmp_path, capsys, [{"receivers": ["phone"], **route}], **extra)
    assert code == 2, text
    assert f"{field}: " in text and words in text, text


# A route's matchers are a conjunction: some alert must carry ALL of them at once. Selector labels belong to
# the alerts reading that source: layer=L3 alerts never carry the Triton or GPU selector's labels.
USER_SELECTORS = {"selectors": {"triton": 'namespace="triton", service="web-chat"',
                                "gpu": 'namespace="gpu-operator", service="nvidia-dcgm-exporter"'}}


@pytest.mark.parametrize("route, ok, words", [
    # the user's two routes: accepted before, their L3 alerts fell to the catch-all
    ({"match": {"layer": "L3", "service": "web-chat"}}, False,
     ["routes[0].match: ", "no alert with layer=L3 carries service=web-chat",
      "alerts that can carry service=web-chat: TritonServerDown"]),
    ({"match": {"layer": "L3", "namespace": "prod"}}, False,
     ["routes[0].match: ", "no alert with layer=L3 carries namespace=prod"]),
    # the selectors' values only: service=prod is no L2 alert's (the Triton selector's service is web-chat; the
    # engine's GPU-memory forecast carries the GPU selector's, and any pod namespace, so namespace is no row here)
    ({"match": {"layer": "L2", "service": "prod"}}, False, ["no alert with layer=L2 carries service=prod"]),
    # valid: a selector label with its value on the layer reading that source
    ({"match": {"layer": "L2", "namespace": "triton"}}, True, []),
    ({"match": {"layer": "L1", "service": "nvidia-dcgm-exporter"}}, True, []),
    # a GPU alert is one physical GPU: the pods on it are named in its description, never labels (a rescheduled
    # pod must not open a second incident), so no L1 route can match a pod's namespace (docs/alerts.md)
    ({"match": {"layer": "L1", "namespace": "prod"}}, False, ["no alert with layer=L1 carries namespace=prod"]),
    # the cluster label, on every alert
    ({"match": {"layer": "L3", "cluster": "prod-a"}}, True, []),
    # a tenant typo is still named as such
    ({"match": {"layer": "L3", "tenant": "acmee"}}, False, ["routes[0].match.tenant: ", "did you mean 'acme'?"]),
])
def test_route_matchers_must_fit_one_alert_at_once(tmp_path, capsys, route, ok, words):
    code, text = check(tmp_path, capsys, [{"receivers": ["phone"], **route}], tenants=["acme"],
                       cluster={"name": "prod-a"}, **USER_SELECTORS)
    assert code == (0 if ok else 2), text
    for w in words:
        assert w in text, text
