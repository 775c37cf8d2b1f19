// Launchers of the mixed-precision attention kernels: validation, the one dispatch site over
// (KV dtype x head_dim), grid shapes. Compiled by nvcc (kvsplit_cuda) and by g++ under the
// emulation harness (kernels/emulation/emulated_kernels.cpp).
#include <cstdint>
#include <string>

#include "kernels/attention/mixed_attention.cuh"
#include "kernels/common/launch_status.h"

namespace kvsplit::kernels {
namespace {

// What one dispatch runs: prefill attention; decode attention (merge and scoring included); or
// the scoring kernel alone, against given maxima.
enum class MixedMode { kPrefill, kDecode, kScoreOnly };

Status validate_mixed(const MixedAttentionParams& mp, bool decode) {
  KVSPLIT_RETURN_IF_ERROR(validate_paged_attention(mp.base));
  if (mp.num_int8_blocks < 0 || mp.num_int4_blocks < 0 || mp.num_summary_slots < 0)
    return invalid_argument("mixed attention: negative arena or summary slot count");
  // The kernels stage rows by cp.async: every page array must start 16-byte aligned (cudaMalloc
  // and the pools' arenas are).
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(mp.base.kv) || misaligned(mp.int8_pages) || misaligned(mp.int4_pages))
    return invalid_argument(
        "mixed attention: kv, int8_pages and int4_pages must be 16-byte aligned");
  if (!decode && mp.base.head_max)
    return invalid_argument("mixed attention: head_max is for decode only");
  if (!mp.score_seqs) return ok_status();
  if (!decode)
    return invalid_argument("mixed attention: score_seqs (scoring outputs) are for decode only");
  if (!mp.token_relevance || !mp.summary_slots || !mp.page_bound)
    return invalid_argument(
        "mixed attention: score_seqs needs token_relevance, summary_slots and page_bound");
  if (mp.summary_parts < 1 || mp.base.block_size % mp.summary_parts != 0)
    return invalid_argument("mixed attention: summary_parts " + std::to_string(mp.summary_parts) +
                            " must be >= 1 and divide block_size " +
                            std::to_string(mp.base.block_size));
  return ok_status();
}

// The decode shape checks shared by launch_mixed_decode and launch_mixed_score.
Status validate_mixed_decode_shape(const PagedAttentionParams& p) {
  if (p.num_tokens != p.num_seqs)
    return invalid_argument("mixed decode attention: num_tokens " + std::to_string(p.num_tokens) +
                            " != num_seqs " + std::to_string(p.num_seqs) + " (one query each)");
  if (p.max_splits < 1 || p.max_splits > 65535)
    return invalid_argument("mixed decode attention: max_splits must be in [1, 65535]");
  return ok_status();
}

template <typename KT, int D>
Status launch_mixed_score_kernel(const MixedAttentionParams& mp, const float* head_max, size_t smem,
                                 cudaStream_t stream) {
  const PagedAttentionParams& p = mp.base;
  const int64_t keys = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  const dim3 sgrid(static_cast<unsigned>((keys + kAttnTileKeys - 1) / kAttnTileKeys),
                   static_cast<unsigned>(p.num_seqs));
  return launch_status(
      launch(mixed_score_kernel<KT, D>, sgrid, dim3(kAttnThreads), smem, stream, mp, head_max),
      "mixed attention scoring");
}

template <typename KT, int D>
Status launch_mixed_typed(const MixedAttentionParams& mp, const float* given_max,
                          cudaStream_t stream, MixedMode mode) {
  const PagedAttentionParams& p = mp.base;
  const bool decode = mode != MixedMode::kPrefill;
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
  // Pipeline stages: attention_stages (paged_attention.cuh), as the all-full kernel.
  const int rows = tokens_per_block * group;
  const int eb = static_cast<int>(sizeof(KT));
  const size_t limit = max_dynamic_smem_per_block();
  const size_t smem = mixed_smem_layout(rows, D, eb, /*with_v=*/true, 1).total;
  const size_t two = mixed_smem_layout(rows, D, eb, /*with_v=*/true, 2).total;
  const size_t score_smem = mixed_smem_layout(group, D, eb, /*with_v=*/false, 1).total;
  const bool score_only = mode == MixedMode::kScoreOnly;
  if (!score_only && p.pipeline_stages == 2 && two > limit) {
    return unimplemented("mixed attention: two pipeline stages need " + std::to_string(two) +
                         " B of shared memory per block; this device allows " +
                         std::to_string(limit));
  }
  if ((!score_only && smem > limit) || ((score_only || mp.score_seqs) && score_smem > limit)) {
    const size_t need = !score_only && smem > limit ? smem : score_smem;
    return unimplemented(
        "mixed attention: a GQA group of " + std::to_string(group) + " heads with head_dim " +
        std::to_string(D) + " needs " + std::to_string(need) +
        " B of shared memory per block; this device allows " + std::to_string(limit));
  }
  if (!score_only && pv_combos(rows, D) > kAttnThreads) {
    return unimplemented(
        "mixed attention: a GQA group of " + std::to_string(group) + " heads with head_dim " +
        std::to_string(D) + " is not compiled (at most " +
        std::to_string(kAttnThreads * kPvRows * kPvChunk / D) + " query rows per block)");
  }
  if (score_only) return launch_mixed_score_kernel<KT, D>(mp, given_max, score_smem, stream);
  const dim3 grid(grid_x, static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  const long long blocks = static_cast<long long>(grid.x) * grid.y * grid.z;
  const cudaError_t e = attention_stages(blocks, smem, two, limit, p.pipeline_stages) == 2
                            ? launch(mixed_attention_kernel<KT, D, 2>, grid, dim3(kAttnThreads),
                                     two, stream, mp, tokens_per_block, decode ? 1 : 0)
                            : launch(mixed_attention_kernel<KT, D, 1>, grid, dim3(kAttnThreads),
                                     smem, stream, mp, tokens_per_block, decode ? 1 : 0);
  KVSPLIT_RETURN_IF_ERROR(
      launch_status(e, decode ? "mixed decode attention" : "mixed prefill attention"));
  if (!decode) return ok_status();
  if (p.max_splits > 1) {
    const dim3 mgrid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_seqs));
    KVSPLIT_RETURN_IF_ERROR(launch_status(
        launch(mixed_merge_kernel<D>, mgrid, dim3(D), 0, stream, mp), "mixed merge states"));
  }
  if (!mp.score_seqs) return ok_status();
  return launch_mixed_score_kernel<KT, D>(mp, mp.score_max, score_smem, stream);
}

