"""`inferwatch generate --out DIR` writes every file under DIR and nowhere else, and the spec reference page
(docs/spec-reference.md, inferwatch's own documentation of its fields) only into the inferwatch checkout that
is running, or with `--spec-reference` (inferwatch/generate.py `for_root`).

Each row runs the real CLI in a working directory (the repository, or a user's stack directory) and compares
the files under every directory it could have touched before and after."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inferwatch import generate
from inferwatch.cli import main
from inferwatch.specdoc import PATH as SPEC_REFERENCE

ROOT = Path(__file__).resolve().parents[1]
SPEC = str(ROOT / "inferwatch.yaml")


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def rendered():
    return generate.render_all(generate.load_spec(SPEC))


# (where --out points, extra flags, the reference page written). The case: --out DIR of a user's stack.
ROWS = [
    ("stack", [], False),                       # a user's own directory: their configuration only
    ("stack", ["--spec-reference"], True),      # asked for: under DIR like everything else
    ("stack/nested/out", [], False),            # a directory that does not exist yet
]


@pytest.mark.parametrize("out, flags, written", ROWS)
def test_generate_writes_under_out_only_and_the_reference_page_only_when_meant(tmp_path, monkeypatch, capsys,
                                                                                 rendered, out, flags, written):
    monkeypatch.setattr(generate, "render_all", lambda spec: rendered)
    monkeypatch.chdir(tmp_path)
    repo_docs_before = (ROOT / SPEC_REFERENCE).stat().st_mtime_ns
    assert main(["generate", "--spec", SPEC, "--out", out, *flags]) == 0
    expected = set(rendered) if written else set(rendered) - {SPEC_REFERENCE}
    assert files_under(tmp_path / out) == expected
    assert files_under(tmp_path) == {f"{out}/{rel}" for rel in expected}   # nothing beside DIR
    assert (ROOT / SPEC_REFERENCE).stat().st_mtime_ns == repo_docs_before  # the repository's page untouched
    assert f"generated {len(expected)} file(s) under {(tmp_path / out).resolve()}" in capsys.readouterr().out
    # --check of the same folder agrees: nothing missing, the page not demanded where it was not written.
    assert main(["generate", "--spec", SPEC, "--out", out, "--check", *flags]) == 0


def test_the_running_checkout_keeps_its_reference_page(rendered):
    assert generate.project_checkout(ROOT)
    assert SPEC_REFERENCE in generate.for_root(rendered, ROOT)
    assert SPEC_REFERENCE in generate.for_root(rendered, ROOT / "src" / "..")


@pytest.mark.parametrize("root", ["/", "docs", "rules", "tmp"])
def test_no_other_directory_is_the_checkout(root, tmp_path, rendered):
    path = tmp_path if root == "tmp" else (Path(root) if root == "/" else ROOT / root)
    assert not generate.project_checkout(path)
    assert SPEC_REFERENCE not in generate.for_root(rendered, path)


def test_help_says_where_files_go_and_when_the_reference_page_is_written():
    done = subprocess.run([sys.executable, "-m", "inferwatch", "generate", "--help"], capture_output=True,
                          text=True, check=True, cwd=ROOT)
    text = " ".join(done.stdout.split())
    assert "every file is written under it" in text
    assert "--spec-reference" in text and "otherwise written only into the inferwatch checkout" in text
