// Launchers of the paged attention kernels: validation, the one dispatch site over
// (KV dtype x head_dim), grid shapes. Compiled by nvcc (kvsplit_cuda) and by g++ under the
// emulation harness (kernels/emulation/emulated_kernels.cpp).
#include <cstdint>
#include <string>

#include "kernels/attention/paged_attention.cuh"
#include "kernels/common/launch_status.h"

namespace kvsplit::kernels {
namespace {

constexpr int kMaxGridYZ = 65535;

}  // namespace

Status validate_paged_attention(const PagedAttentionParams& p) {
  if (p.num_seqs < 0 || p.num_tokens < 0)
    return invalid_argument("attention: negative num_seqs/num_tokens");
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0)
    return invalid_argument("attention: num_heads " + std::to_string(p.num_heads) +
                            " is not a positive multiple of num_kv_heads " +
                            std::to_string(p.num_kv_heads));
  if (!attention_head_dim_supported(p.head_dim))
    return unimplemented("attention: head_dim " + std::to_string(p.head_dim) +
                         " is not compiled (8, 64, 128)");
  if (p.block_size != kAttentionBlockSize)
    return unimplemented("attention: block_size " + std::to_string(p.block_size) +
                         " is not compiled (16)");
  if (p.num_seqs > kMaxGridYZ || p.num_kv_heads > kMaxGridYZ)
    return invalid_argument("attention: more than 65535 sequences or kv heads in one call");
  if (p.num_seqs == 0) return ok_status();
  if (!p.q || !p.out || !p.kv || !p.query_start || !p.kv_lens || !p.block_tables)
    return invalid_argument("attention: null pointer argument");
  // The kernels stage K and V rows by 16-byte cp.async (cudaMalloc and the pools' arenas align).
  if (reinterpret_cast<uintptr_t>(p.kv) % 16 != 0)
    return invalid_argument("attention: kv must be 16-byte aligned");
  if (p.num_blocks <= 0 || p.max_blocks_per_seq <= 0)
    return invalid_argument("attention: num_blocks and max_blocks_per_seq must be positive");
  if (!(p.scale > 0.f)) return invalid_argument("attention: scale must be positive");
  if (p.window < 0) return invalid_argument("attention: negative window");
  if (p.pipeline_stages < 0 || p.pipeline_stages > 2)
    return invalid_argument("attention: pipeline_stages must be 0 (auto), 1 or 2");
  return ok_status();
}

