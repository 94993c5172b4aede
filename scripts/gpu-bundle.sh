#!/usr/bin/env bash
# Builds a bundle for scripts/gpu-check.sh: a stripped runtime-only kiln plus CUDA artifacts with their inputs and
# expected outputs, small enough to travel to a GPU machine (no Rust there) with the working tree.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/gpu-bundle.sh [--arch sm_80|sm_90] [--models NAME,NAME|all|none] [--fixtures] [--no-gelu] OUT_DIR

Builds, on this machine (Rust, LLVM), everything scripts/gpu-check.sh needs on the GPU machine (bash, python3,
numpy; no Rust):
  OUT_DIR/kiln.xz               `cargo build --release --no-default-features --bin kiln`, stripped and
                                xz-compressed: runs CUDA artifacts, has no LLVM
  OUT_DIR/cuda_contracts.xz     runtime/examples/cuda_contracts (the runtime contracts on the device), likewise
  OUT_DIR/cases/NAME/artifact   a CUDA artifact compiled by target/debug/kiln (with PTX) for --arch (default sm_90)
  OUT_DIR/cases/NAME/inputs     the inputs a run gets (reference models), with run.args (one kiln argument a line,
  OUT_DIR/cases/NAME/expected   paths relative to the case) and, for benchmarked cases, bench.args
Cases: each reference model of --models (default all; from ${KILN_MODELS_DIR:-../shared/models}) at its saved
input shapes, with its saved inputs and ONNX Runtime's expected outputs; resnet18 also at batch 32 (benchmark
only; its weights file is a relative symlink to the batch-1 artifact's); with --fixtures every tests/fixtures/*.kir
compiled with --random-weights 0 (symbolic input dims set to 2) and its expected outputs from the interpreter
(`kiln run FIXTURE --backend interp --random-weights 0 --seed 0`); and examples/models/fused_gelu.kir (benchmark
only; --no-gelu leaves it out).

Put OUT_DIR under a folder git ignores so it can travel as a "carried" path: `.gpu-bundle/` (kiln's .gitignore
has /.gpu-bundle; in another checkout, add the line to .git/info/exclude) or `.cache/gpu-bundle`. A call carries
at most 64 MiB with the working tree (~3 MB): the script prints the bundle's size and warns above 60 MiB. All six models with --fixtures (about 120 MiB) do not fit in
one call; split them (measured sizes):
  call 1: scripts/gpu-bundle.sh --models resnet18 .gpu-bundle/a                                    (48 MiB)
  call 2: scripts/gpu-bundle.sh --models bert_small,gpt2_small,mlp,mlp_dynbatch --fixtures --no-gelu \
            .gpu-bundle/b                                                                          (52 MiB)
  call 3: scripts/gpu-bundle.sh --models gpt2_small_step --no-gelu .gpu-bundle/c                    (24 MiB)
EOF
}

arch=sm_90
models=all
fixtures=0
gelu=1
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --fixtures) fixtures=1; shift ;;
    --no-gelu) gelu=0; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "error: unknown option $1" >&2; usage >&2; exit 1 ;;
    *) [ -z "$out" ] || { echo "error: one OUT_DIR only" >&2; exit 1; }; out="$1"; shift ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 1; }

cd "$(dirname "$0")/.."
root=$(pwd)
models_dir=${KILN_MODELS_DIR:-../shared/models}
all_models=(mlp mlp_dynbatch resnet18 bert_small gpt2_small gpt2_small_step)
case "$models" in
  all) chosen=("${all_models[@]}") ;;
  none|"") chosen=() ;;
  *) IFS=, read -r -a chosen <<<"$models" ;;
esac
for m in "${chosen[@]}"; do
  [ -f "$models_dir/$m/model.onnx" ] || { echo "error: no model $models_dir/$m/model.onnx (set KILN_MODELS_DIR)" >&2; exit 1; }
done
# python3 with the onnx package rewrites resnet18's batch (setup.sh/test.sh put one in .venv).
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python

rm -rf "$out"
mkdir -p "$out/cases"
out=$(cd "$out" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

echo "== building the runtime-only kiln (release, --no-default-features) and the compiler (debug, with PTX)"
cargo build --release --no-default-features --bin kiln
cargo build --release -p kiln-runtime --example cuda_contracts
cargo build --bin kiln
# xz shrinks it about 4x (13 MiB to 3 MiB): room for a model per call. gpu-check.sh unpacks it with python3's lzma.
cp target/release/kiln "$scratch/kiln"
strip "$scratch/kiln"
xz -9 -c "$scratch/kiln" >"$out/kiln.xz"
echo "runtime kiln: $(stat -c %s "$scratch/kiln") bytes stripped, $(stat -c %s "$out/kiln.xz") bytes as kiln.xz"
# The runtime contracts on the device (streams, events, transfers, NCCL): runtime/examples/cuda_contracts.rs.
cp target/release/examples/cuda_contracts "$scratch/cuda_contracts"
strip "$scratch/cuda_contracts"
xz -9 -c "$scratch/cuda_contracts" >"$out/cuda_contracts.xz"
kiln=$root/target/debug/kiln

# Writes ARGS... one a line into FILE.
write_args() {
  local file=$1
  shift
  printf '%s\n' "$@" >"$file"
}

# --shape and -i arguments from a reference model's inputs/manifest.json.
manifest_args() {
  "$py" - "$1" "$2" <<'EOF'
import json, sys
kind, manifest = sys.argv[1], sys.argv[2]
for e in json.load(open(manifest)):
    if kind == "shape":
        print("--shape")
        print(f"{e['name']}=" + ("x".join(str(d) for d in e["shape"]) or "scalar"))
    else:
        print("-i")
        print(f"{e['name']}=inputs/{e['file']}")
EOF
}

skipped=()
for m in "${chosen[@]}"; do
  src=$models_dir/$m
  case_dir=$out/cases/$m
  echo "== $m"
  mkdir -p "$case_dir"
  mapfile -t shapes < <(manifest_args shape "$src/inputs/manifest.json")
  mapfile -t ins < <(manifest_args input "$src/inputs/manifest.json")
  "$kiln" compile "$src/model.onnx" --target cuda --arch "$arch" "${shapes[@]}" -o "$case_dir/artifact"
  cp -r "$src/inputs" "$src/expected" "$case_dir/"
  write_args "$case_dir/run.args" "${ins[@]}"
  case "$m" in
    resnet18|bert_small|gpt2_small) write_args "$case_dir/bench.args" "${ins[@]}" --warmup 5 --runs 30 ;;
  esac
  if [ "$m" = resnet18 ]; then
    echo "== resnet18_b32 (benchmark only)"
    b32=$out/cases/resnet18_b32
    mkdir -p "$b32"
    if "$py" - "$src/model.onnx" "$scratch/resnet18_b32.onnx" <<'EOF'
