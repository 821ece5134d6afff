"""Who may set the tenant header in the generated Kubernetes deploy (spec `kubernetes.tenant_trusted_proxies`,
docs/trust-and-durability.md "Kubernetes").

In a cluster the gateway's peer is never loopback: an ingress controller (ingress-nginx, Traefik, an Envoy
gateway) is another pod, so its address is a pod address, and the default `gateway.tenant_trusted_proxies`
(127.0.0.1/32, ::1/128) would bill every request `other`. The pods' spec therefore believes the tenant header
from `kubernetes.tenant_trusted_proxies` (the ingress controller's pod network, as CIDR networks) as well as
from `gateway.tenant_trusted_proxies` (a sidecar in the gateway's own pod stays trusted). Nothing is guessed:
a pod network CIDR differs per cluster (kubeadm's flannel default 10.244.0.0/16, Calico's 192.168.0.0/16,
cloud VPC ranges), and a guess too wide lets any pod of the cluster bill any tenant. `inferwatch check` warns
when the spec declares tenants, holds no API-key map (`gateway.tenant_api_keys`, which needs no trusted peer)
and lists no address a pod could have.
"""

from __future__ import annotations

import ipaddress

from inferwatch.spec import Spec
from inferwatch.speccheck import Finding

PATH = "kubernetes.tenant_trusted_proxies"


def pod_trusted_proxies(spec: Spec) -> list[str]:
    """`gateway.tenant_trusted_proxies` as the pods' spec holds it: the ingress networks of
    `kubernetes.tenant_trusted_proxies` first, then the gateway's own list, each once."""
    return list(dict.fromkeys([*spec.kubernetes.tenant_trusted_proxies, *spec.gateway.tenant_trusted_proxies]))


def _loopback_only(networks: list[str]) -> bool:
    return all(ipaddress.ip_network(n, strict=False).is_loopback for n in networks)


def findings(spec: Spec) -> list[Finding]:
    """A warning (never a refusal: the spec may never be deployed to Kubernetes) when the generated Kubernetes
    gateway would bill every declared tenant `other`: tenants declared, no API-key map, and only loopback
    trusted."""
    if not spec.tenants or spec.gateway.tenant_api_keys is not None:
        return []
    if not _loopback_only(pod_trusted_proxies(spec)):
        return []
    return [Finding(PATH, f"the generated Kubernetes gateway believes {spec.gateway.tenant_header} only from "
                          f"loopback ({', '.join(pod_trusted_proxies(spec))}): behind an ingress controller every "
                          f"request of the {len(spec.tenants)} declared tenant(s) is billed 'other'. List the "
                          f"ingress controller's pod network (CIDR, e.g. 10.244.0.0/16) here, or bill by API key "
                          f"(gateway.tenant_api_keys)", refuse=False)]