namespace {

template <typename KT, int D>
Status launch_typed(const PagedAttentionParams& p, cudaStream_t stream, bool decode) {
  const int group = p.num_heads / p.num_kv_heads;
  int tokens_per_block = 1;
  unsigned grid_x = 1;
  if (decode) {
    grid_x = static_cast<unsigned>(p.max_splits);
  } else {
    tokens_per_block = kPrefillMaxRows / group > 1 ? kPrefillMaxRows / group : 1;
    grid_x = static_cast<unsigned>((p.max_query_len + tokens_per_block - 1) / tokens_per_block);
    if (grid_x == 0) return ok_status();
  }
  // Pipeline stages: attention_stages (paged_attention.cuh).
  const int rows = tokens_per_block * group;
  const size_t limit = max_dynamic_smem_per_block();
  const size_t two = attn_smem_layout(rows, D, sizeof(KT), 2).total;
  const size_t one = attn_smem_layout(rows, D, sizeof(KT), 1).total;
  if (p.pipeline_stages == 2 && two > limit) {
    return unimplemented("attention: two pipeline stages need " + std::to_string(two) +
                         " B of shared memory per block; this device allows " +
                         std::to_string(limit));
  }
  if (one > limit) {
    return unimplemented(
        "attention: a GQA group of " + std::to_string(group) + " heads with head_dim " +
        std::to_string(D) + " needs " + std::to_string(one) +
        " B of shared memory per block; this device allows " + std::to_string(limit));
  }
  if (pv_combos(rows, D) > kAttnThreads) {
    return unimplemented(
        "attention: a GQA group of " + std::to_string(group) + " heads with head_dim " +
        std::to_string(D) + " is not compiled (at most " +
        std::to_string(kAttnThreads * kPvRows * kPvChunk / D) + " query rows per block)");
  }
  const dim3 grid(grid_x, static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  const long long blocks = static_cast<long long>(grid.x) * grid.y * grid.z;
  const cudaError_t e = attention_stages(blocks, one, two, limit, p.pipeline_stages) == 2
                            ? launch(paged_attention_kernel<KT, D, 2>, grid, dim3(kAttnThreads),
                                     two, stream, p, tokens_per_block, decode ? 1 : 0)
                            : launch(paged_attention_kernel<KT, D, 1>, grid, dim3(kAttnThreads),
                                     one, stream, p, tokens_per_block, decode ? 1 : 0);
  return launch_status(e, decode ? "paged decode attention" : "paged prefill attention");
}

template <typename KT>
Status dispatch_head_dim(const PagedAttentionParams& p, cudaStream_t stream, bool decode) {
  switch (p.head_dim) {
    case 8:
      return launch_typed<KT, 8>(p, stream, decode);  // stories260K
    case 64:
      return launch_typed<KT, 64>(p, stream, decode);
    case 128:
      return launch_typed<KT, 128>(p, stream, decode);
  }
  return unimplemented("attention: head_dim " + std::to_string(p.head_dim) + " is not compiled");
}

// The one dispatch site of the attention family.
Status dispatch(const PagedAttentionParams& p, cudaStream_t stream, bool decode) {
  switch (p.kv_dtype) {
    case ElemType::kF32:
      return dispatch_head_dim<float>(p, stream, decode);
    case ElemType::kF16:
      return dispatch_head_dim<__half>(p, stream, decode);
    case ElemType::kBF16:
      return dispatch_head_dim<__nv_bfloat16>(p, stream, decode);
  }
  return invalid_argument("attention: unknown KV dtype");
}

}  // namespace

bool attention_head_dim_supported(int head_dim) {
  return head_dim == 8 || head_dim == 64 || head_dim == 128;
}

Status attention_shape_supported(int head_dim, int gqa_group) {
  if (!attention_head_dim_supported(head_dim))
    return unimplemented("attention: head_dim " + std::to_string(head_dim) +
                         " is not compiled (8, 64, 128)");
  if (gqa_group < 1) return invalid_argument("attention: GQA group must be >= 1");
  // Query rows per block as launch_typed sets them: the group in decode; in prefill as many query
  // tokens as kPrefillMaxRows / group allows (at least one), times the group.
  const int prefill_tokens = kPrefillMaxRows / gqa_group > 1 ? kPrefillMaxRows / gqa_group : 1;
  for (const int rows : {gqa_group, prefill_tokens * gqa_group}) {
    if (pv_combos(rows, head_dim) > kAttnThreads)
      return unimplemented(
          "attention: a GQA group of " + std::to_string(gqa_group) + " heads with head_dim " +
          std::to_string(head_dim) + " is not compiled (at most " +
          std::to_string(kAttnThreads * kPvRows * kPvChunk / head_dim) + " query rows per block)");
  }
  return ok_status();
}

Status launch_paged_prefill(const PagedAttentionParams& p, cudaStream_t stream) {
  KVSPLIT_RETURN_IF_ERROR(validate_paged_attention(p));
  if (p.head_max) return invalid_argument("prefill attention: head_max is for decode only");
  if (p.num_seqs == 0 || p.max_query_len <= 0) return ok_status();
  return dispatch(p, stream, /*decode=*/false);
}

Status launch_paged_decode(const PagedAttentionParams& p, cudaStream_t stream) {
  KVSPLIT_RETURN_IF_ERROR(validate_paged_attention(p));
  if (p.num_seqs == 0) return ok_status();
  if (p.num_tokens != p.num_seqs)
    return invalid_argument("decode attention: num_tokens " + std::to_string(p.num_tokens) +
                            " != num_seqs " + std::to_string(p.num_seqs) + " (one query each)");
  if (p.max_splits < 1 || p.max_splits > 65535)
    return invalid_argument("decode attention: max_splits must be in [1, 65535]");
  if (p.max_splits > 1) {
    if (!p.num_splits || !p.split_offset || !p.part_o || !p.part_m || !p.part_l)
      return invalid_argument("decode attention: split plan arrays or partial workspace missing");
    if (p.chunk_tokens <= 0 || p.chunk_tokens % p.block_size != 0)
      return invalid_argument("decode attention: chunk_tokens " + std::to_string(p.chunk_tokens) +
                              " is not a positive multiple of block_size");
  }
  return dispatch(p, stream, /*decode=*/true);
}

Status launch_merge_states(const PagedAttentionParams& p, cudaStream_t stream) {
  KVSPLIT_RETURN_IF_ERROR(validate_paged_attention(p));
  if (p.num_seqs == 0 || p.max_splits <= 1) return ok_status();
  if (!p.num_splits || !p.split_offset || !p.part_o || !p.part_m || !p.part_l)
    return invalid_argument("merge states: split plan arrays or partial workspace missing");
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_seqs));
  const cudaError_t e =
      p.head_dim == 8    ? launch(merge_states_kernel<8>, grid, dim3(8), 0, stream, p)
      : p.head_dim == 64 ? launch(merge_states_kernel<64>, grid, dim3(64), 0, stream, p)
                         : launch(merge_states_kernel<128>, grid, dim3(128), 0, stream, p);
  return launch_status(e, "merge states");
}

}  // namespace kvsplit::kernels