import sys
import onnx
m = onnx.load(sys.argv[1])
for v in list(m.graph.input) + list(m.graph.output):
    v.type.tensor_type.shape.dim[0].dim_value = 32
del m.graph.value_info[:]
onnx.save(m, sys.argv[2])
EOF
    then
      "$kiln" compile "$scratch/resnet18_b32.onnx" --target cuda --arch "$arch" -o "$b32/artifact"
      if cmp -s "$b32/artifact/weights.safetensors" "$case_dir/artifact/weights.safetensors"; then
        ln -sf ../../resnet18/artifact/weights.safetensors "$b32/artifact/weights.safetensors"
      else
        echo "warning: resnet18's batch-32 weights differ from batch 1's: kept both" >&2
      fi
      write_args "$b32/bench.args" --warmup 3 --runs 20
    else
      echo "warning: cannot rewrite resnet18's batch ($py needs the onnx package): no resnet18_b32" >&2
      rm -rf "$b32"
      skipped+=(resnet18_b32)
    fi
  fi
done

if [ "$fixtures" = 1 ]; then
  for f in tests/fixtures/*.kir; do
    name=fixture_$(basename "$f" .kir)
    case_dir=$out/cases/$name
    echo "== $name"
    # Symbolic input dims become 2; weights bigger than 16 MiB are not worth a call's budget.
    mapfile -t info < <("$kiln" inspect --json "$f" | "$py" -c '
import json, re, sys
d = json.load(sys.stdin)
print(d["parameter_bytes"])
for i in d["inputs"]:
    dims = re.match(r"^[a-z0-9]+\[(.*)\]$", i["type"]).group(1)
    if any(not s.isdigit() for s in dims.split(",") if s):
        print("--shape")
        print(i["name"] + "=" + "x".join(s if s.isdigit() else "2" for s in dims.split(",")))
')
    if [ "${info[0]}" -gt $((16 << 20)) ]; then
      echo "skipped: ${info[0]} bytes of parameters"
      skipped+=("$name (parameters of ${info[0]} bytes)")
      continue
    fi
    shapes=("${info[@]:1}")
    mkdir -p "$case_dir"
    if ! "$kiln" compile "$f" --target cuda --arch "$arch" --random-weights 0 "${shapes[@]}" -o "$case_dir/artifact" \
      >"$scratch/log" 2>&1 ||
      ! "$kiln" run "$f" --backend interp --random-weights 0 --seed 0 "${shapes[@]}" -o "$case_dir/expected" \
        >>"$scratch/log" 2>&1; then
      echo "skipped: $(grep -m1 '^error' "$scratch/log" || tail -n1 "$scratch/log")"
      skipped+=("$name ($(grep -m1 '^error' "$scratch/log" || tail -n1 "$scratch/log"))")
      rm -rf "$case_dir"
      continue
    fi
    # Inputs from the same seed: the artifact has the fixture's inputs in the same order.
    write_args "$case_dir/run.args" --seed 0 "${shapes[@]}"
  done
fi

if [ "$gelu" = 1 ]; then
  echo "== fused_gelu (benchmark only)"
  "$kiln" compile examples/models/fused_gelu.kir --target cuda --arch "$arch" -o "$out/cases/fused_gelu/artifact"
  write_args "$out/cases/fused_gelu/bench.args" --warmup 5 --runs 50
fi

printf '{"arch": "%s", "models": "%s", "fixtures": %s, "made": "%s", "commit": "%s"}\n' "$arch" "$models" \
  "$([ "$fixtures" = 1 ] && echo true || echo false)" "$(date -u +%FT%TZ)" "$(git rev-parse --short HEAD)" \
  >"$out/bundle.json"
echo
echo "cases: $(find "$out/cases" -mindepth 1 -maxdepth 1 | wc -l)"
for s in "${skipped[@]}"; do echo "  skipped: $s"; done
bytes=$(du -sb "$out" | cut -f1)
echo "bundle: $out, $((bytes / 1024 / 1024)) MiB ($bytes bytes; symlinks count once)"
if [ "$bytes" -gt $((60 << 20)) ]; then
  echo "warning: over 60 MiB: with the working tree it will not fit one call's 64 MiB; split it (--help)" >&2
fi
