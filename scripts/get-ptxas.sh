#!/usr/bin/env bash
# Fetches NVIDIA's `ptxas` (CUDA 11.8, from Debian bookworm non-free's nvidia-cuda-toolkit package) into
# .cache/ptxas/ptxas, through a private apt sources list: nothing is installed system-wide and no root is needed.
# Idempotent: an existing working .cache/ptxas/ptxas is kept. Prints the path on success.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/ptxas
if [ -x "$dest/ptxas" ] && "$dest/ptxas" --version >/dev/null 2>&1; then
  echo "$dest/ptxas"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$dest"
echo "deb http://deb.debian.org/debian bookworm main contrib non-free" > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "Dir::State::Status=/dev/null"
  -o Debug::NoLocking=1 -o APT::Sandbox::User=root -qq)
apt-get "${apt_opts[@]}" update >&2
(cd "$work" && apt-get "${apt_opts[@]}" download nvidia-cuda-toolkit >&2)
deb=$(ls "$work"/nvidia-cuda-toolkit_*.deb)
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work" ./usr/bin/ptxas
install -m 0755 "$work/usr/bin/ptxas" "$dest/ptxas"
"$dest/ptxas" --version >&2
echo "$dest/ptxas"
