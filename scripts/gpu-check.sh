#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and nvcc: configure + build with the CUDA backend, run the `gpu`
# tests (real kernels vs the fp64 oracle and the CPU backend), bench_attention (all-full pages, then
# mixed-precision pages), the host tier's swap bandwidth against PCIe, the spatial cut's virtual
# shards at 128K context (bench_spatial --backend cuda), and the llama2.c goldens through `kvsplit generate --backend cuda` (when
# ../shared/tools is present); print a summary.
# Budget: < 8 minutes on one H200.   Usage: scripts/gpu-check.sh [build-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
JOBS=$(nproc)
start=$(date +%s)
log() { echo "[gpu-check $(( $(date +%s) - start ))s] $*"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  log "no NVIDIA GPU visible (nvidia-smi); nothing to check"; exit 0
fi
nvidia-smi -L
NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ]; then log "nvcc not found"; exit 1; fi

# Models and tools: ../shared beside the checkout, or shared/ inside it.
SHARED=""
for d in ../shared shared; do [ -d "$d/models" ] && { SHARED=$(cd "$d" && pwd); break; }; done
if [ -z "${KVSPLIT_MODELS:-}" ] && [ -n "$SHARED" ]; then export KVSPLIT_MODELS="$SHARED/models"; fi

# Only this device's architecture (e.g. 9.0 -> 90): half the nvcc time of the default "80-real;90".
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
ARCH=${ARCH:-90}
log "configure ($BUILD, sm_$ARCH)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSPLIT_BUILD_SERVER=OFF \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > "$BUILD.configure.log" 2>&1 || { tail -30 "$BUILD.configure.log"; exit 1; }
grep -q "CUDA backend ON" "$BUILD.configure.log" || { log "CUDA backend not enabled"; tail -20 "$BUILD.configure.log"; exit 1; }

log "build gpu_tests kernels_emulated_tests bench_attention bench_temporal bench_spatial kvsplit"
cmake --build "$BUILD" --target gpu_tests kernels_emulated_tests bench_attention bench_temporal bench_spatial kvsplit -j"$JOBS" \
  > "$BUILD.build.log" 2>&1 || { grep -E "error" "$BUILD.build.log" | head -40; exit 1; }

log "ctest -L gpu"
ctest --test-dir "$BUILD" -L gpu --output-on-failure -j4 > "$BUILD.gpu-tests.log" 2>&1
gpu_rc=$?
tail -5 "$BUILD.gpu-tests.log"
skipped=$(grep -c "Skipped" "$BUILD.gpu-tests.log" || true)

log "bench_attention"
timeout 240 "$BUILD/benchmarks/bench_attention" --iters 20 --warmup 3 | tee "$BUILD.bench.log"
bench_rc=${PIPESTATUS[0]}

log "bench_attention --mode mixed (semantic cut: full / int8 / int4 / evicted pages)"
timeout 180 "$BUILD/benchmarks/bench_attention" --mode mixed --iters 20 --warmup 3 \
  | tee "$BUILD.bench-mixed.log"
mixed_rc=${PIPESTATUS[0]}

log "bench_temporal --swap-bandwidth (host tier: pinned swap copies against one PCIe copy)"
timeout 120 "$BUILD/benchmarks/bench_temporal" --model synthetic:llama-110m --swap-bandwidth \
  --backend cuda --pages 128 --reps 5 | tee "$BUILD.bench-swap.log"
swap_rc=${PIPESTATUS[0]}

log "bench_spatial --backend cuda (virtual shards on this GPU: merge share at 1 x 128K; issue 13)"
timeout 240 "$BUILD/benchmarks/bench_spatial" --backend cuda --decode --contexts 131072 \
  --shards 1,2,4 --steps 4 --reps 2 --warmup 1 | tee "$BUILD.bench-spatial.log"
spatial_rc=${PIPESTATUS[0]}

golden="skipped (no shared/tools/golden_check.py)"
golden_rc=0
if [ -n "$SHARED" ] && [ -f "$SHARED/tools/golden_check.py" ]; then
  log "golden_check through kvsplit generate --backend cuda --weight-dtype f32"
  wrap="$BUILD/kvsplit-cuda-f32"
  printf '#!/usr/bin/env bash\nexec "%s" "$@" --backend cuda --weight-dtype f32\n' \
    "$(cd "$BUILD" && pwd)/kvsplit" > "$wrap"
  chmod +x "$wrap"
  timeout 180 python3 "$SHARED/tools/golden_check.py" "$wrap" --models "$KVSPLIT_MODELS" \
    > "$BUILD.golden.log" 2>&1
  golden_rc=$?
  tail -3 "$BUILD.golden.log"
  golden="$([ $golden_rc -eq 0 ] && echo PASS || echo FAIL) ($(tail -1 "$BUILD.golden.log"))"
fi

echo
echo "==== gpu-check summary ===="
echo "device:          $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
echo "gpu tests:       $([ $gpu_rc -eq 0 ] && echo PASS || echo FAIL) ($(grep -E 'tests passed|tests failed' "$BUILD.gpu-tests.log" | tail -1); skipped lines: $skipped)"
echo "bench_attention: $([ $bench_rc -eq 0 ] && echo OK || echo FAIL)"
echo "bench mixed:     $([ $mixed_rc -eq 0 ] && echo OK || echo FAIL)"
echo "swap bandwidth:  $([ $swap_rc -eq 0 ] && echo OK || echo FAIL)"
echo "spatial (cuda):  $([ $spatial_rc -eq 0 ] && echo OK || echo FAIL)"
echo "goldens (cuda):  $golden"
grep -E "^B=" "$BUILD.bench.log" || true
grep -E "^B=" "$BUILD.bench-mixed.log" || true
grep -E "device->host|host->device" "$BUILD.bench-swap.log" || true
grep -E "^ +131072 " "$BUILD.bench-spatial.log" || true
echo "elapsed:         $(( $(date +%s) - start ))s"
[ $gpu_rc -eq 0 ] && [ $bench_rc -eq 0 ] && [ $mixed_rc -eq 0 ] && [ $swap_rc -eq 0 ] && [ $spatial_rc -eq 0 ] && [ $golden_rc -eq 0 ]
