"""A real peer client against the gateway: NVIDIA AIPerf's client-side TTFT and inter-token latency next to
the gateway's own histograms for the same run.

Starts the real Triton (`toy_llm`, a decoupled Python backend model streaming one token per response) and the
gateway (the real `inferwatch exporter gateway` process) in front of it, then runs `aiperf profile` with its
`template` endpoint type and `--streaming` against the gateway's `/v2/models/toy_llm/generate_stream`
(the JMESPath `text_output` picks each event's token). AIPerf counts output tokens with a tokenizer and
cannot download one here, so a word-level tokenizer over toy_llm's vocabulary is built with Hugging Face's
`tokenizers` and passed as a folder: each word toy_llm sends is one token, on both sides.

Compared, for the requests of this run only (the gateway's histograms are read before and after):
- TTFT: AIPerf request sent → first token read, against the gateway's arrival → first token event;
- ITL: AIPerf's gaps between chunks (one token each), against the gateway's per-token gaps;
- TPOT: AIPerf's per-request "inter token latency", (latency − TTFT) / (tokens − 1), against the gateway's
  time per output token (the same formula);
- output length: AIPerf's token count against the gateway's `gateway_output_tokens`.
A percentile agrees when AIPerf's value lies in the bucket of the gateway's histogram that holds the same
percentile, or the next bucket up (the client also sees the gateway's own hop and its own scheduling),
i.e. within the histogram's bucket resolution. Prints a table on stderr and a final JSON line; exits 1 when
a percentile disagrees or a request failed.

AIPerf's dependencies (transformers, pydantic, zmq, ...) are kept out of the project's .venv: it runs from
`.venv-aiperf` (created here on first use, or by `make aiperf-venv`), which `make test` never needs.

    .venv/bin/python benchmarks/gateway_aiperf.py [--requests 200] [--concurrency 8] [--tokens 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inferwatch.testing.process import ManagedProcess, free_port, http_ok  # noqa: E402
from inferwatch.testing.triton import start_triton  # noqa: E402

AIPERF_VENV = REPO / ".venv-aiperf"
# The version this comparison was written against (CLI flags and the export's field names).
AIPERF_REQUIREMENTS = ("aiperf==0.13.0", "tokenizers>=0.20")
# toy_llm's vocabulary (examples/model_repository/toy_llm/1/model.py, WORDS): one token per word it sends.
TOY_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away")
QUANTILES = (0.5, 0.9, 0.99)
# (label, gateway histogram, AIPerf metric) measuring the same quantity. AIPerf's "inter_token_latency" is
# per request, (request latency - TTFT) / (output tokens - 1): the gateway's time per output token. Its
# "inter_chunk_latency" is every gap between chunks; toy_llm sends one token per chunk, so it is the
# gateway's per-token inter-token latency.
TTFT = "gateway_time_to_first_token_seconds"
ITL = "gateway_inter_token_latency_seconds"
TPOT = "gateway_time_per_output_token_seconds"
OUTPUT_TOKENS = "gateway_output_tokens"

PAIRS = (("TTFT", TTFT, "time_to_first_token"), ("ITL", ITL, "inter_chunk_latency"),
         ("TPOT", TPOT, "inter_token_latency"))

TOKENIZER_SCRIPT = """
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers
words = json.loads(sys.argv[2])
vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2}
for w in words:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "[BOS]",
    "eos_token": "[EOS]", "model_max_length": 4096}))
"""


def ensure_aiperf_venv() -> Path:
    """The aiperf executable of .venv-aiperf, creating the venv on first use."""
    aiperf = AIPERF_VENV / "bin" / "aiperf"
    if not aiperf.exists():
        print(f"creating {AIPERF_VENV.name} with {' '.join(AIPERF_REQUIREMENTS)} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(AIPERF_VENV)], check=True)
        subprocess.run([str(AIPERF_VENV / "bin" / "pip"), "install", "--quiet", *AIPERF_REQUIREMENTS], check=True)
    return aiperf


def build_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer over toy_llm's words, saved as a Hugging Face tokenizer folder."""
    subprocess.run([str(AIPERF_VENV / "bin" / "python"), "-c", TOKENIZER_SCRIPT, str(folder),
                    json.dumps(TOY_WORDS)], check=True)
    return folder


