#include "backend/split_plan.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/check.h"
#include "kernels/common/kv_quant.h"
#include "kernels/common/paged_kv.h"

namespace kvsplit::backend {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void SplitPlan::write_image(int32_t* out) const {
  out = std::copy(num_splits.begin(), num_splits.end(), out);
  out = std::copy(split_offset.begin(), split_offset.end(), out);
  std::copy(split_begin.begin(), split_begin.end(), out);
}

bool SplitPlan::image_equals(const std::vector<int32_t>& image) const {
  if (image.size() != image_words()) return false;
  auto at = image.begin();
  for (const std::vector<int32_t>* part : {&num_splits, &split_offset, &split_begin}) {
    if (!std::equal(part->begin(), part->end(), at)) return false;
    at += static_cast<std::ptrdiff_t>(part->size());
  }
  return true;
}

int split_span(int kv_len, int window, int block_size) {
  return kv_len - kernels::window_decode_base(kv_len, window, block_size);
}

SplitPlan make_split_plan(const int32_t* kv_lens, int num_seqs, int block_size, int chunk_tokens,
                          int window) {
  KVSPLIT_CHECK(block_size > 0 && num_seqs >= 0 && window >= 0);
  KVSPLIT_CHECK(num_seqs == 0 || kv_lens != nullptr);
  int max_kv_len = 0;
  for (int s = 0; s < num_seqs; ++s) {
    KVSPLIT_CHECK(kv_lens[s] >= 0);
    max_kv_len = std::max(max_kv_len, split_span(kv_lens[s], window, block_size));
  }
  SplitPlan plan;
  plan.window = window;
  // "No split": one chunk covers the longest sequence.
  const int64_t chunk = chunk_tokens <= 0 ? std::max<int64_t>(max_kv_len, 1) : chunk_tokens;
  plan.chunk_tokens = static_cast<int>(round_up(chunk, block_size));
  plan.num_splits.resize(num_seqs);
  plan.split_offset.resize(num_seqs);
  for (int s = 0; s < num_seqs; ++s) {
    const int span = split_span(kv_lens[s], window, block_size);
    const int n = static_cast<int>(std::max<int64_t>(1, ceil_div(span, plan.chunk_tokens)));
    plan.num_splits[s] = n;
    plan.split_offset[s] = plan.total_splits;
    plan.total_splits += n;
    plan.max_splits = std::max(plan.max_splits, n);
  }
  return plan;
}

int attended_keys(int kv_len, int window, int block_size, const PlanPages& pages, int seq) {
  const int base = kernels::window_decode_base(kv_len, window, block_size);
  if (pages.precision == nullptr) return kv_len - base;
  const uint8_t* row = pages.precision + static_cast<int64_t>(seq) * pages.max_blocks_per_seq;
  int keys = 0;
  for (int b = base / block_size; static_cast<int64_t>(b) * block_size < kv_len; ++b) {
    KVSPLIT_CHECK(b < pages.max_blocks_per_seq);
    if (row[b] != static_cast<uint8_t>(kernels::KvPrecision::kEvicted))
      keys += std::min(block_size, kv_len - b * block_size);
  }
  return keys;
}

namespace {

// Splits of `chunk` attended keys over the pages of each sequence (plan_decode_splits with
// evicted pages): a split opens at the first attended page after the previous one filled, the
// first at the window base, so the splits cover [base, kv_len) and every one attends keys.
SplitPlan make_attended_plan(const int32_t* kv_lens, int num_seqs, int block_size, int chunk,
                             int window, const PlanPages& pages) {
  SplitPlan plan;
  plan.window = window;
  plan.chunk_tokens = chunk;
  plan.num_splits.resize(num_seqs);
  plan.split_offset.resize(num_seqs);
  for (int s = 0; s < num_seqs; ++s) {
    const int kv_len = kv_lens[s];
    const int base = kernels::window_decode_base(kv_len, window, block_size);
    const uint8_t* row = pages.precision + static_cast<int64_t>(s) * pages.max_blocks_per_seq;
    plan.split_offset[s] = plan.total_splits;
    plan.split_begin.push_back(base);
    int n = 1, held = 0;  // splits so far; attended keys of the last one
    for (int b = base / block_size; static_cast<int64_t>(b) * block_size < kv_len; ++b) {
      if (row[b] == static_cast<uint8_t>(kernels::KvPrecision::kEvicted)) continue;
      if (held >= chunk) {
        plan.split_begin.push_back(b * block_size);
        ++n;
        held = 0;
      }
      held += std::min(block_size, kv_len - b * block_size);
    }
    plan.num_splits[s] = n;
    plan.total_splits += n;
    plan.max_splits = std::max(plan.max_splits, n);
  }
  return plan;
}

}  // namespace

SplitPlan plan_decode_splits(const int32_t* kv_lens, int num_seqs, int num_kv_heads, int block_size,
                             int parallelism, const SplitPlanConfig& config, int window,
                             PlanPages pages) {
  KVSPLIT_CHECK(num_kv_heads > 0 && block_size > 0);
  const int64_t target =
      int64_t{std::max(parallelism, 1)} * std::max(config.work_items_per_unit, 1);
  const int64_t base_items = int64_t{num_seqs} * num_kv_heads;
  if (num_seqs == 0 || base_items >= target)
    return make_split_plan(kv_lens, num_seqs, block_size, 0, window);

  int64_t total_tokens = 0;
  int max_kv_len = 0;
  bool evicted = false;  // some span has a page no query attends
  for (int s = 0; s < num_seqs; ++s) {
    const int keys = attended_keys(kv_lens[s], window, block_size, pages, s);
    evicted = evicted || keys < split_span(kv_lens[s], window, block_size);
    total_tokens += keys;
    max_kv_len = std::max(max_kv_len, keys);
  }
  // Equal-sized work items: spread the batch's (token, kv_head) pairs over `target` items...
  int64_t chunk = ceil_div(total_tokens * num_kv_heads, target);
  // ...but never below the chunk floor, nor so small that one sequence exceeds its split cap.
  chunk = std::max(chunk, int64_t{config.min_chunk_tokens});
  chunk = std::max(chunk, ceil_div(max_kv_len, std::max(config.max_splits_per_seq, 1)));
  chunk = round_up(std::max<int64_t>(chunk, 1), block_size);
  if (chunk >= max_kv_len) return make_split_plan(kv_lens, num_seqs, block_size, 0, window);
  if (evicted) {
    return make_attended_plan(kv_lens, num_seqs, block_size, static_cast<int>(chunk), window,
                              pages);
  }
  return make_split_plan(kv_lens, num_seqs, block_size, static_cast<int>(chunk), window);
}

Status check_split_plan(const SplitPlan& plan, int num_seqs, int block_size, int window,
                        const int32_t* host_kv_lens) {
  const std::string where = "attention_decode: split plan ";
  if (plan.num_seqs() != num_seqs || static_cast<int>(plan.split_offset.size()) != num_seqs) {
    return invalid_argument(where + "covers " + std::to_string(plan.num_seqs()) +
                            " sequences, the batch has " + std::to_string(num_seqs));
  }
  if (plan.chunk_tokens <= 0 || block_size <= 0 || plan.chunk_tokens % block_size != 0) {
    return invalid_argument(where + "chunk_tokens " + std::to_string(plan.chunk_tokens) +
                            " is not a positive multiple of block_size " +
                            std::to_string(block_size));
  }
  if (plan.window != window) {
    return invalid_argument(where + "was made for window " + std::to_string(plan.window) +
                            ", the call's window is " + std::to_string(window));
  }
  const bool bounds = !plan.split_begin.empty();
  if (bounds && static_cast<int64_t>(plan.split_begin.size()) != plan.total_splits) {
    return invalid_argument(where + "has " + std::to_string(plan.split_begin.size()) +
                            " split bounds for " + std::to_string(plan.total_splits) + " splits");
  }
  int64_t offset = 0;
  int max_splits = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t n = plan.num_splits[s];
    bool ok = n >= 1 && plan.split_offset[s] == offset;
    if (ok && bounds) {  // page aligned and increasing; the first at the base, all below kv_len
      const int32_t* b = plan.split_begin.data() + offset;
      for (int64_t j = 0; ok && j < n; ++j)
        ok = offset + n <= plan.total_splits && b[j] >= 0 && b[j] % block_size == 0 &&
             (j == 0 || b[j] > b[j - 1]);
      if (ok && host_kv_lens != nullptr) {
        const int kv_len = host_kv_lens[s];
        ok = b[0] == kv_len - split_span(kv_len, window, block_size) &&
             (kv_len == 0 ? n == 1 : b[n - 1] < kv_len);
      }
    } else if (ok && host_kv_lens != nullptr) {
      const int span = split_span(host_kv_lens[s], window, block_size);
      const int64_t base = host_kv_lens[s] - span;  // the window's first page boundary
      ok = n * plan.chunk_tokens >= span &&
           base + n * plan.chunk_tokens <= std::numeric_limits<int32_t>::max();
    }
    if (!ok) {
      return invalid_argument(
          where + "does not match " +
          (host_kv_lens ? "kv_len " + std::to_string(host_kv_lens[s]) + " of " : std::string()) +
          "sequence " + std::to_string(s) + " (num_splits " + std::to_string(n) +
          ", split_offset " + std::to_string(plan.split_offset[s]) + ")");
    }
    offset += n;
    max_splits = std::max(max_splits, static_cast<int>(n));
  }
  if (offset != plan.total_splits) return invalid_argument(where + "total_splits is inconsistent");
  // The workspace and the merge follow max_splits; each work item follows its num_splits.
  if (plan.max_splits != max_splits) {
    return invalid_argument(where + "max_splits " + std::to_string(plan.max_splits) +
                            " is not the largest num_splits " + std::to_string(max_splits));
  }
  return ok_status();
}

}  // namespace kvsplit::backend
