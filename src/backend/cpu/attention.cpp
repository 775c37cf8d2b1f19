#include "backend/cpu/attention.h"

#include <math.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention_tile.h"
#include "backend/cpu/quant_keys.h"
#include "kernels/common/paged_kv.h"
#include "kernels/common/softmax_state.h"

namespace kvsplit::backend {
namespace {

using cpu_attention::attend_mixed;
using cpu_attention::fold_tile;
using cpu_attention::kKeyTile;
using cpu_attention::Rows;
using cpu_attention::scale_in_place;
using cpu_attention::thread_scratch;
using kernels::SoftmaxState;

// Query vectors (GQA group x query rows) one prefill work item carries; K/V read once per item.
constexpr int kPrefillRowsPerItem = 64;

// Folds keys [key_begin, key_end) of kv head `kv_head` of the sequence with block table `table`
// (a row of a.block_tables) into `r`. Reads each K/V row once (and looks two pages ahead:
// page_lookahead).
void attend(const AttentionArgs& a, const int32_t* table, int kv_head, int key_begin, int key_end,
            Rows& r) {
  const int bs = a.kv.block_size;
  const int hd = a.head_dim;
  const kernels::PagedKvLayout layout{a.kv.num_kv_heads, bs, hd};
  const float* pages = static_cast<const float*>(a.kv.data);
  const float* kp[kKeyTile];
  const float* vp[kKeyTile];
  int n = 0;
  int tile_begin = key_begin;
  const int64_t row0 = table - a.block_tables;
  for (int blk = key_begin / bs; blk * bs < key_end; ++blk) {
    cpu_attention::page_lookahead(a, row0, blk, key_end, kv_head);
    const int32_t id = table[blk];
    const float* k_base = pages + layout.offset(id, 0, kv_head, 0);
    const float* v_base = pages + layout.offset(id, 1, kv_head, 0);
    const int s0 = std::max(key_begin - blk * bs, 0);
    const int s1 = std::min(bs, key_end - blk * bs);
    for (int slot = s0; slot < s1; ++slot) {
      kp[n] = k_base + static_cast<int64_t>(slot) * hd;
      vp[n] = v_base + static_cast<int64_t>(slot) * hd;
      if (++n == kKeyTile) {
        fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
        tile_begin += n;
        n = 0;
      }
    }
  }
  if (n > 0) fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
}

// out = o / l (0 for an empty state: no resident key); *lse = m + log l (-inf when empty) when
// the call asks for it (AttentionArgs::lse).
void write_normalized(const float* o, SoftmaxState st, int head_dim, float* out, float* lse) {
  const float inv = st.l > 0.f ? 1.f / st.l : 0.f;
  for (int d = 0; d < head_dim; ++d) out[d] = o[d] * inv;
  if (lse != nullptr) *lse = kernels::softmax_state_lse(st);
}

// The lse slot of query row `row`, head `head` (nullptr when the call does not ask for it).
float* lse_slot(const AttentionArgs& a, int64_t row, int head) {
  return a.lse != nullptr ? a.lse + row * a.num_heads + head : nullptr;
}

std::string seq_str(int s) { return "sequence " + std::to_string(s); }

Status validate(const AttentionArgs& a, const char* op) {
  const std::string where = std::string(op) + ": ";
  if (a.kv.dtype != DType::kF32) {
    return unimplemented(where + "the CPU backend reads f32 pages only, got " +
                         std::string(dtype_name(a.kv.dtype)));
  }
  if (a.num_seqs < 0 || a.num_tokens < 0)
    return invalid_argument(where + "negative num_seqs/num_tokens");
  if (a.num_heads <= 0 || a.num_kv_heads <= 0 || a.head_dim <= 0) {
    return invalid_argument(where + "num_heads, num_kv_heads and head_dim must be positive");
  }
  if (a.num_heads % a.num_kv_heads != 0) {
    return invalid_argument(where + "num_heads " + std::to_string(a.num_heads) +
                            " is not a multiple of num_kv_heads " + std::to_string(a.num_kv_heads));
  }
  if (a.kv.num_kv_heads != a.num_kv_heads || a.kv.head_dim != a.head_dim) {
    return invalid_argument(where + "KV pages hold " + std::to_string(a.kv.num_kv_heads) +
                            " kv heads x head_dim " + std::to_string(a.kv.head_dim) +
                            ", args say " + std::to_string(a.num_kv_heads) + " x " +
                            std::to_string(a.head_dim));
  }
  if (a.kv.block_size <= 0 || a.kv.num_blocks < 0) {
    return invalid_argument(where + "bad page geometry (block_size " +
                            std::to_string(a.kv.block_size) + ", num_blocks " +
                            std::to_string(a.kv.num_blocks) + ")");
  }
  if (!std::isfinite(a.scale)) return invalid_argument(where + "scale is not finite");
  if (a.window < 0) return invalid_argument(where + "negative window " + std::to_string(a.window));
  if (a.num_seqs == 0) return ok_status();
  if (!a.query_start || !a.kv_lens || !a.block_tables) {
    return invalid_argument(where + "null query_start, kv_lens or block_tables");
  }
  const bool mixed = a.page_precision != nullptr;  // ids checked by validate_mixed
  if (a.num_tokens > 0 && (!a.q || !a.out || (!mixed && !a.kv.data))) {
    return invalid_argument(where + "null q, out or KV pages");
  }
  if (a.query_start[0] != 0 || a.query_start[a.num_seqs] != a.num_tokens) {
    return invalid_argument(where + "query_start must run from 0 to num_tokens " +
                            std::to_string(a.num_tokens));
  }
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.query_start[s + 1] - a.query_start[s];
    const int kv_len = a.kv_lens[s];
    if (q_len < 0) return invalid_argument(where + "query_start decreases at " + seq_str(s));
    if (kv_len < q_len) {
      return invalid_argument(where + seq_str(s) + " has kv_len " + std::to_string(kv_len) +
                              " < q_len " + std::to_string(q_len));
    }
    // In 64 bits: a kv_len near INT32_MAX would overflow the rounding.
    const int nb = static_cast<int>((int64_t{kv_len} + a.kv.block_size - 1) / a.kv.block_size);
    if (nb > a.max_blocks_per_seq) {
      return invalid_argument(where + seq_str(s) + " needs " + std::to_string(nb) +
                              " blocks, block table has " + std::to_string(a.max_blocks_per_seq));
    }
    const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
    for (int b = 0; b < nb && !mixed; ++b) {
      if (table[b] < 0 || table[b] >= a.kv.num_blocks) {
        return invalid_argument(where + seq_str(s) + " block " + std::to_string(b) + " is id " +
                                std::to_string(table[b]) + ", outside [0, " +
                                std::to_string(a.kv.num_blocks) + ")");
      }
    }
  }
  return cpu_attention::validate_mixed(a, op, std::string(op) == "attention_decode");
}

// Split-K workspace of one calling thread: partial o [total_splits, num_heads, head_dim] and
// states [total_splits, num_heads]; work list [(seq, split)].
struct DecodeWorkspace {
  std::vector<float> o;
  std::vector<SoftmaxState> st;
  std::vector<std::pair<int, int>> items;
  std::vector<float> m;  // [num_seqs, num_heads] final running max, for the scoring side outputs
};

// Merges the partial states of every split sequence of a decode call (and records the final max of
// scored sequences in ws.m).
void merge_splits(const AttentionArgs& a, const backend::SplitPlan& plan, DecodeWorkspace& ws,
                  ThreadPool& pool, bool want_m) {
  const int hd = a.head_dim;
  // Merge the partial states of every split sequence: out = (sum_i o_i e^{m_i - m}) / l.
  pool.parallel_for(static_cast<int64_t>(a.num_seqs) * a.num_heads, [&](int64_t item) {
    const int s = static_cast<int>(item / a.num_heads);
    const int h = static_cast<int>(item % a.num_heads);
    if (plan.num_splits[s] == 1) return;
    float* out = a.out + (static_cast<int64_t>(a.query_start[s]) * a.num_heads + h) * hd;
    std::fill(out, out + hd, 0.f);
    SoftmaxState acc = kernels::softmax_state_empty();
    for (int sp = 0; sp < plan.num_splits[s]; ++sp) {
      const int64_t slot = (static_cast<int64_t>(plan.split_offset[s]) + sp) * a.num_heads + h;
      float sa, sb;
      acc = kernels::softmax_state_merge(acc, ws.st[slot], &sa, &sb);
      const float* o = ws.o.data() + slot * hd;
      for (int d = 0; d < hd; ++d) out[d] = out[d] * sa + o[d] * sb;
    }
    const float inv = acc.l > 0.f ? 1.f / acc.l : 0.f;
    scale_in_place(out, inv, hd);
    if (a.lse != nullptr) *lse_slot(a, a.query_start[s], h) = kernels::softmax_state_lse(acc);
    if (want_m) ws.m[item] = acc.m;
  });
}

}  // namespace

