"""`inferwatch generate --out DIR` never writes outside DIR through a symbolic link (inferwatch/safewrite.py).

Each row plants links in an output tree (a generated file linked to a file outside, a generated directory
linked to a directory outside, a dangling link) and runs the real CLI: it must refuse with one line, exit 2,
and leave everything outside DIR as it was and write nothing at all. A link inside DIR is replaced by the
file, its target untouched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import inferwatch.check  # noqa: F401 - imported before render_all is patched, so it keeps the real one
from inferwatch import generate
from inferwatch.cli import main

ROOT = Path(__file__).resolve().parents[1]
SPEC = str(ROOT / "inferwatch.yaml")
FILE = "rules/generated/notifier.yml"   # a generated file
DIR = "deploy/alertmanager"             # a generated directory


def _file_link(out: Path, outside: Path) -> None:
    (out / FILE).parent.mkdir(parents=True)
    (out / FILE).symlink_to(outside / "victim.txt")


def _dir_link(out: Path, outside: Path) -> None:
    (out / DIR).parent.mkdir(parents=True)
    (out / DIR).symlink_to(outside, target_is_directory=True)


def _parent_dir_link(out: Path, outside: Path) -> None:
    (out / "rules").symlink_to(outside, target_is_directory=True)


def _dangling_link(out: Path, outside: Path) -> None:
    (out / FILE).parent.mkdir(parents=True)
    (out / FILE).symlink_to(outside / "not-there.yml")


ROWS = [
    ("file linked outside", _file_link, "is a symbolic link to"),  # overwrote the link's target before
    ("directory linked outside", _dir_link, "outside"),
    ("parent directory linked outside", _parent_dir_link, "outside"),
    ("dangling link to outside", _dangling_link, "is a symbolic link to"),
]


@pytest.fixture(scope="module")
def rendered():
    return generate.render_all(generate.load_spec(SPEC))


@pytest.fixture(autouse=True)
def render_once(rendered, monkeypatch):
    """The real files, rendered once for the module (rendering is what every other generate test covers)."""
    monkeypatch.setattr(generate, "render_all", lambda spec: rendered)


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name,plant,says", ROWS, ids=[r[0] for r in ROWS])
def test_generate_refuses_links_that_leave_out(tmp_path, capsys, name, plant, says):
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (outside / "victim.txt").write_text("keep me\n")
    plant(out, outside)
    before = snapshot(outside)
    assert main(["generate", "--spec", SPEC, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refusing to write" in err[0] and says in err[0], err
    assert snapshot(outside) == before
    assert [p for p in out.rglob("*") if p.is_file() and not p.is_symlink()] == []  # nothing written


def test_link_inside_out_is_replaced_not_written_through(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "rules" / "generated").mkdir(parents=True)
    (out / "kept.txt").write_text("keep me\n")
    (out / FILE).symlink_to(out / "kept.txt")
    assert main(["generate", "--spec", SPEC, "--out", str(out)]) == 0
    assert not (out / FILE).is_symlink() and (out / FILE).read_text().startswith("#")
    assert (out / "kept.txt").read_text() == "keep me\n"
    assert main(["generate", "--spec", SPEC, "--out", str(out), "--check"]) == 0
