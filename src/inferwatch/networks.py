"""The spec's lists of trusted networks (`gateway.tenant_trusted_proxies`, `kubernetes.tenant_trusted_proxies`):
how an entry is read, which entries are refused and which are warned about (docs/trust-and-durability.md).

- An entry is an IP address (`10.0.0.5`, one host) or a CIDR network (`10.0.0.0/8`), IPv4 or IPv6.
- A network with host bits set (`10.0.0.5/8`) is refused, naming the field: it is ambiguous (one host,
  `10.0.0.5/32`, or the whole `10.0.0.0/8`?), and reading it as the network, as Python's
  `ip_network(strict=False)` would, silently trusts 16 million addresses where one was meant.
- A network holding every address of its family (`0.0.0.0/0`, `::/0`, and `::ffff:0:0/96`, which a
  dual-stack listener matches against every IPv4 peer, RFC 4291 2.5.5.2) is accepted but `inferwatch check`
  warns: every peer may then set the tenant header, so anyone can bill any tenant.
"""

from __future__ import annotations

import ipaddress

from inferwatch.specload import SpecError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Networks that trust every peer of one address family.
EVERYONE = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"),
            ipaddress.ip_network("::ffff:0:0/96"))
# The spec's lists of trusted peers, by path.
TRUSTED_LISTS = ("gateway.tenant_trusted_proxies", "kubernetes.tenant_trusted_proxies")


def parse_network(value: object, path: str) -> Network:
    """One entry of a trusted-network list → its network (an address alone is its /32 or /128). Raises
    SpecError naming `path` when the entry is no address or network, or a network with host bits set."""
    if not isinstance(value, str):
        raise SpecError(path, f"expected an IP address or CIDR network, got {value!r}")
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError:
        pass
    try:
        loose = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise SpecError(path, f"expected an IP address or CIDR network, got {value!r}") from None
    host = value.split("/", 1)[0]
    one = f"{host}/{loose.max_prefixlen}"
    raise SpecError(path, f"{value!r} has host bits set: write {str(loose)!r} for the network or {one!r} for the "
                          f"one address")


def parse_networks(values: list[str], path: str) -> list[Network]:
    """Every entry of the list at `path` parsed by parse_network (errors name `path[i]`)."""
    return [parse_network(v, f"{path}[{i}]") for i, v in enumerate(values)]


def trusts_everyone(network: Network) -> bool:
    """True when `network` holds every address of its family (every peer, or every IPv4 peer)."""
    return any(network.version == e.version and e.subnet_of(network) for e in EVERYONE)  # type: ignore[arg-type]


def open_trust_findings(spec) -> list:
    """A warning (never a refusal: a closed network in front may make it safe) for each trusted-network entry
    that trusts every peer of its family: anyone reaching the gateway may set the tenant header and bill any
    tenant. Returns speccheck.Finding objects, one per entry, path `<list>[i]`."""
    from inferwatch.speccheck import Finding

    out = []
    for path in TRUSTED_LISTS:
        section, name = path.split(".")
        for i, value in enumerate(getattr(getattr(spec, section), name)):
            network = parse_network(value, f"{path}[{i}]")
            if trusts_everyone(network):
                if network.version == 4:
                    who = "every IPv4 peer"
                elif network.prefixlen:
                    who = "every IPv4 peer of a dual-stack listener (::ffff:a.b.c.d)"
                else:
                    who = "every IPv6 peer (and every IPv4 peer of a dual-stack listener)"
                out.append(Finding(
                    f"{path}[{i}]",
                    f"{value} trusts {who} to set {spec.gateway.tenant_header}: anyone who reaches the gateway "
                    f"can bill any tenant; list only the authenticating proxy's addresses (or bill by API key, "
                    f"gateway.tenant_api_keys)", refuse=False))
    return out
