"""Runbook evidence queries with the spec's identity labels (spec `identity`, docs/selectors.md).

Runbooks are written with the default names: `triton=~"{{ $labels.triton }}"`, `pod=~"{{ $labels.pod }}"`,
`node=~"{{ $labels.node }}"`. Where the spec names them otherwise (a ServiceMonitor's `service`, dcgm-exporter's
`Hostname`), each such matcher is renamed in every vector selector whose series carry the spec's names (Triton's
own, the engines', recorded series, the GPU source's), and the alert's labels get the default names as aliases,
so the placeholders still find its values. The Triton collector's own series keep `triton`/`pod`/`node`
(its own labels), so their matchers are left as written.
"""

from __future__ import annotations

import re
from typing import Mapping

from inferwatch.spec import Spec

__all__ = ["with_identity", "node_label"]

# A vector selector's braces (no nesting in PromQL) and one default-named identity matcher inside them.
_BLOCK = re.compile(r"\{[^{}]*(?:\{\{[^{}]*\}\}[^{}]*)*\}")
_MATCHER = re.compile(r'(?<![\w$])(triton|pod|node)(\s*=~\s*"\{\{ \$labels\.)(triton|pod|node)( \}\}")')
COLLECTOR = "$triton_collector_selector"
GPU = "$gpu_selector"


def node_label(spec: Spec, layer: str | None) -> str:
    """The node label of an alert of `layer`: the GPU source's for L1, Triton's otherwise."""
    return spec.identity.gpu.node if layer == "L1" else spec.identity.triton.node


def _names(spec: Spec, node: str) -> dict[str, str]:
    ids = spec.identity.triton
    return {"triton": ids.server, "pod": ids.replica, "node": node}


def with_identity(expr: str, labels: Mapping[str, str], spec: Spec) -> tuple[str, dict[str, str]]:
    """(expr, labels) for `scoped`: `expr` with its default-named identity matchers renamed to the spec's
    (module doc), and `labels` with the default names aliased to the alert's spec-named labels (an alert's
    own label of that name wins). Unchanged with the default identity."""
    node = node_label(spec, labels.get("layer"))
    triton = _names(spec, node)
    gpu = {**triton, "node": spec.identity.gpu.node}
    out = dict(labels)
    for default, name in triton.items():
        if name != default and not out.get(default) and out.get(name):
            out[default] = out[name]
    if all(k == v for k, v in triton.items()) and spec.identity.gpu.node == "node":
        return expr, out

    def block(m: re.Match) -> str:
        text = m.group(0)
        if COLLECTOR in text:
            return text
        names = gpu if GPU in text else triton
        return _MATCHER.sub(lambda mm: names[mm.group(1)] + mm.group(2) + mm.group(3) + mm.group(4), text)
    return _BLOCK.sub(block, expr), out
