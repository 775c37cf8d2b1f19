#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each for a bounded time on a corpus
# seeded from the shared fixtures and the shipped configs. Exit status 1 on any crash, leak,
# sanitizer report or timeout; the reproducer is left in the build directory.
#   scripts/fuzz.sh [BUILD_DIR] [SECONDS_PER_TARGET]      (defaults: build-fuzz, 30)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${1:-build-fuzz}
secs=${2:-30}
models=${KVSPLIT_MODELS:-$root/../shared/models}
parallel=${FUZZ_JOBS:-$(nproc)}
if ! [[ $parallel =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: FUZZ_JOBS must be a count >= 1, got '$parallel'" >&2
  exit 2
fi

cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DKVSPLIT_FUZZ=ON -DKVSPLIT_CUDA=OFF -DKVSPLIT_NATIVE=OFF \
  >/dev/null
targets=$(cmake --build "$dir" --target help | awk -F: '/_fuzz:/ {print $1}' | sort)
cmake --build "$dir" -j"$(nproc)" --target $targets

corpus="$dir/corpus"
rm -rf "$corpus"
mkdir -p "$corpus"
# Debian's python3 has the protobuf runtime (python3-protobuf) for the request seeds.
py=python3
if [[ -x /usr/bin/python3 ]]; then py=/usr/bin/python3; fi
$py scripts/fuzz_seeds.py --models "$models" --configs configs --proto-dir proto --out "$corpus"

# One target per core at once (each libFuzzer run is single-threaded); reports in target order.
# Fuzzers still running when the script ends early (an error, a CI timeout) are stopped.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
run_target() {
  local t=$1 name=${1%_fuzz}
  if (cd "$dir" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "./fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=1048576 \
        -print_final_stats=1 "corpus/$name" 2>"$t.log"); then
    echo ok >"$dir/$t.status"
  else
    echo failed >"$dir/$t.status"
  fi
}
for t in $targets; do
  rm -f "$dir/$t.status"
  mkdir -p "$corpus/${t%_fuzz}"
  ls "$corpus/${t%_fuzz}" | wc -l >"$dir/$t.seeds"
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  run_target "$t" &
done
wait

status=0
for t in $targets; do
  name=${t%_fuzz}
  echo "=== $t: ${secs}s on $(cat "$dir/$t.seeds") seeds"
  if [[ "$(cat "$dir/$t.status" 2>/dev/null)" != ok ]]; then
    echo "$t FAILED; its log:"
    tail -60 "$dir/$t.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$dir/$t.log" | tr '\n' ' '
    echo
  fi
done
exit $status