Status cpu_attention_decode(const AttentionArgs& a, const backend::SplitPlan& plan,
                            ThreadPool& pool) {
  KVSPLIT_RETURN_IF_ERROR(validate(a, "attention_decode"));
  for (int s = 0; s < a.num_seqs; ++s) {
    if (a.query_start[s + 1] - a.query_start[s] != 1) {
      return invalid_argument("attention_decode: " + seq_str(s) +
                              " must have exactly one query token");
    }
  }
  KVSPLIT_RETURN_IF_ERROR(
      backend::check_split_plan(plan, a.num_seqs, a.kv.block_size, a.window, a.kv_lens));
  if (a.num_seqs == 0) return ok_status();
  if (a.score_max != nullptr) {  // scoring only, against the given maxima
    if (a.score_seqs == nullptr || a.head_max != nullptr)
      return invalid_argument("attention_decode: score_max needs score_seqs and no head_max");
    cpu_attention::score_side_outputs(a, a.score_max, pool);
    return ok_status();
  }

  const int hd = a.head_dim;
  const int nkv = a.num_kv_heads;
  const int group = a.num_heads / nkv;
  thread_local DecodeWorkspace ws_tls;
  DecodeWorkspace& ws = ws_tls;  // the caller's; captured by reference below
  ws.items.clear();
  for (int s = 0; s < a.num_seqs; ++s) {
    for (int sp = 0; sp < plan.num_splits[s]; ++sp) ws.items.emplace_back(s, sp);
  }
  if (plan.has_splits()) {
    ws.o.resize(static_cast<size_t>(plan.total_splits) * a.num_heads * hd);
    ws.st.resize(static_cast<size_t>(plan.total_splits) * a.num_heads);
  }
  const bool scoring = a.score_seqs != nullptr;
  const bool want_m = scoring || a.head_max != nullptr;  // the final max of every head
  if (want_m) ws.m.assign(static_cast<size_t>(a.num_seqs) * a.num_heads, -INFINITY);

  const int64_t num_items = static_cast<int64_t>(ws.items.size()) * nkv;
  pool.parallel_for(num_items, [&](int64_t item) {
    const int kvh = static_cast<int>(item % nkv);
    const auto [s, sp] = ws.items[item / nkv];
    const int kv_len = a.kv_lens[s];
    // Uniform chunks from the window base, or the plan's bounds (splits over attended pages).
    const int32_t* bounds =
        plan.split_begin.empty() ? nullptr : &plan.split_begin[plan.split_offset[s]];
    const int key_begin = bounds != nullptr
                              ? bounds[sp]
                              : kernels::window_decode_base(kv_len, a.window, a.kv.block_size) +
                                    sp * plan.chunk_tokens;
    const int key_end = bounds == nullptr ? std::min(kv_len, key_begin + plan.chunk_tokens)
                        : sp + 1 < plan.num_splits[s] ? bounds[sp + 1]
                                                      : kv_len;
    const int first = kernels::window_first_key(kv_len - 1, a.window);
    const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
    const int64_t head0 = static_cast<int64_t>(a.query_start[s]) * a.num_heads + kvh * group;

    Rows r = thread_scratch().rows(group, hd);
    for (int g = 0; g < group; ++g) {
      r.q[g] = a.q + (head0 + g) * hd;
      r.limit[g] = key_end;
      r.first[g] = first;
    }
    if (a.page_precision) {
      attend_mixed(a, s, kvh, key_begin, key_end, r);
    } else {
      attend(a, table, kvh, key_begin, key_end, r);
    }

    if (plan.num_splits[s] == 1) {
      for (int g = 0; g < group; ++g) {
        write_normalized(r.o + static_cast<size_t>(g) * hd, r.st[g], hd, a.out + (head0 + g) * hd,
                         lse_slot(a, a.query_start[s], kvh * group + g));
        if (want_m) ws.m[static_cast<size_t>(s) * a.num_heads + kvh * group + g] = r.st[g].m;
      }
      return;
    }
    const int64_t slot0 =
        (static_cast<int64_t>(plan.split_offset[s]) + sp) * a.num_heads + kvh * group;
    std::copy(r.o, r.o + static_cast<size_t>(group) * hd, ws.o.data() + slot0 * hd);
    std::copy(r.st, r.st + group, ws.st.data() + slot0);
  });
  if (plan.has_splits()) merge_splits(a, plan, ws, pool, want_m);
  if (a.head_max != nullptr) std::copy(ws.m.begin(), ws.m.end(), a.head_max);
  if (scoring) cpu_attention::score_side_outputs(a, ws.m.data(), pool);
  return ok_status();
}

