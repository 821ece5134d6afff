"""Who a request is billed to: the tenant identity, from a source the spec trusts, never as sent.

The trust model (docs/trust-and-durability.md#gateway-tenant-identity-exportersgatewaytenancypy; spec `gateway`):
- a request whose API key (`Authorization: Bearer <key>`) is listed in `gateway.tenant_api_keys` (a secret
  reference: lines `<key> <tenant>`) is billed to that key's tenant, whatever tenant header it sent;
- otherwise the tenant header (`gateway.tenant_header`) is taken only from a peer address inside
  `gateway.tenant_trusted_proxies` (the proxy in front that authenticates users and sets it);
- from anyone else the header is removed: the request is billed to `other` and the upstream sees no header;
- a request with several tenant headers, or one value that is a list (`a, b`) or holds control
  characters, is refused (400): which one would be billed is ambiguous;
- the value is normalised once (surrounding spaces and tabs removed, RFC 9110 §5.5) and that same value is
  what the upstream receives and what the metrics and the usage log bill.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Iterable

from inferwatch.spec import Spec, SpecError

Headers = list[tuple[str, str]]


class TenantRefused(ValueError):
    """The request's tenant identity is ambiguous or malformed: answer 400 with this message."""


def parse_api_keys(text: str, path: str) -> dict[str, str]:
    """`<key> <tenant>` per line (blank lines and `#` comments skipped) → {key: tenant}. Raises SpecError
    naming `path` and the line number (never the key)."""
    keys: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise SpecError(path, f"line {n}: expected `<api key> <tenant>`")
        keys[parts[0]] = parts[1]
    return keys


def _clean(value: str, header: str) -> str | None:
    """The one normalised value of a tenant header: None when blank; TenantRefused when it is a list or
    holds control characters."""
    value = value.strip(" \t")
    if not value:
        return None
    if "," in value:
        raise TenantRefused(f"{header} holds several values; send exactly one tenant")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise TenantRefused(f"{header} holds control characters")
    return value


class Tenancy:
    """Resolves and rewrites the tenant header of one gateway (built once from the spec)."""

    def __init__(self, spec: Spec):
        g = spec.gateway
        self.name = g.tenant_header
        self.header = g.tenant_header.lower()
        self.networks = [ipaddress.ip_network(c, strict=False) for c in g.tenant_trusted_proxies]
        self._keys = (parse_api_keys(g.tenant_api_keys.reveal(), "gateway.tenant_api_keys")
                      if g.tenant_api_keys is not None else {})
        self._key_bytes = [(k.encode(), t) for k, t in self._keys.items()]

    def trusted(self, remote: str | None) -> bool:
        if not remote:
            return False
        try:
            address = ipaddress.ip_address(remote.split("%", 1)[0])
        except ValueError:
            return False
        # A dual-stack listener reports an IPv4 peer as `::ffff:a.b.c.d` (RFC 4291 2.5.5.2): the same peer as
        # the IPv4 network the spec lists, and an IPv6 network that lists the mapped form still matches it.
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return any(address in net or (mapped is not None and mapped in net) for net in self.networks)

    def _keyed(self, headers: Iterable[tuple[str, str]]) -> str | None:
        if not self._key_bytes:
            return None
        for k, v in headers:
            if k.lower() == "authorization" and v[:7].lower() == "bearer ":
                given = v[7:].strip().encode("utf-8", "surrogateescape")
                # Constant-time per key: a key must not be guessable from response times.
                found = [t for key, t in self._key_bytes if hmac.compare_digest(given, key)]
                if found:
                    return found[0]
        return None

    def resolve(self, headers: Headers, remote: str | None) -> str | None:
        """The tenant to bill and forward (None: none, billed `other`). Raises TenantRefused."""
        values = [v for k, v in headers if k.lower() == self.header]
        if len(values) > 1:
            raise TenantRefused(f"{len(values)} {self.name} headers; send exactly one")
        claimed = _clean(values[0], self.name) if values else None
        keyed = self._keyed(headers)
        if keyed is not None:
            return keyed
        return claimed if claimed is not None and self.trusted(remote) else None

    def rewrite(self, headers: Headers, tenant: str | None) -> Headers:
        """`headers` with every tenant header removed and, when `tenant` is set, that one value added."""
        out = [(k, v) for k, v in headers if k.lower() != self.header]
        if tenant is not None:
            out.append((self.name, tenant))
        return out