template <typename KT>
Status dispatch_mixed_head_dim(const MixedAttentionParams& mp, const float* given_max,
                               cudaStream_t stream, MixedMode mode) {
  switch (mp.base.head_dim) {
    case 8:
      return launch_mixed_typed<KT, 8>(mp, given_max, stream, mode);  // stories260K
    case 64:
      return launch_mixed_typed<KT, 64>(mp, given_max, stream, mode);
    case 128:
      return launch_mixed_typed<KT, 128>(mp, given_max, stream, mode);
  }
  return unimplemented("mixed attention: head_dim " + std::to_string(mp.base.head_dim) +
                       " is not compiled");
}

// The one dispatch site of the mixed attention family.
Status dispatch_mixed(const MixedAttentionParams& mp, const float* given_max, cudaStream_t stream,
                      MixedMode mode) {
  switch (mp.base.kv_dtype) {
    case ElemType::kF32:
      return dispatch_mixed_head_dim<float>(mp, given_max, stream, mode);
    case ElemType::kF16:
      return dispatch_mixed_head_dim<__half>(mp, given_max, stream, mode);
    case ElemType::kBF16:
      return dispatch_mixed_head_dim<__nv_bfloat16>(mp, given_max, stream, mode);
  }
  return invalid_argument("mixed attention: unknown KV dtype");
}

}  // namespace

Status launch_mixed_prefill(const MixedAttentionParams& mp, cudaStream_t stream) {
  KVSPLIT_RETURN_IF_ERROR(validate_mixed(mp, /*decode=*/false));
  if (mp.base.num_seqs == 0 || mp.base.max_query_len <= 0) return ok_status();
  return dispatch_mixed(mp, nullptr, stream, MixedMode::kPrefill);
}

Status launch_mixed_decode(const MixedAttentionParams& mp, cudaStream_t stream) {
  KVSPLIT_RETURN_IF_ERROR(validate_mixed(mp, /*decode=*/true));
  const PagedAttentionParams& p = mp.base;
  if (mp.score_seqs && !mp.score_max)
    return invalid_argument("mixed attention: score_seqs needs score_max");
  if (p.num_seqs == 0) return ok_status();
  KVSPLIT_RETURN_IF_ERROR(validate_mixed_decode_shape(p));
  if (p.max_splits > 1) {
    if (!p.num_splits || !p.split_offset || !p.part_o || !p.part_m || !p.part_l)
      return invalid_argument(
          "mixed decode attention: split plan arrays or partial workspace missing");
    if (p.chunk_tokens <= 0 || p.chunk_tokens % p.block_size != 0)
      return invalid_argument("mixed decode attention: chunk_tokens " +
                              std::to_string(p.chunk_tokens) +
                              " is not a positive multiple of block_size");
  }
  return dispatch_mixed(mp, nullptr, stream, MixedMode::kDecode);
}

Status launch_mixed_score(const MixedAttentionParams& mp, const float* head_max,
                          cudaStream_t stream) {
  KVSPLIT_RETURN_IF_ERROR(validate_mixed(mp, /*decode=*/true));
  if (!mp.score_seqs || !head_max)
    return invalid_argument("mixed attention scoring: needs score_seqs and head_max");
  if (mp.base.head_max)
    return invalid_argument("mixed attention scoring: a scoring-only call writes no head_max");
  if (mp.base.num_seqs == 0) return ok_status();
  KVSPLIT_RETURN_IF_ERROR(validate_mixed_decode_shape(mp.base));
  return dispatch_mixed(mp, head_max, stream, MixedMode::kScoreOnly);
}

}  // namespace kvsplit::kernels
