// Online-softmax state and its log-sum-exp merge, shared by the CPU backend and CUDA kernels.
//
// A partial attention result over a subset S of keys is (o, m, l):
//   m = max_{j in S} s_j,  l = sum_{j in S} exp(s_j - m),  o = sum_{j in S} exp(s_j - m) * v_j
// (o unnormalized). The final output is o / l. An empty subset has m = -inf, l = 0, o = 0.
#pragma once

#include <math.h>

#include "kernels/common/host_device.h"

namespace kvsplit::kernels {

struct SoftmaxState {
  float m;  // running max of scores
  float l;  // running sum of exp(score - m)
};

KVSPLIT_HOST_DEVICE SoftmaxState softmax_state_empty() { return SoftmaxState{-INFINITY, 0.f}; }

// Adds one score. Returns through *scale_old the factor by which the caller must rescale its
// accumulated o, and through *p the weight of the new value (exp(score - new m)).
KVSPLIT_HOST_DEVICE void softmax_state_add(SoftmaxState* st, float score, float* scale_old,
                                           float* p) {
  const float m_new = score > st->m ? score : st->m;
  const float a = (st->m == -INFINITY) ? 0.f : expf(st->m - m_new);
  const float b = expf(score - m_new);
  st->l = st->l * a + b;
  st->m = m_new;
  *scale_old = a;
  *p = b;
}

// Tile update (one rescale per tile instead of one per score), step 1: raises the running max to
// cover a tile whose largest score is tile_max and rescales l. Returns the factor by which the
// caller must rescale its accumulated o. Step 2, for each score s of the tile:
// p = expf(s - st->m); st->l += p; o += p * v. A tile_max of -inf (all masked) changes nothing.
KVSPLIT_HOST_DEVICE float softmax_state_raise_max(SoftmaxState* st, float tile_max) {
  if (tile_max <= st->m) return 1.f;
  const float a = (st->m == -INFINITY) ? 0.f : expf(st->m - tile_max);
  st->l *= a;
  st->m = tile_max;
  return a;
}

// Merges state b into a: returns the factors to apply to o_a and o_b so that
// o = o_a * (*scale_a) + o_b * (*scale_b) is the merged unnormalized output.
KVSPLIT_HOST_DEVICE SoftmaxState softmax_state_merge(SoftmaxState a, SoftmaxState b, float* scale_a,
                                                     float* scale_b) {
  if (b.m == -INFINITY) {
    *scale_a = 1.f;
    *scale_b = 0.f;
    return a;
  }
  if (a.m == -INFINITY) {
    *scale_a = 0.f;
    *scale_b = 1.f;
    return b;
  }
  const float m = a.m > b.m ? a.m : b.m;
  const float sa = expf(a.m - m);
  const float sb = expf(b.m - m);
  *scale_a = sa;
  *scale_b = sb;
  return SoftmaxState{m, a.l * sa + b.l * sb};
}

// Log-sum-exp of the scores the state has seen (m + log l); -inf when empty.
KVSPLIT_HOST_DEVICE float softmax_state_lse(SoftmaxState st) {
  return st.l > 0.f ? st.m + logf(st.l) : -INFINITY;
}

}  // namespace kvsplit::kernels
