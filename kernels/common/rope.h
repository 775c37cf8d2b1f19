// Rotary position embedding math shared by the CPU backend and CUDA kernels.
#pragma once

#include <math.h>

#include "kernels/common/host_device.h"

namespace kvsplit::kernels {

// Indices of the i-th rotated pair (0 <= i < rotary_dim / 2) within one head.
// interleaved (llama2.c): (2i, 2i+1); half (HF rotate_half): (i, i + rotary_dim/2).
KVSPLIT_HOST_DEVICE void rope_pair(bool interleaved, int rotary_dim, int i, int* a, int* b) {
  if (interleaved) {
    *a = 2 * i;
    *b = 2 * i + 1;
  } else {
    *a = i;
    *b = i + rotary_dim / 2;
  }
}

// cos and sin of the angle pos * inv_freq (float, as HF's fp32 `inv_freq @ position_ids`), each
// multiplied by `attention_factor` (HF `attention_scaling`: 1 except for YaRN, where it scales
// q and k, hence the attention logits by its square). A factor of exactly 1 leaves the values
// bitwise unchanged.
KVSPLIT_HOST_DEVICE void rope_cos_sin(int pos, float inv_freq, float attention_factor, float* c,
                                      float* s) {
  const float angle = static_cast<float>(pos) * inv_freq;
  *c = cosf(angle) * attention_factor;
  *s = sinf(angle) * attention_factor;
}

// Rotates (x[a], x[b]) by a precomputed (cos, sin) pair from rope_cos_sin.
KVSPLIT_HOST_DEVICE void rope_apply(float* x, int a, int b, float c, float s) {
  const float x0 = x[a];
  const float x1 = x[b];
  x[a] = x0 * c - x1 * s;
  x[b] = x0 * s + x1 * c;
}

// Rotates (x[a], x[b]) by angle pos * inv_freq, scaled by attention_factor.
KVSPLIT_HOST_DEVICE void rope_rotate(float* x, int a, int b, int pos, float inv_freq,
                                     float attention_factor) {
  float c, s;
  rope_cos_sin(pos, inv_freq, attention_factor, &c, &s);
  rope_apply(x, a, b, c, s);
}

}  // namespace kvsplit::kernels
