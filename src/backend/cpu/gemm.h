// CPU GEMM for the "NT" layout of llama2.c / HF weights:
//   out[m, n] (= or +=) x[m, k] * W[n, k]^T (+ bias[n])
//
// Weights are used in a packed, k-major panel layout: W rows are grouped into panels of
// kGemmPanel rows; panel p stores element (row, col) at
//   p * kGemmPanel * k + col * kGemmPanel + (row - p * kGemmPanel),
// the last panel zero-padded. Packed elements are f32, or bf16/f16 kept as 16-bit words (half the
// bytes to stream in decode). pack_matrix() makes it once at upload (CpuBackend::upload_matrix);
// gemm() on a plain row-major matrix packs each panel on the fly into a per-thread f32 buffer.
// A 16-bit panel is read directly when m fits one register tile (decode) and widened once into a
// per-thread f32 buffer when several tiles reuse it (prefill); widening is exact either way.
//
// Batch invariance: every output element is computed the same way whatever m, its tile, the path
// (packed or on the fly) or the thread count: acc = 0; for kk in 0..k-1: acc = fma(x[kk], w[kk],
// acc) (one correctly rounded FMA per step, in k order); then acc + bias (if any); then out + that
// (if accumulate), else a plain store. Vector lanes run over n, never over k, so there is no
// horizontal reduction whose shape could depend on the tile.
#pragma once

#include <cstdint>

#include "backend/cpu/simd.h"
#include "backend/dtype.h"
#include "common/thread_pool.h"

namespace kvsplit::backend::cpu {

#if defined(KVSPLIT_CPU_AVX512)
inline constexpr int kGemmPanel = 64;  // W rows per panel (4 zmm)
inline constexpr int kGemmMr = 6;      // x rows per register tile (24 accumulators)
#elif defined(KVSPLIT_CPU_AVX2)
inline constexpr int kGemmPanel = 16;  // 2 ymm
inline constexpr int kGemmMr = 6;      // 12 accumulators
#else
inline constexpr int kGemmPanel = 16;
inline constexpr int kGemmMr = 4;
#endif

// Floats needed for the packed form of a [rows, cols] matrix.
int64_t packed_size(int64_t rows, int64_t cols);

// Packs `src` (row-major [rows, cols] of `dtype`) into `dst` (packed_size(rows, cols) elements of
// `dst_dtype`, 64-byte aligned). dst_dtype is kF32 (f16/bf16 converted exactly) or == dtype
// (16-bit words kept). Parallel over panels when `pool` is given.
void pack_matrix(const void* src, DType dtype, int64_t rows, int64_t cols, void* dst,
                 DType dst_dtype, ThreadPool* pool);
// Same with dst_dtype = kF32.
void pack_matrix(const void* src, DType dtype, int64_t rows, int64_t cols, float* dst,
                 ThreadPool* pool);

// Copies row `row` of a packed [rows, cols] matrix of `dtype` into out[cols] (f32).
void unpack_row(const void* packed, DType dtype, int64_t rows, int64_t cols, int64_t row,
                float* out);

// A weight matrix W[n, k]: either packed (packed != nullptr, elements of `dtype`) or row-major
// `raw` of `dtype`.
struct GemmWeights {
  const void* packed = nullptr;
  const void* raw = nullptr;
  DType dtype = DType::kF32;
  int64_t n = 0;  // rows of W = output features
  int64_t k = 0;  // cols of W = input features
};

// out[m, n] (=|+=) x[m, k] * W^T (+ bias[n]). x, out row-major with leading dims k and n; bias
// may be null. Threads split the panels of W (each thread streams its own part of W). m >= 0.
void gemm(const float* x, int64_t m, const GemmWeights& w, const float* bias, float* out,
          bool accumulate, ThreadPool& pool);

// Reference-order scalar GEMM on a row-major f32 W (same per-element order as gemm()); for tests.
void gemm_scalar_rowmajor(const float* x, int64_t m, const float* w, int64_t n, int64_t k,
                          const float* bias, float* out, bool accumulate);

}  // namespace kvsplit::backend::cpu
