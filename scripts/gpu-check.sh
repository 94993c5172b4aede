#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (bash, python3 with numpy; torch optional; no Rust): runs a bundle made by
# scripts/gpu-bundle.sh — conformance of every case against its expected outputs, then kiln benchmarks and, where
# torch imports, the same workloads in PyTorch eager and torch.compile — within about 8 minutes.
#
# usage: scripts/gpu-check.sh BUNDLE_DIR [OUT_DIR]
#   OUT_DIR (default $OUT when set, else gpu-check-out) receives gpu-check.json, gpu-check.md and the logs.
#   GPU_CHECK_BUDGET_S (default 470) is the whole script's time budget; every step runs under `timeout`.
# Exit: 0 all conformance cases pass; 1 one failed (or the bundle is unusable); 2 no GPU or driver.
set -uo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 1
fi
bundle=$(cd "$1" 2>/dev/null && pwd) || { echo "error: no bundle directory $1"; exit 1; }
out=${2:-${OUT:-gpu-check-out}}
here=$(cd "$(dirname "$0")" && pwd)
budget=${GPU_CHECK_BUDGET_S:-470}
deadline=$((SECONDS + budget))

# Seconds left before the deadline, less RESERVE (default 15, for the report).
left() { echo $((deadline - SECONDS - ${1:-15})); }
# A timeout of at most $1 seconds that still ends before the deadline (at least 1).
cap() {
  local l
  l=$(left)
  [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"
}

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "no GPU: nvidia-smi is not installed (no NVIDIA driver); nothing to check"
  exit 2
fi
if ! gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1) || [ -z "$gpu" ]; then
  echo "no GPU: nvidia-smi finds no device ($(echo "$gpu" | head -n1)); nothing to check"
  exit 2
fi
gpu=$(echo "$gpu" | head -n1)
echo "GPU: $gpu"

python3 -c 'import numpy' 2>/dev/null || { echo "error: python3 cannot import numpy"; exit 1; }
# The bundle carries kiln xz-compressed; unpack it outside the bundle (which may be read-only).
bin_dir=$(mktemp -d)
trap 'rm -rf "$bin_dir"' EXIT
kiln=$bin_dir/kiln
if [ -f "$bundle/kiln.xz" ]; then
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$bundle/kiln.xz" "$kiln" && chmod +x "$kiln"
elif [ -f "$bundle/kiln" ]; then
  cp "$bundle/kiln" "$kiln" && chmod +x "$kiln"
fi
[ -x "$kiln" ] || { echo "error: no kiln.xz in $bundle (build the bundle with scripts/gpu-bundle.sh)"; exit 1; }

# cudarc loads cuBLAS as libcublas.so (or .so.12) and NCCL as libnccl.so; CUDA 13 machines whose libraries come
# with PyTorch's pip packages have libcublas.so.13 and libnccl.so.2 there: link them under the names cudarc tries.
mkdir -p "$bin_dir/lib"
python3 "$here/gpu_libs.py" "$bin_dir/lib"
export LD_LIBRARY_PATH="$bin_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$out"/{conformance,runs,bench,logs}
out=$(cd "$out" && pwd)
echo "$gpu" >"$out/gpu.txt"
cp "$bundle/bundle.json" "$out/bundle.json" 2>/dev/null

# Reads a case's argument file (one argument a line) into the array `args`.
read_args() {
  args=()
  [ -f "$1" ] && mapfile -t args <"$1"
}

failed=0
echo "== runtime contracts on the device (runtime/examples/cuda_contracts)"
if [ -f "$bundle/cuda_contracts.xz" ]; then
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$bundle/cuda_contracts.xz" "$bin_dir/cuda_contracts" && chmod +x "$bin_dir/cuda_contracts"
  timeout "$(cap 60)" "$bin_dir/cuda_contracts" | tee "$out/logs/contracts.log"
  [ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))
else
  echo "SKIP contracts: no cuda_contracts.xz in the bundle"
fi