# ------------------------------------------------------------------------------------------ histograms
def histograms(metrics_url: str) -> dict[str, dict]:
    """{family: {"buckets": [(le, cumulative count)], "sum": s, "count": n}} summed over label sets."""
    text = requests.get(metrics_url, timeout=30).text
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (TTFT, ITL, TPOT, OUTPUT_TOKENS):
            continue
        buckets: dict[float, float] = {}
        total = {"sum": 0.0, "count": 0.0}
        for s in family.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_sum"):
                total["sum"] += s.value
            elif s.name.endswith("_count"):
                total["count"] += s.value
        out[family.name] = {"buckets": sorted(buckets.items()), **total}
    return out


def delta(after: dict, before: dict) -> dict:
    """The observations made between two reads of the same histogram."""
    prev = dict(before["buckets"]) if before else {}
    return {"buckets": [(le, c - prev.get(le, 0.0)) for le, c in after["buckets"]],
            "sum": after["sum"] - (before["sum"] if before else 0.0),
            "count": after["count"] - (before["count"] if before else 0.0)}


def quantile(hist: dict, q: float) -> tuple[float, float, float]:
    """(estimate, bucket lower bound, bucket upper bound) of quantile `q`, interpolated inside the bucket
    as Prometheus's histogram_quantile does."""
    buckets = hist["buckets"]
    total = buckets[-1][1]
    rank = q * total
    lower, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank and count > prev_count:
            if le == float("inf"):
                return lower, lower, le
            return lower + (le - lower) * (rank - prev_count) / (count - prev_count), lower, le
        lower, prev_count = le, count
    return float("nan"), float("nan"), float("nan")


def next_edge(hist: dict, upper: float) -> float:
    """The bucket edge above `upper` (the next bucket's upper bound)."""
    edges = [le for le, _ in hist["buckets"]]
    i = edges.index(upper)
    return edges[min(i + 1, len(edges) - 1)]


# --------------------------------------------------------------------------------------------- aiperf
def run_aiperf(aiperf: Path, url: str, tokenizer: Path, artifacts: Path, args) -> dict:
    template = json.dumps({"text_input": "{{ text }}", "max_tokens": args.tokens,
                           "first_token_delay_ms": args.first_ms, "token_delay_ms": args.gap_ms})
    # {{ text }} must be a JSON string: let Jinja's tojson quote it. Passed as a file: on the command line
    # aiperf splits --extra-inputs values at commas.
    template_file = artifacts.parent / "payload_template.json"
    template_file.write_text(template.replace('"{{ text }}"', "{{ text|tojson }}"))
    argv = [str(aiperf), "profile", "--model", "toy_llm", "--url", url,
            "--endpoint-type", "template", "--custom-endpoint", "/v2/models/toy_llm/generate_stream",
            "--streaming", "--extra-inputs", f"payload_template:{template_file}",
            "--extra-inputs", "response_field:text_output",
            "--tokenizer", str(tokenizer), "--prompt-input-tokens-mean", "8", "--prompt-input-tokens-stddev", "0",
            "--prompt-output-tokens-mean", str(args.tokens),
            "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
            "--header", "X-Tenant-ID:t0",
            "--ui-type", "none", "--workers-max", "1", "--record-processor-service-count", "1",
            "--random-seed", "7", "--output-artifact-dir", str(artifacts), "--no-auto-plot"]
    # No HF_HUB_OFFLINE: with it, aiperf 0.13 takes the folder for a hub repository id and fails.
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    log = artifacts.parent / "aiperf.log"
    with open(log, "w") as out:
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=args.timeout).returncode
    exports = sorted(artifacts.rglob("profile_export_aiperf.json"))
    if rc != 0 or not exports:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"aiperf failed (exit {rc}); last lines of its output:\n{tail}")
    return json.loads(exports[-1].read_text())


def aiperf_metric(export: dict, name: str) -> dict:
    """One metric of AIPerf's summary export: {"unit", "avg", "p50", "p90", "p99", ...}."""
    found = export.get(name)
    if found is None and "records" in export:
        found = export["records"].get(name)
    if found is None:
        raise SystemExit(f"aiperf export has no {name!r}: {sorted(export)[:40]}")
    return found


