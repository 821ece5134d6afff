#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU: run the GPU exporter on the real NVML and
# compare its values with nvidia-smi on the same GPUs, idle and (when PyTorch is there) under load.
#
#   bash benchmarks/gpu_device_check.sh            # from the repository root; needs python3 with
#                                                  # nvidia-ml-py, prometheus-client, pyyaml, requests
# Prints, per GPU and phase, exporter value / nvidia-smi value / difference for temperature.gpu,
# temperature.memory, memory.used, power.draw, utilization.gpu, fan.speed (where nvidia-smi shows [N/A] the
# exporter must have no series); the DCGM names present and absent; NVML errors by class (blank and
# out_of_range drops included);
# ends with one JSON line. Differences are expected to be small but not zero: the two read at slightly
# different instants, nvidia-smi's power.draw may be an average, and memory.used may count reserved memory
# differently across drivers. Exit 0 when the exporter served every GPU with up=1, else 1.
# NVML_MODE=sim (with a stand-in nvidia-smi on PATH) dry-runs the script itself on a machine without a GPU.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-/tmp/gpu-device-check}
mkdir -p "$OUT_DIR"
PORT=${PORT:-19400}

echo "== host"; nvidia-smi -L || { echo "nvidia-smi failed: no NVIDIA GPU here"; exit 1; }
nvidia-smi --query-gpu=driver_version,name --format=csv,noheader | head -1

# inferwatch is laid out as inferwatch/ + exporters/ (imported as inferwatch.exporters); without an
# install, assemble that layout in a temp folder so nothing has to be fetched on this machine.
if ! "$PY" -c "import inferwatch.exporters.gpu" 2>/dev/null; then
  SITE=$(mktemp -d)
  cp -r inferwatch "$SITE/inferwatch" && cp -r exporters "$SITE/inferwatch/exporters"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import pynvml, prometheus_client, yaml, requests" || { echo "missing Python packages"; exit 1; }

"$PY" -m inferwatch.exporters.gpu --nvml "${NVML_MODE:-real}" --port "$PORT" --interval 1s --no-pod-labels >"$OUT_DIR/exporter.log" 2>&1 &
EXPORTER=$!
trap 'kill $EXPORTER 2>/dev/null; wait $EXPORTER 2>/dev/null' EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null 2>&1 && break
  kill -0 $EXPORTER 2>/dev/null || { echo "exporter exited:"; cat "$OUT_DIR/exporter.log"; exit 1; }
  sleep 0.1
done

PORT=$PORT OUT_DIR=$OUT_DIR "$PY" - <<'PYEOF'
import json, os, subprocess, sys, threading, time
import requests
from prometheus_client.parser import text_string_to_metric_families

port, out_dir = os.environ["PORT"], os.environ["OUT_DIR"]
FIELDS = [("temperature.gpu", "DCGM_FI_DEV_GPU_TEMP"), ("temperature.memory", "DCGM_FI_DEV_MEMORY_TEMP"),
          ("memory.used", "DCGM_FI_DEV_FB_USED"), ("power.draw", "DCGM_FI_DEV_POWER_USAGE"),
          ("utilization.gpu", "DCGM_FI_DEV_GPU_UTIL"), ("fan.speed", "DCGM_FI_DEV_FAN_SPEED")]

def smi():
    rows = subprocess.run(["nvidia-smi", "--query-gpu=index," + ",".join(f for f, _ in FIELDS),
                           "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    out = {}
    for row in rows.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        out[cells[0]] = {f: (float(v) if v.replace(".", "", 1).isdigit() else None)
                         for (f, _), v in zip(FIELDS, cells[1:])}
    return out

def exporter():
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    return text, samples

def compare(phase):
    time.sleep(2.5)                      # at least two collections at --interval 1s
    text, samples = exporter()
    ref = smi()
    rows = []
    for gpu, values in sorted(ref.items()):
        for field, metric in FIELDS:
            ours = [s.value for s in samples if s.name == metric and s.labels.get("gpu") == gpu
                    and "GPU_I_ID" not in s.labels]
            theirs = values[field]
            ours = ours[0] if ours else None
            diff = None if ours is None or theirs is None else round(ours - theirs, 3)
            rows.append({"phase": phase, "gpu": gpu, "field": field, "exporter": ours, "nvidia_smi": theirs,
                         "diff": diff})
            print(f"{phase:5} gpu {gpu} {field:16} exporter={ours!s:>10} nvidia-smi={theirs!s:>10} diff={diff}")
    return text, samples, rows

print("== compare (idle)")
text, samples, rows = compare("idle")
load = None
try:
    import torch
    if torch.cuda.is_available():
        stop = threading.Event()
        def burn():
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
            while not stop.is_set():
                for _ in range(20):
                    a @ a
                torch.cuda.synchronize()
        load = threading.Thread(target=burn, daemon=True)
        load.start()
        time.sleep(3)
        print("== compare (under a bf16 matmul load)")
        text, samples, more = compare("load")
        rows += more
        stop.set()
        load.join(timeout=30)
except ImportError:
    print("(no PyTorch: load phase skipped)")

with open(os.path.join(out_dir, "metrics.txt"), "w") as f:
    f.write(text)
names = sorted({s.name for s in samples if s.name.startswith("DCGM_")})
expected = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
            "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_SM_CLOCK",
            "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE"]
absent = [n for n in expected if n not in names]
up = {s.labels["gpu"]: s.value for s in samples if s.name == "inferwatch_gpu_up"}
errors = {f'{s.labels["class"]}/{s.labels["error"]}': s.value for s in samples
          if s.name == "inferwatch_gpu_nvml_errors_total"}
sentinels = [(s.name, s.value) for s in samples if s.value != s.value or abs(s.value) >= 2**53]
print("== DCGM names present:", len(names), "absent (NVML did not give them here):", absent or "none")
print("== inferwatch_gpu_up:", up)
print("== NVML errors by class:", errors or "none")
print("== sentinel-like values:", sentinels or "none")
# A series the exporter has where nvidia-smi says [N/A] (or the reverse) is a disagreement about support.
support = [(r["phase"], r["gpu"], r["field"]) for r in rows if (r["exporter"] is None) != (r["nvidia_smi"] is None)]
print("== present on one side only:", support or "none")
summary = {"gpus": len(up), "all_up": bool(up) and all(v == 1 for v in up.values()), "absent": absent,
           "nvml_errors": errors, "sentinels": len(sentinels), "support_disagreements": support,
           "nvml_up": [s.value for s in samples if s.name == "inferwatch_gpu_nvml_up"],
           "max_abs_diff": {f: max((abs(r["diff"]) for r in rows if r["field"] == f and r["diff"] is not None),
                                   default=None) for f, _ in FIELDS}}
print(json.dumps(summary))
sys.exit(0 if summary["all_up"] and not sentinels else 1)
PYEOF
RC=$?
echo "== exporter log (last lines)"; tail -n 15 "$OUT_DIR/exporter.log"
exit $RC
