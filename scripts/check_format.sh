#!/usr/bin/env bash
# Fails when a tracked C++/CUDA source is not clang-formatted (.clang-format: Google, 100 columns).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' |
  grep -E '^(src|include|kernels|tests|benchmarks|fuzz)/')
clang-format --dry-run -Werror "${files[@]}"
echo "check_format: ${#files[@]} files formatted"
