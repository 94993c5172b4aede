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

echo "== tests"
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install cargo-nextest --locked --quiet
fi
cargo nextest run --workspace --no-fail-fast --failure-output final
cargo test --workspace --doc --quiet
