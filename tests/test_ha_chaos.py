"""The HA chaos scenario (inferwatch/testing/chaos.py): two Prometheus replicas, three clustered Alertmanager
peers and two notifier replicas sharing one real PostgreSQL outbox on loopback, a storm of about 500 alerts
across the three layers and, at seeded moments: one SIGKILL each of an Alertmanager peer, a notifier replica
(its data folder deleted) and a Prometheus replica, each restarted; a SIGSTOP of the other notifier for
longer than the webhook timeout; one fast restart of PostgreSQL.

Goals (docs/ha.md#the-chaos-scenario): no alert lost; PagerDuty duplicates carry the same dedup key; chat
duplicates at most 1 % of a channel's messages; no alert waits more than 60 s for its message; every page
resolved afterwards.
`make chaos` runs it with a random seed (printed); `make chaos SEED=n` replays one.
"""

from __future__ import annotations

import os
import random

import pytest

from inferwatch.testing import chaos

# Slow, and about five minutes on its own: run by `make chaos`, not by `make test` (keeps the suite under 20
# minutes); the HA pieces it combines have their own tests in the suite (test_ha_*.py).
pytestmark = [pytest.mark.slow, pytest.mark.chaos]
CHAT = ("oncall-slack", "llm-owners-wecom")
MAX_DELAY_S = 60.0
MIN_ALERTS = 450  # the storm fires ~500 (4 nodes x 60 GPUs x 2 alerts, the classifier, six tenants)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    seed = int(os.environ.get("INFERWATCH_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    result = chaos.run(tmp_path_factory.mktemp("chaos"), seed, say=lambda line: print(line, flush=True))
    print("\n" + result.report(), flush=True)
    return result


def test_every_victim_was_killed_and_came_back(outcome):
    assert not outcome.errors, outcome.errors
    assert sorted(k.kill.kind for k in outcome.kills) == ["alertmanager", "notifier", "notifier-stop", "postgres",
                                                          "prometheus"]
    stopped = next(k for k in outcome.kills if k.kill.kind == "notifier-stop")
    assert stopped.restarted_at - stopped.killed_at >= chaos.STOP_S[0], outcome.report()
    killed = next(k for k in outcome.kills if k.kill.kind == "notifier")
    assert killed.index != stopped.index, outcome.report()  # the other replica
    assert all(k.restarted_at > k.killed_at for k in outcome.kills)


def test_the_storm_was_a_storm_across_the_layers(outcome):
    f = outcome.figures
    assert f.should >= MIN_ALERTS, outcome.report()
    assert {c for c, figs in f.channels.items() if figs.should} == {"phone", *CHAT}, outcome.report()


def test_alertmanager_sees_one_alert_per_pair_of_replicas(outcome):
    assert outcome.alertmanager_alerts >= outcome.figures.should and outcome.replica_labelled == 0, outcome.report()


def test_no_alert_lost(outcome):
    f = outcome.figures
    assert f.did == f.should and not f.uncovered, outcome.report()


def test_duplicates_are_harmless_or_rare(outcome):
    channels = outcome.figures.channels
    assert channels["phone"].duplicate_keys_differ == 0, outcome.report()
    for name in CHAT:
        assert channels[name].duplicate_ratio <= 0.01, outcome.report()


def test_no_alert_waits_over_a_minute_for_its_message(outcome):
    assert outcome.figures.max_delay() <= MAX_DELAY_S, outcome.report()


def test_every_page_is_resolved(outcome):
    assert not outcome.open_incidents, outcome.report()
