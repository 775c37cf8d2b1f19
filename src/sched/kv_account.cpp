#include "sched/kv_account.h"

#include <algorithm>

namespace kvsplit::sched {

KvLevel kv_level(const kv::KvPool& pool, const kv::BlockTable& table, int num_computed) {
  KvLevel l;
  const int64_t layers = pool.shape().num_layers;
  const int bs = pool.block_size();
  const auto n = static_cast<int64_t>(table.blocks.size());
  if (table.pages.empty()) {
    l.pages_full = static_cast<int32_t>(n);
    l.bytes = n * pool.page_layer_bytes(kernels::KvPrecision::kFull) * layers;
    l.tokens = std::clamp<int64_t>(num_computed, 0, n * bs);
    return l;
  }
  // Page bytes per rung, looked up once (full, int8, int4).
  const int64_t full = pool.page_layer_bytes(kernels::KvPrecision::kFull) * layers;
  const int64_t b8 = pool.page_layer_bytes(kernels::KvPrecision::kInt8) * layers;
  const int64_t b4 = pool.page_layer_bytes(kernels::KvPrecision::kInt4) * layers;
  const int64_t summary = pool.summary_layer_bytes() * layers;
  const int64_t pages = std::min<int64_t>(n, static_cast<int64_t>(table.pages.size()));
  // Pages dropped behind a sliding window hold nothing anywhere (and are not the cut's evictions).
  for (int64_t i = table.window_dropped; i < pages; ++i) {
    const kv::PageEntry& p = table.pages[i];
    if (p.summary >= 0) l.bytes += summary;  // device memory, beside any resident copy
    l.pages_evicted += p.location == kv::PageLocation::kEvicted ? 1 : 0;
    if (!p.resident()) continue;
    switch (p.precision) {
      case kernels::KvPrecision::kFull:
        ++l.pages_full;
        l.bytes += full;
        break;
      case kernels::KvPrecision::kInt8:
        ++l.pages_int8;
        l.bytes += b8;
        break;
      case kernels::KvPrecision::kInt4:
        ++l.pages_int4;
        l.bytes += b4;
        break;
      case kernels::KvPrecision::kEvicted:
        continue;
    }
    l.tokens += std::clamp<int64_t>(num_computed - i * bs, 0, bs);
  }
  // Restores in flight hold their destination block already (beside the resident copy); a
  // quantized recall its arena page too.
  for (const kv::PendingRestore& r : table.restoring)
    l.bytes += full + (r.precision == kernels::KvPrecision::kInt8   ? b8
                       : r.precision == kernels::KvPrecision::kInt4 ? b4
                                                                    : 0);
  return l;
}

void KvAccount::update(Clock::time_point now, const KvLevel& level) {
  if (started_ && now > since_) {
    const double dt = std::chrono::duration<double>(now - since_).count();
    byte_seconds_ += static_cast<double>(level_.bytes) * dt;
    token_seconds_ += static_cast<double>(level_.tokens) * dt;
  }
  if (!started_ || now > since_) since_ = now;
  started_ = true;
  level_ = level;
  if (trace_on_.load(std::memory_order_relaxed)) trace_.push_back({now, level});
}

}  // namespace kvsplit::sched
