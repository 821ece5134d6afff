"""Channel adapters, one module per provider; `build_channel` picks one from a spec `Channel`."""

from __future__ import annotations

from inferwatch.notifier.channels.base import Channel, DeliveryResult, HttpChannel
from inferwatch.spec import Channel as ChannelSpec


def channel_classes() -> dict[str, type[HttpChannel]]:
    from inferwatch.notifier.channels.pagerduty import PagerDutyChannel
    from inferwatch.notifier.channels.slack import SlackChannel
    from inferwatch.notifier.channels.voice import VoiceChannel
    from inferwatch.notifier.channels.wecom import WeComChannel

    return {c.kind: c for c in (PagerDutyChannel, SlackChannel, WeComChannel, VoiceChannel)}


def build_channel(name: str, spec: ChannelSpec) -> HttpChannel:
    return channel_classes()[spec.type](name, spec)


def default_rate(kind: str) -> int:
    """Messages per minute the provider accepts per destination (the channel class's rate_per_minute)."""
    return channel_classes()[kind].rate_per_minute


# Chat channels take a digest of many groups in one message under a storm; phone channels get one event
# per group (PagerDuty's dedup_key is per group), superseded by the group's newest state instead.
DIGEST_KINDS = ("slack", "wecom")

__all__ = ["Channel", "DeliveryResult", "HttpChannel", "build_channel", "default_rate", "DIGEST_KINDS"]
