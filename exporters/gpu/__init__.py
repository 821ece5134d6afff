"""L1 GPU exporter: NVML readings exported under dcgm-exporter's names, plus what dcgm-exporter lacks.

Modules, one concept each:
  nvml       the narrow NVML interface every reader uses, and how NVML errors are classified
  nvml_real  that interface over the official bindings (`nvidia-ml-py`, imported as `pynvml`)
  scenario   the simulator's scenario file (values over time, faults)
  sim        a simulated NVML behind the same interface, raising the real pynvml exception classes
  reading    one collection pass: NVML calls -> plain `GpuReading` data (the only I/O)
  metrics    plain data -> Prometheus metric families (pure)
  collector  background collection loop, library lifecycle, the prometheus_client collector
  xid        the XID event thread
  server     the HTTP endpoint (/metrics, and /sim/events for the simulator)
  cli        `inferwatch exporter gpu`
"""
