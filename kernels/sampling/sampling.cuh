// GPU sampling kernel body (nvcc in sampling.cu; g++ under the emulation harness). Semantics and
// host API: kernels/sampling/sampling.h; per-element math: kernels/sampling/sampling_math.h.
//
// One thread block per row walks the vocab several times instead of sorting it:
//   max pass -> candidate count and mass -> top-k threshold (radix select on the 64-bit sort key,
//   8 bits per pass, early exit when the remaining bucket is wholly kept) -> top-p threshold
//   (radix select by mass) -> kept mass -> the draw, located by a block-wide prefix sum over
//   contiguous per-thread id ranges.
// Every reduction is over integers (counts, fixed-point masses) or max, so the result does not
// depend on the order in which threads or atomics combine.
#pragma once

#include "kernels/common/cuda_compat.h"
#include "kernels/common/philox.h"
#include "kernels/common/warp_reduce.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_math.h"

#if defined(KVSPLIT_EMULATE_CUDA)
#include <atomic>
// The 64-bit shared-memory atomic the kernel uses (CUDA has it natively).
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
#endif

namespace kvsplit::kernels {

inline constexpr int kSampleThreads = 512;
inline constexpr int kSampleRadixBits = 8;
inline constexpr int kSampleRadixBins = 1 << kSampleRadixBits;

struct SampleSmem {
  unsigned long long mass[kSampleRadixBins];
  unsigned count[kSampleRadixBins];
  unsigned long long scratch_u64[32];
  float scratch_f[32];
  int scratch_i[32];
  unsigned long long bc_prefix, bc_mask, bc_target;
  int bc_state;  // 0: continue, 1: threshold found, 2: nothing exceeds the target
};

// One row's view: logits, temperature and the quantities of earlier passes.
struct SampleRow {
  const float* logits;
  int vocab;
  float temperature;
  float max_scaled;
  float min_p;  // in (0, 1] when on
  bool min_p_on;
};

// True when token i is a candidate (not NaN, passes min-p); then its sort key and mass.
__device__ __forceinline__ bool sample_candidate(const SampleRow& r, int i, uint64_t* key,
                                                 uint64_t* mass) {
  const float s = r.logits[i] / r.temperature;
  if (s != s) return false;
  const float w = sample_weight(s, r.max_scaled);
  if (r.min_p_on && !(w >= r.min_p)) return false;
  *key = sample_sort_key(s, i);
  *mass = sample_mass(w);
  return true;
}

// Block-wide u64 sum; every thread gets it.
__device__ __forceinline__ unsigned long long sample_block_sum(unsigned long long v,
                                                               SampleSmem* sm) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kFullWarpMask, v, o);
  __syncthreads();
  if (lane == 0) sm->scratch_u64[warp] = v;
  __syncthreads();
  unsigned long long t = 0;
  for (int w = 0; w < num_warps; ++w) t += sm->scratch_u64[w];
  return t;
}

// (value, index) with NaN losing and the lowest index winning exact ties (as launch_argmax).
__device__ __forceinline__ bool sample_argmax_better(float v, int i, float best_v, int best_i) {
  if (v != v) return false;
  if (best_v != best_v) return true;
  return v > best_v || (v == best_v && i < best_i);
}

// Argmax of logits[0, vocab); every thread gets it, and its value in *best_value.
__device__ __forceinline__ int sample_block_argmax(const float* logits, int vocab, SampleSmem* sm,
                                                   float* best_value) {
  float best_v = NAN;
  int best_i = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (sample_argmax_better(logits[i], i, best_v, best_i)) {
      best_v = logits[i];
      best_i = i;
    }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(kFullWarpMask, best_v, o);
    const int oi = __shfl_xor_sync(kFullWarpMask, best_i, o);
    if (sample_argmax_better(ov, oi, best_v, best_i)) {
      best_v = ov;
      best_i = oi;
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) {
    sm->scratch_f[warp] = best_v;
    sm->scratch_i[warp] = best_i;
  }
  __syncthreads();
  best_v = sm->scratch_f[0];
  best_i = sm->scratch_i[0];
  for (int w = 1; w < num_warps; ++w)
    if (sample_argmax_better(sm->scratch_f[w], sm->scratch_i[w], best_v, best_i)) {
      best_v = sm->scratch_f[w];
      best_i = sm->scratch_i[w];
    }
  *best_value = best_v;
  return best_i;
}

// Radix select over the candidates with key >= lo, in descending key order. Returns the key of
// the first token at which the running total (counts when !by_mass, masses when by_mass) exceeds
// `target`; every candidate with key >= the result is kept. Returns lo when nothing exceeds it.
__device__ uint64_t sample_radix_select(const SampleRow& r, uint64_t lo, bool by_mass,
                                        uint64_t target, SampleSmem* sm) {
  uint64_t prefix = 0, mask = 0;
  for (int shift = 64 - kSampleRadixBits; shift >= 0; shift -= kSampleRadixBits) {
    for (int b = threadIdx.x; b < kSampleRadixBins; b += blockDim.x) {
      sm->count[b] = 0;
      sm->mass[b] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < r.vocab; i += blockDim.x) {
      uint64_t key, mass;
      if (!sample_candidate(r, i, &key, &mass) || key < lo || (key & mask) != prefix) continue;
      const int d = static_cast<int>((key >> shift) & (kSampleRadixBins - 1));
      atomicAdd(&sm->count[d], 1u);
      if (by_mass) atomicAdd(&sm->mass[d], static_cast<unsigned long long>(mass));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t acc = 0;
      int chosen = -1;
      for (int d = kSampleRadixBins - 1; d >= 0; --d) {
        const uint64_t v = by_mass ? sm->mass[d] : sm->count[d];
        if (acc + v > target) {
          chosen = d;
          break;
        }
        acc += v;
      }
      if (chosen < 0) {
        sm->bc_state = 2;
      } else {
        target -= acc;
        prefix |= static_cast<uint64_t>(chosen) << shift;
        mask |= static_cast<uint64_t>(kSampleRadixBins - 1) << shift;
        // The whole bucket is kept: everything from its lowest possible key up.
        const bool whole = by_mass ? sm->count[chosen] == 1 : sm->count[chosen] == target + 1;
        sm->bc_state = whole || shift == 0 ? 1 : 0;
      }
      sm->bc_prefix = prefix;
      sm->bc_mask = mask;
      sm->bc_target = target;
    }
    __syncthreads();
    const int state = sm->bc_state;
    prefix = sm->bc_prefix;
    mask = sm->bc_mask;
    target = sm->bc_target;
    if (state == 2) return lo;
    if (state == 1) return prefix;
  }
  return prefix;  // not reached: shift 0 always finishes
}

