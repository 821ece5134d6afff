"""Triton replicas: a configured target is polled as every server behind its name, never as one blended server.

Why: several Triton pods behind one Service address answer in turn. Read through the Service, a counter reads
400, 8, 400, 8 … (each read from another pod) and `rate()` reports executions where every real rate is 0.

- **Resolved at each poll** (`plan`): the target URL's host is resolved (A/AAAA records, as a headless
  Service's name gives every ready pod's address) before every poll. One address: the target is polled at it,
  its series as before (no new label). Several: each address is polled as its own server (the URL keeps the
  name, the connection is pinned to the address: Host header and TLS name unchanged, pinning.py), its series
  labelled `address="IP:PORT"` beside `triton` (the target's name).
  Addresses that appear or go away (pods that come and go) start or end their series at the next poll.
  IPv4 addresses are used when the name has any: a dual-stack host (or `localhost`) resolves to one IPv4 and
  one IPv6 address of the same server, which must not count twice. An IP literal is not resolved.
- **A load-balanced address** (one address, several servers: a ClusterIP Service, a TCP load balancer) is
  told by its statistics (`went_back`): at the first poll that reaches the server, the statistics are read
  `PROBE_READS` times in a row, each on a new connection (Kubernetes and most TCP balancers pick a backend
  per connection); one Triton's cumulative counts never go down between two reads, so any that does means
  more than one server answered. The target then reads `inferwatch_triton_target_load_balanced 1`, one log
  line says so and what to configure, and its statistics counters are not exported (a blend of several
  servers' counters is no server's: unknown, so absent). Identical servers with identical counts (idle, no
  traffic since start) cannot be told apart this way, and their blended counts are then right anyway.

`merge_with_address` puts the families of each address group together (the families are built by
families.py unchanged, one group at a time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from urllib.parse import urlparse

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from inferwatch.exporters.triton.reader import TargetConfig
from inferwatch.exporters.triton.stats import ModelStats

PROBE_READS = 4
# host, port -> the addresses the name resolves to now (strings); raises OSError when it does not resolve.
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (getaddrinfo: /etc/hosts, DNS), IPv4 first-and-only when it has any,
    in the order given, each once. Raises OSError (socket.gaierror) when the name does not resolve."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
    for family, _type, _proto, _name, sockaddr in infos:
        if family in found and sockaddr[0] not in found[family]:
            found[family].append(str(sockaddr[0]))
    return found[socket.AF_INET] or found[socket.AF_INET6]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _port(url: str) -> int:
    parsed = urlparse(url)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def address_label(ip: str, port: int) -> str:
    """`IP:PORT`, an IPv6 address in brackets (as in a URL)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def replica_target(target: TargetConfig, ip: str) -> TargetConfig:
    """The target as one address of its name: the same URLs, connected to `ip` (TargetConfig.pinned_address)."""
    return dataclasses.replace(target, pinned_address=ip)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to poll for one target now: (address label, target) pairs ("" = the target as configured), and
    how many addresses its name resolved to (None: an IP literal, not resolved; 0: it did not resolve)."""

    polls: tuple[tuple[str, TargetConfig], ...]
    addresses: int | None


async def plan(target: TargetConfig, resolver: Resolver) -> Plan:
    """Resolve the target's host now (never raises: a name that does not resolve is polled as configured,
    and its poll fails as a connection error)."""
    host = urlparse(target.url).hostname or ""
    if not host or _is_ip(host):
        return Plan((("", target),), None)
    try:
        addrs = await resolver(host, _port(target.url))
    except OSError:
        addrs = []
    if not addrs:
        return Plan((("", target),), 0)
    if len(addrs) == 1:   # the address resolved now, so a name that moves is followed
        return Plan((("", replica_target(target, addrs[0])),), 1)
    port = _port(target.url)
    return Plan(tuple((address_label(ip, port), replica_target(target, ip)) for ip in addrs), len(addrs))


def went_back(reads: Iterable[Mapping[tuple[str, str], ModelStats]]) -> bool:
    """True when a cumulative count (inference_count, execution_count, any inference_stats count) of a model
    version present in two consecutive reads is lower in the later one: two different servers answered."""
    previous: Mapping[tuple[str, str], ModelStats] | None = None
    for read in reads:
        if previous is not None:
            for key in set(previous) & set(read):
                if any(b < a for a, b in zip(_counts(previous[key]), _counts(read[key]), strict=True)):
                    return True
        previous = read
    return False


def _counts(st: ModelStats) -> list[int]:
    return [st.inference_count, st.execution_count, *(st.inference[name].count for name in sorted(st.inference))]


def merge_with_address(groups: Mapping[str, list[Metric]]) -> list[Metric]:
    """Families built per address group (same names, same order) → one list; samples of a group with an
    address get `address` as their last label."""
    merged: dict[str, Metric] = {}
    for address, families in groups.items():
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type)
            for s in family.samples:
                labels = {**s.labels, "address": address} if address else s.labels
                into.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
    return list(merged.values())


def target_families(addresses: Mapping[str, int | None],
                    load_balanced: Mapping[tuple[str, str], bool | None]) -> list[Metric]:
    """`inferwatch_triton_target_addresses{triton}` (what the name resolved to at the last poll; absent for an
    IP literal) and `inferwatch_triton_target_load_balanced{triton[,address]}` (absent until probed)."""
    count = GaugeMetricFamily("inferwatch_triton_target_addresses", "addresses the target's host name resolved to "
                              "at the last poll (A/AAAA records; several: each is polled as its own server, "
                              "labelled address); 0 when it did not resolve", labels=["triton"])
    for name, n in sorted(addresses.items()):
        if n is not None:
            count.add_metric([name], float(n))
    balanced = Metric("inferwatch_triton_target_load_balanced", "1 when reads of this address on separate "
                      "connections answered as several servers (statistics went back): a load-balanced address; "
                      "its statistics are not exported. Poll every replica instead (a headless Service's name, "
                      "or one URL per pod)", "gauge")
    for (name, address), flag in sorted(load_balanced.items()):
        if flag is not None:
            labels = {"triton": name, **({"address": address} if address else {})}
            balanced.add_sample("inferwatch_triton_target_load_balanced", labels, 1.0 if flag else 0.0)
    return [count, balanced]


async def probe(target: TargetConfig, timeout: float, reads: int = PROBE_READS) -> bool | None:
    """Read the statistics `reads` times in a row, each on a new connection: True when they went back (several
    servers answer this address), False when not, None when a read failed (no verdict; try again later)."""
    import aiohttp

    from inferwatch.exporters.triton.answers import decode_json, read_capped
    from inferwatch.exporters.triton.stats import parse_stats

    found = []
    try:
        async with aiohttp.ClientSession(connector=target.connector(force_close=True),
                                         timeout=aiohttp.ClientTimeout(total=timeout),
                                         headers=target.headers or None) as session:
            for _ in range(reads):
                async with session.get(target.url.rstrip("/") + "/v2/models/stats") as resp:
                    body = await read_capped(resp, target.max_answer_bytes)
                    if resp.status != 200:
                        return None
                found.append(parse_stats(decode_json(body))[0])
    except Exception:  # noqa: BLE001 - any failure only means no verdict this time; the poll reports failures
        return None
    return went_back(found)
