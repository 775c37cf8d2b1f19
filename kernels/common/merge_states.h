// Merge of partial attention results over disjoint key sets, each given as a normalized output and
// the log-sum-exp of its scores (the spatial cut's partials, kv-cuts.md §4; Backend::
// merge_attention_states). One row = one query token and head. Shared by the CPU backend and the
// CUDA kernel so both compute the same sums in the same order.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/host_device.h"

namespace kvsplit::kernels {

// Weights of the parts of row r: w[p] = exp(lse[p][r] - M), M = max_p lse[p][r]. Returns M
// (-inf when every part is empty; every w is then 0). w has num_parts entries. A NaN or +inf
// lse (a bad partial) makes every weight and M NaN, so the merged row is NaN rather than a row
// that silently leaves that part out.
KVSPLIT_HOST_DEVICE float merge_weights(const float* const* lse, int num_parts, int64_t r,
                                        float* w) {
  float m = -INFINITY;
  bool bad = false;
  for (int p = 0; p < num_parts; ++p) {
    const float l = lse[p][r];
    bad = bad || l != l || l == INFINITY;
    m = l > m ? l : m;
  }
  if (bad) {
    for (int p = 0; p < num_parts; ++p) w[p] = NAN;
    return NAN;
  }
  for (int p = 0; p < num_parts; ++p) w[p] = m == -INFINITY ? 0.f : expf(lse[p][r] - m);
  return m;
}

// out[d] = sum_p w[p] * o[p][r * head_dim + d] / sum_p w[p] for d in [d0, d1); 0 when the sum
// is 0; NaN when the weights are (merge_weights of a bad partial).
KVSPLIT_HOST_DEVICE void merge_row(const float* const* o, const float* w, int num_parts, int64_t r,
                                   int head_dim, int d0, int d1, float* out) {
  float sum = 0.f;
  for (int p = 0; p < num_parts; ++p) sum += w[p];
  if (sum != sum) {
    for (int d = d0; d < d1; ++d) out[d] = NAN;
    return;
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int d = d0; d < d1; ++d) {
    float acc = 0.f;
    for (int p = 0; p < num_parts; ++p)
      if (w[p] > 0.f) acc += w[p] * o[p][r * head_dim + d];
    out[d] = acc * inv;
  }
}

// The merged log-sum-exp of row r: M + log(sum_p w[p]) (-inf when every part is empty; NaN for
// a bad partial).
KVSPLIT_HOST_DEVICE float merged_lse(float m, const float* w, int num_parts) {
  float sum = 0.f;
  for (int p = 0; p < num_parts; ++p) sum += w[p];
  if (sum != sum || m != m) return NAN;
  return sum > 0.f ? m + logf(sum) : -INFINITY;
}

}  // namespace kvsplit::kernels
