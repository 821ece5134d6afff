"""Which GPUs NVML lists now, matched by UUID against every GPU the exporter has seen.

Why each collection: the device list is not fixed. A GPU unbound from the driver (after XID 79 "fallen off the
bus", or by an operator) or hot-removed leaves `nvmlDeviceGetCount`, and the GPUs after it move down one index
(NVML numbers what it enumerates). A handle taken before then may answer "invalid argument" to every call, an
error that reads as "field not supported": kept, it gave `inferwatch_gpu_up 1` with no readings. So every
collection re-opens every listed index (nvmlDeviceGetHandleByIndex + nvmlDeviceGetUUID, two calls per GPU) and:

- a GPU seen before (same UUID) is read through the new handle, under the identity (labels) it was first seen
  with, so its series and its alerts' `for` continue whatever index NVML gives it now;
- a GPU seen before whose UUID is not among the GPUs opened now (left the list, or can no longer be opened) is
  **lost**: `inferwatch_gpu_up 0` under its identity, until it is listed and opens again;
- a new UUID is a new GPU (its PCI bus id and name are read once);
- an index that cannot be opened, for a GPU never named, stays a bare `GpuIdentity(index)` reading `up` 0,
  as at discovery.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from inferwatch.exporters.gpu.nvml import Nvml
from inferwatch.exporters.gpu.reading import Device, ErrorTally, GpuIdentity, _call, _DeviceLost, open_device

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DeviceList:
    """One enumeration: `present` (devices to read, handles set; bare unnamed ones with handle None), `lost`
    (identities of GPUs seen before and not opened now), `count` (nvmlDeviceGetCount)."""

    present: tuple[Device, ...]
    lost: tuple[GpuIdentity, ...]
    count: int


class SeenGpus:
    """Every GPU the exporter has opened, by UUID, with the identity it was first seen with. Not thread-safe:
    the collector calls it under its lock."""

    def __init__(self) -> None:
        self.by_uuid: dict[str, GpuIdentity] = {}
        self._lost_logged: set[str] = set()

    def remember(self, devices: list[Device]) -> None:
        """Record the named, opened `devices` (discovery) without replacing an identity already seen."""
        for d in devices:
            if d.handle is not None and d.identity.uuid:
                self.by_uuid.setdefault(d.identity.uuid, d.identity)

    def enumerate(self, nvml: Nvml, tally: ErrorTally) -> DeviceList:
        """Open every index NVML lists now. Raises reading.LibraryLost (from the count or any call)."""
        count = _call(tally, "-", "device_count", nvml.device_count) or 0
        present: list[Device] = []
        opened: set[str] = set()
        for index in range(count):
            handle = _call_quiet(tally, index, "device_handle", nvml.device_handle, index)
            uuid = None if handle is None else _call_quiet(tally, index, "uuid", nvml.uuid, handle)
            if handle is None or not uuid:
                present.append(Device(GpuIdentity(index), None))   # cannot be named: read as lost, bare
                continue
            if uuid in opened:      # NVML listing one UUID twice would be a driver bug; read it once
                continue
            opened.add(uuid)
            identity = self.by_uuid.get(uuid)
            if identity is None:
                identity = open_device(nvml, tally, index, None).identity
                if identity.uuid != uuid:     # it changed between the two reads: take it next collection
                    continue
                self.by_uuid[uuid] = identity
            elif uuid in self._lost_logged:
                self._lost_logged.discard(uuid)
                log.warning("GPU %s (%s) is listed again, at NVML index %d; reading it", identity.index, uuid, index)
            present.append(Device(identity, handle))
        lost = tuple(ident for uuid, ident in sorted(self.by_uuid.items()) if uuid not in opened)
        for ident in lost:
            if ident.uuid not in self._lost_logged:
                self._lost_logged.add(ident.uuid)
                log.warning("GPU %d (%s) is no longer in NVML's device list or cannot be opened: lost "
                            "(inferwatch_gpu_up 0) until it comes back", ident.index, ident.uuid)
        return DeviceList(tuple(_without_lost_bare(present, lost)), lost, count)


def _without_lost_bare(present: list[Device], lost: tuple[GpuIdentity, ...]) -> list[Device]:
    """`present` less one bare (unopenable, unnamed) index per lost GPU: such an index is most likely that GPU,
    which its named identity reports already. Bare indexes at a lost GPU's old index go first; the surplus
    (GPUs never opened since start) stays."""
    bare = [d for d in present if d.handle is None]
    lost_indexes = {ident.index for ident in lost}
    bare.sort(key=lambda d: d.identity.index not in lost_indexes)
    drop = {id(d) for d in bare[:len(lost)]}
    return [d for d in present if id(d) not in drop]


def _call_quiet(tally: ErrorTally, gpu: int, call: str, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None when it fails with a device-level error (counted); LibraryLost propagates."""
    try:
        return _call(tally, gpu, call, fn, *args, strict=True)
    except _DeviceLost:
        return None
