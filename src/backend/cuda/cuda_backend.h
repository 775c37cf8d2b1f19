// CudaBackend: the Backend contract (src/backend/backend.h) on one CUDA device. One stream; device
// memory from the stream-ordered pool (cudaMallocAsync); pinned host staging for weight uploads
// and split plans; GEMMs through cuBLAS with fp32 accumulation; everything else through the
// kernels in kernels/ (launchers return Status). Not thread-safe: one owner (a worker).
//
// Mixed-precision pages and the scoring side outputs (AttentionArgs::page_precision, score_seqs)
// run the kernels of kernels/attention/mixed_attention.h; every array of the call, the side
// outputs included, is device memory (the model forward uploads and downloads them).
// AttentionArgs::lse (spatial cut) is passed to both kernel families; merge_attention_states
// runs kernels/attention/merge_partials.h (the host array of part pointers goes by value).
//
// Index errors inside kernels (block ids, slots, token ids out of range) set a device error flag;
// the kernel skips the bad item, and the next synchronize() / copy_d2h() returns
// kInvalidArgument naming the op family that saw it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend_factory.h"

namespace kvsplit::backend::cuda {

class CudaBackend final : public Backend {
 public:
  // Use create_cuda_backend(); `device` must exist.
  static StatusOr<std::unique_ptr<Backend>> create(int device, const CudaBackendOptions& options);
  ~CudaBackend() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }
  int parallelism() const override { return num_sms_; }

  StatusOr<void*> alloc(size_t bytes) override;
  void free(void* ptr) override;
  Status copy_h2d(void* dst_dev, const void* src_host, size_t bytes) override;
  Status copy_d2h(void* dst_host, const void* src_dev, size_t bytes) override;
  Status copy_d2d(void* dst_dev, const void* src_dev, size_t bytes) override;
  Status memset_zero(void* dst_dev, size_t bytes) override;
  Status synchronize() override;
  StatusOr<void*> alloc_host(size_t bytes) override;
  void free_host(void* ptr) override;
  bool host_memory_pinned() const override { return true; }
  Status copy_d2h_async(void* dst_host, const void* src_dev, size_t bytes) override;
  Status copy_h2d_async(void* dst_dev, const void* src_host, size_t bytes) override;
  // A batch goes to the copy kernel (kernels/kv_pages/copy_pieces.h) when every range is
  // 16-byte aligned and its host side lies in alloc_host memory (of any CudaBackend), else to
  // one cudaMemcpyBatchAsync; set_batch_copy_method forces either (backend.h).
  void set_batch_copy_method(BatchCopyMethod method) override { copy_method_ = method; }
  Status copy_batch_async(CopyDir dir, const CopyRange* copies, size_t n) override;
  // On the copy stream, after the work queued so far on the compute stream; the fence is an event
  // recorded behind the batch, polled by wait_fence (cudaEventQuery) until its timeout.
  StatusOr<uint64_t> copy_batch_fenced(CopyDir dir, const CopyRange* copies, size_t n) override;
  StatusOr<bool> wait_fence(uint64_t fence, int64_t timeout_us) override;
  // Events with timing on the compute stream, reused after release_time_marks.
  StatusOr<int> mark_time() override;
  StatusOr<double> seconds_between(int from, int to) override;
  void release_time_marks() override { time_marks_used_ = 0; }
  int device() const override { return device_; }
  Status bind_thread() override;
  bool can_read_from(const Backend& src) override;
  Status read_for_peer(void* dst_host, const void* src_dev, size_t bytes) override;
  Status copy_from(void* dst_dev, const Backend& src, const void* src_dev, size_t bytes) override;
  StatusOr<MatrixView> upload_matrix(const void* host, DType dtype, int64_t rows,
                                     int64_t cols) override;
  // The backend's one stream, for the NCCL communicator (nccl_communicator.cpp), which enqueues
  // its send/recv there so they are ordered with this backend's work. Owned by the backend.
  cudaStream_t stream() const { return stream_; }

