"""Every reference to the docs is one that resolves: relative links of the README and docs pages, `docs/<page>.md
#<anchor>` references in code and tests (anchors as MkDocs makes them, Python-Markdown's toc slugs), and the
README sections code and tests cite by heading (`README, "Overhead"`). `make lint` builds the docs site with
`mkdocs build --strict`, which checks the links between docs pages; this checks what MkDocs does not see."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from markdown.extensions.toc import slugify

REPO_ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS_REF = re.compile(r"docs/([a-z0-9_-]+\.md)#([a-z0-9_-]+)")
README_CITE = re.compile(r'README\.?m?d?,? (?:\(|section )?"([^"]+)"')


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [REPO_ROOT / name for name in out if (REPO_ROOT / name).exists()]


def _headings(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)]


def _anchors(page: Path) -> set[str]:
    return {slugify(h, "-") for h in _headings(page)}


def test_relative_links_of_the_readme_and_docs_pages_resolve():
    broken = []
    for page in [REPO_ROOT / "README.md", *_tracked("docs/*.md")]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"``.*?``|`[^`\n]*`", "", text)  # code spans show link syntax, they are no links
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#") and page.name == "README.md":
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such heading)")
    assert broken == []


def test_docs_anchors_cited_in_code_and_tests_exist():
    broken = []
    for source in _tracked("*.py", "*.md", "*.yaml", "*.yml"):
        for page, anchor in DOCS_REF.findall(source.read_text(encoding="utf-8", errors="replace")):
            target = REPO_ROOT / "docs" / page
            if not target.exists() or anchor not in _anchors(target):
                broken.append(f"{source.relative_to(REPO_ROOT)}: docs/{page}#{anchor}")
    assert broken == []


def test_readme_sections_cited_in_code_and_tests_exist():
    headings = {h.strip("`").lower() for h in _headings(REPO_ROOT / "README.md")}
    headings |= {re.sub(r"\s*\(.*\)$", "", h).strip("` ").lower() for h in _headings(REPO_ROOT / "README.md")}
    broken = []
    for source in _tracked("*.py"):
        for cited in README_CITE.findall(source.read_text(encoding="utf-8", errors="replace")):
            name = cited.strip("` ").lower()
            if name.endswith("..."):
                if not any(h.startswith(name[:-3].strip()) for h in headings):
                    broken.append(f"{source.relative_to(REPO_ROOT)}: {cited}")
            elif name.rstrip(".") not in headings:
                broken.append(f"{source.relative_to(REPO_ROOT)}: {cited}")
    assert broken == []
