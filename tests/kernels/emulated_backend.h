// A Backend whose ops run the CUDA kernel sources under the emulation harness (host memory as
// "device" memory), so the whole Llama forward pass can be checked against the goldens with the
// kernels the CUDA backend launches. Memory, weight storage and GEMMs come from the CPU backend
// (cuBLAS has no emulated twin); weights are kept plain row-major as CudaBackend keeps them.
// Test-only; mirrors src/backend/cuda/cuda_backend.cpp's argument plumbing.
#pragma once

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/kernel_args.h"
#include "kernels/attention/merge_partials.h"
#include "kernels/attention/mixed_attention.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/common/float_bits.h"
#include "kernels/kv_pages/copy_pieces.h"
#include "kernels/kv_pages/kv_page_ops.h"
#include "kernels/ops/ops.h"
#include "kernels/sampling/sampling.h"

namespace kvsplit::testing {

class EmulatedKernelBackend final : public backend::Backend {
 public:
  // weight_dtype: storage of uploaded weights (as CudaBackendOptions::weight_dtype; f32 sources
  // are rounded to nearest even); unset keeps the file's dtype.
  explicit EmulatedKernelBackend(std::optional<backend::DType> weight_dtype = std::nullopt)
      : cpu_(backend::make_cpu_backend(1)), weight_dtype_(weight_dtype) {}

  backend::DeviceKind kind() const override { return backend::DeviceKind::kCuda; }
  std::string name() const override { return "emulated-cuda-kernels"; }
  int parallelism() const override { return 4; }

  StatusOr<void*> alloc(size_t bytes) override { return cpu_->alloc(bytes); }
  void free(void* ptr) override { cpu_->free(ptr); }
  Status copy_h2d(void* d, const void* s, size_t n) override { return cpu_->copy_h2d(d, s, n); }
  Status copy_d2h(void* d, const void* s, size_t n) override { return cpu_->copy_d2h(d, s, n); }
  Status copy_d2d(void* d, const void* s, size_t n) override { return cpu_->copy_d2d(d, s, n); }
  Status memset_zero(void* d, size_t n) override { return cpu_->memset_zero(d, n); }
  Status synchronize() override {
    return error_ ? invalid_argument("kernel error flag set") : ok_status();
  }
  // A batch goes to the copy kernel where it can take it, as on CudaBackend (host memory is
  // "device" memory here, so only the alignment rule applies); else range by range. A few thread
  // blocks, so a batch's chunks are strided over.
  Status copy_batch_async(CopyDir dir, const CopyRange* copies, size_t n) override {
    std::vector<kernels::CopyPiece> pieces(n);
    bool kernel = method_ != BatchCopyMethod::kDma;
    for (size_t i = 0; i < n && kernel; ++i) {
      pieces[i] = {copies[i].dst, copies[i].src, copies[i].bytes};
      kernel = kernels::copy_piece_supported(pieces[i]);
    }
    if (!kernel) {
      if (method_ == BatchCopyMethod::kKernel)
        return invalid_argument("copy batch: the copy kernel cannot take this batch");
      return Backend::copy_batch_async(dir, copies, n);
    }
    ++kernel_batches_;
    return kernels::launch_copy_pieces(pieces.data(), n, 3, nullptr);
  }
  void set_batch_copy_method(BatchCopyMethod m) override { method_ = m; }
  int kernel_batches() const { return kernel_batches_; }

  // One emulated device (host memory): every copy is a device copy.
  int device() const override { return 0; }
  bool can_read_from(const backend::Backend& src) override { return src.device() == 0; }
  Status copy_from(void* dst, const backend::Backend&, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return ok_status();
  }

