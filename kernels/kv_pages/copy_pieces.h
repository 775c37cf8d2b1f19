// Host API of the batched copy kernel (temporal cut, kv-cuts.md §3): a batch of copies ("pieces")
// run by the GPU's threads instead of its copy engines. A swap moves a sequence's pages as one
// piece per page and layer (tens of KB each); one DMA transfer per piece pays a per-transfer setup
// that caps the link well below one large copy (docs/kv-tiers.md "Copies"). The kernel reads and
// writes pinned host memory directly (mapped into the device's address space, as every
// cudaHostAlloc allocation is under unified addressing), so a swap is one launch per
// kCopyPiecesPerLaunch pieces, whatever their number. No CUDA device header: callable from g++.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/cuda_stream.h"
#include "kvsplit/status.h"

namespace kvsplit::kernels {

struct CopyPiece {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
};

// Pieces per launch: their descriptors travel as the kernel's parameters (no descriptor buffer
// whose lifetime would outlast the call): 14 KiB of the 32 KiB CUDA allows from sm_70 on.
inline constexpr int kCopyPiecesPerLaunch = 512;
// Bytes one thread block copies per grid-stride step (its threads x 8 vectors of 16 bytes).
inline constexpr int kCopyChunkBytes = 32 * 1024;

// True when the kernel can copy `p`: dst, src and bytes all multiples of 16 (one 16-byte vector
// access at a time), and the two ranges disjoint.
bool copy_piece_supported(const CopyPiece& p);

// Copies every piece (pieces[i].bytes from src to dst), in launches of at most
// kCopyPiecesPerLaunch pieces on `stream`, each with at most `max_blocks` thread blocks (fewer
// leave more of the device to the work that runs beside a copy). The pointers must be usable by
// the device: device memory, or pinned host memory mapped into its address space. Asynchronous;
// stream order makes the bytes visible to later work (host reads after a synchronize).
// Errors (nothing launched): an unsupported piece (copy_piece_supported, naming its index),
// max_blocks < 1, or a failed launch.
Status launch_copy_pieces(const CopyPiece* pieces, size_t n, int max_blocks, cudaStream_t stream);

}  // namespace kvsplit::kernels
