"""Who may bill a tenant in the generated Kubernetes deploy (deploy/kubernetes/tenancy.py): the pods'
spec (the `inferwatch-spec` ConfigMap of deploy/kubernetes/spec.yaml) believes the tenant header from the
ingress networks of `kubernetes.tenant_trusted_proxies` besides `gateway.tenant_trusted_proxies`, and
`inferwatch check` warns where the Kubernetes gateway would bill every declared tenant `other`.

The gateway's own resolution (exporters/gateway/tenancy.py) is run on the spec read back from the generated
ConfigMap, so each row is what a pod of that deploy would bill.
"""

from __future__ import annotations

import pytest
import yaml

from inferwatch.cli import main
from inferwatch.deploy.kubernetes.generate import OUT_DIR
from inferwatch.deploy.kubernetes.generate import outputs as k8s_outputs
from inferwatch.deploy.kubernetes.tenancy import findings
from inferwatch.exporters.gateway.tenancy import Tenancy
from inferwatch.spec import SpecError, spec_from_dict

TENANTS = {"tenants": ["acme", "globex"]}
INGRESS = {"kubernetes": {"tenant_trusted_proxies": ["10.244.0.0/16"]}}
KEYS = {"gateway": {"tenant_api_keys": "${INFERWATCH_TEST_TENANT_KEYS}"}}


def pod_spec(raw: dict):
    """The spec a pod of the generated deploy reads (deploy/kubernetes/spec.yaml's ConfigMap)."""
    text = k8s_outputs(spec_from_dict(raw))[f"{OUT_DIR}/spec.yaml"]
    configmap = yaml.safe_load(text)
    return spec_from_dict(yaml.safe_load(configmap["data"]["inferwatch.yaml"]))


# (spec, peer address, X-Tenant-ID sent, billed). The case: an ingress pod's request billed `other`
# while the k8s deploy trusted only loopback.
ROWS = [
    ({**TENANTS}, "10.244.3.7", "globex", None),                  # default: the ingress pod is not trusted
    ({**TENANTS, **INGRESS}, "10.244.3.7", "globex", "globex"),    # its pod network listed: believed
    ({**TENANTS, **INGRESS}, "10.245.0.9", "globex", None),        # a pod outside the listed network
    ({**TENANTS, **INGRESS}, "192.168.1.5", "acme", None),         # a node or an outside client
    ({**TENANTS, **INGRESS}, "127.0.0.1", "acme", "acme"),         # a sidecar in the gateway's own pod
    # A dual-stack listener reports IPv4 peers in their IPv4-mapped IPv6 form: the same peers.
    ({**TENANTS, **INGRESS}, "::ffff:10.244.3.7", "globex", "globex"),
    ({**TENANTS, **INGRESS}, "::ffff:10.245.0.9", "globex", None),
    ({**TENANTS, **INGRESS}, "::ffff:127.0.0.1", "acme", "acme"),
    ({**TENANTS, **INGRESS}, "fe80::1%eth0", "acme", None),       # a link-local IPv6 peer, zone id dropped
]


@pytest.mark.parametrize("raw, peer, sent, billed", ROWS)
def test_the_generated_gateway_bills_the_ingress_networks_tenant_only(raw, peer, sent, billed):
    tenancy = Tenancy(pod_spec(raw))
    assert tenancy.resolve([("X-Tenant-ID", sent)], peer) == billed


def test_the_pods_keep_the_gateways_own_list_after_the_ingress_networks():
    spec = pod_spec({**TENANTS, **INGRESS, "gateway": {"tenant_trusted_proxies": ["127.0.0.1/32", "10.244.0.0/16"]}})
    assert spec.gateway.tenant_trusted_proxies == ["10.244.0.0/16", "127.0.0.1/32"]


# (spec, warned): warned only where the Kubernetes gateway would bill every declared tenant `other`.
CHECK_ROWS = [
    ({**TENANTS}, True),
    ({**TENANTS, **INGRESS}, False),
    ({**TENANTS, **KEYS}, False),                                             # API keys need no trusted peer
    ({}, False),                                                               # no tenant declared
    ({**TENANTS, "gateway": {"tenant_trusted_proxies": ["10.0.0.0/8"]}}, False),  # the gateway's own list
    ({**TENANTS, "kubernetes": {"tenant_trusted_proxies": ["::1/128"]}}, True),   # loopback again
]


@pytest.mark.parametrize("raw, warned", CHECK_ROWS)
def test_check_warns_where_every_tenant_would_be_billed_other(raw, warned, monkeypatch):
    monkeypatch.setenv("INFERWATCH_TEST_TENANT_KEYS", "k1 acme\n")
    found = [f for f in findings(spec_from_dict(raw)) if f.path == "kubernetes.tenant_trusted_proxies"]
    assert bool(found) == warned
    assert all(not f.refuse and "billed 'other'" in f.message for f in found)


def test_inferwatch_check_prints_the_warning_and_still_accepts_the_spec(tmp_path, capsys):
    path = tmp_path / "inferwatch.yaml"
    path.write_text(yaml.safe_dump(TENANTS))
    assert main(["check", "--spec", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: kubernetes.tenant_trusted_proxies: the generated Kubernetes gateway believes X-Tenant-ID " \
           "only from loopback" in err, err


@pytest.mark.parametrize("value", ["10.244.0.0/33", "ingress", ""])
def test_a_network_that_is_not_one_is_refused_with_its_path(value):
    with pytest.raises(SpecError) as exc:
        spec_from_dict({"kubernetes": {"tenant_trusted_proxies": ["10.0.0.0/8", value]}})
    assert exc.value.path == "kubernetes.tenant_trusted_proxies[1]"
