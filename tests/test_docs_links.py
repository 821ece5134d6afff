"""Every reference to the docs is one that resolves: relative links of the README, the docs pages and the
runbooks; `docs/<page>.md#<anchor>` and `docs/<page>.md` references in code, tests, config and docs (anchors as
MkDocs makes them, Python-Markdown's toc slugs); sections cited by heading, `docs/<page>.md, "Heading"` or
`README, "Heading"`. `make lint` builds the docs site with `mkdocs build --strict`, which checks the links
between docs pages; this checks what MkDocs does not see. The README stays an entry page of at most 250 lines.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

REPO_ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS_REF = re.compile(r"(?<![\w/.-])docs/((?:[a-z0-9_-]+/)*[a-z0-9_-]+\.md)(?:#([a-z0-9_-]+))?")
DOCS_CITE = re.compile(r'(?<![\w/.-])docs/((?:[a-z0-9_-]+/)*[a-z0-9_-]+\.md),? "([^"]+)"')
README_CITE = re.compile(r'README\.?m?d?,? (?:\(|section )?"([^"]+)"')
# Every kind of file that may cite the docs: code, tests, config, docs, runbooks, build and CI files.
CITING = ("*.py", "*.md", "*.yaml", "*.yml", "*.toml", "Makefile", "Dockerfile", ".gitignore", ".ci/*")
# Upstream projects' files cited by their path in the upstream repository (Alertmanager, Triton, AIPerf ...):
# not pages of ours, so only their existence here is not required.
UPSTREAM_DOCS = {"configuration.md", "metrics-reference.md", "user_guide/metrics.md",
                 "user_guide/model_configuration.md", "protocol/extension_generate.md",
                 "protocol/extension_statistics.md", "x.md"}
README_MAX_LINES = 250


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
    for page in [REPO_ROOT / "README.md", *_tracked("docs/*.md", "docs/**/*.md", "runbooks/*.md")]:
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


def test_docs_pages_and_anchors_cited_in_code_and_tests_exist():
    broken = []
    for source in _tracked(*CITING):
        for page, anchor in DOCS_REF.findall(source.read_text(encoding="utf-8", errors="replace")):
            target = REPO_ROOT / "docs" / page
            if not target.exists():
                if anchor or page not in UPSTREAM_DOCS:
                    broken.append(f"{source.relative_to(REPO_ROOT)}: docs/{page}#{anchor}")
            elif anchor and anchor not in _anchors(target):
                broken.append(f"{source.relative_to(REPO_ROOT)}: docs/{page}#{anchor}")
    assert broken == []


def _cited(heading: str, headings: list[str]) -> bool:
    """A cited heading names a heading of the page, or its start (`"What a complete answer is"`, `"HA ..."`);
    markup, a parenthesised tail and line breaks inside the citation do not count."""
    name = re.sub(r"\s+", " ", heading).strip("`. ").lower().removesuffix("...").strip()
    known = [re.sub(r"`", "", h).lower() for h in headings]
    known += [re.sub(r"\s*\(.*\)$", "", h).strip() for h in known]
    return any(h == name or h.startswith(name) for h in known) if name else False


def test_docs_sections_cited_by_heading_exist():
    broken = []
    for source in _tracked(*CITING):
        for page, heading in DOCS_CITE.findall(source.read_text(encoding="utf-8", errors="replace")):
            target = REPO_ROOT / "docs" / page
            if not target.exists() and page in UPSTREAM_DOCS:
                continue
            if not target.exists() or not _cited(heading, _headings(target)):
                broken.append(f'{source.relative_to(REPO_ROOT)}: docs/{page}, "{heading}"')
    assert broken == []


def test_readme_sections_cited_in_code_and_tests_exist():
    headings = _headings(REPO_ROOT / "README.md")
    broken = []
    for source in _tracked(*CITING):
        if source.name == "test_docs_links.py":
            continue  # this file names the citation forms it checks
        for cited in README_CITE.findall(source.read_text(encoding="utf-8", errors="replace")):
            if not _cited(cited, headings):
                broken.append(f"{source.relative_to(REPO_ROOT)}: {cited}")
    assert broken == []


@pytest.mark.parametrize("citation, headings, cited", [
    ('"Overhead"', ["Overhead"], True),
    ('"What a complete answer is"', ["What a complete answer is, and cancellation"], True),
    ('"Generated and hand-written\nfiles"', ["Generated and hand-written files"], True),
    ('"HA"', ["HA (replicas of Prometheus, Alertmanager and the notifier)"], True),
    ('"Kubernetes ..."', ["Kubernetes with kube-prometheus-stack"], True),
    ('"Selectors"', ["Gateway", "Triton"], False),
    ('""', ["Gateway"], False),
])
def test_a_citation_matches_a_heading_or_its_start(citation, headings, cited):
    assert _cited(citation.strip('"'), headings) is cited


def test_citation_patterns_find_each_form():
    text = 'see docs/ha.md#the-chaos-scenario, docs/gateway-apis.md, "What a complete answer is" and site/docs/x.md'
    assert DOCS_REF.findall(text) == [("ha.md", "the-chaos-scenario"), ("gateway-apis.md", "")]
    assert DOCS_CITE.findall(text) == [("gateway-apis.md", "What a complete answer is")]
    assert README_CITE.findall('(README, "Overhead") and README "HA"') == ["Overhead", "HA"]


def test_readme_stays_an_entry_page():
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text to docs/"


def test_readme_links_every_docs_page():
    """The README's table is the map of the docs: a new page gets a row (benchmark pages through their index)."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for target in LINK.findall(text)}
    pages = {str(p.relative_to(REPO_ROOT)) for p in _tracked("docs/*.md")}
    pages = {p for p in pages if p.count("/") == 1 and p != "docs/index.md"} | {"docs/benchmarks/index.md"}
    assert sorted(pages - linked) == []
