"""Committed fixtures still match what the installed programs produce, and tests read nothing outside the
repository."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from fixtures.capture_alertmanager_webhook import capture

from notifier_support import FIXTURE

REPO_ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("startsAt", "fingerprint")


def _stable(body: dict) -> dict:
    body = json.loads(json.dumps(body))
    for alert in body["alerts"]:
        for key in VOLATILE:
            assert alert.pop(key), f"alert lacks {key}"
    return body


def test_alertmanager_fixture_is_what_alertmanager_sends(tmp_path):
    """The capture script re-run against the real Alertmanager gives the committed fixture (but for the
    start time and fingerprint of each alert): refresh it with the script when this fails after an upgrade."""
    assert _stable(capture(tmp_path)) == _stable(json.loads(FIXTURE.read_text()))


def test_fixture_lives_inside_the_repository():
    assert FIXTURE.resolve().is_relative_to(REPO_ROOT)
    assert FIXTURE.is_file()


# Absolute paths in tracked text that point at a machine's folders rather than into the checkout. System
# locations a test may legitimately name (/proc, /dev, /tmp, the kubelet socket the GPU exporter documents)
# are allowed.
ALLOWED = re.compile(r"^/(proc|sys|dev|tmp|usr|etc|var/lib/kubelet|run|bin|opt/tritonserver)\b")
SIBLING = "../" + "shared"  # the team notes beside a checkout, which users do not get
ABSOLUTE = re.compile(r"""["'](/(?:work|home|root|mnt|srv|data)\b[^"']*)["']""")


def test_no_code_reads_a_path_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "*.py", "*.sh", "Makefile", ".ci/*"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in files:
        text = (REPO_ROOT / name).read_text(errors="replace")
        for match in ABSOLUTE.finditer(text):
            if not ALLOWED.match(match.group(1)):
                offenders.append(f"{name}: {match.group(1)}")
        if SIBLING in text:
            offenders.append(f"{name}: {SIBLING}")
    assert offenders == []
