"""Files written under one root that never leave it: `inferwatch generate --out DIR`.

A directory or file inside the root may be a symbolic link (a checkout with `deploy/` linked elsewhere, or a
hostile tree). A path whose parent directory resolves outside the root, or a file that is a link pointing
outside it, is refused before anything is written; every file is written to a temporary name beside it and
renamed over the old entry, so a link inside the root is replaced by the file, never written through.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from inferwatch.errors import UsageError


def escapes(root: Path, rel: str) -> str | None:
    """Why writing `rel` under `root` would leave it (a sentence), or None when it stays inside."""
    base = root.resolve()
    path = root / rel
    # The nearest existing ancestor decides where the missing directories would be created.
    parent = path.parent
    while not parent.exists() and parent != root and not parent.is_symlink():
        parent = parent.parent
    if parent.is_symlink() and not parent.exists():
        return f"{parent} is a dangling symbolic link"
    if not parent.resolve().is_relative_to(base):
        return f"its directory resolves to {parent.resolve()}, outside {base}"
    if path.is_symlink() and not path.resolve().is_relative_to(base):
        return f"it is a symbolic link to {path.resolve()}, outside {base}"
    return None


def check_all(root: Path, rels) -> None:
    """Raise UsageError naming the first of `rels` whose write would leave `root` (nothing written yet)."""
    for rel in rels:
        why = escapes(root, rel)
        if why is not None:
            raise UsageError(f"refusing to write {rel} under --out {root}: {why}")


def write(root: Path, rel: str, text: str) -> None:
    """Write `text` (UTF-8) to `root/rel` by renaming a temporary file over it (never through a link)."""
    why = escapes(root, rel)
    if why is not None:
        raise UsageError(f"refusing to write {rel} under --out {root}: {why}")
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
