#include "kv/block_allocator.h"

#include "common/check.h"

namespace kvsplit::kv {

BlockAllocator::BlockAllocator(int num_blocks) {
  KVSPLIT_CHECK(num_blocks >= 0);
  refcount_.assign(num_blocks, 0);
  watched_.assign(num_blocks, 0);
  free_.reserve(num_blocks);
  // Stack: the lowest ids are handed out first.
  for (int32_t id = num_blocks - 1; id >= 0; --id) free_.push_back(id);
}

std::optional<std::vector<int32_t>> BlockAllocator::allocate(int n) {
  KVSPLIT_CHECK(n >= 0);
  if (n > num_free()) return std::nullopt;
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) {
    const int32_t id = free_.back();
    free_.pop_back();
    KVSPLIT_CHECK(refcount_[id] == 0);
    refcount_[id] = 1;
    out[i] = id;
  }
  return out;
}

void BlockAllocator::incref(int32_t block) {
  KVSPLIT_CHECK_MSG(block >= 0 && block < num_blocks(), "incref: block id out of range");
  KVSPLIT_CHECK_MSG(refcount_[block] > 0, "incref of a free block");
  if (++refcount_[block] == 2 && watched_[block] && watcher_ != nullptr)
    watcher_->on_sharing_changed(block);
}

void BlockAllocator::decref(int32_t block) {
  KVSPLIT_CHECK_MSG(block >= 0 && block < num_blocks(), "decref: block id out of range");
  KVSPLIT_CHECK_MSG(refcount_[block] > 0, "decref of a free block (double free)");
  const int32_t left = --refcount_[block];
  if (left == 0) {
    KVSPLIT_CHECK_MSG(!watched_[block], "a watched block was freed");
    free_.push_back(block);
  } else if (left == 1 && watched_[block] && watcher_ != nullptr) {
    watcher_->on_sharing_changed(block);
  }
}

void BlockAllocator::watch(int32_t block, bool on) {
  KVSPLIT_CHECK_MSG(block >= 0 && block < num_blocks(), "watch: block id out of range");
  watched_[block] = on;
}

int BlockAllocator::refcount(int32_t block) const {
  KVSPLIT_CHECK_MSG(block >= 0 && block < num_blocks(), "refcount: block id out of range");
  return refcount_[block];
}

}  // namespace kvsplit::kv
