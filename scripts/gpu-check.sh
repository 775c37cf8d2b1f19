#!/usr/bin/env bash
# The prepared first run on a GPU (H100/H200), in ONE device call of at most 7 minutes:
#
#   here first:   scripts/gpu-kit.sh          # builds the binaries for sm_90 into .gpu-kit/ (no GPU)
#   then the device tool's run call:
#       command   scripts/gpu-check.sh
#       carry     [".gpu-kit"]
#       timeout_s 480   (the 15-minute device budget then leaves room for a targeted rerun)
#
# Stages, most valuable first, each under its own timeout (140+3x45+40+60+40 = 415 s), all of them
# also under one deadline (GPU_CHECK_BUDGET, default 420 s from the start, a device build included):
#   a. nvidia-smi -L, then the `gpu`-labelled tests (gpu_tests: real kernels against the fp64
#      oracle, the CPU backend and the llama2.c goldens), GPU_TEST_SHARDS (4) gtest shards at once;
#      with a GPU shown, any test (or benchmark) skipped for "no CUDA device" FAILS its stage: the
#      CUDA runtime could not start (libcuda not found, a driver older than the runtime)
#   b. bench_attention, plain, --mode mixed and --mode mixed --probe, at reduced iterations; plain
#      rows check their output (column "output": ok / WRONG, a WRONG row makes the stage FAIL) and
#      rotate rows that read under 2 x L2 over copies of their pages (column "copies"); the
#      `B=1 x 128K w4K` row is to be re-measured that way (docs/cuda.md: its 43.6 us was L2-resident)
#   c. bench_temporal --swap-bandwidth --backend cuda (host tier against one PCIe copy)
#   d. bench_spatial --backend cuda at 1 x 128K, 1 and 4 virtual shards on this GPU, if time remains
#   e. the first GOLDEN_CASES (4) goldens, both formats, through `kvsplit generate --backend cuda
#      --weight-dtype f32` (gpu_tests check every golden on CUDA already; this is the CLI path),
#      then again with `--speculative ngram` (both in golden.log)
# Benchmarks run line-buffered (stdbuf), so a timed-out or crashed one still leaves its figures.
# Binaries come from .gpu-kit/ (with its models and libraries); without a kit this script builds
# them here (slow, device time; the device image may also lack the build's dependencies).
# Every log goes under ${OUT:-./gpu-check-logs} (at most 8 files: the device tool returns no more):
#   gpu-check.log (this transcript and the summary), env.log, gpu-tests.log, bench-attention.log,
#   bench-temporal.log, bench-spatial.log, golden.log, build.log (device build only).
# Exits 0 whatever failed: the summary at the end says what did.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 0
ROOT=$(pwd)
LOGS=${OUT:-$ROOT/gpu-check-logs}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
KIT=${GPU_KIT:-$ROOT/.gpu-kit}
BUILD=$ROOT/build-gpu
SHARDS=${GPU_TEST_SHARDS:-4}
start=$(date +%s)
DEADLINE=$(( start + ${GPU_CHECK_BUDGET:-420} ))
TMP=$(mktemp -d /tmp/gpu-check.XXXXXX)

log() { echo "[gpu-check $(( $(date +%s) - start ))s] $*"; }
loud() { echo; echo "!!!!!!!! $* !!!!!!!!"; echo; }
# Seconds a stage may run: its own limit, cut to what is left before the deadline; 0 when < 15 s.
allow() {
  local lim=$1 left=$(( DEADLINE - $(date +%s) ))
  (( left < lim )) && lim=$left
  (( lim < 15 )) && lim=0
  echo "$lim"
}

declare -a ST_NAME=() ST_RES=() ST_NOTE=()
record() { ST_NAME+=("$1"); ST_RES+=("$2"); ST_NOTE+=("$3"); log "$1: $2 $3"; }

