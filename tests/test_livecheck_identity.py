"""`inferwatch check --prometheus` with the spec's identity labels and the `engine` source, against a real
Prometheus scraping a TensorRT-LLM engine's families (tests/fixtures/engine/) as the user's own ServiceMonitor
labels Triton's port: job `serving/triton`, `namespace`, `service`, `endpoint`, `pod`, `container`, and `node`
from a relabelling. Each row is one spec: the lines about selectors.triton and selectors.engine it gives."""

from __future__ import annotations

import pytest
import yaml

from engine_support import EngineExposition
from inferwatch.livecheck import live_problems
from inferwatch.spec import spec_from_dict
from inferwatch.testing.prometheus import start_prometheus

TRITON = 'namespace="serving", service="triton"'
OPERATOR_IDENTITY = {"triton": {"server": "service", "replica": "pod", "node": "node"}}

# (row id, spec data, the start of each expected selectors.triton / selectors.engine line; [] = fits)
ROWS = [
    ("fits", {"selectors": {"triton": TRITON, "engine": TRITON}, "identity": OPERATOR_IDENTITY}, []),
    ("engine-left-at-default", {"selectors": {"triton": TRITON}, "identity": OPERATOR_IDENTITY},
     ['selectors.engine: {job=~"triton.*|vllm.*"} selects none of the']),
    ("identity-left-at-default", {"selectors": {"triton": TRITON, "engine": TRITON}},
     ["selectors.triton: ", "lack the label triton"]),
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    engine = EngineExposition("tensorrt_llm.metrics")
    prom = None
    try:
        labels = {"namespace": "serving", "service": "triton", "endpoint": "metrics", "pod": "triton-0",
                  "container": "triton", "node": "gpu-a"}
        workdir = tmp_path_factory.mktemp("livecheck-identity")
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "serving/triton",
                                "static_configs": [{"targets": [engine.address], "labels": labels}]}]}))
        prom = start_prometheus(workdir, config)
        prom.wait_for('count({job="serving/triton", __name__=~"nv_trt_llm_.+"})', timeout=60)
        yield prom
    finally:
        if prom is not None:
            prom.stop()
        engine.stop()


@pytest.mark.parametrize("data, expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_engine_and_identity_lines(prometheus, data, expected):
    lines = [str(p) for p in live_problems(spec_from_dict(data), prometheus.url)]
    ours = [line for line in lines if line.startswith(("selectors.triton:", "selectors.engine:"))]
    if not expected:
        assert ours == [], lines
        return
    assert len(ours) == 1, lines
    assert ours[0].startswith(expected[0]) and all(part in ours[0] for part in expected[1:]), ours
    if "engine" in expected[0]:
        assert "serving/triton" in ours[0], ours  # names the jobs to select
