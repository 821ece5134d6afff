"""Which pod holds which GPU: the kubelet's device assignments, resolved against NVML's identities.

The kubelet's PodResources API (v1 `List`, kubelet.py) answers, per pod and container, the device IDs the
NVIDIA device plugin assigned. This module turns that answer into a `PodMap` and resolves the IDs the way
dcgm-exporter does (internal/pkg/transformation/kubernetes.go of NVIDIA/dcgm-exporter), so the
`namespace`, `pod` and `container` labels land on the same series:

  resources   `nvidia.com/gpu` (also `nvidia.com/gpu.shared` and other `nvidia.com/gpu*` renames) and
              `nvidia.com/mig-<profile>`; other resources are not GPUs and are ignored
  whole GPU   the GPU UUID ("GPU-…", the device plugin's default), or the device name "nvidia<N>"
  MIG         the MIG device UUID ("MIG-…", drivers >= 470), the legacy "MIG-GPU-<uuid>/<gi>/<ci>", or
              GKE's "nvidia<N>/gi<M>"; the labels go to that instance's series (GPU_I_ID), not the parent's
  sharing     a time-slicing replica suffix ("::<n>", GKE "/vgpu<n>") is stripped; when several containers
              hold one device, the last one the kubelet lists names it (dcgm-exporter does the same)
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from inferwatch.exporters.gpu.reading import GpuIdentity, MigReading

_LEGACY_MIG = re.compile(r"^MIG-(GPU-[^/]+)/(\d+)/(\d+)$")
_REPLICA = re.compile(r"(::\d+|/vgpu\d+)$")


@dataclasses.dataclass(frozen=True)
class PodRef:
    """The container a device is assigned to (dcgm-exporter's label names)."""

    namespace: str
    pod: str
    container: str

    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One device ID the kubelet lists for a container, with its resource name."""

    resource: str
    device_id: str
    holder: PodRef


def is_gpu_resource(resource: str) -> bool:
    return resource.startswith("nvidia.com/gpu") or resource.startswith("nvidia.com/mig-")


@dataclasses.dataclass(frozen=True)
class PodMap:
    """Device ID -> holder, after filtering resources and stripping replica suffixes. Empty = no labels."""

    by_id: dict[str, PodRef] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, assignments: Iterable[Assignment]) -> PodMap:
        by_id: dict[str, PodRef] = {}
        for a in assignments:
            if is_gpu_resource(a.resource):
                by_id[_REPLICA.sub("", a.device_id)] = a.holder
        return cls(by_id)

    def for_gpu(self, gpu: GpuIdentity) -> PodRef | None:
        """The holder of the whole GPU, by UUID or by device name."""
        return (self.by_id.get(gpu.uuid) if gpu.uuid else None) or self.by_id.get(f"nvidia{gpu.index}")

    def for_mig(self, gpu: GpuIdentity, mig: MigReading) -> PodRef | None:
        """The holder of one MIG instance of `gpu`, by MIG UUID, legacy MIG-GPU id or GKE name."""
        if mig.uuid and mig.uuid in self.by_id:
            return self.by_id[mig.uuid]
        for device_id, holder in self.by_id.items():
            legacy = _LEGACY_MIG.match(device_id)
            if legacy and legacy.group(1) == gpu.uuid and int(legacy.group(2)) == mig.gi_id:
                return holder
        return self.by_id.get(f"nvidia{gpu.index}/gi{mig.gi_id}")

    def describe(self) -> dict[str, str]:
        """{device id: "namespace/pod/container"} for log lines."""
        return {k: f"{v.namespace}/{v.pod}/{v.container}" for k, v in sorted(self.by_id.items())}

