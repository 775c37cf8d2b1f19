#!/usr/bin/env bash
# Runs the test suite of a build directory (default: build). GPU tests skip without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
if [[ ! -d "$dir" ]]; then
  bash scripts/setup.sh
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$dir" -j"$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)"
