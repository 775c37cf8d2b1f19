// Mixed-precision paged attention on the CPU (semantic cut): pages read at their own precision in
// the same tile loop as full pages, evicted pages skipped, and the scoring side outputs.
#include <math.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention_tile.h"
#include "backend/cpu/quant_keys.h"
#include "kernels/common/kv_quant.h"
#include "kernels/common/paged_kv.h"

namespace kvsplit::backend::cpu_attention {
namespace {

// s[r][t] = q[r] . k_t for the nr <= kRowBlock rows q[0 .. nr) and t < num_keys, the same bits
// as fold_rows computes them.
template <typename Keys>
void dots_block(const Keys& keys, const float* const* q, int nr, int num_keys, int hd,
                float* const* s) {
  switch (nr) {
    case 4:
      keys.template dots<4>(q, num_keys, hd, s);
      break;
    case 3:
      keys.template dots<3>(q, num_keys, hd, s);
      break;
    case 2:
      keys.template dots<2>(q, num_keys, hd, s);
      break;
    default:
      keys.template dots<1>(q, num_keys, hd, s);
      break;
  }
}

std::string page_str(int s, int b) {
  return "page " + std::to_string(b) + " of sequence " + std::to_string(s);
}

}  // namespace

Status validate_mixed(const AttentionArgs& a, const char* op, bool decode) {
  const std::string where = std::string(op) + ": ";
  if (a.score_seqs && !decode) {
    return invalid_argument(where + "score_seqs (scoring side outputs) is decode-only");
  }
  if (!a.page_precision && !a.score_seqs) return ok_status();
  const bool bound = a.score_seqs && a.page_bound;
  if (bound && (!a.summary_slots || (a.num_summary_slots > 0 && !a.summaries))) {
    return invalid_argument(where + "page_bound needs summary_slots and summaries");
  }
  if (a.num_summary_slots < 0) return invalid_argument(where + "negative num_summary_slots");
  if (bound && (a.summary_parts < 1 || a.kv.block_size % a.summary_parts != 0)) {
    return invalid_argument(where + "summary_parts " + std::to_string(a.summary_parts) +
                            " must be >= 1 and divide block_size " +
                            std::to_string(a.kv.block_size));
  }
  if (bound && !(a.scale > 0.f)) return invalid_argument(where + "page_bound needs scale > 0");
  for (int s = 0; s < a.num_seqs; ++s) {
    const int nb =
        static_cast<int>((int64_t{a.kv_lens[s]} + a.kv.block_size - 1) / a.kv.block_size);
    const int64_t row0 = static_cast<int64_t>(s) * a.max_blocks_per_seq;
    for (int b = 0; b < nb; ++b) {
      const int p = a.page_precision ? a.page_precision[row0 + b] : 0;
      const int32_t id = a.block_tables[row0 + b];
      const void* arena = a.kv.data;
      int count = a.kv.num_blocks;
      const char* name = "kv";
      switch (p) {
        case static_cast<int>(KvPrecision::kFull):
          break;
        case static_cast<int>(KvPrecision::kInt8):
          arena = a.int8_pages, count = a.num_int8_blocks, name = "int8_pages";
          break;
        case static_cast<int>(KvPrecision::kInt4):
          arena = a.int4_pages, count = a.num_int4_blocks, name = "int4_pages";
          if (a.head_dim % 2 != 0)
            return invalid_argument(where + "int4 pages need an even head_dim");
          break;
        case static_cast<int>(KvPrecision::kEvicted):
          arena = nullptr, name = nullptr;
          break;
        default:
          return invalid_argument(where + page_str(s, b) + " has precision " + std::to_string(p) +
                                  ", not a KvPrecision (0..3)");
      }
      if (name && !arena) {
        return invalid_argument(where + page_str(s, b) + " needs the " + name +
                                " arena, which is null");
      }
      if (name && (id < 0 || id >= count)) {
        return invalid_argument(where + page_str(s, b) + " is id " + std::to_string(id) + " in " +
                                name + ", outside [0, " + std::to_string(count) + ")");
      }
      if (bound && a.score_seqs[s]) {
        const int32_t slot = a.summary_slots[row0 + b];
        if (slot < -1 || slot >= a.num_summary_slots) {
          return invalid_argument(where + page_str(s, b) + " has summary slot " +
                                  std::to_string(slot) + ", outside [0, " +
                                  std::to_string(a.num_summary_slots) + ") (or -1)");
        }
      }
    }
  }
  return ok_status();
}

void attend_mixed(const AttentionArgs& a, int seq, int kv_head, int key_begin, int key_end,
                  Rows& r) {
  const int bs = a.kv.block_size;
  const int hd = a.head_dim;
  const int64_t row0 = static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  // The tile being gathered: keys [tile_begin, tile_begin + n), all of precision `cur`, from one
  // or more consecutive pages (full: K/V row pointers; int8 / int4: code rows and parameters,
  // converted in registers when the tile is folded). A tile ends at kKeyTile keys, at a change
  // of precision and at an evicted page.
  const float* kp[kKeyTile];
  const float* vp[kKeyTile];
  Int8Keys k8;
  Int4Keys k4;
  PrefetchQueue prefetch;  // lines of the next tile's quantized pages
  k8.prefetch = &prefetch;
  k4.prefetch = &prefetch;
  float* const int4_params = int4_param_slots(hd);  // [kKeyTile pages, 2, head_dim]
  int int4_pages = 0;                               // pages of the tile with decoded parameters
  KvPrecision cur = KvPrecision::kFull;
  int n = 0;
  int tile_begin = key_begin;
  const auto flush = [&] {
    if (n > 0) {
      switch (cur) {
        case KvPrecision::kInt8:
          fold_tile(r, k8, tile_begin, n, hd, a.scale);
          break;
        case KvPrecision::kInt4:
          fold_tile(r, k4, tile_begin, n, hd, a.scale);
          break;
        default:
          fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
          break;
      }
    }
    prefetch.drain();
    tile_begin += n;
    n = 0;
    int4_pages = 0;
  };
  // Lookahead (page_lookahead): full pages one page ahead, as attend() does; quantized pages a
  // tile ahead (`ahead` pages), their lines issued from inside the fold of the tile before
  // (PrefetchQueue), the first tile's at once.
  const int ahead = std::max(1, kKeyTile / bs);
  const int first = key_begin / bs;
  for (int blk = first - ahead; blk < first; ++blk) {
    page_lookahead(a, row0, blk, key_end, kv_head, ahead, Lookahead::kQuantized);
  }
  for (int blk = first; blk * bs < key_end; ++blk) {
    page_lookahead(a, row0, blk, key_end, kv_head, 1, Lookahead::kFull);
    page_lookahead(a, row0, blk, key_end, kv_head, ahead, Lookahead::kQuantized, &prefetch);
    const KvPrecision p = precision_of(a, row0 + blk);
    const int32_t id = a.block_tables[row0 + blk];
    int slot = std::max(key_begin - blk * bs, 0);
    const int s1 = std::min(bs, key_end - blk * bs);
    if (p == KvPrecision::kEvicted) {  // a gap: the tile before it ends here
      flush();
      tile_begin = blk * bs + s1;
      continue;
    }
    if (p != cur) {
      flush();
      cur = p;
    }
    while (slot < s1) {
      const int take = std::min(s1 - slot, kKeyTile - n);
      switch (p) {
        case KvPrecision::kInt8:
          append_int8(a, id, kv_head, slot, slot + take, n, k8);
          break;
        case KvPrecision::kInt4:
          append_int4(a, id, kv_head, slot, slot + take, n,
                      int4_params + static_cast<int64_t>(int4_pages++) * 2 * hd, k4);
          break;
        default:
          full_rows(a, id, kv_head, slot, slot + take, kp + n, vp + n);
          break;
      }
      slot += take;
      n += take;
      if (n == kKeyTile) flush();
    }
  }
  flush();
}

namespace {

// Relevance of slots [0, num_keys) of one page for the query rows of kv head g of sequence s:
// rel[t] = max(rel[t], max over the group's heads of exp(z - m)), z computed by keys.dot exactly
// as fold_rows scored it, so the most attended token of a head gets exactly 1.
template <typename Keys>
void page_relevance(const AttentionArgs& a, const Keys& keys, const float* q0, const float* mh,
                    int g, int num_keys, float* rel) {
  const int hd = a.head_dim;
  const int group = a.num_heads / a.num_kv_heads;
  const float* q[kRowBlock];
  float d[kRowBlock][kKeyTile];
  float* dr[kRowBlock] = {d[0], d[1], d[2], d[3]};
  static_assert(kRowBlock == 4);
  for (int i0 = 0; i0 < group; i0 += kRowBlock) {
    const int nr = std::min(kRowBlock, group - i0);
    for (int k = 0; k < nr; ++k) q[k] = q0 + static_cast<int64_t>(g * group + i0 + k) * hd;
    dots_block(keys, q, nr, num_keys, hd, dr);
    for (int k = 0; k < nr; ++k) {
      const float m = mh[g * group + i0 + k];
      for (int t = 0; t < num_keys; ++t) {
        const float z = d[k][t] * a.scale;  // z - m below may be contracted into an fma:
        rel[t] = std::max(rel[t], z >= m ? 1.f : expf(z - m));  // z == m gives exactly 1
      }
    }
  }
}

}  // namespace

void score_side_outputs(const AttentionArgs& a, const float* m, ThreadPool& pool) {
  const int bs = a.kv.block_size;
  const int hd = a.head_dim;
  const int nkv = a.num_kv_heads;
  const int group = a.num_heads / nkv;
  thread_local std::vector<std::pair<int, int>> items_tls;  // [(seq, page)]
  std::vector<std::pair<int, int>>& items = items_tls;
  items.clear();
  for (int s = 0; s < a.num_seqs; ++s) {
    if (!a.score_seqs[s]) continue;
    const int nb = static_cast<int>((int64_t{a.kv_lens[s]} + bs - 1) / bs);
    // With a sliding window only the keys the query attends are scored (pages before its window
    // keep their values: this layer never reads them again).
    const int first = kernels::window_first_key(a.kv_lens[s] - 1, a.window);
    for (int i = first / bs; i < nb; ++i) items.emplace_back(s, i);
  }
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t item) {
    const auto [s, i] = items[item];
    const int64_t row = static_cast<int64_t>(s) * a.max_blocks_per_seq + i;
    const float* q0 = a.q + static_cast<int64_t>(a.query_start[s]) * a.num_heads * hd;
    const float* mh = m + static_cast<int64_t>(s) * a.num_heads;
    if (a.page_bound && a.summary_slots[row] >= 0) {
      const int64_t part_elems = int64_t{2} * nkv * hd;
      const kernels::KvSummaryElem* summary =
          a.summaries + static_cast<int64_t>(a.summary_slots[row]) * a.summary_parts * part_elems;
      float best = 0.f;
      for (int part = 0; part < a.summary_parts; ++part) {
        for (int h = 0; h < a.num_heads; ++h) {
          const kernels::KvSummaryElem* kmin =
              summary + part * part_elems + static_cast<int64_t>(h / group) * hd;
          const kernels::KvSummaryElem* kmax = kmin + static_cast<int64_t>(nkv) * hd;
          const float* q = q0 + static_cast<int64_t>(h) * hd;
          double ub = 0.0;
          for (int d = 0; d < hd; ++d) {
            if (q[d] == 0.f) continue;  // no term, whatever the range (0 x inf would be NaN)
            const double lo = kernels::kvq_half_float(kmin[d]);
            const double hi = kernels::kvq_half_float(kmax[d]);
            ub += std::max(static_cast<double>(q[d]) * lo, static_cast<double>(q[d]) * hi);
          }
          best = std::max(best, expf(static_cast<float>(a.scale * ub) - mh[h]));
        }
      }
      a.page_bound[row] = std::max(a.page_bound[row], best);
    }
    const KvPrecision p = precision_of(a, row);
    if (!a.token_relevance || p == KvPrecision::kEvicted) return;
    const int32_t id = a.block_tables[row];
    const int n = std::min(bs, a.kv_lens[s] - i * bs);
    const int lo = std::max(0, kernels::window_first_key(a.kv_lens[s] - 1, a.window) - i * bs);
    float* out = a.token_relevance + static_cast<int64_t>(s) * a.max_blocks_per_seq * bs + i * bs;
    float rel[kKeyTile];
    const float* kp[kKeyTile];
    const float* vp[kKeyTile];
    for (int t0 = lo; t0 < n; t0 += kKeyTile) {
      const int t1 = std::min(n, t0 + kKeyTile);
      std::fill(rel, rel + (t1 - t0), 0.f);
      for (int g = 0; g < nkv; ++g) {
        if (p == KvPrecision::kFull) {
          full_rows(a, id, g, t0, t1, kp, vp);
          page_relevance(a, PtrKeys{kp, vp}, q0, mh, g, t1 - t0, rel);
        } else {
          with_quantized_keys(a, p, id, g, t0, t1, [&](const auto& keys) {
            page_relevance(a, keys, q0, mh, g, t1 - t0, rel);
          });
        }
      }
      for (int t = t0; t < t1; ++t) out[t] = std::max(out[t], rel[t - t0]);
    }
  });
}

}  // namespace kvsplit::backend::cpu_attention
