"""GPUs attributed to pods: a local gRPC server implementing the kubelet's PodResources v1 service (the stubs
generated from exporters/gpu/podresources/api.proto) on a unix socket, the simulated NVML, real scrapes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import grpc
import pytest
import requests

from gpu_support import FakeClock, fake_kubelet, samples
from inferwatch.exporters.gpu.collector import GpuCollector
from inferwatch.exporters.gpu.kubelet import PodAttribution
from inferwatch.exporters.gpu.podresources import api_pb2
from inferwatch.exporters.gpu.pods import Assignment, PodMap, PodRef
from inferwatch.exporters.gpu.reading import GpuIdentity, MigReading
from inferwatch.exporters.gpu.scenario import parse_scenario
from inferwatch.exporters.gpu.server import MetricsServer
from inferwatch.exporters.gpu.sim import SimNvml

MIG_SCENARIO = {"gpus": 2, "mig": {1: [{"profile": "3g.40gb", "gi_id": 1, "memory_total_mib": 40192},
                                       {"profile": "1g.10gb", "gi_id": 9, "memory_total_mib": 9728}]}}


@pytest.fixture
def kubelet():
    with fake_kubelet() as (fake, path):
        yield fake, path


@pytest.fixture
def exporter(kubelet):
    fake, path = kubelet
    clock = FakeClock()
    sim = SimNvml(parse_scenario(MIG_SCENARIO), clock=clock)
    pods = PodAttribution(path, timeout_s=5)
    collector = GpuCollector(sim, "node-a", wall=clock, monotonic=clock, pods=pods)
    collector.collect_once()   # discovers the GPUs (and the MIG UUIDs the kubelet will hand out)
    server = MetricsServer.for_collector(collector, "127.0.0.1", 0)
    server.start()
    yield fake, collector, f"http://127.0.0.1:{server.port}/metrics"
    server.stop()


def _pods(url: str) -> dict[tuple[str, str, str], tuple | None]:
    """{(metric, gpu, GPU_I_ID): (namespace, pod, container) or None} from a real scrape."""
    text = requests.get(url, timeout=10).text
    return {(s.name, s.labels["gpu"], s.labels.get("GPU_I_ID", "")):
            (s.labels["namespace"], s.labels["pod"], s.labels["container"]) if "pod" in s.labels else None
            for s in samples(text) if "gpu" in s.labels and s.name != "inferwatch_gpu_clocks_event_active"}


def test_two_pods_one_gpu_one_mig_instance_then_one_goes_away(exporter):
    fake, collector, url = exporter
    snapshot = collector.snapshot
    gpu0_uuid = snapshot.gpus[0].identity.uuid
    mig9_uuid = next(m.uuid for m in snapshot.gpus[1].mig if m.gi_id == 9)
    assert gpu0_uuid.startswith("GPU-") and mig9_uuid.startswith("MIG-")
    fake.pods = [("llm", "triton-0", [("triton", "nvidia.com/gpu", [gpu0_uuid])]),
                 ("vision", "classifier-7", [("server", "nvidia.com/mig-1g.10gb", [mig9_uuid])]),
                 ("llm", "cpu-only", [("sidecar", "example.com/nic", ["nic-0"])])]
    collector.collect_once()
    pods = _pods(url)
    assert pods[("DCGM_FI_DEV_GPU_TEMP", "0", "")] == ("llm", "triton-0", "triton")
    assert pods[("DCGM_FI_DEV_FB_USED", "0", "")] == ("llm", "triton-0", "triton")
    assert pods[("inferwatch_gpu_up", "0", "")] == ("llm", "triton-0", "triton")
    assert pods[("DCGM_FI_DEV_FB_USED", "1", "9")] == ("vision", "classifier-7", "server")
    assert pods[("DCGM_FI_DEV_FB_USED", "1", "1")] is None          # the instance nobody holds
    assert pods[("DCGM_FI_DEV_FB_USED", "1", "")] is None           # the MIG parent is not the pod's
    assert pods[("inferwatch_gpu_xid_errors_total", "0", "")] is None

    fake.pods = fake.pods[1:]                                          # triton-0 is deleted
    collector.collect_once()
    pods = _pods(url)
    assert pods[("DCGM_FI_DEV_GPU_TEMP", "0", "")] is None
    assert pods[("DCGM_FI_DEV_FB_USED", "1", "9")] == ("vision", "classifier-7", "server")


def test_a_failing_kubelet_keeps_the_last_labels_and_a_vanished_socket_drops_them(exporter, kubelet, caplog):
    fake, collector, url = exporter
    _, path = kubelet
    fake.pods = [("llm", "triton-0", [("triton", "nvidia.com/gpu", ["nvidia0"])])]   # device-name IDs
    collector.collect_once()
    assert _pods(url)[("DCGM_FI_DEV_GPU_TEMP", "0", "")] == ("llm", "triton-0", "triton")
    fake.fail_with = grpc.StatusCode.UNAVAILABLE
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            collector.collect_once()
    assert _pods(url)[("DCGM_FI_DEV_GPU_TEMP", "0", "")] == ("llm", "triton-0", "triton")
    assert sum("List at" in r.getMessage() and "UNAVAILABLE" in r.getMessage() for r in caplog.records) == 1
    os.unlink(path)
    collector.collect_once()
    assert _pods(url)[("DCGM_FI_DEV_GPU_TEMP", "0", "")] is None


def test_without_the_socket_no_labels_and_said_once(tmp_path, caplog):
    clock = FakeClock()
    sim = SimNvml(parse_scenario({"gpus": 1}), clock=clock)
    collector = GpuCollector(sim, "node-a", wall=clock, monotonic=clock,
                             pods=PodAttribution(str(tmp_path / "kubelet.sock")))
    with caplog.at_level(logging.INFO, logger="inferwatch.exporters.gpu.kubelet"):
        for _ in range(4):
            collector.collect_once()
    said = [r.getMessage() for r in caplog.records if "pod-resources socket" in r.getMessage()]
    assert len(said) == 1 and str(tmp_path / "kubelet.sock") in said[0]
    registry_text = MetricsServer.for_collector(collector, "127.0.0.1", 0).cache.body(None, None)[2].decode()
    assert samples(registry_text, "DCGM_FI_DEV_GPU_TEMP") and not any(
        "pod" in s.labels for s in samples(registry_text))


GPU = GpuIdentity(3, "GPU-3f2b", "00000000:1B:00.0", "NVIDIA H100 80GB HBM3")
MIG = MigReading(gi_id=5, profile="1g.10gb", uuid="MIG-77aa")
HOLDER = PodRef("ns", "p", "c")


# (resource, device id as the device plugin hands it out, held: "gpu" / "mig" / None)
@pytest.mark.parametrize("resource, device_id, held", [
    ("nvidia.com/gpu", "GPU-3f2b", "gpu"),                 # the default: GPU UUID
    ("nvidia.com/gpu", "nvidia3", "gpu"),                  # --kubernetes-gpu-id-type device-name
    ("nvidia.com/gpu", "GPU-3f2b::2", "gpu"),              # time-slicing replica
    ("nvidia.com/gpu.shared", "GPU-3f2b::0", "gpu"),       # renamed shared resource
    ("nvidia.com/gpu", "nvidia3/vgpu1", "gpu"),            # GKE sharing
    ("nvidia.com/mig-1g.10gb", "MIG-77aa", "mig"),         # MIG device UUID (mixed strategy)
    ("nvidia.com/gpu", "MIG-77aa", "mig"),                 # MIG device UUID (single strategy)
    ("nvidia.com/mig-1g.10gb", "MIG-GPU-3f2b/5/0", "mig"),  # legacy MIG id: parent UUID / GI / CI
    ("nvidia.com/gpu", "nvidia3/gi5", "mig"),              # GKE MIG
    ("nvidia.com/mig-1g.10gb", "MIG-GPU-3f2b/6/0", None),  # another instance of the GPU
    ("nvidia.com/gpu", "GPU-other", None),
    ("example.com/fpga", "GPU-3f2b", None),               # not a GPU resource
])
def test_device_ids_as_device_plugins_write_them(resource, device_id, held):
    pods = PodMap.of([Assignment(resource, device_id, HOLDER)])
    assert (pods.for_gpu(GPU) is HOLDER) == (held == "gpu")
    assert (pods.for_mig(GPU, MIG) is HOLDER) == (held == "mig")


def test_committed_stubs_match_the_proto():
    proc = subprocess.run([sys.executable, "-m", "inferwatch.exporters.gpu.podresources.generate", "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_stubs_speak_the_kubelets_service():
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"           # the gRPC path /v1.PodResourcesLister/List
    assert {m.name for m in service.methods} == {"List", "GetAllocatableResources", "Get"}
    devices = api_pb2.ContainerDevices.DESCRIPTOR.fields_by_name
    assert (devices["resource_name"].number, devices["device_ids"].number) == (1, 2)
    pod = api_pb2.PodResources.DESCRIPTOR.fields_by_name
    assert (pod["name"].number, pod["namespace"].number, pod["containers"].number) == (1, 2, 3)
