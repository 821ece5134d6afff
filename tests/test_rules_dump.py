"""The rules' YAML is written by libyaml's emitter when PyYAML has it (rules/generate.py `_Dumper`, for speed):
it must write exactly the text the pure-Python emitter writes, so the committed files do not depend on how
PyYAML was built. Checked on the specs whose rules differ most (the repository's, the demo's short windows,
a central store's cluster label)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferwatch.rules import generate
from inferwatch.spec import spec_from_dict

REPO = Path(__file__).resolve().parents[1]


def _raw(path: str) -> dict:
    return yaml.safe_load((REPO / path).read_text())


SPECS = {
    "repository": lambda: _raw("inferwatch.yaml"),
    "demo": lambda: _raw("examples/demo/inferwatch.demo.yaml"),
    "central store": lambda: {**_raw("inferwatch.yaml"), "cluster": {"name": "eu-1"},
                              "central_store": {"url": "http://vm:8428", "edge": "vmagent"}},
}


class _PurePython(yaml.SafeDumper):
    pass


_PurePython.add_representer(str, generate._str)


def test_the_fast_emitter_is_libyaml_where_pyyaml_has_it():
    assert issubclass(generate._Dumper, yaml.CSafeDumper) == yaml.__with_libyaml__


@pytest.mark.parametrize("name", SPECS)
def test_libyaml_writes_the_rules_as_the_pure_python_emitter_does(name, monkeypatch):
    spec = spec_from_dict(SPECS[name]())
    fast = generate.outputs(spec)
    monkeypatch.setattr(generate, "_Dumper", _PurePython)
    assert generate.outputs(spec) == fast
