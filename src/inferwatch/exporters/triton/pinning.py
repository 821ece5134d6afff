"""An aiohttp resolver that sends one host name to one chosen address (replicas.py: one reader per replica).

Why a resolver rather than the address in the URL: the URL keeps the name, so the Host header, TLS's server
name and certificate check stay those of the configured target while the connection goes to one replica.
Any other host name resolves as usual.
"""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver


class PinnedResolver(AbstractResolver):
    """Resolves `host` to `address` only (an IPv4 or IPv6 literal); other names through ThreadedResolver."""

    def __init__(self, host: str, address: str):
        self.host = host.lower()
        self.address = address
        self._other = ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if host.lower() != self.host:
            return await self._other.resolve(host, port, family)
        fam = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        return [ResolveResult(hostname=host, host=self.address, port=port, family=fam, proto=0,
                              flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        await self._other.close()