# Runs "$@" under `timeout` with the kit's library path, output appended to $LOG; returns its status.
run_logged() {
  local log_file=$1 lim=$2; shift 2
  echo "\$ $* (timeout ${lim}s)" >> "$log_file"
  local t0; t0=$(date +%s)
  local buf=()
  command -v stdbuf >/dev/null && buf=(stdbuf -oL -eL)
  LD_LIBRARY_PATH=$LIBPATH timeout -k 5 "$lim" "${buf[@]}" "$@" >> "$log_file" 2>&1
  local rc=$?
  echo "[exit $rc after $(( $(date +%s) - t0 ))s]" >> "$log_file"
  return $rc
}
# Records a benchmark stage from its exit status and log; a failure shows the log's last lines.
record_bench() {
  local name=$1 rc=$2 log_file=$3 res
  res=$(bench_result "$rc" "$log_file")
  if [ "$res" = FAIL ] && tail -5 "$log_file" | grep -q "skipped.*no CUDA device"; then
    loud "$name: nvidia-smi shows a GPU, but the benchmark found no CUDA device: the CUDA runtime cannot use it (env.log)"
    record "$name" "$res" "(exit $rc, but it skipped: no CUDA device)"
  else
    record "$name" "$res" "(exit $rc)"
  fi
  case "$res" in FAIL|TIMEOUT) grep -v '^\[exit' "$log_file" | tail -3 | sed 's/^/    | /';; esac
}
# PASS / SKIP (the binary printed "skipped") / TIMEOUT / FAIL for one benchmark run. A skip for
# "no CUDA device" is a FAIL: main() only gets here after nvidia-smi showed a GPU, so the CUDA
# runtime could not start (see the gpu tests stage).
bench_result() {
  local rc=$1 log_file=$2
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo TIMEOUT
  elif [ "$rc" -ne 0 ]; then echo "FAIL"
  elif tail -5 "$log_file" | grep -q "skipped.*no CUDA device"; then echo FAIL
  elif tail -5 "$log_file" | grep -q "skipped"; then echo SKIP
  else echo PASS; fi
}

