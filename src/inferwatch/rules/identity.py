"""The identity of each alert's subject: the labels that make one incident, per source, in one place.

Every rule, dashboard and triage query that reduces a source's series to "one thing that can break" reads
these tuples, so making them configurable (per source, in the spec's selectors) changes this module only.
docs/alerts.md ("What one alert means") lists, per alert, the identity it gets from here.

- A physical GPU (`GPU`): the exporter target that reads it (`job`, `instance`: one per node, stable across
  workload pods), `node`, `gpu` (index) and `UUID`, plus labels that are functions of the device (and its
  driver) and so never split it: `pci_bus_id`, `device`, `modelName`, `Hostname`/`hostname` (dcgm-exporter
  spells it either way by version), `DCGM_FI_DRIVER_VERSION`. Device-wide
  fields (temperature, power, clock-event reasons, XID, ECC, row remap) are reduced to it with `max by`:
  dcgm-exporter in MIG mode writes them once per GPU instance, each copy with `GPU_I_ID`/`GPU_I_PROFILE` and
  the same `gpu`/`UUID`, and one A100 at 91 °C split into three instances is one hot GPU, not three.
- A MIG instance (`GPU_INSTANCE`): the GPU plus dcgm-exporter's `GPU_I_ID` and `GPU_I_PROFILE` (label names
  from dcgm-exporter's MIG support, `pkg/dcgmexporter`: "GPU_I_ID", "GPU_I_PROFILE"). Only per-instance fields
  (framebuffer, profiling utilization) are judged per instance; on a GPU without MIG both labels are absent
  and the instance is the GPU.
- Pod labels (`POD`: `namespace`, `pod`, `container` of the pod holding the GPU) are never identity: a GPU
  whose pod is rescheduled is the same GPU, so its alert keeps its `for` and stays one incident. Alerts name
  the pod in their description instead (`pods_holding`).
- A Triton server (`TRITON`): `node`, `triton` (the server label the scrape configuration gives, in
  Kubernetes the Service name) and `pod` (the replica behind that Service: the Prometheus Operator's target
  label on Triton's own series). The collector knows no pod names: its series of one replica take `pod` and
  `node` from Triton's own scrape of the same pod IP (rules/replicas.py), or carry the `pod` its own scrape
  gives (a collector beside each Triton). Outside Kubernetes `pod` is absent on both and `triton` alone
  names the server. Every join between Triton's series and the collector's matches on it, so N replicas
  behind one Service give N results, never a many-to-many error.
"""

from __future__ import annotations

import dataclasses

from inferwatch.selectors import Selector

# --------------------------------------------------------------------------------------------------- GPUs
GPU: tuple[str, ...] = ("job", "instance", "node", "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                         "hostname", "DCGM_FI_DRIVER_VERSION")
MIG: tuple[str, ...] = ("GPU_I_ID", "GPU_I_PROFILE")
GPU_INSTANCE: tuple[str, ...] = GPU + MIG
POD: tuple[str, ...] = ("namespace", "pod", "container")

# Utilization 0-1 of a GPU or MIG instance, first source that exists (per instance):
# DCGM_FI_DEV_GPU_UTIL (percent; dcgm-exporter writes none for a MIG instance), then the profiling field
# DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio; dcgm-exporter's maintainers' answer for MIG utilization).
UTILIZATION_CHAIN: tuple[tuple[str, float], ...] = (("DCGM_FI_DEV_GPU_UTIL", 100.0),
                                                    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0))

# ------------------------------------------------------------------------------------------------- Triton
TRITON_REPLICA = "pod"
TRITON: tuple[str, ...] = ("node", "triton", TRITON_REPLICA)
# The server without `node`: joins with the collector, whose series of one replica carry the collector's node
# only where the scrape configuration relabels it.
TRITON_SERVER: tuple[str, ...] = ("triton", TRITON_REPLICA)
# The labels the Triton collector writes on its own series (exporters/triton/families.py), whatever the spec.
COLLECTOR_SERVER, COLLECTOR_REPLICA, COLLECTOR_NODE = "triton", "pod", "node"