Status cpu_attention_prefill(const AttentionArgs& a, ThreadPool& pool) {
  KVSPLIT_RETURN_IF_ERROR(validate(a, "attention_prefill"));
  if (a.head_max != nullptr || a.score_max != nullptr)
    return invalid_argument("attention_prefill: head_max and score_max are for decode only");
  if (a.num_tokens == 0) return ok_status();

  const int hd = a.head_dim;
  const int nkv = a.num_kv_heads;
  const int group = a.num_heads / nkv;
  const int rows_per_item = std::max(1, kPrefillRowsPerItem / group);  // query rows per item
  // Work list [(seq, first query row)], heaviest (latest rows, most keys) first.
  thread_local std::vector<std::pair<int, int>> items_tls;
  std::vector<std::pair<int, int>>& items = items_tls;
  items.clear();
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.query_start[s + 1] - a.query_start[s];
    for (int i = 0; i < q_len; i += rows_per_item) items.emplace_back(s, i);
  }
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    const auto keys = [&](const std::pair<int, int>& it) {
      const int pos =
          a.kv_lens[it.first] - (a.query_start[it.first + 1] - a.query_start[it.first]) + it.second;
      return pos - kernels::window_first_key(pos, a.window);
    };
    return keys(x) > keys(y);
  });

  pool.parallel_for(static_cast<int64_t>(items.size()) * nkv, [&](int64_t item) {
    const int kvh = static_cast<int>(item % nkv);
    const auto [s, i0] = items[item / nkv];
    const int q_len = a.query_start[s + 1] - a.query_start[s];
    const int num_rows = std::min(rows_per_item, q_len - i0);
    const int pos0 = a.kv_lens[s] - q_len + i0;  // position of the item's first query row
    const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;

    Rows r = thread_scratch().rows(num_rows * group, hd);
    for (int i = 0; i < num_rows; ++i) {
      const int64_t head0 =
          static_cast<int64_t>(a.query_start[s] + i0 + i) * a.num_heads + kvh * group;
      for (int g = 0; g < group; ++g) {
        r.q[i * group + g] = a.q + (head0 + g) * hd;
        r.limit[i * group + g] = pos0 + i + 1;
        r.first[i * group + g] = kernels::window_first_key(pos0 + i, a.window);
      }
    }
    const int key_begin = kernels::window_first_key(pos0, a.window);  // the first row's window
    if (a.page_precision) {
      attend_mixed(a, s, kvh, key_begin, pos0 + num_rows, r);
    } else {
      attend(a, table, kvh, key_begin, pos0 + num_rows, r);
    }
    for (int i = 0; i < num_rows; ++i) {
      const int64_t head0 =
          static_cast<int64_t>(a.query_start[s] + i0 + i) * a.num_heads + kvh * group;
      for (int g = 0; g < group; ++g) {
        const int row = i * group + g;
        write_normalized(r.o + static_cast<size_t>(row) * hd, r.st[row], hd,
                         a.out + (head0 + g) * hd,
                         lse_slot(a, a.query_start[s] + i0 + i, kvh * group + g));
      }
    }
  });
  return ok_status();
}

}  // namespace kvsplit::backend
