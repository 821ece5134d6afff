"""deploy/webhook_size.py `_escaped` counts the bytes Go's encoding/json (HTML escaping on) writes for a
string with str methods; it must give what a walk over the characters gives, as Go's encoder
(encoding/json `appendString`) writes them: `"` `\\` `\\n` `\\r` `\\t` as 2 bytes, `<` `>` `&` U+2028 U+2029 and
the other control characters as 6 (`\\u003c`), every other character as its UTF-8 bytes, plus 2 quotes."""

from __future__ import annotations

import pytest

from conftest import REPO_ROOT
from inferwatch.deploy import webhook_size
from inferwatch.rules.generate import rule_groups
from inferwatch.spec import load_spec


def walk(text: str) -> int:
    out = 2
    for ch in text:
        if ch in "<>&\u2028\u2029" or ord(ch) < 0x20:
            out += 6 if ch not in "\n\r\t" else 2
        elif ch in "\"\\":
            out += 2
        else:
            out += len(ch.encode("utf-8"))
    return out


@pytest.mark.parametrize("text, expected", [
    ("", 2), ("abc", 5), ('"', 4), ("\\", 4), ("\n", 4), ("\r\t", 6), ("<", 8), ("a&b", 10),
    ("\u2028", 8), ("\u2029x", 9), ("\x00", 8), ("\x1f", 8), ("\x0b\x0c", 14), ("é", 4), ("€", 5), ("🙂", 6),
    ("\x7f", 3), ("{{ $labels.model }} > 0.5\n", 34),
])
def test_escaped_bytes_per_character_kind(text, expected):
    assert walk(text) == expected
    assert webhook_size._escaped(text) == expected


def test_every_code_point_below_0x3000_and_every_generated_annotation_counts_as_the_walk_does():
    texts = [chr(c) for c in range(0x3000)] + ["".join(chr(c) for c in range(0x3000))]
    for groups in rule_groups(load_spec(REPO_ROOT / "inferwatch.yaml")).values():
        for g in groups:
            for r in g.rules:
                texts += [str(v) for v in (getattr(r, "annotations", None) or {}).values()]
                texts += [str(getattr(r, "expr", ""))]
    assert len(texts) > 3000
    assert [webhook_size._escaped(t) for t in texts] == [walk(t) for t in texts]
