#!/usr/bin/env bash
# The main job on the bundled default model: build kiln (release), inspect the model, run it, print outputs and
# timing. Usage: scripts/demo.sh [MODEL] (default: examples/models/tiny_cnn.kir).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
model="${1:-examples/models/tiny_cnn.kir}"
cargo build --release --quiet --bin kiln
./target/release/kiln inspect "$model"
./target/release/kiln run "$model" --output-dir target/demo-out
