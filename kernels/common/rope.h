// Rotary position embedding math shared by the CPU backend and CUDA kernels.
#pragma once

#include <math.h>

#include "host_device.h"

namespace kvsplit::kernels {

// Indices of the i-th rotated pair (0 <= i < rotary_dim / 2) within one head.
// interleaved (llama2.c): (2i, 2i+1); half (HF rotate_half): (i, i + rotary_dim/2).
KVSPLIT_HOST_DEVICE void rope_pair(bool interleaved, int rotary_dim, int i, int* a, int* b) {
  if (interleaved) { *a = 2 * i; *b = 2 * i + 1; }
  else { *a = i; *b = i + rotary_dim / 2; }
}

// Rotates (x[a], x[b]) by angle pos * inv_freq.
KVSPLIT_HOST_DEVICE void rope_rotate(float* x, int a, int b, int pos, float inv_freq) {
  const float angle = static_cast<float>(pos) * inv_freq;
  const float c = cosf(angle);
  const float s = sinf(angle);
  const float x0 = x[a];
  const float x1 = x[b];
  x[a] = x0 * c - x1 * s;
  x[b] = x0 * s + x1 * c;
}

}  // namespace kvsplit::kernels