@dataclasses.dataclass(frozen=True)
class TritonLabels:
    """The spec's identity labels of a Triton server (spec `identity.triton`): `server`, `replica`, `node`.
    Defaults are `triton`, `pod`, `node`, so every expression reads exactly as with the constants above."""

    server: str = COLLECTOR_SERVER
    replica: str = COLLECTOR_REPLICA
    node: str = COLLECTOR_NODE

    @classmethod
    def of(cls, spec) -> "TritonLabels":
        ident = spec.identity.triton
        return cls(ident.server, ident.replica, ident.node)

    @property
    def ident(self) -> tuple[str, ...]:
        """One replica: (node, server, replica), the order of TRITON."""
        return (self.node, self.server, self.replica)

    @property
    def server_ident(self) -> tuple[str, ...]:
        """One replica without its node (TRITON_SERVER): what the collector's series share with Triton's."""
        return (self.server, self.replica)

    @property
    def model_version(self) -> tuple[str, ...]:
        return self.ident + ("model", "version")

    def from_collector(self, expr: str) -> str:
        """`expr` (collector series) with the collector's `triton`/`pod`/`node` labels copied to the spec's
        names, so it joins with Triton's own series; `expr` unchanged with the default names. The copy
        keeps the collector's label too (an alert on it carries both)."""
        for theirs, ours in ((COLLECTOR_SERVER, self.server), (COLLECTOR_REPLICA, self.replica),
                             (COLLECTOR_NODE, self.node)):
            if theirs != ours:
                expr = f'label_replace({expr}, "{ours}", "$1", "{theirs}", "(.*)")'
        return expr

    @property
    def default(self) -> bool:
        return (self.server, self.replica, self.node) == (COLLECTOR_SERVER, COLLECTOR_REPLICA, COLLECTOR_NODE)


def by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def device_wide(expr: str) -> str:
    """`max by (GPU) (expr)`: a device-wide field reduced to the physical GPU (MIG copies and pod labels go)."""
    return f"max by ({by(GPU)}) ({expr})"


def per_instance(expr: str) -> str:
    """`max by (GPU_INSTANCE) (expr)`: a per-instance field, one series per MIG instance (per GPU without
    MIG), without the pod labels."""
    return f"max by ({by(GPU_INSTANCE)}) ({expr})"


def utilization(gpu: Selector, *matchers: str, keep: tuple[str, ...] = GPU_INSTANCE, over: str = "") -> str:
    """Utilization 0-1 along UTILIZATION_CHAIN, one series per `keep` labels: the first field a GPU (by UUID)
    exports; later fields only for GPUs lacking every earlier one. `matchers`: extra label matchers (text);
    `over`: a range (`5m`) to average each field over instead of its last value. Unknown (no field) is absent."""
    parts = []
    for metric, scale in UTILIZATION_CHAIN:
        sel = gpu(metric, *matchers)
        value = f"avg_over_time({sel}[{over}])" if over else sel
        scaled = f"max by ({by(keep)}) ({value})" + (f" / {scale:g}" if scale != 1 else "")
        parts.append(scaled)
    return "\nor on (UUID)\n".join(parts)


def pods_holding(gpu: Selector, uuid_arg: str = '(index $labels "UUID")', cluster: tuple[str, str] = ("", "")) -> str:
    """A Go-template fragment for an alert's description: ` Pods on it: ns/pod, ...` for the pods holding the
    GPU (or its MIG instances), read at notification time from DCGM_FI_DEV_FB_USED's pod labels; nothing
    where no pod holds it. `cluster`: (matcher, printf argument) scoping the query to the alert's cluster."""
    from inferwatch.selectors import go_string

    matcher, arg = cluster
    sel = gpu("DCGM_FI_DEV_FB_USED", *([matcher] if matcher else []), "UUID=%q", 'pod!=""')
    query = go_string(f"group by (namespace, pod) ({sel})")
    return (f'{{{{ with printf "{query}"{arg} {uuid_arg} | query }}}} Pods on it:'
            f'{{{{ range $i, $p := sortByLabel "pod" . }}}}{{{{ if $i }}}},{{{{ end }}}} {{{{ $p.Labels.namespace }}}}/'
            f'{{{{ $p.Labels.pod }}}}{{{{ end }}}}.{{{{ end }}}}')
