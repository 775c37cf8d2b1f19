// The fp64 attention oracle: a boring reference that gathers K/V from pages through block tables,
// and seeded random test cases (shuffled page tables, partial last blocks, poisoned unused slots).
// Header-only; shared by the CPU attention tests and the CUDA parity suite.
//
// Every pointer in the AttentionArgs handed to the oracle is HOST memory (the CUDA suite passes
// host copies of its arrays). Pages are read through a loader callback, so one oracle serves f32,
// f16 and bf16 pages:  double load(int64_t elem)  returns element `elem` of the layer's page array
// [num_blocks, 2 (K, V), num_kv_heads, block_size, head_dim].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace kvsplit::oracle {

// ---- index math (kept independent of kernels/common/paged_kv.h on purpose) ----

// The first key a query at `pos` attends: with a sliding window W > 0 (AttentionArgs::window),
// transformers masks key k when k <= pos - W; 0 without one.
inline int first_key(int pos, int window) { return window > 0 ? std::max(0, pos - window + 1) : 0; }

// Element offset of (block, kv_sel 0 = K / 1 = V, kv_head, slot, dim 0) in a layer's pages.
inline int64_t page_offset(const backend::LayerKv& kv, int32_t block, int kv_sel, int kv_head,
                           int slot) {
  const int64_t per_head = int64_t{kv.block_size} * kv.head_dim;
  const int64_t per_block = int64_t{2} * kv.num_kv_heads * per_head;
  return block * per_block + (int64_t{kv_sel} * kv.num_kv_heads + kv_head) * per_head +
         int64_t{slot} * kv.head_dim;
}

// Query head h reads kv head h / (num_heads / num_kv_heads).
inline int kv_head_of(int head, int num_heads, int num_kv_heads) {
  return head / (num_heads / num_kv_heads);
}

// fp64 partial softmax state over keys [key_begin, key_end) of one (sequence, query head):
// m = max score, l = sum exp(s - m), o = sum exp(s - m) v (unnormalized). Empty range: m = -inf.
struct PartialState {
  double m = -std::numeric_limits<double>::infinity();
  double l = 0.0;
  std::vector<double> o;  // [head_dim]
};

template <typename LoadFn>
PartialState partial_state(const backend::AttentionArgs& a, LoadFn&& load, int seq, int token,
                           int head, int key_begin, int key_end) {
  const int hd = a.head_dim;
  const int kvh = kv_head_of(head, a.num_heads, a.num_kv_heads);
  const int32_t* table = a.block_tables + int64_t{seq} * a.max_blocks_per_seq;
  const float* qv = a.q + (int64_t{token} * a.num_heads + head) * hd;
  PartialState st;
  st.o.assign(hd, 0.0);
  std::vector<double> scores;
  scores.reserve(std::max(0, key_end - key_begin));
  for (int j = key_begin; j < key_end; ++j) {
    const int64_t k0 = page_offset(a.kv, table[j / a.kv.block_size], 0, kvh, j % a.kv.block_size);
    double dot = 0.0;
    for (int d = 0; d < hd; ++d) dot += static_cast<double>(qv[d]) * load(k0 + d);
    scores.push_back(dot * static_cast<double>(a.scale));
  }
  if (scores.empty()) return st;
  st.m = *std::max_element(scores.begin(), scores.end());
  for (int j = key_begin; j < key_end; ++j) {
    const double p = std::exp(scores[j - key_begin] - st.m);
    st.l += p;
    const int64_t v0 = page_offset(a.kv, table[j / a.kv.block_size], 1, kvh, j % a.kv.block_size);
    for (int d = 0; d < hd; ++d) st.o[d] += p * load(v0 + d);
  }
  return st;
}

// Causal attention of every query token: returns out [num_tokens, num_heads, head_dim] in fp64.
// Query i of sequence s (q_len = query_start[s+1] - query_start[s]) sits at position
// kv_lens[s] - q_len + i and attends to keys [first_key(position, a.window), position].
template <typename LoadFn>
std::vector<double> attention(const backend::AttentionArgs& a, LoadFn&& load) {
  const int hd = a.head_dim;
  std::vector<double> out(static_cast<size_t>(a.num_tokens) * a.num_heads * hd, 0.0);
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_begin = a.query_start[s];
    const int q_len = a.query_start[s + 1] - q_begin;
    for (int i = 0; i < q_len; ++i) {
      const int pos = a.kv_lens[s] - q_len + i;
      for (int h = 0; h < a.num_heads; ++h) {
        PartialState st =
            partial_state(a, load, s, q_begin + i, h, first_key(pos, a.window), pos + 1);
        double* o = out.data() + (int64_t{q_begin + i} * a.num_heads + h) * hd;
        for (int d = 0; d < hd; ++d) o[d] = st.l > 0 ? st.o[d] / st.l : 0.0;
      }
    }
  }
  return out;
}

