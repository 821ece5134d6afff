"""The layer order of the package (docs/architecture.md "Layers"): runtime components never import the
generators of `deploy/` (`inferwatch.deploy`), read from the imports each module's syntax tree names, including
the ones inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "inferwatch"
# The processes that run in production, and what they read at run time.
RUNTIME = ("exporters", "notifier", "triage")
# A component's cli.py is the command layer: an offline subcommand (`inferwatch notifier routes`: the effective
# routing table) may call a generator; the processes it starts never do.
COMMAND_LAYER = "cli.py"


def package_of(path: Path) -> str:
    return ".".join(("inferwatch", *path.relative_to(PACKAGE).parent.parts))


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute module names `source` (a module of `package`) imports anywhere, top level or inside
    functions; relative imports resolved against `package`."""
    tree = ast.parse(source)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def runtime_modules() -> list[Path]:
    return sorted(p for area in RUNTIME for p in (PACKAGE / area).rglob("*.py") if p.name != COMMAND_LAYER)


def test_every_runtime_area_exists():
    assert [area for area in RUNTIME if not (PACKAGE / area / "__init__.py").is_file()] == []
    assert len(runtime_modules()) > 50


@pytest.mark.parametrize("path", runtime_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_runtime_modules_never_import_the_generators(path):
    names = imported_modules(path.read_text(encoding="utf-8"), package_of(path))
    bad = sorted(n for n in names if n == "inferwatch.deploy" or n.startswith("inferwatch.deploy."))
    assert bad == []


@pytest.mark.parametrize(("source", "found"), [
    ("from inferwatch.deploy import alertmanager\n", True),
    ("def f():\n    from inferwatch.deploy.prometheus import config\n", True),
    ("import inferwatch.deploy.compose\n", True),
    ("from .. import deploy\n", True),
    ("from inferwatch.notifier import amtree\n", False),
    ("from inferwatch.deployment import x\n", False),
])
def test_the_import_reader_finds_each_form(source, found):
    names = imported_modules(source, "inferwatch.notifier")
    assert any(n == "inferwatch.deploy" or n.startswith("inferwatch.deploy.") for n in names) is found
