// The fp64 oracle for mixed-precision paged attention (semantic cut): each page of a sequence is
// full precision, int8, int4 or evicted (AttentionArgs::page_precision). Quantized pages are read
// through the per-element dequantization of kernels/common/kv_quant.h, so the oracle sees exactly
// the values the kernel must see; everything after the dequantization is fp64. Also the scoring
// side outputs (token relevance and Quest page bounds) in fp64, and a builder that turns an
// oracle::AttentionCase into a mixed case (random precisions, shuffled arena ids).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "kernels/common/kv_quant.h"
#include "oracle/attention_oracle.h"

namespace kvsplit::oracle {

using kernels::KvPrecision;

// Dequantized element d of (kv_sel, kv_head) at logical position pos of sequence s, which must be
// resident (page precision != kEvicted).
inline double mixed_elem(const backend::AttentionArgs& a, int s, int pos, int sel, int kvh, int d) {
  const int bs = a.kv.block_size;
  const int64_t row = int64_t{s} * a.max_blocks_per_seq + pos / bs;
  const int32_t id = a.block_tables[row];
  const auto p = static_cast<KvPrecision>(a.page_precision[row]);
  const kernels::QuantPageLayout ql{a.num_kv_heads, bs, a.head_dim};
  switch (p) {
    case KvPrecision::kFull:
      return static_cast<const float*>(a.kv.data)[page_offset(a.kv, id, sel, kvh, pos % bs) + d];
    case KvPrecision::kInt8:
      return kernels::int8_page_elem(
          ql, static_cast<const uint8_t*>(a.int8_pages) + id * ql.bytes(p), sel, kvh, pos % bs, d);
    case KvPrecision::kInt4:
      return kernels::int4_page_elem(
          ql, static_cast<const uint8_t*>(a.int4_pages) + id * ql.bytes(p), sel, kvh, pos % bs, d);
    default:
      return std::numeric_limits<double>::quiet_NaN();
  }
}

inline bool mixed_resident(const backend::AttentionArgs& a, int s, int pos) {
  const int64_t row = int64_t{s} * a.max_blocks_per_seq + pos / a.kv.block_size;
  return static_cast<KvPrecision>(a.page_precision[row]) != KvPrecision::kEvicted;
}

// fp64 results of one mixed call. Side outputs only for decode sequences (q_len 1).
struct MixedResult {
  std::vector<double> out;         // [num_tokens, num_heads, head_dim]
  std::vector<double> lse;         // [num_tokens, num_heads] m + log l (-inf: nothing resident)
  std::vector<double> max_score;   // [num_seqs, num_heads] m_h of the decode query (-inf: none)
  std::vector<double> relevance;   // [num_seqs, max_blocks * block_size] max_h exp(z - m); -1
                                   // where not resident
  std::vector<double> page_bound;  // [num_seqs, max_blocks], needs summaries; NaN: no slot
                                   // or before the window
};

// Scores of one query row against resident keys [key_begin, key_end) (NaN where not resident or
// before key_begin).
inline std::vector<double> mixed_scores(const backend::AttentionArgs& a, int s, int token, int h,
                                        int key_begin, int key_end) {
  const int hd = a.head_dim;
  const int kvh = kv_head_of(h, a.num_heads, a.num_kv_heads);
  const float* q = a.q + (int64_t{token} * a.num_heads + h) * hd;
  std::vector<double> z(key_end, std::numeric_limits<double>::quiet_NaN());
  for (int j = key_begin; j < key_end; ++j) {
    if (!mixed_resident(a, s, j)) continue;
    double dot = 0.0;
    for (int d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * mixed_elem(a, s, j, 0, kvh, d);
    z[j] = dot * static_cast<double>(a.scale);
  }
  return z;
}

inline MixedResult mixed_attention(const backend::AttentionArgs& a) {
  const int hd = a.head_dim;
  const int bs = a.kv.block_size;
  const double inf = std::numeric_limits<double>::infinity();
  MixedResult r;
  r.out.assign(static_cast<size_t>(a.num_tokens) * a.num_heads * hd, 0.0);
  r.lse.assign(static_cast<size_t>(a.num_tokens) * a.num_heads, -inf);
  r.max_score.assign(static_cast<size_t>(a.num_seqs) * a.num_heads, -inf);
  r.relevance.assign(static_cast<size_t>(a.num_seqs) * a.max_blocks_per_seq * bs, -1.0);
  r.page_bound.assign(static_cast<size_t>(a.num_seqs) * a.max_blocks_per_seq,
                      std::numeric_limits<double>::quiet_NaN());
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q0 = a.query_start[s];
    const int q_len = a.query_start[s + 1] - q0;
    const int kv_len = a.kv_lens[s];
    for (int i = 0; i < q_len; ++i) {
      const int pos = kv_len - q_len + i;
      for (int h = 0; h < a.num_heads; ++h) {
        const int kvh = kv_head_of(h, a.num_heads, a.num_kv_heads);
        const std::vector<double> z =
            mixed_scores(a, s, q0 + i, h, first_key(pos, a.window), pos + 1);
        double m = -inf;
        for (double x : z) m = std::isnan(x) ? m : std::max(m, x);
        if (m == -inf) continue;  // nothing resident: output 0
        double l = 0.0;
        std::vector<double> o(hd, 0.0);
        for (int j = 0; j <= pos; ++j) {
          if (std::isnan(z[j])) continue;
          const double p = std::exp(z[j] - m);
          l += p;
          for (int d = 0; d < hd; ++d) o[d] += p * mixed_elem(a, s, j, 1, kvh, d);
        }
        double* out = r.out.data() + (int64_t{q0 + i} * a.num_heads + h) * hd;
        for (int d = 0; d < hd; ++d) out[d] = o[d] / l;
        r.lse[int64_t{q0 + i} * a.num_heads + h] = m + std::log(l);
        if (q_len != 1) continue;
        r.max_score[int64_t{s} * a.num_heads + h] = m;
        for (int j = 0; j <= pos; ++j) {
          if (std::isnan(z[j])) continue;
          double& rel = r.relevance[int64_t{s} * a.max_blocks_per_seq * bs + j];
          rel = std::max(rel, std::exp(z[j] - m));
        }
      }
      if (q_len != 1 || !a.summaries) continue;
      const int nb = (kv_len + bs - 1) / bs;
      // With a window, pages wholly before it are not scored (NaN: untouched).
      for (int b = first_key(kv_len - 1, a.window) / bs; b < nb; ++b) {
        const int32_t slot = a.summary_slots[int64_t{s} * a.max_blocks_per_seq + b];
        if (slot < 0) continue;
        double best = 0.0;
        // Summary layout [slots, summary_parts, 2, num_kv_heads, head_dim]: the largest part's.
        for (int part = 0; part < a.summary_parts; ++part) {
          for (int h = 0; h < a.num_heads; ++h) {
            const int kvh = kv_head_of(h, a.num_heads, a.num_kv_heads);
            const kernels::KvSummaryElem* kmin =
                a.summaries +
                ((int64_t{slot} * a.summary_parts + part) * 2 * a.num_kv_heads + kvh) * hd;
            const kernels::KvSummaryElem* kmax = kmin + int64_t{a.num_kv_heads} * hd;
            const float* q = a.q + (int64_t{q0} * a.num_heads + h) * hd;
            double ub = 0.0;
            for (int d = 0; d < hd; ++d) {
              if (q[d] == 0.f) continue;  // no term (0 x inf would be NaN)
              const double lo = kernels::kvq_half_float(kmin[d]);
              const double hi = kernels::kvq_half_float(kmax[d]);
              ub += std::max(double{q[d]} * lo, double{q[d]} * hi);
            }
            best =
                std::max(best, std::exp(ub * a.scale - r.max_score[int64_t{s} * a.num_heads + h]));
          }
        }
        r.page_bound[int64_t{s} * a.max_blocks_per_seq + b] = best;
      }
    }
  }
  return r;
}

// ---- building mixed cases ----

// Probabilities of each precision for pages that may be demoted (every page but a partial last
// one, which stays full: only full pages are quantized).
struct MixSpec {
  double p_int8 = 0.25;
  double p_int4 = 0.25;
  double p_evicted = 0.2;
};

// The quantized arenas and per-precision block tables of a mixed case built from an AttentionCase
// (whose f32 pages remain the full-precision arena). Pages are quantized with `backend`.
struct MixedCase {
  std::vector<uint8_t> precision;  // [num_seqs, max_blocks_per_seq]
  std::vector<int32_t> tables;     // [num_seqs, max_blocks_per_seq] ids in each precision's arena
  std::vector<uint8_t> int8_arena;
  std::vector<uint8_t> int4_arena;
  int num_int8 = 0;
  int num_int4 = 0;
  bool quantized_ok = true;  // every quantize_kv_page call succeeded