// Total mass of the candidates with key >= lo; with count != nullptr also their number.
__device__ __forceinline__ uint64_t sample_kept_mass(const SampleRow& r, uint64_t lo,
                                                     SampleSmem* sm, uint64_t* count) {
  unsigned long long m = 0, n = 0;
  for (int i = threadIdx.x; i < r.vocab; i += blockDim.x) {
    uint64_t key, mass;
    if (sample_candidate(r, i, &key, &mass) && key >= lo) {
      m += mass;
      ++n;
    }
  }
  m = sample_block_sum(m, sm);
  if (count) *count = sample_block_sum(n, sm);
  return m;
}

// grid num_rows, block kSampleThreads (a multiple of 32).
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* logits, int vocab, const SampleRowParams* params, int32_t* ids) {
  __shared__ SampleSmem sm;
  const int row_id = blockIdx.x;
  const SampleRowParams P = params[row_id];
  const float* row = logits + static_cast<int64_t>(row_id) * vocab;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, num_warps = blockDim.x / 32;

  bool greedy = !(P.temperature >= kSampleGreedyTemperature);
  float max_s = -INFINITY;
  if (!greedy) {
    for (int i = tid; i < vocab; i += blockDim.x) max_s = fmaxf(max_s, row[i] / P.temperature);
    max_s = warp_max(max_s);
    __syncthreads();
    if (lane == 0) sm.scratch_f[warp] = max_s;
    __syncthreads();
    max_s = sm.scratch_f[0];
    for (int w = 1; w < num_warps; ++w) max_s = fmaxf(max_s, sm.scratch_f[w]);
    greedy = !(max_s > -INFINITY && max_s < INFINITY);  // degenerate: all NaN / -inf, or +inf
  }
  if (greedy) {
    float best_v;
    const int best = sample_block_argmax(row, vocab, &sm, &best_v);
    // No usable logit (all NaN, or the maximum infinite): -1, as sampling::logits_usable.
    const bool usable = best_v == best_v && best_v > -INFINITY && best_v < INFINITY;
    if (tid == 0) ids[row_id] = usable ? best : -1;
    return;
  }

  SampleRow r{row, vocab, P.temperature, max_s, P.min_p < 1.f ? P.min_p : 1.f, P.min_p > 0.f};
  uint64_t num_candidates = 0;
  uint64_t lo = 0;  // kept: candidates with key >= lo (every key is > 0)
  uint64_t kept_mass = sample_kept_mass(r, lo, &sm, &num_candidates);
  if (P.top_k > 0 && static_cast<uint64_t>(P.top_k) < num_candidates) {
    lo = sample_radix_select(r, lo, /*by_mass=*/false, static_cast<uint64_t>(P.top_k) - 1, &sm);
    kept_mass = sample_kept_mass(r, lo, &sm, nullptr);
  }
  if (P.top_p < 1.f) {
    const uint64_t limit = top_p_limit(P.top_p, kept_mass);
    const uint64_t t = sample_radix_select(r, lo, /*by_mass=*/true, limit, &sm);
    if (t != lo) {
      lo = t;
      kept_mass = sample_kept_mass(r, lo, &sm, nullptr);
    }
  }
  const uint64_t pick = mul_hi_u64(sampling_random_bits(P.seed, P.step), kept_mass);

  // Locate `pick` in id order: thread t owns ids [t * chunk, (t + 1) * chunk).
  const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int begin = tid * chunk < vocab ? tid * chunk : vocab;
  const int end = begin + chunk < vocab ? begin + chunk : vocab;
  unsigned long long local = 0;
  for (int i = begin; i < end; ++i) {
    uint64_t key, mass;
    if (sample_candidate(r, i, &key, &mass) && key >= lo) local += mass;
  }
  unsigned long long incl = local;  // inclusive scan within the warp
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const unsigned long long v = __shfl_up_sync(kFullWarpMask, incl, o);
    if (lane >= o) incl += v;
  }
  __syncthreads();
  if (lane == 31) sm.scratch_u64[warp] = incl;
  __syncthreads();
  unsigned long long before = incl - local;
  for (int w = 0; w < warp; ++w) before += sm.scratch_u64[w];
  if (pick >= before && pick < before + local) {
    unsigned long long run = before;
    for (int i = begin; i < end; ++i) {
      uint64_t key, mass;
      if (!sample_candidate(r, i, &key, &mass) || key < lo) continue;
      run += mass;
      if (run > pick) {
        ids[row_id] = i;
        break;
      }
    }
  }
}

}  // namespace kvsplit::kernels
