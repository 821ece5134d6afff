"""Notifier replicas tell each other what they accepted, so that one notification is delivered once however
Alertmanager's peers spread it over the replicas (docs/ha.md#what-a-dead-part-costs).

Alertmanager's cluster delivers at least once: a peer that took over from a dead one resends what the dead
one had sent, a webhook whose answer was lost is retried, and a peer acting on a snapshot taken before a
group resolved sends that group's firing state again right after another peer sent the resolution
(prometheus/alertmanager#2447, #4008). Behind one address, each of those may reach another replica than the
first. Before storing a webhook, a replica asks its peers (`targets.notifiers`, POST /-/peer/check with the
webhook's delivery key and group key) and its own outbox:
- a webhook whose delivery key a replica accepted within `notifier.dedup_window` is a duplicate;
- a firing webhook all of whose firing alerts were already reported resolved (same fingerprint, started no
  later than the resolution's endsAt) is stale: Prometheus gives an alert that fires again a new start, so
  only a copy of the past can start before its own resolution. It is kept (auditable) and not delivered.
A peer that does not answer within PEER_TIMEOUT_S is left out (fail open: a duplicate rather than a loss).

A replica killed after storing a webhook but before answering it (or before delivering it) finds the rows
pending when it starts again, while Alertmanager has meanwhile retried the webhook on a peer. Before its
worker starts, it asks the peers about those rows (POST /-/peer/delivered): the replica that accepted a
notification first sends it. A row a peer delivered already, or holds pending after accepting it earlier, is
left out (superseded); a row this replica accepted first is kept, and the peers holding it pending are told
to leave theirs out (POST /-/peer/release). So two replicas never both leave one out, and only a send in
flight at the moment of a kill goes out twice.
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp

from inferwatch.notifier.model import WebhookMessage, parse_time

PEER_TIMEOUT_S = 0.5
CHECK_PATH = "/-/peer/check"
DELIVERED_PATH = "/-/peer/delivered"
RELEASE_PATH = "/-/peer/release"
RECONCILE_TIMEOUT_S = 5.0


@dataclasses.dataclass
class Verdict:
    seen: bool = False                                               # some replica accepted this delivery key
    resolved: dict[str, float] = dataclasses.field(default_factory=dict)  # fingerprint -> latest endsAt
    asked: int = 0
    answered: int = 0

    def merge(self, seen: bool, resolved: dict[str, float]) -> None:
        self.seen = self.seen or seen
        for fp, end in resolved.items():
            self.resolved[fp] = max(end, self.resolved.get(fp, end))


def stale(message: WebhookMessage, resolved: dict[str, float]) -> bool:
    """A firing notification every firing alert of which was already reported resolved (see module doc)."""
    if message.status != "firing" or not message.firing:
        return False
    for alert in message.firing:
        started = parse_time(alert.starts_at)
        end = resolved.get(alert.fingerprint)
        if started is None or end is None or started > end:
            return False
    return True


class Peers:
    """Asks the other replicas (base URLs) about a webhook, all at once, each for at most PEER_TIMEOUT_S."""

    def __init__(self, urls: list[str], authorization: str | None):
        self.urls = list(urls)
        self.headers = {"Authorization": authorization} if authorization else {}
        self._session: aiohttp.ClientSession | None = None

    async def check(self, message: WebhookMessage) -> Verdict:
        verdict = Verdict(asked=len(self.urls))
        if not self.urls:
            return verdict
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S))
        body = {"delivery_key": message.delivery_key(), "group_key": message.group_key}
        answers = await asyncio.gather(*(self._ask(url, body) for url in self.urls))
        for answer in answers:
            if answer is not None:
                verdict.answered += 1
                resolved = {str(k): float(v) for k, v in (answer.get("resolved") or {}).items()}
                verdict.merge(bool(answer.get("seen")), resolved)
        return verdict

    async def settle(self, rows: list[tuple[int, str, str, float]]) -> list[int]:
        """Decide, with the peers, which recovered rows (id, delivery key, channel, accepted at) this replica
        must not send (returned), and tell peers to drop their copies of those it keeps (see module doc)."""
        if not self.urls or not rows:
            return []
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S))
        body = {"items": [[key, channel] for _, key, channel, _ in rows]}
        answers = await asyncio.gather(*(self._ask(url, body, DELIVERED_PATH, RECONCILE_TIMEOUT_S)
                                         for url in self.urls))
        skip: set[int] = set()
        release: dict[str, list] = {}
        for url, answer in zip(self.urls, answers, strict=True):
            statuses = (answer or {}).get("items")
            if not isinstance(statuses, list) or len(statuses) != len(rows):
                continue
            for (row_id, key, channel, accepted_at), status in zip(rows, statuses, strict=True):
                if not isinstance(status, dict):
                    continue
                theirs = status.get("accepted_at")
                earlier = theirs is not None and theirs < accepted_at
                if status.get("delivered") or (status.get("pending") and earlier):
                    skip.add(row_id)
                elif status.get("pending"):
                    release.setdefault(url, []).append([key, channel])
        for url, items in release.items():
            await self._ask(url, {"items": [i for i in items]}, RELEASE_PATH, RECONCILE_TIMEOUT_S)
        return sorted(skip)

    async def _ask(self, url: str, body: dict, path: str = CHECK_PATH, timeout: float | None = None) -> dict | None:
        session = self._session
        if session is None:  # closed (or never opened): no peer can be asked
            return None
        try:
            limit = aiohttp.ClientTimeout(total=timeout) if timeout else session.timeout
            async with session.post(url + path, json=body, headers=self.headers, timeout=limit) as resp:
                if resp.status != 200:
                    return None
                answer = await resp.json()
                return answer if isinstance(answer, dict) else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
