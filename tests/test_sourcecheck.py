"""`inferwatch check` warns where selectors, identity labels and upstreams each valid alone do not fit together
(inferwatch/sourcecheck.py): one row per combination, the fitting defaults as a row with no warning, and the
CLI printing the line and still passing. A model served by an OpenAI-compatible upstream gets no Triton rule."""

from __future__ import annotations

import json

import pytest

from inferwatch.cli import main
from inferwatch.rules.generate import outputs
from inferwatch.sourcecheck import findings
from inferwatch.spec import spec_from_dict

VLLM = {"triton": {"kind": "triton", "url": "http://triton:8000", "default": True},
        "vllm": {"kind": "openai", "url": "http://vllm:8000", "models": ["llama3"]}}

# (row id, spec data, the start of each expected warning; [] = fits)
ROWS = [
    ("defaults", {}, []),
    ("same-node-label", {"identity": {"triton": {"server": "service", "node": "Hostname"},
                                      "gpu": {"node": "Hostname"}}}, []),
    ("gpu-node-differs", {"identity": {"gpu": {"node": "Hostname"}}},
     ["identity.gpu.node (Hostname) and identity.triton.node (node) differ"]),
    ("engine-default-custom-triton", {"selectors": {"triton": 'namespace="serving", service="triton"'}},
     ["selectors.engine keeps its default"]),
    ("engine-follows-custom-triton", {"selectors": {"triton": 'namespace="serving", service="triton"',
                                                    "engine": 'namespace="serving", service="triton"'}}, []),
    ("engine-is-gpu", {"selectors": {"engine": 'job="inferwatch-gpu"'}},
     ["selectors.engine selects the same series as selectors.gpu"]),
    ("engine-is-triton", {"selectors": {"engine": 'job="triton"'}}, []),
    ("own-monitor-default-server", {"kubernetes": {"triton": {"monitor": False}},
                                    "selectors": {"engine": 'namespace="triton", service="triton"'}},
     ["kubernetes.triton.monitor is false"]),
    ("own-monitor-service-server", {"kubernetes": {"triton": {"monitor": False}},
                                    "selectors": {"engine": 'namespace="triton", service="triton"'},
                                    "identity": {"triton": {"server": "service"}}}, []),
]


@pytest.mark.parametrize("data, expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_each_misfit_is_one_warning(data, expected):
    found = findings(spec_from_dict(data))
    assert len(found) == len(expected), found
    for line, start in zip(found, expected, strict=True):
        assert line.startswith(start), line


def test_check_prints_the_warning_and_passes(tmp_path, capsys):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"identity": {"gpu": {"node": "Hostname"}}}))
    assert main(["check", "--spec", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: identity.gpu.node (Hostname) and identity.triton.node (node) differ" in err, err
    assert "Traceback" not in err


def test_a_model_of_an_openai_upstream_gets_no_triton_rule():
    # In `models` (gateway labels) and served by vLLM: TritonModelNotLoaded lists the Triton model only.
    spec = spec_from_dict({"upstreams": VLLM, "models": ["llama3", "simple"]})
    triton = outputs(spec)["rules/generated/triton.yml"]
    assert 'model", "simple"' in triton
    assert "llama3" not in triton