def to_seconds(metric: dict, key: str) -> float:
    scale = {"ms": 1e-3, "ns": 1e-9, "us": 1e-6, "s": 1.0, "sec": 1.0}.get(metric.get("unit", "ms"), 1e-3)
    return float(metric[key]) * scale


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="requests AIPerf sends (default 200)")
    ap.add_argument("--concurrency", type=int, default=8, help="AIPerf's concurrent requests (default 8)")
    ap.add_argument("--tokens", type=int, default=20, help="tokens toy_llm streams per request (default 20)")
    # Delays away from bucket edges (TTFT 0.05|0.075, ITL 0.01|0.015): a value on an edge would be split
    # between two buckets by scheduling noise alone.
    ap.add_argument("--first-ms", type=int, default=60, help="toy_llm's first-token delay (default 60)")
    ap.add_argument("--gap-ms", type=int, default=12, help="toy_llm's inter-token delay (default 12)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds AIPerf may run (default 600)")
    args = ap.parse_args()

    aiperf = ensure_aiperf_venv()
    work = Path(tempfile.mkdtemp(prefix="gw-aiperf-"))
    procs = []
    try:
        tokenizer = build_tokenizer(work / "tokenizer")
        triton = start_triton(work / "triton")
        procs.append(triton.process)
        gw_port, gw_metrics = free_port(), free_port()
        (work / "gateway.yaml").write_text(json.dumps({"tenants": ["t0"], "models": ["toy_llm"]}))
        gateway = ManagedProcess(
            "gateway", [sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--upstream", triton.url,
                        "--port", str(gw_port), "--metrics-port", str(gw_metrics),
                        "--spec", str(work / "gateway.yaml")],
            work / "gateway.log", cwd=str(REPO), ready=lambda: http_ok(f"http://127.0.0.1:{gw_metrics}/metrics"))
        gateway.start(timeout=30)
        procs.append(gateway)
        metrics_url = f"http://127.0.0.1:{gw_metrics}/metrics"
        before = histograms(metrics_url)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        export = run_aiperf(aiperf, f"http://127.0.0.1:{gw_port}", tokenizer, work / "artifacts", args)
        elapsed = time.perf_counter() - t0
        after = histograms(metrics_url)
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)

    runs = {name: delta(after[name], before.get(name)) for name in (TTFT, ITL, TPOT, OUTPUT_TOKENS)}
    rows = []
    agree = True
    for label, family, name in PAIRS:
        metric = aiperf_metric(export, name)
        hist = runs[family]
        for q in QUANTILES:
            key = f"p{int(q * 100)}"
            client = to_seconds(metric, key)
            estimate, lower, upper = quantile(hist, q)
            ok = lower <= client <= next_edge(hist, upper)
            agree &= ok
            rows.append({"metric": label, "quantile": key, "aiperf_ms": round(client * 1000, 2),
                         "gateway_ms": round(estimate * 1000, 2),
                         "gateway_bucket_ms": [round(lower * 1000, 2), round(upper * 1000, 2)], "agree": ok})
        rows.append({"metric": label, "quantile": "mean", "aiperf_ms": round(to_seconds(metric, "avg") * 1000, 2),
                     "gateway_ms": round(hist["sum"] / max(hist["count"], 1) * 1000, 2)})
    osl = aiperf_metric(export, "output_sequence_length")
    gw_tokens = runs[OUTPUT_TOKENS]
    count = aiperf_metric(export, "request_count")
    errors = export.get("error_request_count") or {}
    print(f"AIPerf against the gateway, {int(count.get('avg', 0))} requests, load average {load0:.2f} on "
          f"{os.cpu_count()} CPUs", file=sys.stderr)
    print(f"{'metric':5s} {'q':5s} {'AIPerf ms':>10s} {'gateway ms':>11s}  gateway bucket", file=sys.stderr)
    for r in rows:
        bucket = f"({r['gateway_bucket_ms'][0]}, {r['gateway_bucket_ms'][1]}]" if "gateway_bucket_ms" in r else ""
        mark = "" if r.get("agree", True) else "  DISAGREE"
        print(f"{r['metric']:5s} {r['quantile']:5s} {r['aiperf_ms']:10.2f} {r['gateway_ms']:11.2f}  {bucket}{mark}",
              file=sys.stderr)
    result = {
        "requests_aiperf": count.get("avg"), "requests_gateway": gw_tokens["count"],
        "aiperf_errors": errors.get("avg", 0),
        "output_tokens_mean_aiperf": osl.get("avg"),
        "output_tokens_mean_gateway": round(gw_tokens["sum"] / max(gw_tokens["count"], 1), 2),
        "percentiles": rows, "agree": agree, "concurrency": args.concurrency, "tokens": args.tokens,
        "first_token_delay_ms": args.first_ms, "token_delay_ms": args.gap_ms, "seconds": round(elapsed, 1),
        "load_average_1m": round(load0, 2), "cpus": os.cpu_count(),
    }
    print(json.dumps(result))
    failed = bool(errors.get("avg")) or gw_tokens["count"] != count.get("avg")
    return 0 if agree and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
