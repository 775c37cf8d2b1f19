#include "sched/kv_handoff.h"

#include <fmt/format.h>

namespace kvsplit::sched {

Status copy_kv_blocks(const kv::KvPool& src, std::span<const int32_t> src_blocks, kv::KvPool& dst,
                      std::span<const int32_t> dst_blocks) {
  const kv::KvShape& a = src.shape();
  const kv::KvShape& b = dst.shape();
  if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads || a.head_dim != b.head_dim ||
      src.block_size() != dst.block_size() || src.config().dtype != dst.config().dtype) {
    return invalid_argument("copy_kv_blocks: source and destination KV pools differ in shape");
  }
  if (src_blocks.size() != dst_blocks.size()) {
    return invalid_argument(fmt::format("copy_kv_blocks: {} source blocks but {} destination blocks",
                                        src_blocks.size(), dst_blocks.size()));
  }
  if (a.num_layers == 0 || src_blocks.empty()) return ok_status();
  const size_t block_bytes = static_cast<size_t>(src.bytes_per_block() / a.num_layers);
  backend::Backend& be = dst.backend();
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
        return invalid_argument(fmt::format("copy_kv_blocks: block id out of range ({} -> {})", sb, db));
      }
      size_t run = 1;
      while (i + run < src_blocks.size() && src_blocks[i + run] == sb + static_cast<int32_t>(run) &&
             dst_blocks[i + run] == db + static_cast<int32_t>(run) &&
             sb + static_cast<int32_t>(run) < s.num_blocks &&
             db + static_cast<int32_t>(run) < d.num_blocks) {
        ++run;
      }
      KVSPLIT_RETURN_IF_ERROR(be.copy_d2d(d_base + static_cast<size_t>(db) * block_bytes,
                                          s_base + static_cast<size_t>(sb) * block_bytes,
                                          run * block_bytes));
      i += run;
    }
  }
  return be.synchronize();
}

}  // namespace kvsplit::sched