echo "== conformance (rtol 1e-3, atol 1e-4; integers exact)"
for case_dir in "$bundle"/cases/*/; do
  name=$(basename "$case_dir")
  if [ ! -f "$case_dir/run.args" ] || [ ! -d "$case_dir/expected" ]; then
    continue
  fi
  if [ "$(left 200)" -le 0 ]; then
    echo "SKIP $name: the conformance share of the budget is spent"
    continue
  fi
  read_args "$case_dir/run.args"
  log=$out/logs/run-$name.log
  if (cd "$case_dir" && timeout "$(cap 60)" "$kiln" run artifact "${args[@]}" -o "$out/runs/$name") >"$log" 2>&1; then
    # Outputs come back only for a failure (what comes back from the machine is limited).
    if python3 "$here/gpu_compare.py" "$case_dir/expected" "$out/runs/$name" --name "$name" \
      --json "$out/conformance/$name.json"; then
      rm -rf "${out:?}/runs/$name"
    else
      failed=$((failed + 1))
    fi
  else
    python3 "$here/gpu_compare.py" "$case_dir/expected" "$out/runs/$name" --name "$name" --run-log "$log" \
      --json "$out/conformance/$name.json"
    failed=$((failed + 1))
  fi
done

echo "== kiln benchmarks"
for name in fused_gelu resnet18 resnet18_b32 bert_small gpt2_small; do
  case_dir=$bundle/cases/$name
  [ -f "$case_dir/bench.args" ] || continue
  if [ "$(left 150)" -le 0 ]; then
    echo "SKIP bench $name: out of time"
    continue
  fi
  read_args "$case_dir/bench.args"
  log=$out/logs/bench-$name.log
  if (cd "$case_dir" && timeout "$(cap 60)" "$kiln" bench artifact "${args[@]}" --json) >"$log" 2>&1; then
    tail -n1 "$log" >"$out/bench/$name.json"
    python3 - "$out/bench/$name.json" "$name" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
line = f"{sys.argv[2]}: median {r['median_ms']:.3f} ms (min {r['min_ms']:.3f}, p90 {r['p90_ms']:.3f})"
if r.get("device_median_ms") is not None:
    line += f"; on the device (data resident) {r['device_median_ms']:.3f} ms"
if r.get("device_copy_gbps") and r.get("io_bytes"):
    ms = r.get("device_median_ms") or r["median_ms"]
    gbps = r["io_bytes"] / (ms / 1e3) / 1e9
    line += f"; {gbps:.1f} GB/s = {100 * gbps / r['device_copy_gbps']:.0f}% of the device copy ({r['device_copy_gbps']:.0f} GB/s)"
print(line)
EOF
  else
    why=$(grep -m1 -i error "$log" || tail -n1 "$log")
    echo "bench $name failed: $why"
    python3 -c 'import json, sys; print(json.dumps({"error": sys.argv[1]}))' "$why" >"$out/bench/$name.json"
  fi
done

echo "== PyTorch baseline"
if ! compgen -G "$out/bench/*.json" >/dev/null; then
  echo "SKIP torch baseline: this bundle benchmarks nothing"
elif timeout "$(cap 60)" python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' >/dev/null 2>&1; then
  t=$(left 25)
  if [ "$t" -gt 20 ]; then
    # The workloads this bundle benchmarks (so a split bundle's calls do not repeat each other's baselines).
    only=""
    for f in "$out"/bench/*.json; do
      only=${only:+$only,}$(basename "$f" .json)
    done
    timeout "$t" python3 "$here/gpu_torch_baseline.py" --json "$out/torch.json" --budget-s $((t - 10)) --only "$only" \
      2>"$out/logs/torch.log" || echo "torch baseline stopped early (see logs/torch.log); partial results kept"
  else
    echo "SKIP torch baseline: out of time"
  fi
else
  echo "SKIP torch baseline: torch is missing or sees no GPU"
fi

python3 "$here/gpu_report.py" "$out" || echo "error: the report failed"
echo "wrote $out/gpu-check.json and $out/gpu-check.md (${SECONDS}s)"
if [ "$failed" -gt 0 ]; then
  echo "$failed conformance case(s) FAILED"
  exit 1
fi
