"""Selectors, identity labels and upstreams that are each valid but do not fit together: warnings of
`inferwatch check` (one line each, naming the spec fields and what to write instead).

- `identity.gpu.node` differs from `identity.triton.node`: Alertmanager's inhibit `equal:` compares one label
  name on both alerts, so GpuLost/GpuNvmlLost cannot hold back the Triton alerts of their node and the
  generated configuration leaves that inhibition out (deploy/alertmanager.py).
- `kubernetes.triton.monitor: false` (the user's own ServiceMonitor) with `identity.triton.server` left at
  `triton`, which the Prometheus Operator's target labels never include (`service` names the Service).
- `selectors.triton` changed while `selectors.engine` keeps its default (`job=~"triton.*|vllm.*"`): the
  engines' families on Triton's port carry Triton's labels, whose job may match neither prefix.
- `selectors.engine` equal to another source's selector but Triton's: the engine rules would read that
  source's series (only Triton's port serves engine families besides a vLLM server's own job).

A model in `models` that an OpenAI-compatible upstream serves gets no Triton rule (inferwatch.upstreams
.triton_models), and an L2 threshold for it is refused by the spec itself.
"""

from __future__ import annotations

from inferwatch.selectors import SOURCES, default_selector, parse
from inferwatch.spec import Spec

__all__ = ["findings"]


def findings(spec: Spec) -> list[str]:
    """Warning lines (no prefix) for the combinations in the module doc; [] when everything fits."""
    out = []
    gpu_node, triton_node = spec.identity.gpu.node, spec.identity.triton.node
    if gpu_node != triton_node:
        out.append(f"identity.gpu.node ({gpu_node}) and identity.triton.node ({triton_node}) differ: "
                   f"Alertmanager's inhibit `equal` compares one label name, so GpuLost and GpuNvmlLost will not "
                   f"hold back the Triton alerts of their node (that inhibition is left out); relabel both "
                   f"sources' node to one label name and set it in both")
    if not spec.kubernetes.triton.monitor and spec.identity.triton.server == "triton":
        out.append("kubernetes.triton.monitor is false (your own ServiceMonitor scrapes Triton) while "
                   "identity.triton.server is `triton`, a label the Prometheus Operator does not write: two Tritons "
                   "would be summed into one; set identity.triton.server: service (docs/selectors.md)")
    engine = spec.selectors.engine
    if engine == default_selector("engine") and spec.selectors.triton != default_selector("triton"):
        out.append(f"selectors.engine keeps its default ({engine}) while selectors.triton is "
                   f"{spec.selectors.triton!r}: the engines' families on Triton's port carry Triton's labels, "
                   f"so set selectors.engine to select them (e.g. the same as selectors.triton, or a regex "
                   f"covering Triton's and your vLLM servers' jobs)")
    engine_matchers = frozenset(parse(engine).matchers)
    for source in SOURCES:
        if source in ("engine", "triton"):
            continue
        if frozenset(spec.selectors.of(source).matchers) == engine_matchers:
            out.append(f"selectors.engine selects the same series as selectors.{source} ({engine}): the engine "
                       f"rules would read that source's series; give the engines Triton's selector or their "
                       f"own job")
    return out
