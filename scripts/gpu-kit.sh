#!/usr/bin/env bash
# Prepares the GPU check kit HERE (no GPU needed): builds only what scripts/gpu-check.sh runs, for
# sm_90 (H100/H200), in build-gpu/, and packs it into .gpu-kit/kit.tar.gz (.gpu-kit/ is ignored
# through .git/info/exclude) so a device session spends no device time compiling. The tarball:
#   bin/            gpu_tests bench_attention bench_temporal bench_spatial kvsplit (stripped)
#   lib/            the non-system, non-CUDA shared libraries they load (Debian 12's fmt, spdlog,
#                   yaml-cpp, ICU 72, pcre2, xxhash, liburing), which the device image may lack
#   lib/fallback/   libstdc++ and libgcc_s, used there only if the device's are too old
#   shared/models/  every model file or folder the gpu tests name (model_path("...") in the sources
#                   of gpu_tests and the test headers they include), plus what golden_check.py
#                   reads: stories260K (both formats), tok512, goldens, hf-tiny/qwen2-tiny today
#   shared/tools/golden_check.py
# and beside it .gpu-kit/MANIFEST (commit, git-status hash, flags, files) and SOURCES.sha256 (per
# source file), from which gpu-check.sh says whether the kit still matches the tree it runs in.
# CUDA's own libraries (cudart, cuBLAS, NCCL) are NOT carried (hundreds of MB): gpu-check.sh finds
# them on the device (its CUDA 13.0 toolkit, or the nvidia-* Python packages beside PyTorch).
# CPU code is built for x86-64-v3 (AVX2/FMA), not -march=native: the device's CPU is not this one.
#
# Usage: scripts/gpu-kit.sh [-jN]      (default -j1 under nice -n 19: leaves the CPUs to others)
#        scripts/gpu-kit.sh --list-models   prints the models the kit would carry, builds nothing
# Then, with the device tool: run  command "scripts/gpu-check.sh"  carry [".gpu-kit"]  timeout_s 480
# NCCL is left out (GPU_KIT_NCCL=ON puts it in): its tests need two GPUs, and a kit built with it
# cannot start on a machine where libnccl.so.2 is not found.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=${1:--j1}
BUILD=build-gpu
KIT=.gpu-kit
TARGETS=(gpu_tests bench_attention bench_temporal bench_spatial kvsplit)
MODELS_SRC=${KVSPLIT_MODELS:-$ROOT/../shared/models}
TOOLS_SRC=$ROOT/../shared/tools
start=$(date +%s)
log() { echo "[gpu-kit $(( $(date +%s) - start ))s] $*"; }

