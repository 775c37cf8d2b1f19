// Launcher of the batched copy kernel: validation, the launch split and the chunk prefix sums.
// Compiled by nvcc (kvsplit_cuda) and by g++ under the emulation harness
// (kernels/emulation/emulated_kernels.cpp).
#include <algorithm>
#include <memory>
#include <string>

#include "kernels/common/launch_status.h"
#include "kernels/kv_pages/copy_pieces.cuh"

namespace kvsplit::kernels {

bool copy_piece_supported(const CopyPiece& p) {
  const auto d = reinterpret_cast<uintptr_t>(p.dst), s = reinterpret_cast<uintptr_t>(p.src);
  if (((d | s | p.bytes) & 15u) != 0) return false;
  if (p.bytes == 0) return true;
  if (p.dst == nullptr || p.src == nullptr) return false;
  return d + p.bytes <= s || s + p.bytes <= d;
}

Status launch_copy_pieces(const CopyPiece* pieces, size_t n, int max_blocks, cudaStream_t stream) {
  if (max_blocks < 1)
    return invalid_argument("copy_pieces: max_blocks " + std::to_string(max_blocks) + " < 1");
  if (n > 0 && pieces == nullptr) return invalid_argument("copy_pieces: null pieces");
  for (size_t i = 0; i < n; ++i) {
    if (pieces[i].bytes / kCopyChunkBytes >= 0xffffffffull)
      return invalid_argument("copy_pieces: piece " + std::to_string(i) + " is too large");
    if (!copy_piece_supported(pieces[i]))
      return invalid_argument("copy_pieces: piece " + std::to_string(i) +
                              " is not 16-byte aligned in its addresses and size, or overlaps "
                              "itself (" +
                              std::to_string(pieces[i].bytes) + " bytes)");
  }
  // Heap: the batch is 14 KiB, more than a caller's stack should carry in every context.
  auto batch = std::make_unique<CopyPieceBatch>();
  size_t i = 0;
  while (i < n) {
    CopyPieceBatch& b = *batch;
    b.n = 0;
    uint64_t chunks = 0;
    // Up to kCopyPiecesPerLaunch non-empty pieces, and chunks countable in 32 bits.
    for (; i < n && b.n < kCopyPiecesPerLaunch; ++i) {
      const CopyPiece& p = pieces[i];
      if (p.bytes == 0) continue;
      const uint64_t c = (p.bytes + kCopyChunkBytes - 1) / kCopyChunkBytes;
      if (b.n > 0 && chunks + c > 0xffffffffull) break;  // the next launch takes it
      b.first_chunk[b.n] = static_cast<uint32_t>(chunks);
      b.piece[b.n++] = p;
      chunks += c;
    }
    if (b.n == 0) break;
    b.first_chunk[b.n] = static_cast<uint32_t>(chunks);
    const unsigned grid = static_cast<unsigned>(std::min<uint64_t>(chunks, uint64_t(max_blocks)));
    KVSPLIT_RETURN_IF_ERROR(launch_status(
        launch(copy_pieces_kernel, dim3(grid), dim3(kCopyThreads), 0, stream, b), "copy_pieces"));
  }
  return ok_status();
}

}  // namespace kvsplit::kernels
