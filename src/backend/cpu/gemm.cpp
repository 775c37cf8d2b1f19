#include "backend/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "common/check.h"

namespace kvsplit::backend::cpu {
namespace {

constexpr int64_t kP = kGemmPanel;
constexpr int64_t kTasksPerThread = 3;

int64_t num_panels(int64_t rows) { return (rows + kP - 1) / kP; }

// Weight element types of a packed panel: f32, or 16-bit bf16 / f16 words.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

inline float to_f32(float v) { return v; }
inline float to_f32(Bf16 v) { return bf16_to_f32(v.bits); }
inline float to_f32(F16 v) { return f16_to_f32(v.bits); }

float load_as_f32(const void* src, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(src)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
  }
  return 0.f;
}

// Packs panel p of row-major src [rows, cols] into dst [cols, kP] (zero-padded past `rows`),
// converting to f32.
void pack_panel_f32(const void* src, DType dtype, int64_t rows, int64_t cols, int64_t p,
                    float* dst) {
  const int64_t r0 = p * kP;
  const int64_t nvalid = std::min<int64_t>(kP, rows - r0);
  if (nvalid < kP) std::memset(dst, 0, sizeof(float) * kP * cols);
  for (int64_t r = 0; r < nvalid; ++r) {
    const int64_t base = (r0 + r) * cols;
    if (dtype == DType::kF32) {
      const float* s = static_cast<const float*>(src) + base;
      for (int64_t c = 0; c < cols; ++c) dst[c * kP + r] = s[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) dst[c * kP + r] = load_as_f32(src, dtype, base + c);
    }
  }
}

// Same, keeping 16-bit words (bf16 / f16 stay as they are).
void pack_panel_u16(const uint16_t* src, int64_t rows, int64_t cols, int64_t p, uint16_t* dst) {
  const int64_t r0 = p * kP;
  const int64_t nvalid = std::min<int64_t>(kP, rows - r0);
  if (nvalid < kP) std::memset(dst, 0, sizeof(uint16_t) * kP * cols);
  for (int64_t r = 0; r < nvalid; ++r) {
    const uint16_t* s = src + (r0 + r) * cols;
    for (int64_t c = 0; c < cols; ++c) dst[c * kP + r] = s[c];
  }
}

// Converts a packed 16-bit panel (kP * k words) to f32.
template <typename WT>
void widen_panel(const WT* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = to_f32(src[i]);
}

// Per-thread 64-byte-aligned scratch for on-the-fly packing.
float* thread_scratch(int64_t floats) {
  struct Buf {
    float* p = nullptr;
    int64_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf buf;
  if (buf.n < floats) {
    std::free(buf.p);
    const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    buf.p = static_cast<float*>(std::aligned_alloc(64, bytes));
    KVSPLIT_CHECK_MSG(buf.p != nullptr, "gemm scratch allocation failed");
    buf.n = floats;
  }
  return buf.p;
}

// Register tile: c[MR, kP] = x[MR rows, ldx] * panel^T, over all k. Every element is the FMA
// chain from 0 in k order (see gemm.h); 16-bit weights are widened exactly before the FMA.
//
// `pf`, `pf_lines`: cache lines to prefetch into L2 meanwhile (part of the next panel), `pf_step`
// per k step, so the next panel's DRAM reads overlap this panel's work.
#if defined(KVSPLIT_CPU_AVX512)
inline __m512 load16(const float* p) { return _mm512_load_ps(p); }
inline __m512 load16(const Bf16* p) {
  const __m256i h = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16(const F16* p) {
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int MR, typename WT>
void tile(const float* x, int64_t ldx, const WT* wp, int64_t k, float* c, const char* pf,
          int64_t pf_lines, int pf_step) {
  __m512 acc[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    if (kk * pf_step < pf_lines) {
      for (int q = 0; q < pf_step; ++q) _mm_prefetch(pf + (kk * pf_step + q) * 64, _MM_HINT_T1);
    }
    const WT* wk = wp + kk * kP;
    const __m512 w0 = load16(wk);
    const __m512 w1 = load16(wk + 16);
    const __m512 w2 = load16(wk + 32);
    const __m512 w3 = load16(wk + 48);
    for (int r = 0; r < MR; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * ldx + kk]);
      acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(xb, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(xb, w3, acc[r][3]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 4; ++v) _mm512_store_ps(c + r * kP + v * 16, acc[r][v]);
}
#elif defined(KVSPLIT_CPU_AVX2)
inline __m256 load8(const float* p) { return _mm256_load_ps(p); }
inline __m256 load8(const Bf16* p) {
  const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const F16* p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float t[8];
  for (int i = 0; i < 8; ++i) t[i] = to_f32(p[i]);
  return _mm256_load_ps(t);
#endif
}

template <int MR, typename WT>
void tile(const float* x, int64_t ldx, const WT* wp, int64_t k, float* c, const char* pf,
          int64_t pf_lines, int pf_step) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    if (kk * pf_step < pf_lines) {
      for (int q = 0; q < pf_step; ++q) _mm_prefetch(pf + (kk * pf_step + q) * 64, _MM_HINT_T1);
    }
    const WT* wk = wp + kk * kP;
    const __m256 w0 = load8(wk);
    const __m256 w1 = load8(wk + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * ldx + kk);
      acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_store_ps(c + r * kP, acc[r][0]);
    _mm256_store_ps(c + r * kP + 8, acc[r][1]);
  }
}
#else
template <int MR, typename WT>
void tile(const float* x, int64_t ldx, const WT* wp, int64_t k, float* c, const char*, int64_t,
          int) {
  float acc[MR][kP] = {};
  for (int64_t kk = 0; kk < k; ++kk) {
    const WT* wk = wp + kk * kP;
    for (int r = 0; r < MR; ++r) {
      const float xv = x[r * ldx + kk];
      for (int j = 0; j < kP; ++j) acc[r][j] = std::fma(xv, to_f32(wk[j]), acc[r][j]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < kP; ++j) c[r * kP + j] = acc[r][j];
}
#endif

template <typename WT, int... Ms>
void run_tile_impl(int mr, const float* x, int64_t ldx, const WT* wp, int64_t k, float* c,
                   const char* pf, int64_t pf_lines, int pf_step,
                   std::integer_sequence<int, Ms...>) {
  // Dispatch mr (1..kGemmMr) to tile<mr>.
  ((mr == Ms + 1 ? (tile<Ms + 1>(x, ldx, wp, k, c, pf, pf_lines, pf_step), 0) : 0), ...);
}

template <typename WT>
void run_tile(int mr, const float* x, int64_t ldx, const WT* wp, int64_t k, float* c,
              const char* pf, int64_t pf_lines, int pf_step) {
  run_tile_impl(mr, x, ldx, wp, k, c, pf, pf_lines, pf_step,
                std::make_integer_sequence<int, kGemmMr>{});
}

// out rows (leading dim ldo) <- c tile: v = c (+ bias); out = accumulate ? out + v : v.
void epilogue(const float* c, int mr, int64_t nvalid, const float* bias, float* out, int64_t ldo,
              bool accumulate) {
  for (int r = 0; r < mr; ++r) {
    const float* cr = c + r * kP;
    float* o = out + r * ldo;
    for (int64_t j = 0; j < nvalid; ++j) {
      float v = cr[j];
      if (bias) v = v + bias[j];
      o[j] = accumulate ? o[j] + v : v;
    }
  }
}

// Rows [m0, m1) of x times one panel (`panel` of element type WT), all tiles; prefetches
// `pf_total_lines` lines from `next` (null: none) spread over the tiles.
template <typename WT>
void panel_rows(const float* x, int64_t k, int64_t m0, int64_t m1, const WT* panel,
                const char* next, int64_t pf_total_lines, int64_t j0, int64_t nvalid,
                const float* bias, float* out, int64_t n, bool accumulate) {
  alignas(64) float c[kGemmMr * kP];
  const int64_t num_tiles = (m1 - m0 + kGemmMr - 1) / kGemmMr;
  const int64_t lines_per_tile = next ? (pf_total_lines + num_tiles - 1) / num_tiles : 0;
  for (int64_t i = m0, t = 0; i < m1; i += kGemmMr, ++t) {
    const int mr = static_cast<int>(std::min<int64_t>(kGemmMr, m1 - i));
    if (k > 0) {
      const int64_t first = std::min(pf_total_lines, t * lines_per_tile);
      const int64_t count = std::max<int64_t>(0, std::min(lines_per_tile, pf_total_lines - first));
      const int pf_step = static_cast<int>(std::clamp<int64_t>((count + k - 1) / k, 1, 8));
      run_tile(mr, x + i * k, k, panel, k, c, next ? next + first * 64 : nullptr, count, pf_step);
    } else {
      std::fill(c, c + kGemmMr * kP, 0.f);
    }
    epilogue(c, mr, nvalid, bias ? bias + j0 : nullptr, out + i * n + j0, n, accumulate);
  }
}

template <typename WT>
void gemm_packed_half(const float* x, int64_t k, int64_t m0, int64_t m1, const WT* panel,
                      const char* next, int64_t pf_lines, int64_t j0, int64_t nvalid,
                      const float* bias, float* out, int64_t n, bool accumulate) {
  if (m1 - m0 <= kGemmMr) {
    // One tile: read the 16-bit panel directly (half the bytes of f32: decode).
    panel_rows(x, k, m0, m1, panel, next, pf_lines, j0, nvalid, bias, out, n, accumulate);
  } else {
    // Several tiles: widen the panel once (exact) and reuse it from cache.
    float* wide = thread_scratch(kP * k);
    widen_panel(panel, kP * k, wide);
    panel_rows(x, k, m0, m1, static_cast<const float*>(wide), next, pf_lines, j0, nvalid, bias, out,
               n, accumulate);
  }
}

}  // namespace

int64_t packed_size(int64_t rows, int64_t cols) { return num_panels(rows) * kP * cols; }

void pack_matrix(const void* src, DType dtype, int64_t rows, int64_t cols, void* dst,
                 DType dst_dtype, ThreadPool* pool) {
  KVSPLIT_CHECK(dst_dtype == DType::kF32 || dst_dtype == dtype);
  auto one = [&](int64_t p) {
    if (dst_dtype == DType::kF32) {
      pack_panel_f32(src, dtype, rows, cols, p, static_cast<float*>(dst) + p * kP * cols);
    } else {
      pack_panel_u16(static_cast<const uint16_t*>(src), rows, cols, p,
                     static_cast<uint16_t*>(dst) + p * kP * cols);
    }
  };
  const int64_t np = num_panels(rows);
  if (pool) {
    pool->parallel_for(np, one);
  } else {
    for (int64_t p = 0; p < np; ++p) one(p);
  }
}

void pack_matrix(const void* src, DType dtype, int64_t rows, int64_t cols, float* dst,
                 ThreadPool* pool) {
  pack_matrix(src, dtype, rows, cols, dst, DType::kF32, pool);
}

void unpack_row(const void* packed, DType dtype, int64_t rows, int64_t cols, int64_t row,
                float* out) {
  KVSPLIT_CHECK(row >= 0 && row < rows);
  const int64_t base = (row / kP) * kP * cols + row % kP;
  for (int64_t c = 0; c < cols; ++c) out[c] = load_as_f32(packed, dtype, base + c * kP);
}

void gemm(const float* x, int64_t m, const GemmWeights& w, const float* bias, float* out,
          bool accumulate, ThreadPool& pool) {
  const int64_t n = w.n;
  const int64_t k = w.k;
  if (m <= 0 || n <= 0) return;
  KVSPLIT_CHECK(w.packed != nullptr || w.raw != nullptr || k == 0);
  // Tasks are contiguous runs of panels handed out dynamically (a descheduled thread does not
  // stall the others); a few per thread so each still streams a long contiguous part of W.
  const int64_t np = num_panels(n);
  const int64_t want_tasks = int64_t{pool.num_threads()} * kTasksPerThread;
  const int64_t per_task = std::max<int64_t>(1, np / want_tasks);
  const int64_t panel_tasks = (np + per_task - 1) / per_task;
  // Too few panels for the threads (small n, many threads): also split m, in whole tiles.
  const int64_t num_tiles_total = (m + kGemmMr - 1) / kGemmMr;
  const int64_t m_chunks =
      panel_tasks >= want_tasks
          ? 1
          : std::min(num_tiles_total, (want_tasks + panel_tasks - 1) / panel_tasks);
  const int64_t rows_per_chunk = (num_tiles_total + m_chunks - 1) / m_chunks * kGemmMr;
  const int64_t elem_bytes = w.packed != nullptr ? static_cast<int64_t>(dtype_size(w.dtype)) : 4;
  const int64_t panel_bytes = kP * k * elem_bytes;
  pool.parallel_for(panel_tasks * m_chunks, [&](int64_t task) {
    const int64_t pb = (task / m_chunks) * per_task;
    const int64_t pe = std::min(np, pb + per_task);
    const int64_t m0 = (task % m_chunks) * rows_per_chunk;
    const int64_t m1 = std::min(m, m0 + rows_per_chunk);
    if (m0 >= m1) return;
    for (int64_t p = pb; p < pe; ++p) {
      const int64_t j0 = p * kP;
      const int64_t nvalid = std::min<int64_t>(kP, n - j0);
      if (w.packed == nullptr) {
        float* scratch = k > 0 ? thread_scratch(kP * k) : nullptr;
        if (k > 0) pack_panel_f32(w.raw, w.dtype, n, k, p, scratch);
        panel_rows(x, k, m0, m1, static_cast<const float*>(scratch), nullptr, 0, j0, nvalid, bias,
                   out, n, accumulate);
        continue;
      }
      // The next packed panel of this task is prefetched across this panel's tiles.
      const char* base = static_cast<const char*>(w.packed) + p * panel_bytes;
      const char* next = p + 1 < pe ? base + panel_bytes : nullptr;
      const int64_t pf_lines = next ? panel_bytes / 64 : 0;
      switch (w.dtype) {
        case DType::kF32:
          panel_rows(x, k, m0, m1, reinterpret_cast<const float*>(base), next, pf_lines, j0, nvalid,
                     bias, out, n, accumulate);
          break;
        case DType::kBF16:
          gemm_packed_half(x, k, m0, m1, reinterpret_cast<const Bf16*>(base), next, pf_lines, j0,
                           nvalid, bias, out, n, accumulate);
          break;
        case DType::kF16:
          gemm_packed_half(x, k, m0, m1, reinterpret_cast<const F16*>(base), next, pf_lines, j0,
                           nvalid, bias, out, n, accumulate);
          break;
      }
    }
  });
}

void gemm_scalar_rowmajor(const float* x, int64_t m, const float* w, int64_t n, int64_t k,
                          const float* bias, float* out, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t kk = 0; kk < k; ++kk) acc = std::fma(x[i * k + kk], w[j * k + kk], acc);
      float v = acc;
      if (bias) v = v + bias[j];
      out[i * n + j] = accumulate ? out[i * n + j] + v : v;
    }
  }
}

}  // namespace kvsplit::backend::cpu