# The sources of gpu_tests (as tests/gpu/CMakeLists.txt globs them) and, transitively, the headers
# under tests/ they include ("x.h" looked up beside the file, in tests/ and tests/kernels/).
gpu_test_sources() {
  local -A seen=()
  local queue=(tests/gpu/*_test.cpp tests/kernels/*_parity_test.cpp) f inc d
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}; queue=("${queue[@]:1}")
    [ -z "${seen[$f]:-}" ] || continue
    seen[$f]=1; echo "$f"
    while read -r inc; do
      for d in "$(dirname "$f")" tests tests/kernels; do
        if [ -f "$d/$inc" ]; then queue+=("$(realpath -m --relative-to=. "$d/$inc")"); break; fi
      done
    done < <(grep -oE '^#include "[^"]+"' "$f" | cut -d'"' -f2)
  done
}
# The models (paths under the models folder) the kit carries: every literal the gpu tests name
# in model_path("...") or KVSPLIT_REQUIRE_MODEL("..."), and what golden_check.py reads. A path
# built at run time would be missed, so a non-literal argument in those sources stops the kit.
kit_models() {
  local srcs; mapfile -t srcs < <(gpu_test_sources)
  local dynamic
  dynamic=$(grep -nE '(model_path|KVSPLIT_REQUIRE_MODEL)\([^")]' "${srcs[@]}" \
              | grep -v '^tests/test_util.h:' || true)   # where both are defined
  if [ -n "$dynamic" ]; then
    echo "gpu-kit: a gpu test builds a model path at run time; name it as a literal so the kit can carry it:" >&2
    echo "$dynamic" >&2
    return 1
  fi
  {
    grep -ohE '(model_path|KVSPLIT_REQUIRE_MODEL)\("[^"]+"\)' "${srcs[@]}" | cut -d'"' -f2
    # golden_check.py (stage e of gpu-check.sh) and the llama2.c licence
    printf '%s\n' stories260K.bin tok512.bin stories260K-hf golden/stories260K_greedy.jsonl \
      LICENSE-llama2.c.txt
  } | LC_ALL=C sort -u
}
if [ "${1:-}" = --list-models ]; then kit_models; exit; fi
# Resolved before the build: a model the tests read and the models folder lacks stops the kit now.
models_list=$(kit_models) || exit 1
mapfile -t MODELS <<< "$models_list"
for rel in "${MODELS[@]}"; do
  [ -e "$MODELS_SRC/$rel" ] || { echo "gpu-kit: a gpu test reads $rel, not found under $MODELS_SRC (set KVSPLIT_MODELS)"; exit 1; }
done

NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
[ -n "$NVCC" ] || { echo "gpu-kit: nvcc not found (set CUDACXX)"; exit 1; }

# ccache (the top CMakeLists uses it as the launcher when found): paths relative to the repo root
# and no build-dir hashing, so a rebuild or another tree's identical compile hits the cache.
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1

# .gpu-kit/ and build-gpu/ never travel as untracked files: only through `carry`.
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$KIT/" "$exclude" 2>/dev/null || echo "/$KIT/" >> "$exclude"

mkdir -p "$BUILD"
log "configure $BUILD (Release, sm_90, no server, x86-64-v3)"
nice -n 19 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSPLIT_BUILD_SERVER=OFF \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90 -DKVSPLIT_NATIVE=OFF \
  -DKVSPLIT_NCCL="${GPU_KIT_NCCL:-OFF}" -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DCMAKE_C_FLAGS=-march=x86-64-v3 > "$BUILD/kit-configure.log" 2>&1 \
  || { tail -30 "$BUILD/kit-configure.log"; exit 1; }
grep -q "CUDA backend ON" "$BUILD/kit-configure.log" || { echo "gpu-kit: CUDA backend not enabled"; tail -20 "$BUILD/kit-configure.log"; exit 1; }
nccl=$(grep -o "NCCL communicator [A-Z]*" "$BUILD/kit-configure.log" | head -1)

log "build ${TARGETS[*]} ($JOBS, nice 19; log: $BUILD/kit-build.log)"
if ! nice -n 19 cmake --build "$BUILD" --target "${TARGETS[@]}" -- "$JOBS" > "$BUILD/kit-build.log" 2>&1; then
  grep -E "error|FAILED" "$BUILD/kit-build.log" | head -40; exit 1
fi
log "built"

# Where ninja put each target.
declare -A BIN=(
  [gpu_tests]=$BUILD/tests/gpu/gpu_tests
  [bench_attention]=$BUILD/benchmarks/bench_attention
  [bench_temporal]=$BUILD/benchmarks/bench_temporal
  [bench_spatial]=$BUILD/benchmarks/bench_spatial
  [kvsplit]=$BUILD/kvsplit
)
for t in "${TARGETS[@]}"; do [ -x "${BIN[$t]}" ] || { echo "gpu-kit: ${BIN[$t]} missing"; exit 1; }; done

# Staged in build-gpu/kit/ (ignored), then packed: .gpu-kit/ holds kit.tar.gz, MANIFEST and
# SOURCES.sha256 only. Unpacked it is ~60 MiB (ICU's data alone is 31 MiB) and the tree that
# travels, carried paths included, may not pass 64 MiB; gzip halves it and every image has gzip.
STAGE=$BUILD/kit
rm -rf "$STAGE" "$KIT"
mkdir -p "$KIT" "$STAGE/bin" "$STAGE/lib/fallback" "$STAGE/shared/models/golden" "$STAGE/shared/tools"
for t in "${TARGETS[@]}"; do
  cp "${BIN[$t]}" "$STAGE/bin/$t"
  strip --strip-unneeded "$STAGE/bin/$t"   # symbol tables only: the .nv_fatbin (sm_90 code) stays
done

# Shared libraries: carry every resolved one except glibc's, the C++ runtime (-> fallback/, used
# on the device only when its own is too old) and CUDA's (found on the device). Copied under
# their soname, links resolved.
is_cuda_lib() { case "$1" in libcuda.so*|libcudart.so*|libcublas*|libnccl.so*|libnvidia-*|libnvrtc*|libnvJitLink*|libcudnn*) return 0;; esac; return 1; }
is_glibc_lib() { case "$1" in ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|libutil.so*) return 0;; esac; return 1; }
declare -A CUDA_LIBS=()
for t in "${TARGETS[@]}"; do
  while read -r name path; do
    if is_glibc_lib "$name"; then continue; fi
    if is_cuda_lib "$name"; then CUDA_LIBS[$name]=1; continue; fi
    [ -f "$path" ] || { echo "gpu-kit: $t needs $name, not found here ($path)"; exit 1; }
    case "$name" in
      libstdc++.so*|libgcc_s.so*) dest=$STAGE/lib/fallback ;;
      *) dest=$STAGE/lib ;;
    esac
    [ -f "$dest/$name" ] || cp -L "$path" "$dest/$name"
  done < <(ldd "$STAGE/bin/$t" | awk '/=>/ {print $1, $3}')
done

# Models: what the gpu tests and golden_check.py read (MODELS, resolved and checked above).
M=$STAGE/shared/models
for rel in "${MODELS[@]}"; do
  [ ! -e "$M/$rel" ] || continue   # inside a folder already copied
  mkdir -p "$M/$(dirname "$rel")"
  cp -rL "$MODELS_SRC/$rel" "$M/$rel"
  chmod -R u+w "$M/$rel"   # the shared copies are read-only: the next kit run removes these
done
log "models: ${MODELS[*]}"
if [ -f "$TOOLS_SRC/golden_check.py" ]; then cp "$TOOLS_SRC/golden_check.py" "$STAGE/shared/tools/"; fi

# What the kit was built from: gpu-check.sh says whether the device's tree still matches.
# Per-file hashes of the sources: the device may have no .git, and this names the changed files.
{ git ls-files; git ls-files --others --exclude-standard; } \
  | grep -E '^(src|include|kernels|tests|benchmarks)/|^CMakeLists.txt$' \
  | while read -r f; do [ ! -f "$f" ] || echo "$f"; done | LC_ALL=C sort -u \
  | xargs -d '\n' sha256sum > "$KIT/SOURCES.sha256"
glibc_max=$(objdump -T "$STAGE"/bin/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
glibcxx_max=$(objdump -T "$STAGE"/bin/* 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)
log "pack $KIT/kit.tar.gz"
tar -C "$STAGE" -cf - bin lib shared | gzip -6 > "$KIT/kit.tar.gz"
raw_k=$(du -sk "$STAGE" | cut -f1)
{
  echo "commit: $(git rev-parse HEAD)"
  echo "status_porcelain_sha256: $(git status --porcelain | sha256sum | cut -c1-16) ($(git status --porcelain | wc -l) lines)"
  echo "tree_sha256: $({ git rev-parse HEAD; git status --porcelain; git diff HEAD; } | sha256sum | cut -c1-16) (HEAD + status + diff)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), nvcc $("$NVCC" --version | grep -o 'release [0-9.]*' | cut -c9-)"
  echo "flags: Release, CMAKE_CUDA_ARCHITECTURES=90, KVSPLIT_NATIVE=OFF -march=x86-64-v3, KVSPLIT_BUILD_SERVER=OFF, $nccl"
  echo "needs: $glibc_max $glibcxx_max; CUDA libraries from the device: ${!CUDA_LIBS[*]}"
  echo "models: ${MODELS[*]}"
  echo "kit.tar.gz: $(( $(stat -c %s "$KIT/kit.tar.gz") / 1024 )) KiB packed, $raw_k KiB unpacked:"
  (cd "$STAGE" && find . -type f | LC_ALL=C sort | xargs -d '\n' du -k | sed 's/^/  /')
} > "$KIT/MANIFEST"

size_k=$(du -sk "$KIT" | cut -f1)
tree_k=$({ git ls-files -z; git ls-files -z --others --exclude-standard; } | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1 || true)
log "kit ready: $KIT $(( size_k / 1024 )) MiB ($(( raw_k / 1024 )) MiB unpacked); with the tree ($(( tree_k / 1024 )) MiB) $(( (size_k + tree_k) / 1024 )) MiB of the 64 that travel"
log "CUDA libraries left to the device: ${!CUDA_LIBS[*]}"
if [ $(( size_k + tree_k )) -gt $(( 60 * 1024 )) ]; then
  echo "gpu-kit: WARNING: kit + tree is over 60 MiB, close to the 64 MiB that may travel"
fi
echo "Device run:  command \"scripts/gpu-check.sh\"  carry [\".gpu-kit\"]  timeout_s 480"
