#include "kv/migrate.h"

#include <chrono>
#include <string>
#include <vector>

#include "kv/page_ops.h"
#include "kv/swap.h"

namespace kvsplit::kv {
namespace {

using kernels::KvPrecision;

// Copies one page of every layer from shard `from` (block b) to `to` (block d).
Status copy_page(KvPool& src, int32_t b, KvPool& dst, int32_t d, std::vector<std::byte>& staging) {
  backend::Backend& from = src.backend();
  backend::Backend& to = dst.backend();
  const size_t bytes = static_cast<size_t>(src.page_layer_bytes(KvPrecision::kFull));
  const bool direct = to.can_read_from(from);
  for (int l = 0; l < src.shape().num_layers; ++l) {
    if (direct) {
      KVSPLIT_RETURN_IF_ERROR(to.copy_from(dst.full_page(l, d), from, src.full_page(l, b), bytes));
    } else {
      staging.resize(bytes);
      KVSPLIT_RETURN_IF_ERROR(from.copy_d2h(staging.data(), src.full_page(l, b), bytes));
      KVSPLIT_RETURN_IF_ERROR(from.synchronize());
      KVSPLIT_RETURN_IF_ERROR(to.copy_h2d(dst.full_page(l, d), staging.data(), bytes));
      KVSPLIT_RETURN_IF_ERROR(to.synchronize());
    }
  }
  return ok_status();
}

}  // namespace

StatusOr<int> migrate_pages(KvPool& pool, BlockTable& table, int first_page, int end_page,
                            int to_shard, MigrateStats* stats, int max_pages) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(table.blocks.size());
  if (to_shard < 0 || to_shard >= pool.num_shards())
    return invalid_argument("migrate: shard " + std::to_string(to_shard) + " outside [0, " +
                            std::to_string(pool.num_shards()) + ")");
  if (first_page < 0 || end_page < first_page || end_page > n)
    return invalid_argument("migrate: pages [" + std::to_string(first_page) + ", " +
                            std::to_string(end_page) + ") outside the table's " +
                            std::to_string(n));
  if (!table.pages.empty() && table.pages.size() != table.blocks.size())
    return invalid_argument("migrate: the table's pages and blocks differ in length");
  // Restores in flight land first (the owner usually settles them itself, where they count).
  PageOpStats settled;
  KVSPLIT_RETURN_IF_ERROR(complete_restores(pool, table, -1, &settled));
  // A host-tier swap-in prefetch reads the host slots this may free: given up first (the owner
  // usually drops it itself, where it counts).
  drop_host_prefetch(pool, table, nullptr);
  std::vector<int> idx;
  for (int i = first_page; i < end_page; ++i) {
    if (max_pages > 0 && static_cast<int>(idx.size()) == max_pages) break;
    const PageEntry pe = table.page(i);
    if (pe.precision != KvPrecision::kFull) continue;
    if ((pe.location == PageLocation::kDevice && pe.shard != to_shard) ||
        pe.location == PageLocation::kHost)
      idx.push_back(i);
  }
  if (idx.empty()) return 0;
  KvPool& dst = pool.shard(to_shard);
  // As placement does (KvPool::allocate_placed): the shard's idle cached pages make room.
  auto blocks = dst.allocate_blocks(static_cast<int>(idx.size()));
  if (!blocks)
    return resource_exhausted("migrate: shard " + std::to_string(to_shard) + " has " +
                              std::to_string(dst.local_available()) +
                              " free or evictable blocks, " + std::to_string(idx.size()) +
                              " pages to move");
  Status st = ok_status();
  std::vector<std::byte> staging;
  const int64_t page_bytes = pool.page_layer_bytes(KvPrecision::kFull);
  int64_t from_host = 0;
  std::vector<backend::Backend::CopyRange> from_host_copies;  // one batch, queued at the end
  for (size_t k = 0; k < idx.size() && st.ok(); ++k) {
    const int i = idx[k];
    const PageEntry pe = table.page(i);
    if (pe.location == PageLocation::kHost) {
      ++from_host;
      dst.add_page_copies((*blocks)[k], pool.host_slot(pe.original),
                          backend::Backend::CopyDir::kHostToDevice, &from_host_copies);
    } else {
      st = copy_page(pool.shard(pe.shard), table.blocks[i], dst, (*blocks)[k], staging);
    }
  }
  if (st.ok())
    st = dst.backend().copy_batch_async(backend::Backend::CopyDir::kHostToDevice,
                                        from_host_copies.data(), from_host_copies.size());
  // The host slots are freed below (and the blocks on an error): every queued copy must be done.
  const Status synced = dst.backend().synchronize();
  if (st.ok()) st = synced;
  if (!st.ok()) {
    for (int32_t b : *blocks) pool.decref_block(to_shard, b);
    return st.with_prefix("migrate");
  }
  if (table.pages.empty()) table.pages.resize(table.blocks.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const int i = idx[k];
    PageEntry& pe = table.pages[i];
    if (pe.location == PageLocation::kHost) {
      pool.host_allocator().decref(pe.original);
      pe.original = -1;
      pe.location = PageLocation::kDevice;
    } else {
      pool.decref_block(pe.shard, table.blocks[i]);
    }
    pe.shard = static_cast<uint8_t>(to_shard);
    table.blocks[i] = (*blocks)[k];
  }
  if (stats != nullptr) {
    stats->pages += static_cast<int64_t>(idx.size());
    stats->from_host += from_host;
    stats->bytes += static_cast<int64_t>(idx.size()) * page_bytes * pool.shape().num_layers;
    stats->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return static_cast<int>(idx.size());
}

}  // namespace kvsplit::kv
