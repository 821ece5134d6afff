"""The compose stack's spec (deploy/compose.py `compose_spec`) changes addresses and paths only: what
the user's spec says about its Triton's timing is kept, so `inferwatch generate` and `check` judge the compose
outputs by the user's settings, not by Triton's defaults."""

from __future__ import annotations

import pytest

from inferwatch.deploy.compose import compose_spec
from inferwatch.generate import render_all
from inferwatch.spec import spec_from_dict


def _spec(scrape: str, triton_interval_ms: int | None):
    triton = {"name": "t0", "url": "http://127.0.0.1:8000", "metrics_url": "http://127.0.0.1:8002/metrics"}
    if triton_interval_ms is not None:
        triton["metrics_interval_ms"] = triton_interval_ms
    return spec_from_dict({"version": 1, "prometheus": {"scrape_interval": scrape, "evaluation_interval": scrape},
                           "targets": {"triton": [triton]}})


# (scrape interval, Triton's --metrics-interval-ms in the spec, the compose Triton's interval). The first row
# is the case that failed: a 1 s scrape of a Triton exporting every second was refused as "at least 2000 ms".
@pytest.mark.parametrize("scrape, interval_ms, kept", [
    ("1s", 1000, 1000),
    ("2s", 2000, 2000),
    ("15s", 5000, 5000),
    ("15s", None, 2000),   # not given: Triton's default
])
def test_the_compose_triton_keeps_the_spec_s_metrics_interval(scrape, interval_ms, kept):
    spec = _spec(scrape, interval_ms)
    assert compose_spec(spec).targets.triton[0].metrics_interval_ms == kept
    assert render_all(spec)  # every output, the compose ones included, renders without a SpecError


# (case, outbox password in the spec, environment passed to the replicas, password in the replicas' spec, secret)
OUTBOX_PASSWORDS = [
    ("an environment variable", {"password": "${PG_PW}"}, {"PG_PW"}, "${PG_PW}", None),
    ("a password file", {"password_file": "/etc/pg/pw"}, set(), None, "notifier-outbox-password"),
    ("inline: turned into a reference", {"password": "hunter2-inline"}, {"INFERWATCH_NOTIFIER_OUTBOX_PASSWORD"},
     "${INFERWATCH_NOTIFIER_OUTBOX_PASSWORD}", None),
]


@pytest.mark.parametrize("case, password, env, in_spec, secret", OUTBOX_PASSWORDS, ids=[c[0] for c in OUTBOX_PASSWORDS])
def test_compose_replicas_share_the_postgresql_outbox_with_its_password_by_reference(case, password, env, in_spec,
                                                                                      secret):
    import yaml

    from inferwatch.deploy.compose import HA_FILE, NOTIFIER_SPEC

    url = "postgresql://notifier@db.example:5432/inferwatch"
    files = render_all(spec_from_dict({"ha": {"notifier_replicas": 2},
                                       "notifier": {"outbox": {"url": url, **password}}}))
    assert "hunter2-inline" not in files[HA_FILE] + files[NOTIFIER_SPEC]
    override = yaml.safe_load(files[HA_FILE])
    outbox = yaml.safe_load(files[NOTIFIER_SPEC])["notifier"]["outbox"]
    assert outbox["url"] == url and outbox.get("password") == in_spec
    for name in ("notifier", "notifier-1"):
        service = override["services"][name]
        assert env <= set(service.get("environment", {})), service
        assert (secret in service.get("secrets", [])) is (secret is not None)
    if secret:
        assert outbox["password_file"] == f"/run/secrets/{secret}"
        assert override["secrets"][secret]["file"].endswith(f"/{secret}")
