"""`kubernetes.triton.pods_service`: the Triton collector in the cluster polls every pod behind a headless
Service, while the gateway keeps the load-balanced Service."""

from __future__ import annotations

import pytest

from inferwatch.deploy.kubernetes.specfile import cluster_spec, triton_url
from inferwatch.spec import spec_from_dict
from inferwatch.specload import SpecError


@pytest.mark.parametrize("triton, collector_url, gateway_url", [
    ({}, "http://triton.triton.svc:8000", "http://triton.triton.svc:8000"),
    ({"pods_service": "triton-pods"}, "http://triton-pods.triton.svc:8000", "http://triton.triton.svc:8000"),
    ({"pods_service": "tp", "namespace": "inference", "http_port": 8080}, "http://tp.inference.svc:8080",
     "http://triton.inference.svc:8080"),
])
def test_the_collector_polls_the_headless_service_when_named(triton, collector_url, gateway_url):
    spec = spec_from_dict({"kubernetes": {"triton": triton}})
    (target,) = cluster_spec(spec).targets.triton
    assert target.url == collector_url
    assert target.name == spec.kubernetes.triton.service   # the `triton` label stays the Service's name
    assert triton_url(spec) == gateway_url


def test_a_pods_service_that_is_no_kubernetes_name_is_refused():
    with pytest.raises(SpecError, match="pods_service"):
        spec_from_dict({"kubernetes": {"triton": {"pods_service": "Triton_Pods"}}})