  void apply(backend::AttentionArgs& a) {
    a.page_precision = precision.data();
    a.block_tables = tables.data();
    a.int8_pages = int8_arena.empty() ? nullptr : int8_arena.data();
    a.num_int8_blocks = num_int8;
    a.int4_pages = int4_arena.empty() ? nullptr : int4_arena.data();
    a.num_int4_blocks = num_int4;
  }
};

// Picks precisions (force[s][b] >= 0 overrides the draw), quantizes the chosen pages into arenas
// in shuffled order (plus one unused arena page each) and poisons the full-precision copy of
// every evicted page with NaN (its table entry becomes an id no arena has).
inline MixedCase make_mixed(AttentionCase& c, backend::Backend& backend, Rng& rng,
                            const MixSpec& mix, const std::vector<std::vector<int>>& force = {}) {
  const int bs = c.spec.block_size;
  const kernels::QuantPageLayout ql{c.spec.num_kv_heads, bs, c.spec.head_dim};
  const int64_t block_elems = int64_t{2} * c.spec.num_kv_heads * bs * c.spec.head_dim;
  MixedCase m;
  m.precision.assign(c.block_tables.size(), 0);
  m.tables = c.block_tables;
  struct Pending {
    size_t row;
    KvPrecision p;
  };
  std::vector<Pending> pending;
  for (int s = 0; s < c.num_seqs; ++s) {
    const int nb = (c.kv_lens[s] + bs - 1) / bs;
    for (int b = 0; b < nb; ++b) {
      const size_t row = static_cast<size_t>(s) * c.max_blocks_per_seq + b;
      KvPrecision p = KvPrecision::kFull;
      // Pages before the window stay full (and poisoned: make_case), never quantized.
      const bool full_page = (b + 1) * bs <= c.kv_lens[s] && b >= c.unread_pages(s);
      const double u = rng.uniform(0.0, 1.0);
      if (full_page) {
        if (u < mix.p_int8) {
          p = KvPrecision::kInt8;
        } else if (u < mix.p_int8 + mix.p_int4) {
          p = KvPrecision::kInt4;
        } else if (u < mix.p_int8 + mix.p_int4 + mix.p_evicted) {
          p = KvPrecision::kEvicted;
        }
      }
      if (s < static_cast<int>(force.size()) && b < static_cast<int>(force[s].size()) &&
          force[s][b] >= 0) {
        p = static_cast<KvPrecision>(force[s][b]);
      }
      m.precision[row] = static_cast<uint8_t>(p);
      if (p != KvPrecision::kFull) pending.push_back({row, p});
    }
  }
  for (KvPrecision p : {KvPrecision::kInt8, KvPrecision::kInt4}) {
    std::vector<size_t> rows;
    for (const Pending& e : pending)
      if (e.p == p) rows.push_back(e.row);
    const int n = static_cast<int>(rows.size()) + 1;
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    rng.shuffle(ids);
    std::vector<uint8_t>& arena = p == KvPrecision::kInt8 ? m.int8_arena : m.int4_arena;
    arena.assign(static_cast<size_t>(n * ql.bytes(p)), 0xA5);
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* src = c.pages.data() + c.block_tables[rows[i]] * block_elems;
      m.quantized_ok &= backend
                            .quantize_kv_page(src, backend::DType::kF32, ql, p,
                                              arena.data() + ids[i] * ql.bytes(p))
                            .ok();
      m.tables[rows[i]] = ids[i];
    }
    (p == KvPrecision::kInt8 ? m.num_int8 : m.num_int4) = n;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Pending& e : pending) {
    float* full = c.pages.data() + c.block_tables[e.row] * block_elems;
    std::fill(full, full + block_elems, nan);  // the kernel must not read the original
    if (e.p == KvPrecision::kEvicted) m.tables[e.row] = 1 << 30;
  }
  return m;
}

}  // namespace kvsplit::oracle
