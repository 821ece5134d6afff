"""The generated spec reference (docs/spec-reference.md) documents every field of the spec's sections."""

from __future__ import annotations

import dataclasses
import re

from inferwatch.spec import GatewaySettings, Spec, Tier
from inferwatch.specdoc import _sections, render


def test_every_field_of_every_section_is_a_row_under_its_path():
    text = render()
    sections = []
    _sections(Spec, "", Spec(), sections)
    headings = re.findall(r"^## `?([^`\n]+)`?$", text, flags=re.M)
    assert headings == ["Top level"] + [path for path, _, _ in sections[1:]]
    rows = re.findall(r"^\| `([^`]+)` \|", text, flags=re.M)
    expected = [f.metadata.get("key", f.name) for _, cls, _ in sections for f in dataclasses.fields(cls)]
    assert rows == expected


def test_a_row_carries_type_default_and_the_field_doc():
    text = render()
    section = text[text.index("## `gateway`"):]
    doc = next(f.metadata["doc"] for f in dataclasses.fields(GatewaySettings) if f.name == "upstream_timeout")
    assert f"| `upstream_timeout` | duration | `5m` | {doc} |" in section
    assert "## `tiers.<name>`" in text
    assert len([f for f in dataclasses.fields(Tier)]) == len(
        re.findall(r"^\| `", text[text.index("## `tiers.<name>`"):].split("\n## ")[0], flags=re.M))