main() {
  log "start; logs under $LOGS"
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! timeout 30 nvidia-smi -L >/dev/null 2>&1; then
    log "no NVIDIA GPU visible (nvidia-smi); nothing to check"
    return 0
  fi
  timeout 30 nvidia-smi -L

  # ---- binaries: the kit, or a build here --------------------------------------------------
  declare -gA BIN=()
  NOBIN="(no binary)"
  local mode
  KITX=$TMP/kit   # the kit unpacked: bin/ lib/ shared/
  if [ -f "$KIT/kit.tar.gz" ]; then
    mkdir -p "$KITX"
    tar -xzf "$KIT/kit.tar.gz" -C "$KITX" || loud "could not unpack $KIT/kit.tar.gz"
  fi
  if [ -x "$KITX/bin/gpu_tests" ]; then
    mode=kit
    for t in gpu_tests bench_attention bench_temporal bench_spatial kvsplit; do BIN[$t]=$KITX/bin/$t; done
    export KVSPLIT_MODELS=$KITX/shared/models
    GOLDEN_PY=$KITX/shared/tools/golden_check.py
    log "using the kit $KIT ($(grep -m1 '^commit:' "$KIT/MANIFEST" 2>/dev/null))"
  else
    mode=build
    loud "NO .gpu-kit/ (run scripts/gpu-kit.sh before the device call, carry [\".gpu-kit\"]): BUILDING ON THE DEVICE, spending device time"
    BIN=([gpu_tests]=$BUILD/tests/gpu/gpu_tests [bench_attention]=$BUILD/benchmarks/bench_attention
         [bench_temporal]=$BUILD/benchmarks/bench_temporal [bench_spatial]=$BUILD/benchmarks/bench_spatial
         [kvsplit]=$BUILD/kvsplit)
    local d
    for d in "$ROOT/shared" "$ROOT/../shared"; do
      if [ -z "${KVSPLIT_MODELS:-}" ] && [ -d "$d/models" ]; then export KVSPLIT_MODELS=$d/models; fi
      if [ -z "${GOLDEN_PY:-}" ] && [ -f "$d/tools/golden_check.py" ]; then GOLDEN_PY=$d/tools/golden_check.py; fi
    done
    local nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
    [ -x "$nvcc" ] || nvcc=$(command -v nvcc || echo nvcc)
    local arch; arch=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    local lim; lim=$(allow 300)
    log "configure + build (sm_${arch:-90}, -j$(nproc), at most ${lim}s; log build.log)"
    { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSPLIT_BUILD_SERVER=OFF \
        -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" &&
      timeout -k 5 "$lim" cmake --build "$BUILD" --target gpu_tests bench_attention bench_temporal \
        bench_spatial kvsplit -j"$(nproc)"; } > "$LOGS/build.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then
      NOBIN="(no binary: the device build failed, see build.log)"
      loud "device build failed (exit $rc): see build.log"
      grep -E "error|Could not find|FAILED" "$LOGS/build.log" | head -15
    fi
  fi
  GOLDEN_PY=${GOLDEN_PY:-}

  # ---- libraries and environment (env.log) -------------------------------------------------
  resolve_libs > "$LOGS/env.log" 2>&1
  {
    echo "== nvidia-smi"; timeout 30 nvidia-smi
    timeout 30 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    echo "== host"; grep -m1 "model name" /proc/cpuinfo
    echo "cpu flags: $(grep -m1 -o -w -E 'avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')$(grep -m1 -o -w avx512f /proc/cpuinfo)"
    echo "cores $(nproc); $(grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null); $(ldd --version 2>&1 | head -1)"
    echo "KVSPLIT_MODELS=${KVSPLIT_MODELS:-}"; echo "LD_LIBRARY_PATH (the kit's binaries)=$LIBPATH"
    if [ "$mode" = kit ]; then echo "== MANIFEST"; cat "$KIT/MANIFEST"; fi
  } >> "$LOGS/env.log" 2>&1
  if [ "$mode" = kit ]; then
    kit_freshness
    grep -qw avx2 /proc/cpuinfo || loud "this CPU shows no AVX2: the kit's host code is x86-64-v3 and may die on an illegal instruction"
  fi
  if grep -q "STILL MISSING" "$LOGS/env.log"; then
    loud "shared libraries missing for the binaries: $(grep 'STILL MISSING' "$LOGS/env.log" | head -3 | tr '\n' ' ')"
  fi

  # ---- a. gpu tests ------------------------------------------------------------------------
  local lim; lim=$(allow 140)
  if [ ! -x "${BIN[gpu_tests]}" ]; then record "gpu tests" SKIP "$NOBIN"
  elif [ "$lim" -eq 0 ]; then record "gpu tests" SKIP "(no time left)"
  else
    log "a. gpu tests: ${BIN[gpu_tests]##*/}, $SHARDS shards at once, ${lim}s (gpu-tests.log)"
    local i pids=() rcs=()
    for (( i = 0; i < SHARDS; i++ )); do
      GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i \
        run_logged "$LOGS/gpu-tests-shard$i.log" "$lim" "${BIN[gpu_tests]}" --gtest_color=no &
      pids+=($!)
    done
    for i in "${!pids[@]}"; do wait "${pids[$i]}"; rcs+=($?); done
    local f passed=0 failed=0 skipped=0 timeouts=0 n
    : > "$LOGS/gpu-tests.log"
    for (( i = 0; i < SHARDS; i++ )); do
      f=$LOGS/gpu-tests-shard$i.log
      { echo "######## shard $i of $SHARDS (exit ${rcs[$i]})"; cat "$f"; } >> "$LOGS/gpu-tests.log"
      n=$(grep -oE '^\[  PASSED  \] [0-9]+' "$f" | grep -oE '[0-9]+$'); passed=$(( passed + ${n:-0} ))
      n=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$f" | grep -oE '[0-9]+' | head -1); skipped=$(( skipped + ${n:-0} ))
      n=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$f" | grep -oE '[0-9]+' | head -1); failed=$(( failed + ${n:-0} ))
      if [ "${rcs[$i]}" -eq 124 ] || [ "${rcs[$i]}" -eq 137 ]; then
        timeouts=$(( timeouts + 1 ))
        echo "shard $i TIMED OUT while running: $(grep '^\[ RUN      \]' "$f" | tail -1)"
      elif [ "${rcs[$i]}" -ne 0 ] && ! grep -q '^\[  FAILED  \]' "$f"; then
        failed=$(( failed + 1 )); echo "shard $i exited ${rcs[$i]} with no gtest verdict: $(tail -2 "$f" | tr '\n' ' ')"
      fi
      # After a fault (illegal or misaligned address) every later test of the process fails too:
      # the first failure in run order, and the first CUDA error, point at the one that faulted.
      n=$(grep -m1 -E '^\[  FAILED  \] [A-Za-z]' "$f") && echo "shard $i first failure: $n"
      # (not the batch-copy warnings: a refused cudaMemcpyBatchAsync is no fault)
      # (awk, no pipe: under pipefail a grep -m1 at the end of a pipe kills its feeder, 141)
      n=$(awk '/cudaMemcpyBatchAsync/ {next} /cudaError|illegal (memory )?address|misaligned address/ {print; exit}' "$f")
      [ -n "$n" ] && echo "shard $i first CUDA error: $n"
      rm -f "$f"
    done
    grep -E '^\[  FAILED  \] [A-Za-z]' "$LOGS/gpu-tests.log" | sed 's/ ([0-9]* ms)$//' | sort -u | head -20
    local res=PASS
    (( failed > 0 )) && res=FAIL
    (( timeouts > 0 )) && res=TIMEOUT
    (( passed == 0 && failed == 0 && timeouts == 0 )) && res=SKIP
    # nvidia-smi showed a GPU above, so a test skipped for "no CUDA device" (KVSPLIT_REQUIRE_DEVICE)
    # means the CUDA runtime could not start here (libcuda not found, a driver older than the
    # runtime, ...): the device tests did not run, and the stage fails, whatever else passed.
    local nodev nodev_why note=""
    nodev=$(grep -A1 ': Skipped$' "$LOGS/gpu-tests.log" | grep -c 'no CUDA device')
    if (( nodev > 0 )); then
      nodev_why=$(grep -A1 ': Skipped$' "$LOGS/gpu-tests.log" | grep -m1 -o 'no CUDA device.*')
      loud "nvidia-smi shows a GPU, but $nodev gpu tests skipped with \"$nodev_why\": the CUDA runtime cannot use it (env.log: libraries, driver)"
      res=FAIL
      note="; $nodev skipped for $nodev_why"
    fi
    record "gpu tests" "$res" "(passed $passed, failed $failed, skipped $skipped, shards timed out $timeouts$note)"
    if (( skipped > 0 )); then
      echo "most common skip reasons:"
      grep -A1 ': Skipped$' "$LOGS/gpu-tests.log" | grep -vE ': Skipped$|^--$' | sort | uniq -c \
        | sort -rn | head -3
    fi
  fi

  # ---- b. bench_attention plain + mixed ----------------------------------------------------
  local blog=$LOGS/bench-attention.log rc
  : > "$blog"
  for m in plain mixed probe; do
    # probe: the mixed kernel with each stage left out in turn (issue 11: where its time goes).
    local args=(--mode "$m")
    [ "$m" = probe ] && args=(--mode mixed --probe)
    lim=$(allow 45)
    if [ ! -x "${BIN[bench_attention]}" ]; then record "bench_attention $m" SKIP "$NOBIN"; continue; fi
    if [ "$lim" -eq 0 ]; then record "bench_attention $m" SKIP "(no time left)"; continue; fi
    log "b. bench_attention ${args[*]}, ${lim}s"
    echo "######## bench_attention ${args[*]}" >> "$blog"
    run_logged "$blog" "$lim" "${BIN[bench_attention]}" "${args[@]}" --iters 10 --warmup 2; rc=$?
    record_bench "bench_attention $m" $rc "$blog"
  done

  # ---- c. bench_temporal --swap-bandwidth ---------------------------------------------------
  local tlog=$LOGS/bench-temporal.log
  : > "$tlog"
  lim=$(allow 40)
  if [ ! -x "${BIN[bench_temporal]}" ]; then record "swap bandwidth" SKIP "$NOBIN"
  elif [ "$lim" -eq 0 ]; then record "swap bandwidth" SKIP "(no time left)"
  else
    log "c. bench_temporal --swap-bandwidth --backend cuda, ${lim}s"
    run_logged "$tlog" "$lim" "${BIN[bench_temporal]}" --model synthetic:llama-110m --swap-bandwidth \
      --backend cuda --pages 128 --reps 3; rc=$?
    record_bench "swap bandwidth" $rc "$tlog"
  fi

  # ---- d. bench_spatial --backend cuda at 128K ----------------------------------------------
  local slog=$LOGS/bench-spatial.log
  : > "$slog"
  lim=$(allow 60)
  if [ ! -x "${BIN[bench_spatial]}" ]; then record "spatial 128K" SKIP "$NOBIN"
  elif [ "$lim" -lt 30 ]; then record "spatial 128K" SKIP "(no time left)"
  else
    log "d. bench_spatial --backend cuda --decode 1 x 128K, shards 1,4, ${lim}s"
    run_logged "$slog" "$lim" "${BIN[bench_spatial]}" --backend cuda --decode --contexts 131072 \
      --shards 1,4 --steps 4 --reps 2 --warmup 1; rc=$?
    record_bench "spatial 128K" $rc "$slog"
  fi

  # ---- e. goldens through kvsplit generate --backend cuda -----------------------------------
  local glog=$LOGS/golden.log
  lim=$(allow 40)
  local cases=$TMP/golden-cases.jsonl
  head -n "${GOLDEN_CASES:-4}" "${KVSPLIT_MODELS:-/nonexistent}/golden/stories260K_greedy.jsonl" > "$cases" 2>/dev/null
  if [ -z "$GOLDEN_PY" ] || [ ! -f "$GOLDEN_PY" ] || [ -z "${KVSPLIT_MODELS:-}" ]; then
    record "goldens (cuda)" SKIP "(no golden_check.py or models)"
  elif [ ! -x "${BIN[kvsplit]}" ]; then record "goldens (cuda)" SKIP "$NOBIN"
  elif [ ! -s "$cases" ]; then record "goldens (cuda)" SKIP "(no golden cases under \$KVSPLIT_MODELS)"
  elif ! command -v python3 >/dev/null; then record "goldens (cuda)" SKIP "(no python3)"
  elif [ "$lim" -eq 0 ]; then record "goldens (cuda)" SKIP "(no time left)"
  else
    log "e. golden_check.py through kvsplit generate --backend cuda --weight-dtype f32, ${lim}s"
    # The kit's library path for kvsplit alone (python3 keeps the machine's own libraries).
    local wrap=$TMP/kvsplit-cuda-f32
    printf '#!/usr/bin/env bash\nexport LD_LIBRARY_PATH=%q\nexec %q "$@" --backend cuda --weight-dtype f32\n' \
      "$LIBPATH" "${BIN[kvsplit]}" > "$wrap"
    chmod +x "$wrap"
    echo "\$ golden_check.py $wrap (timeout ${lim}s)" > "$glog"
    timeout -k 5 "$lim" env PYTHONUNBUFFERED=1 python3 "$GOLDEN_PY" "$wrap" --models "$KVSPLIT_MODELS" \
      --cases "$cases" >> "$glog" 2>&1; rc=$?
    echo "[exit $rc]" >> "$glog"
    local verdict; verdict=$(grep -E 'golden cases match' "$glog" | tail -1)
    local ok=${verdict%%/*} total; total=${verdict#*/}; total=${total%% *}
    local res; res=$(bench_result $rc "$glog")
    if [ -n "$verdict" ]; then
      record "goldens (cuda)" "$res" "(pass ${ok:-0}, fail $(( ${total:-0} - ${ok:-0} )); $verdict)"
    else
      record "goldens (cuda)" "$res" "(exit $rc, no verdict line)"
    fi
    # The same cases with speculative decoding: drafts verified by multi-token rows (every row's
    # logits) over the paged KV on the device must give the same tokens.
    local swrap=$TMP/kvsplit-cuda-f32-spec slog=$glog  # appended: 8 log files at most
    lim=$(allow 40)
    printf '#!/usr/bin/env bash\nexport LD_LIBRARY_PATH=%q\nexec %q "$@" --backend cuda --weight-dtype f32 --speculative ngram\n' \
      "$LIBPATH" "${BIN[kvsplit]}" > "$swrap"
    chmod +x "$swrap"
    echo "\$ golden_check.py $swrap (timeout ${lim}s)" >> "$slog"
    [ "$lim" -eq 0 ] && lim=1  # out of time: the run times out at once and is recorded so
    timeout -k 5 "$lim" env PYTHONUNBUFFERED=1 python3 "$GOLDEN_PY" "$swrap" --models "$KVSPLIT_MODELS" \
      --cases "$cases" >> "$slog" 2>&1; rc=$?
    echo "[exit $rc]" >> "$slog"
    verdict=$(grep -E 'golden cases match' "$slog" | tail -1)
    res=$(bench_result $rc "$slog")
    record "goldens (cuda, speculative)" "$res" "(exit $rc; ${verdict:-no verdict line})"
  fi

  summary "$mode"
}

