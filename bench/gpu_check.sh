#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU, over a folder that bench/gpu_prepare.py made:
# runs each model through the bundled C++ runner (no Python, no TVM install), compares every
# output with onnxruntime's CPU output on the same inputs, and times it next to onnxruntime's
# CPU latency measured when preparing. Prints a table; writes gpu_check.json to $OUT (or DIR).
#   bash bench/gpu_check.sh gpu_check [runs]
set -uo pipefail
DIR=${1:-gpu_check}
RUNS=${2:-50}
RESULTS=${OUT:-$DIR}/gpu_check.json
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 - "$DIR" "$RUNS" "$RESULTS" <<'PY'
import json, re, subprocess, sys
from pathlib import Path
import numpy as np

folder, runs, results = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
manifest = json.loads((folder / "manifest.json").read_text())
# the GPU machine has no aotc: the rule of aotc.runtime.inputs.npy_file_name, repeated
safe = lambda n: "".join(c if c.isalnum() or c in "-_." else "_" for c in n)
rows = []
for m in manifest["models"]:
    data, out = folder / "data" / m["model"], folder / "out" / m["model"]
    cmd = [str(folder / "bundle" / "bin" / "aotc-run"), str(folder / "bundle" / "model" / m["so"]),
           "--output-dir", str(out), "--runs", runs, "--warmup", "5"]
    for name in m["inputs"]:
        cmd += ["--input", f"{name}={data / f'in_{safe(name)}.npy'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    row = {"model": m["model"], "onnxruntime_cpu_ms": m["onnxruntime_cpu_ms"]}
    if done.returncode != 0:
        row["error"] = (done.stderr or done.stdout).strip()[-500:]
        rows.append(row)
        continue
    p50 = re.search(r"p50 ([0-9.]+)", done.stdout)
    load = re.search(r"in ([0-9.]+) ms", done.stdout)
    row["aotc_p50_ms"] = float(p50.group(1)) if p50 else None
    row["load_ms"] = float(load.group(1)) if load else None
    diffs, matches = [], []
    for name in m["outputs"]:
        got, want = np.load(out / f"{safe(name)}.npy"), np.load(data / f"ref_{safe(name)}.npy")
        diffs.append(float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0)
        matches.append(bool(np.allclose(got, want, rtol=1e-3, atol=1e-3)))
    row["max_abs_diff"] = max(diffs)
    row["matches"] = all(matches)
    rows.append(row)
print(f"target {manifest['target']}, {runs} runs each (C++ runner; times include copying inputs in and outputs out)")
print(f"{'model':14s} {'match':6s} {'max|diff|':>10s} {'aotc p50 ms':>12s} {'ORT CPU ms':>11s} {'load ms':>8s}")
for r in rows:
    if "error" in r:
        print(f"{r['model']:14s} ERROR  {r['error']}")
        continue
    print(f"{r['model']:14s} {str(r['matches']):6s} {r['max_abs_diff']:10.2e} {r['aotc_p50_ms']:12.3f} "
          f"{r['onnxruntime_cpu_ms']:11.3f} {r['load_ms']:8.1f}")
results.write_text(json.dumps({"target": manifest["target"], "rows": rows}, indent=1))
sys.exit(0 if all(r.get("matches") for r in rows) else 1)
PY
