// Host API of the GPU sampling kernel: temperature, min-p, top-k and top-p sampling with a
// per-request counter-based Philox4x32-10 stream. No CUDA device header.
//
// Semantics of one row (the host reference in tests/kernels/sampling_parity_test.cpp implements
// the same steps with sorting):
//   1. temperature < kSampleGreedyTemperature (or NaN): argmax of the logits (lowest id on exact
//      ties, NaN never wins) — as launch_argmax — or -1 when that maximum is NaN (all NaN) or
//      infinite: no usable logit (sampling::logits_usable; a model whose activations overflow).
//      No draw.
//   2. s_i = logit_i / temperature; NaN entries are excluded. If max s is not finite (all
//      excluded / -inf, or +inf present) the row falls back to step 1: its argmax, which is -1 when
//      the raw logits have no finite maximum (a finite row whose scaled maximum overflows keeps
//      its finite argmax).
//   3. w_i = expf(s_i - max s), mass q_i = floor(w_i * 2^40) (kernels/sampling/sampling_math.h).
//   4. Candidates: w_i >= min_p (min_p in (0, 1]; otherwise off), then the top_k of them by
//      (descending s, ascending id) when 0 < top_k < #candidates.
//   5. top_p < 1: in that order, keep the prefix up to the first token whose running mass exceeds
//      floor(top_p * M), M = candidate mass (so top-p is relative to the renormalised candidates).
//   6. One draw: 64 bits of Philox4x32-10 at counter (seed, step) (kernels/common/philox.h),
//      r = high64(bits * M_kept) in [0, M_kept); the token is the first kept id, in id order,
//      whose running mass exceeds r.
// A token therefore depends only on its row's logits, seed and step — never on other rows.
// Penalties (repetition / presence / frequency) are not applied here.
#pragma once

#include <cstdint>

#include "kernels/common/cuda_stream.h"
#include "kvsplit/status.h"

namespace kvsplit::kernels {

// Per-row parameters (device memory, [num_rows]). Out-of-range values never fault: top_k <= 0,
// top_p >= 1 or NaN, min_p <= 0 or NaN turn the filter off; min_p > 1 keeps only the maximum.
struct SampleRowParams {
  float temperature = 1.f;
  float top_p = 1.f;
  float min_p = 0.f;
  int32_t top_k = 0;
  uint64_t seed = 0;
  uint64_t step = 0;  // e.g. the number of tokens the request has generated so far
};

// ids[r] = sampled token of logits[r, 0..vocab); logits [num_rows, vocab] f32, params [num_rows],
// ids [num_rows] int32. One thread block per row. vocab in [1, kSampleMaxVocab].
Status launch_sample(const float* logits, int num_rows, int vocab, const SampleRowParams* params,
                     int32_t* ids, cudaStream_t stream);

// kInvalidArgument naming the field when a host-side copy of the params is out of the ranges of
// SamplingParams::validate() (temperature finite >= 0, top_p in (0, 1], min_p in [0, 1],
// top_k >= 0). Callers that take params from users validate before uploading.
Status validate_sample_params(const SampleRowParams& p);

}  // namespace kvsplit::kernels