// The log-sum-exp of the scaled scores each query row attends (AttentionArgs::lse), causal as
// attention(): [num_tokens, num_heads], m + log l of the row's fp64 state (-inf for no key).
template <typename LoadFn>
std::vector<double> attention_lse(const backend::AttentionArgs& a, LoadFn&& load) {
  std::vector<double> lse(static_cast<size_t>(a.num_tokens) * a.num_heads,
                          -std::numeric_limits<double>::infinity());
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_begin = a.query_start[s];
    const int q_len = a.query_start[s + 1] - q_begin;
    for (int i = 0; i < q_len; ++i) {
      const int pos = a.kv_lens[s] - q_len + i;
      for (int h = 0; h < a.num_heads; ++h) {
        const PartialState st =
            partial_state(a, load, s, q_begin + i, h, first_key(pos, a.window), pos + 1);
        if (st.l > 0) lse[int64_t{q_begin + i} * a.num_heads + h] = st.m + std::log(st.l);
      }
    }
  }
  return lse;
}

// Convenience for f32 pages (a.kv.data is host memory holding floats).
inline std::vector<double> attention_f32(const backend::AttentionArgs& a) {
  const float* pages = static_cast<const float*>(a.kv.data);
  return attention(a, [pages](int64_t i) { return static_cast<double>(pages[i]); });
}

// ---- deterministic random numbers (same stream on every compiler) ----

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * ((next() >> 11) * 0x1.0p-53); }
  // Uniform integer in [lo, hi] (inclusive).
  int range(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<uint64_t>(int64_t{hi} - lo + 1));
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }

 private:
  uint64_t state_;
};

// ---- random test cases ----

struct CaseSpec {
  int num_heads = 4;
  int num_kv_heads = 4;
  int head_dim = 64;
  int block_size = 16;
  std::vector<int> kv_lens;  // [num_seqs], >= 1
  std::vector<int> q_lens;   // [num_seqs], 1 <= q_len <= kv_len; empty: all 1 (decode)
  int extra_blocks = 3;      // free pages beyond what the sequences need (never read)
  uint64_t seed = 1;
  double q_range = 2.0;   // q ~ U(-q_range, q_range): sharpens the softmax
  double kv_range = 1.0;  // K, V ~ U(-kv_range, kv_range)
  // Fill unused pages, slots past kv_len in a last partial block and block-table padding with
  // NaN / -1, so a kernel that reads memory it does not own produces NaN (or fails validation).
  // Turn off for kernels that deliberately load whole pages and mask afterwards.
  bool poison_unused = true;
  // Sliding window of the call (AttentionArgs::window; 0: none). With poison_unused, the pages
  // wholly before the window of a sequence's first query row are poisoned too: no kernel may read
  // them.
  int window = 0;
};

// Host arrays of one attention call with f32 pages. args() points into this object, so keep it
// alive (and unmoved) while the args are used.
struct AttentionCase {
  CaseSpec spec;
  int num_seqs = 0;
  int num_tokens = 0;
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  std::vector<int32_t> query_start;   // [num_seqs + 1]
  std::vector<int32_t> kv_lens;       // [num_seqs]
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], padding -1
  std::vector<float> q;               // [num_tokens, num_heads, head_dim]
  std::vector<float> pages;           // [num_blocks, 2, num_kv_heads, block_size, head_dim]
  std::vector<float> out;             // [num_tokens, num_heads, head_dim], NaN-filled

  backend::LayerKv layer_kv() {
    backend::LayerKv kv;
    kv.data = pages.data();
    kv.dtype = backend::DType::kF32;
    kv.num_blocks = num_blocks;
    kv.num_kv_heads = spec.num_kv_heads;
    kv.block_size = spec.block_size;
    kv.head_dim = spec.head_dim;
    return kv;
  }

  // Pages of sequence s that no query row attends: those wholly before the sliding window of its
  // first query row (0 without a window).
  int unread_pages(int s) const {
    const int q_len = query_start[s + 1] - query_start[s];
    return first_key(kv_lens[s] - q_len, spec.window) / spec.block_size;
  }

  backend::AttentionArgs args() {
    backend::AttentionArgs a;
    a.q = q.data();
    a.out = out.data();
    a.kv = layer_kv();
    a.num_seqs = num_seqs;
    a.num_tokens = num_tokens;
    a.num_heads = spec.num_heads;
    a.num_kv_heads = spec.num_kv_heads;
    a.head_dim = spec.head_dim;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.head_dim)));
    a.query_start = query_start.data();
    a.kv_lens = kv_lens.data();
    a.block_tables = block_tables.data();
    a.max_blocks_per_seq = max_blocks_per_seq;
    a.max_query_len = 0;
    a.max_kv_len = 0;
    a.window = spec.window;
    for (int s = 0; s < num_seqs; ++s) {
      a.max_query_len = std::max(a.max_query_len, query_start[s + 1] - query_start[s]);
      a.max_kv_len = std::max(a.max_kv_len, kv_lens[s]);
    }
    return a;
  }
};