  // Plain row-major copy (the kernels read tables directly).
  StatusOr<backend::MatrixView> upload_matrix(const void* host, backend::DType dtype, int64_t rows,
                                              int64_t cols) override {
    const int64_t n = rows * cols;
    if (weight_dtype_ && dtype == backend::DType::kF32 && *weight_dtype_ != backend::DType::kF32) {
      weights_.emplace_back(static_cast<size_t>(n) * 2);
      auto* dst = reinterpret_cast<uint16_t*>(weights_.back().data());
      const float* src = static_cast<const float*>(host);
      for (int64_t i = 0; i < n; ++i)
        dst[i] = *weight_dtype_ == backend::DType::kBF16 ? kernels::float_to_bf16_bits(src[i])
                                                         : kernels::float_to_half_bits(src[i]);
      return backend::MatrixView{dst, *weight_dtype_, rows, cols};
    }
    const size_t bytes = static_cast<size_t>(n) * backend::dtype_size(dtype);
    weights_.emplace_back(bytes);
    std::memcpy(weights_.back().data(), host, bytes);
    return backend::MatrixView{weights_.back().data(), dtype, rows, cols};
  }

  Status embedding(const int32_t* ids, int num_tokens, const backend::MatrixView& t,
                   float* out) override {
    return kernels::launch_embedding(ids, num_tokens, t.data, t.dtype, t.rows, t.cols, out, &error_,
                                     nullptr);
  }
  Status rmsnorm(const float* x, const float* w, int n, int dim, float eps, float* out) override {
    return kernels::launch_rmsnorm(x, w, n, dim, eps, out, nullptr, nullptr);
  }
  Status add_rmsnorm(float* res, const float* x, const float* w, int n, int dim, float eps,
                     float* out) override {
    return kernels::launch_rmsnorm(x, w, n, dim, eps, out, res, nullptr);
  }
  Status gemm(const float* x, int m, const backend::MatrixView& w, const float* bias, float* out,
              bool accumulate) override {
    return cpu_->gemm(x, m, w, bias, out, accumulate);
  }
  Status rope(float* q, float* k, const int32_t* pos, int n, int heads, int kv_heads,
              const backend::RopeArgs& a) override {
    kernels::RopeParams p;
    p.q = q;
    p.k = k;
    p.positions = pos;
    p.inv_freq = a.inv_freq;
    p.num_tokens = n;
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = a.head_dim;
    p.rotary_dim = a.rotary_dim;
    p.interleaved = a.style == backend::RopeStyle::kInterleaved;
    p.attention_factor = a.attention_factor;
    return kernels::launch_rope(p, nullptr);
  }
  Status swiglu(const float* g, const float* u, int64_t n, float* out) override {
    return kernels::launch_swiglu(g, u, n, out, nullptr);
  }
  Status kv_append(const backend::LayerKv& kv, const float* k, const float* v, const int32_t* slots,
                   int n) override {
    return kernels::launch_kv_append(backend::cuda::kv_append_params(kv, k, v, slots, n, &error_),
                                     nullptr);
  }
  Status attention_prefill(const backend::AttentionArgs& a) override {
    KVSPLIT_RETURN_IF_ERROR(backend::cuda::check_sharded_scoring_args(a, /*decode=*/false));
    kernels::PagedAttentionParams p = params(a);
    if (backend::cuda::needs_mixed_attention(a)) {
      ++mixed_calls_;
      return kernels::launch_mixed_prefill(backend::cuda::mixed_attention_params(a, p), nullptr);
    }
    return kernels::launch_paged_prefill(p, nullptr);
  }
  Status attention_decode(const backend::AttentionArgs& a,
                          const backend::SplitPlan& plan) override {
    KVSPLIT_RETURN_IF_ERROR(backend::cuda::check_sharded_scoring_args(a, /*decode=*/true));
    KVSPLIT_RETURN_IF_ERROR(
        backend::check_split_plan(plan, a.num_seqs, a.kv.block_size, a.window, nullptr));
    kernels::PagedAttentionParams p = params(a);
    if (a.score_max != nullptr) {  // scoring only, as CudaBackend::attention_decode
      ++decode_calls_;
      ++mixed_calls_;
      ++score_only_calls_;
      return kernels::launch_mixed_score(backend::cuda::mixed_attention_params(a, p), a.score_max,
                                         nullptr);
    }
    p.max_splits = plan.max_splits > 1 ? plan.max_splits : 1;
    if (plan.has_splits()) {
      const size_t heads = static_cast<size_t>(plan.total_splits) * a.num_heads;
      partials_.assign(heads * (a.head_dim + 2), 0.f);
      p.chunk_tokens = plan.chunk_tokens;
      p.num_splits = plan.num_splits.data();
      p.split_offset = plan.split_offset.data();
      if (!plan.split_begin.empty()) p.split_begin = plan.split_begin.data();
      p.part_o = partials_.data();
      p.part_m = p.part_o + heads * a.head_dim;
      p.part_l = p.part_m + heads;
    }
    ++decode_calls_;
    head_max_calls_ += a.head_max != nullptr;
    if (backend::cuda::needs_mixed_attention(a)) {
      ++mixed_calls_;
      kernels::MixedAttentionParams mp = backend::cuda::mixed_attention_params(a, p);
      if (a.score_seqs) {
        score_max_.assign(static_cast<size_t>(a.num_seqs) * a.num_heads, 0.f);
        mp.score_max = score_max_.data();
      }
      return kernels::launch_mixed_decode(mp, nullptr);
    }
    KVSPLIT_RETURN_IF_ERROR(kernels::launch_paged_decode(p, nullptr));
    if (plan.has_splits()) KVSPLIT_RETURN_IF_ERROR(kernels::launch_merge_states(p, nullptr));
    return ok_status();
  }
  Status merge_attention_states(const float* const* o, const float* const* lse, int num_parts,
                                int64_t rows, int head_dim, float* out, float* lse_out) override {
    return kernels::launch_merge_partials(
        backend::cuda::merge_partials_params(o, lse, num_parts, rows, head_dim, out, lse_out),
        nullptr);
  }
  Status quantize_kv_page(const void* src, backend::DType src_dtype,
                          const kernels::QuantPageLayout& layout, kernels::KvPrecision to,
                          void* dst) override {
    ++page_op_calls_;
    return kernels::launch_quantize_kv_page(src, src_dtype, layout, to, dst, nullptr);
  }
  Status dequantize_kv_page(const void* src, kernels::KvPrecision from,
                            const kernels::QuantPageLayout& layout, void* dst,
                            backend::DType dst_dtype) override {
    ++page_op_calls_;
    return kernels::launch_dequantize_kv_page(src, from, layout, dst, dst_dtype, nullptr);
  }
  Status summarize_kv_page(const void* src, backend::DType src_dtype,
                           const kernels::QuantPageLayout& layout,
                           kernels::KvSummaryElem* dst) override {
    ++page_op_calls_;
    return kernels::launch_summarize_kv_page(src, src_dtype, layout, dst, nullptr);
  }
  bool has_sample_tokens() const override { return true; }
  Status sample_tokens(const float* logits, int num_rows, int vocab,
                       const backend::SamplingRow* rows, int32_t* ids) override {
    std::vector<kernels::SampleRowParams> p(num_rows);
    for (int r = 0; r < num_rows; ++r) p[r] = backend::cuda::sample_row_params(rows[r]);
    return kernels::launch_sample(logits, num_rows, vocab, p.data(), ids, nullptr);
  }

  int decode_calls() const { return decode_calls_; }
  // Attention calls that ran the mixed-precision kernels, and page op calls (semantic cut).
  int mixed_calls() const { return mixed_calls_; }
  int page_op_calls() const { return page_op_calls_; }
  // Decode calls that wrote head_max, and scoring-only calls (score_max): sharded scoring.
  int head_max_calls() const { return head_max_calls_; }
  int score_only_calls() const { return score_only_calls_; }

 private:
  kernels::PagedAttentionParams params(const backend::AttentionArgs& a) {
    kernels::PagedAttentionParams p = backend::cuda::attention_params(a);
    p.error_flag = &error_;
    return p;
  }

  std::unique_ptr<backend::Backend> cpu_;
  std::optional<backend::DType> weight_dtype_;
  std::vector<std::vector<unsigned char>> weights_;
  std::vector<float> partials_;
  int error_ = 0;
  BatchCopyMethod method_ = BatchCopyMethod::kAuto;
  int kernel_batches_ = 0;
  std::vector<float> score_max_;
  int decode_calls_ = 0;
  int mixed_calls_ = 0;
  int page_op_calls_ = 0;
  int head_max_calls_ = 0;
  int score_only_calls_ = 0;
};

}  // namespace kvsplit::testing
