// The batched copy kernel (kernels/kv_pages/copy_pieces.h) against memcpy: pieces of many sizes
// (empty, one vector, under and over a chunk), more pieces than one launch takes, grids smaller
// than the chunk count, and the refusals. Device memory on both sides here; tests/gpu runs the
// pinned host side through CudaBackend (cuda_host_tier_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kv_pages/copy_pieces.h"

namespace kvsplit::testing {
namespace {

using kernels::CopyPiece;

// Random sizes (multiples of 16) laid out back to back in one source and one destination buffer,
// the destination order shuffled so pieces are not one contiguous run; returns the host image
// the destination must equal.
struct Layout {
  std::vector<size_t> src_off, dst_off, bytes;
  size_t total = 0;
};

Layout make_layout(std::mt19937& rng, int n, size_t max_bytes) {
  Layout l;
  std::uniform_int_distribution<size_t> size(0, max_bytes / 16);
  for (int i = 0; i < n; ++i) {
    const size_t b = (i % 7 == 3) ? 0 : 16 * size(rng);  // some empty pieces
    l.src_off.push_back(l.total);
    l.bytes.push_back(b);
    l.total += b;
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  l.dst_off.resize(n);
  size_t at = 0;
  for (int i : order) {
    l.dst_off[i] = at;
    at += l.bytes[i];
  }
  return l;
}

void check_copy(uint32_t seed, int n, size_t max_bytes, int max_blocks) {
  std::mt19937 rng(seed);
  const Layout l = make_layout(rng, n, max_bytes);
  std::vector<unsigned char> src(l.total + 16), sentinel(l.total + 16, 0xA5);
  for (auto& c : src) c = static_cast<unsigned char>(rng());
  DevArray<unsigned char> dsrc(src), ddst(sentinel);
  std::vector<CopyPiece> pieces(n);
  for (int i = 0; i < n; ++i)
    pieces[i] = {ddst.get() + l.dst_off[i], dsrc.get() + l.src_off[i], l.bytes[i]};
  ASSERT_TRUE(kernels::launch_copy_pieces(pieces.data(), pieces.size(), max_blocks, nullptr).ok());
  ASSERT_EQ(device_sync(), "");
  std::vector<unsigned char> want = sentinel;
  for (int i = 0; i < n; ++i)
    if (l.bytes[i]) std::memcpy(want.data() + l.dst_off[i], src.data() + l.src_off[i], l.bytes[i]);
  const std::vector<unsigned char> got = ddst.to_host();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], want[i]) << "byte " << i << " (seed " << seed << ", " << n << " pieces)";
}

TEST(CopyPieces, SmallPiecesOneLaunch) {
  KVSPLIT_REQUIRE_DEVICE();
  check_copy(1, 37, 4096, 3);
}

TEST(CopyPieces, PiecesLargerThanAChunkWithFewBlocks) {
  KVSPLIT_REQUIRE_DEVICE();
  // Up to 3 chunks per piece; one block strides over every chunk, then two.
  check_copy(2, 9, 3 * kernels::kCopyChunkBytes + 48, 1);
  check_copy(3, 9, 3 * kernels::kCopyChunkBytes + 48, 2);
}

TEST(CopyPieces, MorePiecesThanOneLaunchTakes) {
  KVSPLIT_REQUIRE_DEVICE();
  check_copy(4, 2 * kernels::kCopyPiecesPerLaunch + 5, 256, 4);
}

TEST(CopyPieces, NothingToCopyLaunchesNothing) {
  KVSPLIT_REQUIRE_DEVICE();
  EXPECT_TRUE(kernels::launch_copy_pieces(nullptr, 0, 1, nullptr).ok());
  const CopyPiece empty{nullptr, nullptr, 0};
  EXPECT_TRUE(kernels::launch_copy_pieces(&empty, 1, 1, nullptr).ok());
}

TEST(CopyPieces, RefusesWhatTheKernelCannotCopy) {
  KVSPLIT_REQUIRE_DEVICE();
  DevArray<unsigned char> buf(4096);
  unsigned char* p = buf.get();
  const CopyPiece ok{p, p + 1024, 256};
  const CopyPiece bad_size{p, p + 1024, 250};
  const CopyPiece bad_addr{p + 8, p + 1024, 256};
  const CopyPiece overlap{p, p + 128, 256};
  const CopyPiece null_src{p, nullptr, 16};
  EXPECT_TRUE(kernels::copy_piece_supported(ok));
  for (const CopyPiece& c : {bad_size, bad_addr, overlap, null_src}) {
    EXPECT_FALSE(kernels::copy_piece_supported(c));
    const CopyPiece batch[2] = {ok, c};
    const Status st = kernels::launch_copy_pieces(batch, 2, 4, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("piece 1"), std::string::npos) << st.message();
  }
  EXPECT_EQ(kernels::launch_copy_pieces(&ok, 1, 0, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvsplit::testing