inline AttentionCase make_case(const CaseSpec& spec) {
  AttentionCase c;
  c.spec = spec;
  c.num_seqs = static_cast<int>(spec.kv_lens.size());
  Rng rng(spec.seed);
  const int bs = spec.block_size;
  std::vector<int> blocks_needed(c.num_seqs);
  int total_blocks = 0;
  c.query_start.assign(c.num_seqs + 1, 0);
  for (int s = 0; s < c.num_seqs; ++s) {
    const int q_len = spec.q_lens.empty() ? 1 : spec.q_lens[s];
    c.query_start[s + 1] = c.query_start[s] + q_len;
    c.kv_lens.push_back(spec.kv_lens[s]);
    blocks_needed[s] = (spec.kv_lens[s] + bs - 1) / bs;
    total_blocks += blocks_needed[s];
    c.max_blocks_per_seq = std::max(c.max_blocks_per_seq, blocks_needed[s]);
  }
  c.max_blocks_per_seq += 1;  // one padding column: kernels must stop at kv_len
  c.num_tokens = c.query_start[c.num_seqs];
  c.num_blocks = total_blocks + spec.extra_blocks;

  // Physical ids in random order; sequences take them in turn.
  std::vector<int32_t> ids(c.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  rng.shuffle(ids);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  c.block_tables.assign(static_cast<size_t>(c.num_seqs) * c.max_blocks_per_seq,
                        spec.poison_unused ? -1 : 0);
  const int64_t block_elems = int64_t{2} * spec.num_kv_heads * bs * spec.head_dim;
  c.pages.assign(static_cast<size_t>(c.num_blocks * block_elems), spec.poison_unused ? nan : 0.f);
  backend::LayerKv kv = c.layer_kv();
  int next = 0;
  for (int s = 0; s < c.num_seqs; ++s) {
    const int unread = spec.poison_unused ? c.unread_pages(s) : 0;
    for (int b = 0; b < blocks_needed[s]; ++b) {
      const int32_t id = ids[next++];
      c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + b] = id;
      if (b < unread) continue;  // stays NaN
      const int valid = std::min(bs, spec.kv_lens[s] - b * bs);
      for (int sel = 0; sel < 2; ++sel)
        for (int h = 0; h < spec.num_kv_heads; ++h)
          for (int slot = 0; slot < valid; ++slot) {
            float* p = c.pages.data() + page_offset(kv, id, sel, h, slot);
            for (int d = 0; d < spec.head_dim; ++d)
              p[d] = static_cast<float>(rng.uniform(-spec.kv_range, spec.kv_range));
          }
    }
  }
  c.q.resize(static_cast<size_t>(c.num_tokens) * spec.num_heads * spec.head_dim);
  for (float& x : c.q) x = static_cast<float>(rng.uniform(-spec.q_range, spec.q_range));
  c.out.assign(c.q.size(), nan);
  return c;
}

// ---- comparison ----

struct Comparison {
  bool ok = true;
  int64_t num_nan = 0;  // non-finite values in `got`
  double max_abs_err = 0.0;
  double max_rel_err = 0.0;  // |got - want| / max(|want|, 1e-30) at the worst element
  int64_t worst = -1;        // index of the first element outside tolerance (or the worst one)
  std::string message;       // empty when ok
};

// ok when every element is finite and |got - want| <= atol + rtol * |want|.
inline Comparison compare(const float* got, const std::vector<double>& want, double atol,
                          double rtol) {
  Comparison c;
  double worst_excess = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) {
      if (c.num_nan++ == 0 && c.ok) c.worst = static_cast<int64_t>(i);
      c.ok = false;
      continue;
    }
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    c.max_abs_err = std::max(c.max_abs_err, err);
    c.max_rel_err = std::max(c.max_rel_err, err / std::max(std::abs(want[i]), 1e-30));
    const double excess = err - (atol + rtol * std::abs(want[i]));
    if (excess > worst_excess) {
      worst_excess = excess;
      c.ok = false;
      if (c.num_nan == 0) c.worst = static_cast<int64_t>(i);
    }
  }
  if (!c.ok) {
    const size_t w = static_cast<size_t>(c.worst);
    c.message = "mismatch: " + std::to_string(c.num_nan) + " non-finite values; max abs err " +
                std::to_string(c.max_abs_err) + "; element " + std::to_string(c.worst) + " got " +
                std::to_string(got[w]) + " want " + std::to_string(want[w]);
  }
  return c;
}

}  // namespace kvsplit::oracle