  Status embedding(const int32_t* ids, int num_tokens, const MatrixView& table,
                   float* out) override;
  Status rmsnorm(const float* x, const float* weight, int num_tokens, int dim, float eps,
                 float* out) override;
  Status add_rmsnorm(float* residual, const float* x, const float* weight, int num_tokens, int dim,
                     float eps, float* out) override;
  Status gemm(const float* x, int m, const MatrixView& w, const float* bias, float* out,
              bool accumulate) override;
  Status rope(float* q, float* k, const int32_t* positions, int num_tokens, int num_heads,
              int num_kv_heads, const RopeArgs& args) override;
  Status swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  Status kv_append(const LayerKv& kv, const float* k, const float* v, const int32_t* slot_mapping,
                   int num_tokens) override;
  Status attention_prefill(const AttentionArgs& args) override;
  Status attention_decode(const AttentionArgs& args, const backend::SplitPlan& plan) override;
  Status merge_attention_states(const float* const* o, const float* const* lse, int num_parts,
                                int64_t rows, int head_dim, float* out, float* lse_out) override;
  Status quantize_kv_page(const void* src, DType src_dtype, const kernels::QuantPageLayout& layout,
                          kernels::KvPrecision to, void* dst) override;
  Status dequantize_kv_page(const void* src, kernels::KvPrecision from,
                            const kernels::QuantPageLayout& layout, void* dst,
                            DType dst_dtype) override;
  Status summarize_kv_page(const void* src, DType src_dtype, const kernels::QuantPageLayout& layout,
                           kernels::KvSummaryElem* dst) override;
  bool has_sample_tokens() const override { return true; }
  Status check_model_attention(int head_dim, int gqa_group) const override;
  Status sample_tokens(const float* logits, int num_rows, int vocab, const SamplingRow* rows,
                       int32_t* ids) override;

 private:
  CudaBackend() = default;
  // Grows a device scratch buffer to at least `bytes`.
  Status reserve(void** buf, size_t* cap, size_t bytes);
  // Pinned staging of at least `bytes`, free for reuse (waits for the last copy out of it).
  StatusOr<void*> staging(size_t bytes);
  Status check_error_flag();
  // cudaMemcpyAsync on `stream` (the compute stream by default), no wait; nothing for 0 bytes.
  Status enqueue_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      const char* what);
  Status enqueue_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      const char* what, cudaStream_t stream);
  // A batch on `stream`: the copy kernel where it can take it (and the method allows), else one
  // cudaMemcpyBatchAsync where the driver takes it, else a copy per range.
  Status enqueue_batch(CopyDir dir, const CopyRange* copies, size_t n, cudaStream_t stream);
  bool kernel_can_copy(CopyDir dir, const CopyRange* copies, size_t n) const;

  int device_ = 0;
  int num_sms_ = 0;
  std::string name_;
  CudaBackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudaEvent_t staging_done_ = nullptr;
  // Fenced copies (asynchronous restores): their own stream, so they overlap the compute stream;
  // compute_mark_ orders each batch after the compute work queued before it.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;
  std::unordered_map<uint64_t, cudaEvent_t> fences_;  // in flight, by fence
  std::vector<cudaEvent_t> spare_events_;             // landed fences' events, for reuse
  uint64_t next_fence_ = 0;
  void* pinned_ = nullptr;
  size_t pinned_cap_ = 0;
  bool batch_copies_ = true;  // cudaMemcpyBatchAsync exists here (off, logged, once it is missing)
  bool batch_refusal_logged_ = false;  // a batch it refused went piece by piece (logged once)
  bool batch_accepted_ = false;        // some batch went through cudaMemcpyBatchAsync
  int batch_not_supported_run_ = 0;    // cudaErrorNotSupported refusals in a row
  BatchCopyMethod copy_method_ = BatchCopyMethod::kAuto;
  std::vector<cudaEvent_t> time_marks_;  // mark_time's events; [0, time_marks_used_) in use
  size_t time_marks_used_ = 0;
  int* error_flag_ = nullptr;      // device int, see the class comment
  const char* last_flag_op_ = "";  // op family most recently launched with the flag
  void* act16_ = nullptr;          // bf16/f16 copy of GEMM activations
  size_t act16_cap_ = 0;
  void* plan_dev_ = nullptr;  // split plan arrays [2, num_seqs] (+ [total_splits] bounds) int32
  size_t plan_cap_ = 0;
  // What plan_dev_ holds (num_splits, split_offset, split_begin): every layer of a step decodes
  // with the same plan, and uploading it again would make the host wait for the last upload's
  // staging.
  std::vector<int32_t> plan_uploaded_;
  void* partials_ = nullptr;  // split-K partial (o, m, l)
  size_t partials_cap_ = 0;
  void* score_max_ = nullptr;  // mixed attention scoring: per-head max score [num_seqs, num_heads]
  size_t score_max_cap_ = 0;
  void* sample_rows_ = nullptr;  // kernels::SampleRowParams [num_rows]
  size_t sample_rows_cap_ = 0;
  std::vector<void*> weights_;  // owned uploads
};

}  // namespace kvsplit::backend::cuda