# LD_LIBRARY_PATH for the kit's binaries: the kit's lib/ first, then wherever this machine keeps
# what ldd still cannot find (cudart, cuBLAS, NCCL: the CUDA toolkit, or the nvidia-* Python
# packages beside PyTorch), then the caller's LD_LIBRARY_PATH. Prints what it did (env.log).
resolve_libs() {
  LIBPATH=""
  [ -d "$KITX/lib" ] && [ "$mode" = kit ] && LIBPATH=$KITX/lib
  local cands=() d p
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/x86_64-linux/lib \
           /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
    [ -d "$d" ] && cands+=("$d")
  done
  if command -v python3 >/dev/null; then
    while read -r p; do
      for d in "$p"/*/lib "$p"/cu*/lib; do [ -d "$d" ] && cands+=("$d"); done
    done < <(timeout 20 python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
  fi
  echo "== libraries (candidates: ${cands[*]})"
  local with_caller name found missing bins=()
  for name in "${!BIN[@]}"; do [ -x "${BIN[$name]}" ] && bins+=("${BIN[$name]}"); done
  [ ${#bins[@]} -gt 0 ] || { echo "no binaries"; return; }
  for _ in 1 2 3 4 5 6; do
    with_caller=$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    missing=$(for b in "${bins[@]}"; do LD_LIBRARY_PATH=$with_caller ldd "$b" 2>&1; done \
              | awk '/=> not found/ {print $1}' | sort -u)
    if LD_LIBRARY_PATH=$with_caller ldd "${bins[0]}" 2>&1 | grep -q "GLIBCXX.*not found\|CXXABI.*not found" \
       && [ -d "$KITX/lib/fallback" ] && [[ ":$LIBPATH:" != *":$KITX/lib/fallback:"* ]]; then
      echo "the system libstdc++ is too old: adding the kit's lib/fallback"
      LIBPATH=$LIBPATH:$KITX/lib/fallback; continue
    fi
    [ -n "$missing" ] || break
    local before=$LIBPATH rest=() expr=() f
    declare -A where=()
    for name in $missing; do
      for d in "${cands[@]}"; do [ -e "$d/$name" ] && { where[$name]=$d; break; }; done
      [ -n "${where[$name]:-}" ] || { rest+=("$name"); expr+=(-o -name "$name"); }
    done
    if [ ${#rest[@]} -gt 0 ]; then   # one search for all the others, 30 s at most
      echo "searching /usr /opt /lib for ${rest[*]}"
      while read -r f; do [ -n "${where[${f##*/}]:-}" ] || where[${f##*/}]=${f%/*}; done \
        < <(timeout 30 find /usr /opt /lib \( "${expr[@]:1}" \) -print 2>/dev/null)
    fi
    for name in $missing; do
      found=${where[$name]:-}
      if [ -n "$found" ] && [[ ":$LIBPATH:" != *":$found:"* ]]; then
        echo "$name: from $found"; LIBPATH=$LIBPATH${LIBPATH:+:}$found
      elif [ -z "$found" ]; then
        echo "$name: STILL MISSING (not in the candidates, nor under /usr /opt /lib)"
      fi
    done
    [ "$LIBPATH" != "$before" ] || break   # nothing more to find
  done
  LIBPATH=${LIBPATH#:}
  LIBPATH=$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat; do
      if [ -e "$d/libcuda.so.1" ]; then
        [[ ":$LIBPATH:" == *":$d:"* ]] || LIBPATH=$LIBPATH:$d
        echo "libcuda.so.1 (the driver, loaded by cudart): from $d"; break
      fi
    done
  fi
  for b in "${bins[@]}"; do echo "== ldd ${b##*/}"; LD_LIBRARY_PATH=$LIBPATH ldd "$b" 2>&1; done
  # The glibc / libstdc++ the binaries need that this machine does not have.
  for b in "${bins[@]}"; do LD_LIBRARY_PATH=$LIBPATH ldd "$b" 2>&1; done | grep -E "version .* not found" \
    | sort -u | sed 's/^/STILL MISSING: /'
}

# Whether the device's tree still holds the sources the kit was built from (the kit may be stale).
kit_freshness() {
  local sums=$KIT/SOURCES.sha256 changed added
  [ -f "$sums" ] || { log "kit: no SOURCES.sha256, cannot tell whether it matches this tree"; return; }
  changed=$(sha256sum -c "$sums" 2>/dev/null | grep -v ': OK$' | cut -d: -f1)
  added=$(LC_ALL=C comm -13 <(awk '{print $2}' "$sums" | LC_ALL=C sort) \
            <({ find src include kernels tests benchmarks -type f 2>/dev/null; echo CMakeLists.txt; } | LC_ALL=C sort) \
          | grep -vE '(^|/)(__pycache__|\.)|\.pyc$')
  {
    echo "== kit freshness"
    echo "changed since the kit: ${changed:-none}"; echo "new since the kit: ${added:-none}"
  } >> "$LOGS/env.log"
  if [ -z "$changed" ] && [ -z "$added" ]; then
    log "kit matches this tree (every source file as when it was built)"
  else
    loud "KIT IS STALE: $(echo "$changed" "$added" | wc -w) source files differ from when it was built (env.log lists them): the results are for the kit's build ($(grep -m1 '^commit:' "$KIT/MANIFEST"))"
    echo "$changed $added" | tr ' ' '\n' | grep . | head -8
  fi
  if command -v git >/dev/null && git rev-parse HEAD >/dev/null 2>&1; then
    local head; head=$(git rev-parse HEAD)
    grep -q "^commit: $head" "$KIT/MANIFEST" || log "kit: built at $(grep -m1 '^commit:' "$KIT/MANIFEST" | cut -c9-20), HEAD here is ${head:0:12}"
  fi
}

summary() {
  local i npass=0 nfail=0 nskip=0
  echo
  echo "==================== gpu-check summary ($1 binaries) ===================="
  echo "device:  $(timeout 30 nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -1)"
  for i in "${!ST_NAME[@]}"; do
    printf '%-22s %-8s %s\n' "${ST_NAME[$i]}" "${ST_RES[$i]}" "${ST_NOTE[$i]}"
    case "${ST_RES[$i]}" in PASS) npass=$((npass+1));; SKIP) nskip=$((nskip+1));; *) nfail=$((nfail+1));; esac
  done
  echo "stages:  $npass PASS, $nfail FAIL/TIMEOUT, $nskip SKIP"
  echo "---- headline figures"
  grep -E "^device:" "$LOGS/bench-attention.log" 2>/dev/null | head -1
  grep -E "^B=" "$LOGS/bench-attention.log" 2>/dev/null | head -14
  # bench_attention's sliding-window rows (plain mode, shapes named "B=1 x 128K w4K"), then the
  # mixed-precision rows at the launcher's depth (the --mode mixed section, not its --probe run)
  grep -E "^B=[^ ]+ x [^ ]+ w[0-9]+K " "$LOGS/bench-attention.log" 2>/dev/null | head -12
  # plain rows whose output was wrong (stderr, in the same log) and rows still L2-resident
  grep -E "WRONG OUTPUT|L2-resident" "$LOGS/bench-attention.log" 2>/dev/null | head -6
  awk '/^######## bench_attention/ { s = $0; next }
       s ~ /--mode mixed$/ && /^B=/ && / (all-full|all-int8|all-int4|f\/8\/4\/evict) +(scored|-) +- /' \
    "$LOGS/bench-attention.log" 2>/dev/null | head -18
  grep -E "device->host|host->device" "$LOGS/bench-temporal.log" 2>/dev/null
  grep -E "^ +131072 " "$LOGS/bench-spatial.log" 2>/dev/null | head -4
  grep -E "golden cases match" "$LOGS/golden.log" 2>/dev/null | tail -2  # plain, speculative
  echo "logs:    $LOGS: $(cd "$LOGS" && printf "%s " *)"
  echo "elapsed: $(( $(date +%s) - start ))s"
}

main 2>&1 | tee "$LOGS/gpu-check.log"
rm -rf "$TMP"
exit 0
