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


# References a reader of the checkout cannot open: the team's notes beside it and issue numbers of its own
# tracker. Each pattern is written so it does not match its own source line. An upstream issue is cited by its
# public URL (https://github.com/<owner>/<repo>/issues/<n>), which none of these match.
NOTE_REFERENCE = re.compile(r"researc[h]/|(?:CONVENTION[S]|DESIG[N]|REFERENCE[S]|STYL[E])\.md|share[d]/"
                            r"|\bissu[e] (?:[0-9]+|#)")
OWN_DOC = re.compile(r"\bdocs/([a-z0-9_-]+\.md)(?:#([a-z0-9-]+))?")


def _tracked_text_files() -> list[str]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return [name for name in files if (REPO_ROOT / name).is_file()]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


def test_no_reference_to_a_document_outside_the_repository():
    offenders = []
    for name in _tracked_text_files():
        for number, line in enumerate((REPO_ROOT / name).read_text(errors="replace").splitlines(), 1):
            if NOTE_REFERENCE.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []


def test_references_to_the_repository_docs_resolve():
    """`docs/sources.md#triton` names a heading that exists; a `docs/x.md` that is not ours (Alertmanager's
    docs/configuration.md) is an upstream file and is not checked."""
    ours = {p.name: _anchors(p.read_text()) for p in (REPO_ROOT / "docs").glob("*.md")}
    broken = []
    for name in _tracked_text_files():
        for match in OWN_DOC.finditer((REPO_ROOT / name).read_text(errors="replace")):
            doc, anchor = match.groups()
            if doc in ours and anchor and anchor not in ours[doc]:
                broken.append(f"{name}: {match.group(0)}")
    assert broken == []


def test_architecture_lists_every_module():
    """docs/architecture.md names each module of the package under its component's heading
    (`**GPU exporter** (`exporters/gpu/`, ...)`): the heading whose folder is the longest prefix of the path."""
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    body = text[text.index("## Components and their modules"):text.index("Outside the package")]
    sections = {}
    for part in body.split("\n**")[1:]:
        folder = re.search(r"\(`([a-z_/]+/)`", part)
        assert folder, f"component heading without its folder: {part.splitlines()[0]}"
        sections[folder.group(1)] = part
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    missing = []
    for name in files:
        if name.startswith(("tests/", "benchmarks/", "examples/")) or name.endswith(("__init__.py", "_pb2.py",
                                                                                      "_pb2_grpc.py")):
            continue
        folder = max((f for f in sections if name.startswith(f)), key=len, default=None)
        if folder is None or f"`{Path(name).name}`" not in sections[folder]:
            missing.append(name)
    assert missing == []
