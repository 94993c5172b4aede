#!/usr/bin/env bash
# Resident memory of the runtime-only binary (kiln-serve) beside the full kiln binary, on one artifact: compiles
# MODEL (default: the shared resnet18) with the release kiln, then runs `bench --json` of the artifact with each
# binary (alternating, ROUNDS times) and `--version` of each under /usr/bin/time. Prints a Markdown table.
# Usage: scripts/rss_runtime_only.sh [MODEL.onnx] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-${KILN_MODELS_DIR:-../shared/models}/resnet18/model.onnx}"
rounds="${2:-3}"
[ -f "$model" ] || { echo "no model at $model (give one, or set KILN_MODELS_DIR)"; exit 1; }
. scripts/setup.sh
cargo build --release --quiet -p kiln -p kiln-serve --bins
art="$(mktemp -d)/artifact"
./target/release/kiln compile "$model" -o "$art" >/dev/null
inputs=()
dir="$(dirname "$model")/inputs"
if [ -f "$dir/manifest.json" ]; then
  while read -r name file; do inputs+=(--input "$name=$dir/$file"); done < <(
    python3 -c 'import json,sys; [print(e["name"], e["file"]) for e in json.load(open(sys.argv[1]))]' "$dir/manifest.json")
fi
echo "| binary | size | RSS of --version | bench: median ms (1 thread) | bench: peak RSS MiB |"
echo "| --- | --- | --- | --- | --- |"
for r in $(seq "$rounds"); do
  for bin in kiln kiln-serve; do
    size=$(( $(stat -c %s "target/release/$bin") / 1024 / 1024 ))
    ver=$( { /usr/bin/time -f %M "target/release/$bin" --version >/dev/null; } 2>&1 | tail -1)
    json=$("target/release/$bin" bench "$art" "${inputs[@]}" --threads 1 --runs 20 --json 2>/dev/null | tail -1)
    python3 - "$bin" "$size" "$ver" "$json" <<'PY'
import json, sys
bin, size, ver, j = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
rss = j.get("peak_rss_bytes", j.get("peak_rss_kib", 0) * 1024) / 2**20
print(f"| {bin} | {size} MiB | {ver / 1024:.1f} MiB | {j['median_ms']:.2f} | {rss:.1f} |")
PY
  done
done
rm -rf "$(dirname "$art")"
