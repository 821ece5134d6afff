"""GPU-to-pod attribution from the kubelet's PodResources v1 API (`List`) over its unix socket.

`PodAttribution.refresh()` runs once per collection (collector.py): it calls `List` (bounded by
`timeout_s`, answers up to MAX_ANSWER_BYTES) and keeps the answer as a `pods.PodMap`, logging which devices
changed holders. Behaviour, each logged once per condition:
  - no socket at the path: no namespace/pod/container labels ("runs without them and says so once"); checked
    again at every refresh, so a kubelet that comes up later is picked up
  - the socket answers: attribution on (logged when it starts and when it comes back)
  - a call fails (kubelet restarting, permission denied): the last answer is kept until one succeeds,
    since a kubelet restart does not move pods; `up` reads False meanwhile
  - the socket goes away: the labels go with it (nothing left to vouch for them)
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from inferwatch.exporters.gpu.pods import Assignment, PodMap, PodRef

log = logging.getLogger(__name__)
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_ANSWER_BYTES = 16 * 1024 * 1024   # a List answer for hundreds of pods is well under this


def assignments(answer: Any) -> list[Assignment]:
    """Every (resource, device id, container) of a ListPodResourcesResponse, in the kubelet's order."""
    out: list[Assignment] = []
    for pod in answer.pod_resources:
        for container in pod.containers:
            holder = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                out.extend(Assignment(devices.resource_name, device_id, holder) for device_id in devices.device_ids)
    return out


class PodResourcesClient:
    """`List` on the kubelet's pod-resources socket. Raises grpc.RpcError (e.g. UNAVAILABLE, DEADLINE_EXCEEDED)."""

    def __init__(self, socket_path: str, timeout_s: float = 2.0):
        import grpc

        from inferwatch.exporters.gpu.podresources import api_pb2, api_pb2_grpc

        self._pb: Any = api_pb2  # generated: protobuf builds its message classes at import
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix://{os.path.abspath(socket_path)}",
                                              options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)])
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def list(self) -> Any:
        return self._stub.List(self._pb.ListPodResourcesRequest(), timeout=self._timeout_s)

    def close(self) -> None:
        self._channel.close()


class PodAttribution:
    """Who holds which GPU, refreshed from the kubelet. `current` is the last good PodMap (empty = no labels);
    `up` is True while the last `List` answered. Thread-safe."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0):
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._map = PodMap()
        self._client: PodResourcesClient | None = None
        self._state = ""          # the last condition logged: "", "no-socket", "up", "error:<code>"
        self.up = False

    @property
    def current(self) -> PodMap:
        with self._lock:
            return self._map

    def refresh(self) -> None:
        """Ask the kubelet once; never raises (failures are logged and keep the last answer)."""
        if not Path(self.socket_path).exists():
            self._close()
            self._set(PodMap(), up=False)
            self._note("no-socket", logging.INFO, "no kubelet pod-resources socket at %s: GPU series carry no "
                       "namespace/pod/container labels (mount the socket into the exporter to attribute GPUs "
                       "to pods)", self.socket_path)
            return
        import grpc

        try:
            if self._client is None:
                self._client = PodResourcesClient(self.socket_path, self.timeout_s)
            answer = self._client.list()
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            with self._lock:
                self.up = False
            self._note(f"error:{code}", logging.WARNING, "kubelet pod-resources List at %s failed (%s: %s); "
                       "keeping the last pod labels until it answers", self.socket_path, code,
                       exc.details() if hasattr(exc, "details") else exc)
            return
        self._note("up", logging.INFO, "attributing GPUs to pods from the kubelet's pod-resources API at %s",
                   self.socket_path)
        self._set(PodMap.of(assignments(answer)), up=True)

    def _set(self, new: PodMap, up: bool) -> None:
        with self._lock:
            old, self._map, self.up = self._map, new, up
        if new.by_id != old.by_id:
            before, after = old.describe(), new.describe()
            for device in sorted(set(before) | set(after)):
                if before.get(device) != after.get(device):
                    log.info("pod-resources: device %s %s", device,
                             f"held by {after[device]}" if device in after else f"released by {before[device]}")

    def _note(self, state: str, level: int, message: str, *args: Any) -> None:
        if state != self._state:
            self._state = state
            log.log(level, message, *args)

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
