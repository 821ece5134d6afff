"""L1 GPU exporter: NVML readings exported under dcgm-exporter's names, plus what dcgm-exporter lacks.

Modules, one concept each:
  nvml       the narrow NVML interface every reader uses, and how NVML errors are classified
  nvml_real  that interface over the official bindings (`nvidia-ml-py`, imported as `pynvml`)
  scenario   the simulator's scenario file (values over time, faults)
  sim        a simulated NVML behind the same interface, raising the real pynvml exception classes
  sanity     which returned values are blank sentinels or physically impossible (dropped and counted)
  reading    one collection pass: NVML calls -> plain `GpuReading` data (the only NVML I/O)
  pods       the kubelet's device IDs -> which container holds which GPU or MIG instance
  kubelet    the PodResources v1 `List` over the kubelet's unix socket, refreshed per collection
  podresources  the kubelet's api.proto and the gRPC stubs generated from it
  metrics    plain data -> Prometheus metric families (pure)
  collector  background collection loop, library lifecycle, the prometheus_client collector
  xid        the XID event thread
  exposition /metrics bodies rendered once per collection, negotiated by prometheus-client
  simapi     POST /sim/events, the simulator's bounded, loopback-only input
  server     the HTTP endpoint (/metrics, and /sim/events for the simulator)
  cli        `inferwatch exporter gpu`
"""
