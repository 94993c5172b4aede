#!/usr/bin/env bash
# Every test kiln has: formatting, lints, unit/integration/snapshot tests (nextest) and doc tests. Installs what it
# needs first. Fails on the first failure. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export INSTA_UPDATE="${INSTA_UPDATE:-no}"   # snapshots are checked, never silently rewritten

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== cargo clippy (kiln-runtime with MPI)"
cargo clippy -p kiln-runtime --features mpi --all-targets --quiet -- -D warnings

echo "== the runtime stands alone (no Cranelift, no LLVM in kiln-runtime or kiln-serve)"
for p in kiln-runtime kiln-serve; do
  if cargo tree -p "$p" -e normal --prefix none | grep -E "^(cranelift|inkwell|llvm-sys|kiln-codegen|kiln-passes)"; then
    echo "$p depends on the compiler (see above)"; exit 1
  fi
done

echo "== MPI collectives under mpirun -np 2"
cargo build --quiet -p kiln-runtime --features mpi --example mpi_collectives
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Two ranks on a two-core machine: oversubscription is allowed so a busy machine does not refuse the run.
mpirun --oversubscribe -np 2 target/debug/examples/mpi_collectives

echo "== ONNX node conformance (reference interpreter)"
# ONNX ships its node tests as Python definitions; generate the data once into .cache (about 10 s).
ONNX_VERSION=1.23.2
ORT_VERSION=1.32.0
CONVERTER_VERSION=1.16.0
MATURIN_VERSION=1.16.0
PYTEST_VERSION=8.4.2
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import onnx, onnxruntime, onnxconverter_common, pytest, sys; from importlib.metadata import version; sys.exit(onnx.__version__ != '$ONNX_VERSION' or onnxruntime.__version__ != '$ORT_VERSION' or onnxconverter_common.__version__ != '$CONVERTER_VERSION' or pytest.__version__ != '$PYTEST_VERSION' or version('maturin') != '$MATURIN_VERSION')" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "onnx==$ONNX_VERSION" "onnxruntime==$ORT_VERSION" \
    "onnxconverter-common==$CONVERTER_VERSION" "maturin==$MATURIN_VERSION" "pytest==$PYTEST_VERSION" numpy
fi
cases=.cache/onnx-node-tests
if ! grep -q "onnx $ONNX_VERSION" "$cases/VERSION" 2>/dev/null; then
  mkdir -p .cache
  .venv/bin/python -W ignore scripts/gen_onnx_node_tests.py "$cases"
fi
# The public model corpus (light model zoo, symbolic copies of ../shared/models, int8 and fp16 variants) with ONNX Runtime's outputs, for
# tests/corpus.rs; regenerated only when its versions change.
.venv/bin/python -W ignore scripts/gen_corpus.py .cache/corpus
# Debug build: kiln-ir and every dependency are optimized in dev builds, so this is fast and shares nextest's.
cargo build --quiet --bin kiln
./target/debug/kiln conformance "$cases" --backend interp --min-passed "$(cat tests/conformance-floor.txt)" > target/conformance.txt \
  || { grep -E "^FAILED" target/conformance.txt; tail -1 target/conformance.txt; exit 1; }
tail -1 target/conformance.txt
echo "== ONNX node conformance (CPU backend: the same cases, compiled)"
./target/debug/kiln conformance "$cases" --backend cpu --min-passed "$(cat tests/conformance-floor.txt)" > target/conformance-cpu.txt \
  || { grep -E "^FAILED" target/conformance-cpu.txt; tail -1 target/conformance-cpu.txt; exit 1; }
tail -1 target/conformance-cpu.txt
echo "== ONNX node conformance (CUDA runtime and PTX kernels on the emulated device)"
./target/debug/kiln conformance "$cases" --backend cuda-emulated --min-passed "$(cat tests/conformance-floor.txt)" > target/conformance-cuda.txt \
  || { grep -E "^FAILED" target/conformance-cuda.txt; tail -1 target/conformance-cuda.txt; exit 1; }
tail -1 target/conformance-cuda.txt

echo "== ptxas (CUDA 11.8 from Debian non-free, for the PTX tests; nothing installed system-wide)"
KILN_PTXAS="$PWD/$(scripts/get-ptxas.sh)"
export KILN_PTXAS
"$KILN_PTXAS" --version | tail -1

echo "== tests"
models="${KILN_MODELS_DIR:-../shared/models}"
if [ ! -d "$models" ]; then
  echo "SKIPPED: reference models not found at $models (set KILN_MODELS_DIR); the reference-model tests skip"
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install cargo-nextest --locked --quiet
fi
echo "== Python package and C API: built into .venv (maturin) and target/debug (libkiln_c.so), then pytest"
# The dev profile shares nextest's build (dependencies optimized); `pip install ./python` (the README's) builds release.
PATH="$PWD/.venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" \
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation ./python
cargo build --quiet -p kiln-capi
KILN_MODELS_DIR="$models" .venv/bin/python -m pytest python/tests -q -rs -p no:cacheprovider
# Doc tests first (nextest does not run them), so the run closes on nextest's summary line.
cargo test --workspace --doc --quiet
cargo nextest run --workspace --no-fail-fast --failure-output final
