"""The XID event thread: registers every GPU for XID critical-error events and counts them by code.

NVML delivers XIDs only as events (`nvmlEventSetWait_v2`; a timeout is the normal "nothing happened"),
with no history, so this runs continuously beside the collection loop. It re-registers whenever the
collector's device list changes (re-init after library loss, a GPU readable again). A GPU whose events
are unsupported (some VMs and containers) is skipped and the error counted.
"""

from __future__ import annotations

import logging
import threading

import pynvml

from inferwatch.exporters.gpu.collector import GpuCollector
from inferwatch.exporters.gpu.nvml import LIBRARY_LOST, Nvml

log = logging.getLogger(__name__)


class XidWatcher:
    """Waits on NVML events for the collector's GPUs; `timeout_ms` bounds each wait (and stop latency)."""

    def __init__(self, nvml: Nvml, collector: GpuCollector, timeout_ms: int = 1000, idle_s: float = 0.5):
        self.nvml = nvml
        self.collector = collector
        self.timeout_ms = timeout_ms
        self.idle_s = idle_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="gpu-xid-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.timeout_ms / 1000 + 5)

    def run(self) -> None:
        while not self._stop.is_set():
            generation, devices = self.collector.devices_for_events()
            if devices is None:
                self._stop.wait(self.idle_s)
                continue
            try:
                self._watch(generation, devices)
            except pynvml.NVMLError as exc:
                cls = self.collector.tally.record(exc, "-", "xid_events")
                # Wait for the collector to notice and re-initialise rather than spin on a dead library.
                while (cls == LIBRARY_LOST and not self._stop.is_set()
                       and self.collector.generation == generation):
                    self._stop.wait(self.idle_s)
                if cls != LIBRARY_LOST:
                    self._stop.wait(self.idle_s)
            except Exception:
                log.exception("XID event thread failed; restarting it")
                self._stop.wait(self.idle_s)

    def _watch(self, generation: int, devices: list) -> None:
        event_set = self.nvml.event_set_create()
        try:
            by_key = {}
            for device in devices:
                try:
                    self.nvml.register_xid_events(device.handle, event_set)
                    by_key[self.nvml.device_key(device.handle)] = device.identity
                except pynvml.NVMLError as exc:
                    if self.collector.tally.record(exc, device.identity.index, "register_xid_events") == LIBRARY_LOST:
                        raise
            while not self._stop.is_set() and self.collector.generation == generation:
                try:
                    event = self.nvml.wait_xid_event(event_set, self.timeout_ms)
                except pynvml.NVMLError_Timeout:
                    continue
                identity = by_key.get(event.device_key)
                if identity is None:
                    log.warning("XID %d from an unregistered device; ignored", event.xid)
                    continue
                self.collector.record_xid(identity, event.xid)
        finally:
            try:
                self.nvml.event_set_free(event_set)
            except pynvml.NVMLError:
                pass  # the library may already be gone; the set went with it
