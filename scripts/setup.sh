#!/usr/bin/env bash
# Installs what building and testing kiln needs on Debian 12, as root (or with sudo). Idempotent and quiet when
# everything is already there. Sourced by demo.sh and test.sh; exports LLVM_SYS_191_PREFIX.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# LLVM 19 for the NVPTX backend (inkwell). Debian's /usr/bin/llvm-config may be an older LLVM, so point
# llvm-sys at LLVM 19 explicitly; static linking needs Polly.
# OpenMPI and libclang (bindgen) for the MPI collectives (kiln-runtime feature `mpi`, tested under mpirun).
# A C compiler and valgrind for the C API's example and misuse checks (python/tests/test_capi.py).
APT_PACKAGES=(llvm-19-dev libpolly-19-dev libzstd-dev zlib1g-dev python3-venv pkg-config
  openmpi-bin libopenmpi-dev libclang-dev gcc valgrind)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export LLVM_SYS_191_PREFIX=/usr/lib/llvm-19

# Rust 1.95 or newer. Debian's own rustc is too old for edition 2024; rustup needs access to rust-lang.org.
need_rust() {
  command -v cargo >/dev/null 2>&1 || return 0
  local v
  v=$(rustc --version | awk '{print $2}')
  [ "$(printf '%s\n1.95.0\n' "$v" | sort -V | head -1)" != "1.95.0" ]
}
if need_rust; then
  echo "setup: installing Rust 1.95 with rustup"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain 1.95.0 --profile minimal -c clippy,rustfmt
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
