#include "sched/kv_handoff.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

namespace kvsplit::sched {

Status check_handoff_table(const kv::BlockTable& table) {
  if (!table.pages.empty() && table.pages.size() != table.blocks.size()) {
    return internal_error(fmt::format("KV handoff: the table has {} page entries for {} blocks",
                                      table.pages.size(), table.blocks.size()));
  }
  for (size_t i = static_cast<size_t>(table.window_dropped); i < table.pages.size(); ++i) {
    const kv::PageEntry& p = table.pages[i];
    if (!p.resident() || p.precision != kernels::KvPrecision::kFull) {
      return internal_error(fmt::format(
          "KV handoff: page {} of {} is not full precision and resident (a KV cut changed it "
          "before the handoff); only full pages can be handed off",
          i, table.pages.size()));
    }
  }
  return ok_status();
}

KvCopyRoute plan_kv_copy(int src_device, int dst_device, bool direct_access) {
  if (src_device == dst_device) return KvCopyRoute::kSameDevice;
  return direct_access ? KvCopyRoute::kPeer : KvCopyRoute::kStaged;
}

const char* kv_copy_route_name(KvCopyRoute route) {
  switch (route) {
    case KvCopyRoute::kSameDevice:
      return "same device";
    case KvCopyRoute::kPeer:
      return "peer";
    case KvCopyRoute::kStaged:
      return "staged through host";
  }
  return "?";
}

StatusOr<KvCopyRoute> copy_kv_blocks(const kv::KvPool& src, std::span<const int32_t> src_blocks,
                                     kv::KvPool& dst, std::span<const int32_t> dst_blocks) {
  const kv::KvShape& a = src.shape();
  const kv::KvShape& b = dst.shape();
  if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads ||
      a.head_dim != b.head_dim || src.block_size() != dst.block_size() ||
      src.config().dtype != dst.config().dtype) {
    return invalid_argument("copy_kv_blocks: source and destination KV pools differ in shape");
  }
  if (src_blocks.size() != dst_blocks.size()) {
    return invalid_argument(
        fmt::format("copy_kv_blocks: {} source blocks but {} destination blocks", src_blocks.size(),
                    dst_blocks.size()));
  }
  backend::Backend& from = src.backend();
  backend::Backend& to = dst.backend();
  const bool same = from.device() == to.device();
  const KvCopyRoute route =
      plan_kv_copy(from.device(), to.device(), same || to.can_read_from(from));
  if (a.num_layers == 0 || src_blocks.empty()) return route;
  const size_t block_bytes = static_cast<size_t>(src.bytes_per_block() / a.num_layers);
  std::vector<char> staging;  // kStaged: one run at a time
  for (int layer = 0; layer < a.num_layers; ++layer) {
    const backend::LayerKv s = src.layer(layer);
    const backend::LayerKv d = dst.layer(layer);
    const auto* s_base = static_cast<const char*>(s.data);
    auto* d_base = static_cast<char*>(d.data);
    size_t i = 0;
    while (i < src_blocks.size()) {
      const int32_t sb = src_blocks[i];
      const int32_t db = dst_blocks[i];
      if (sb < 0 || sb >= s.num_blocks || db < 0 || db >= d.num_blocks) {
        return invalid_argument(
            fmt::format("copy_kv_blocks: block id out of range ({} -> {})", sb, db));
      }
      size_t run = 1;
      while (i + run < src_blocks.size() && src_blocks[i + run] == sb + static_cast<int32_t>(run) &&
             dst_blocks[i + run] == db + static_cast<int32_t>(run) &&
             sb + static_cast<int32_t>(run) < s.num_blocks &&
             db + static_cast<int32_t>(run) < d.num_blocks) {
        ++run;
      }
      const char* from_ptr = s_base + static_cast<size_t>(sb) * block_bytes;
      char* to_ptr = d_base + static_cast<size_t>(db) * block_bytes;
      const size_t bytes = run * block_bytes;
      if (route == KvCopyRoute::kStaged) {
        staging.resize(std::max(staging.size(), bytes));
        // `from` belongs to another worker's thread: read_for_peer leaves its state alone.
        KVSPLIT_RETURN_IF_ERROR(from.read_for_peer(staging.data(), from_ptr, bytes));
        KVSPLIT_RETURN_IF_ERROR(to.copy_h2d(to_ptr, staging.data(), bytes));
        KVSPLIT_RETURN_IF_ERROR(to.synchronize());  // the buffer is reused by the next run
      } else {
        KVSPLIT_RETURN_IF_ERROR(to.copy_from(to_ptr, from, from_ptr, bytes));
      }
      i += run;
    }
  }
  KVSPLIT_RETURN_IF_ERROR(to.synchronize());
  return route;
}

StatusOr<KvCopyRoute> copy_kv_pages(const kv::KvPool& src, std::span<const int32_t> src_blocks,
                                    std::span<const uint8_t> src_shards, kv::KvPool& dst,
                                    const kv::BlockTable& dst_table, int first_page) {
  if (src_blocks.size() != dst_table.blocks.size() ||
      (!src_shards.empty() && src_shards.size() != src_blocks.size()))
    return invalid_argument(fmt::format("copy_kv_pages: {} source pages, {} destination pages",
                                        src_blocks.size(), dst_table.blocks.size()));
  const size_t first = static_cast<size_t>(std::max(dst_table.window_dropped, first_page));
  if (first_page < 0 || first > src_blocks.size())
    return invalid_argument(
        fmt::format("copy_kv_pages: {} pages dropped or cached of {}", first, src_blocks.size()));
  const bool src_flat = src_shards.empty() || src.num_shards() == 1;
  if (src_flat && dst.num_shards() == 1) {
    return copy_kv_blocks(src, src_blocks.subspan(first), dst,
                          std::span<const int32_t>(dst_table.blocks).subspan(first));
  }
  KvCopyRoute route = plan_kv_copy(src.backend().device(), dst.backend().device(), true);
  for (int a = 0; a < src.num_shards(); ++a) {
    for (int b = 0; b < dst.num_shards(); ++b) {
      std::vector<int32_t> from, to;
      for (size_t i = first; i < src_blocks.size(); ++i) {
        const int sa = src_shards.empty() ? 0 : src_shards[i];
        const int sb = dst_table.page(i).shard;
        if (sa >= src.num_shards() || sb >= dst.num_shards())
          return invalid_argument("copy_kv_pages: a page names a shard the pool does not have");
        if (sa == a && sb == b) {
          from.push_back(src_blocks[i]);
          to.push_back(dst_table.blocks[i]);
        }
      }
      if (from.empty()) continue;
      KVSPLIT_ASSIGN_OR_RETURN(const KvCopyRoute r,
                               copy_kv_blocks(src.shard(a), from, dst.shard(b), to));
      if (a == 0 && b == 0) route = r;
    }
  }
  return route;
}

HandoffCopyFaultHook fail_handoff_copies(int first, int n) {
  auto next = std::make_shared<std::atomic<int>>(0);
  return [first, n, next](const std::string& request_id) -> Status {
    const int k = next->fetch_add(1, std::memory_order_relaxed);
    if (k < first || k >= first + n) return ok_status();
    return internal_error(
        fmt::format("injected fault: KV handoff copy {} (request {}) failed", k, request_id));
  };
}

}  // namespace kvsplit::sched
