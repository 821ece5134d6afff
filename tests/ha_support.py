"""Test support for the HA configuration: the HA example spec with its channel secrets set."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
HA_SPEC = ROOT / "examples/ha/inferwatch.ha.yaml"
# The ${...} secrets the HA spec names (the chaos scenario points them at the simulators).
ENV = {"INFERWATCH_DEMO_PAGERDUTY_KEY": "k" * 32, "INFERWATCH_DEMO_PAGERDUTY_URL": "http://127.0.0.1:1/v2/enqueue",
       "INFERWATCH_DEMO_SLACK_URL": "http://127.0.0.1:1/services/T/B/X",
       "INFERWATCH_DEMO_WECOM_URL": "http://127.0.0.1:1/w", "INFERWATCH_DEMO_NOTIFIER_TOKEN": "t",
       "INFERWATCH_DEMO_OUTBOX_PASSWORD": "p"}


def ha_spec(data_path: Path = HA_SPEC):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        return load_spec(data_path)
