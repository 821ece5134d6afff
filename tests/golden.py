"""Golden /metrics files shared by the exporters' tests: compare with the committed text, lint with promtool."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def assert_matches_golden(text: str, golden: Path) -> None:
    """`text` equals the committed golden file; UPDATE_GOLDEN=1 rewrites it first (intended changes)."""
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), "golden /metrics changed; rerun with UPDATE_GOLDEN=1 if intended"


def promtool_check_metrics(golden: Path) -> subprocess.CompletedProcess:
    """`promtool check metrics` over the golden file (promtool must be installed: make system-deps)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: apt-get install prometheus (make system-deps)"
    return subprocess.run([promtool, "check", "metrics"], input=golden.read_text(), capture_output=True, text=True)
