"""Notifier replicas tell each other what they accepted, so that one notification is delivered once however
Alertmanager's peers spread it over the replicas (README "HA").

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
worker starts, it asks the peers about those rows (POST /-/peer/delivered) and leaves out, as superseded,
each one a peer delivered to the same channel or accepted earlier than it did (the earlier one sends it; two
replicas never both leave one out).
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp

from inferwatch.notifier.model import WebhookMessage, parse_time

PEER_TIMEOUT_S = 0.5
CHECK_PATH = "/-/peer/check"
DELIVERED_PATH = "/-/peer/delivered"
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

    async def taken_over(self, rows: list[tuple[int, str, str, float]]) -> list[int]:
        """Ids of recovered rows (id, delivery key, channel, accepted at) a peer delivered to the same channel or
        accepted earlier: this replica must not send them again."""
        if not self.urls or not rows:
            return []
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S))
        body = {"items": [[key, channel] for _, key, channel, _ in rows]}
        answers = await asyncio.gather(*(self._ask(url, body, DELIVERED_PATH, RECONCILE_TIMEOUT_S)
                                         for url in self.urls))
        out = set()
        for answer in answers:
            statuses = (answer or {}).get("items")
            if not isinstance(statuses, list) or len(statuses) != len(rows):
                continue
            for (row_id, _key, _channel, accepted_at), status in zip(rows, statuses):
                theirs = status.get("accepted_at") if isinstance(status, dict) else None
                earlier = theirs is not None and theirs < accepted_at
                if isinstance(status, dict) and (status.get("delivered") or earlier):
                    out.add(row_id)
        return sorted(out)

    async def _ask(self, url: str, body: dict, path: str = CHECK_PATH, timeout: float | None = None) -> dict | None:
        try:
            kwargs = {"timeout": aiohttp.ClientTimeout(total=timeout)} if timeout else {}
            async with self._session.post(url + path, json=body, headers=self.headers, **kwargs) as resp:
                if resp.status != 200:
                    return None
                answer = await resp.json()
                return answer if isinstance(answer, dict) else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
