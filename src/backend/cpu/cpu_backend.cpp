// CpuBackend: the Backend contract on host memory, with a thread pool and compile-time SIMD.
// Weights are packed once at upload (gemm.h); activations are plain row-major f32.
#include "backend/cpu/cpu_backend.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/kv_quant_ops.h"
#include "backend/cpu/simd.h"
#include "common/thread_pool.h"
#include "kernels/common/merge_states.h"
#include "kernels/common/paged_kv.h"
#include "kernels/common/rope.h"

namespace kvsplit::backend {
namespace {

constexpr size_t kAlign = 64;
// Elementwise ops below this many elements per task are not worth a thread hand-off.
constexpr int64_t kMinElemsPerTask = 16384;

std::string str(int64_t v) { return std::to_string(v); }

// A batch of copies larger than this (in all) is copied with non-temporal stores: far beyond the
// caches, a plain memcpy of page-sized pieces first reads every destination line
// (read-for-ownership), which halves its bandwidth (bench_temporal --swap-bandwidth).
constexpr size_t kStreamCopyBytes = size_t{8} << 20;

// memcpy with non-temporal stores for the 64-byte-aligned body of the destination.
void copy_streaming(std::byte* dst, const std::byte* src, size_t bytes) {
#if defined(__AVX2__)
  const size_t head = std::min(bytes, (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  const size_t body = bytes & ~size_t{63};
  for (size_t i = 0; i < body; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
  }
  std::memcpy(dst + body, src + body, bytes - body);
  _mm_sfence();  // the streamed lines are visible before the copy counts as done
#else
  std::memcpy(dst, src, bytes);
#endif
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& o)
      : pool_(std::max(1, o.threads),
              o.spin_micros < 0 ? ThreadPool::kDefaultSpinMicros : o.spin_micros),
        device_(o.device),
        no_peer_access_(o.emulate_no_peer_access),
        async_copies_(o.async_copies),
        copy_delay_(std::chrono::microseconds(std::max<int64_t>(0, o.fenced_copy_delay_us))) {}
  ~CpuBackend() override {
    stop_copy_thread();
    for (auto& [ptr, info] : packed_) std::free(const_cast<void*>(ptr));
  }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override {
    return "cpu (" + std::to_string(pool_.num_threads()) + " threads, " + cpu::kSimdName + ")";
  }
  int parallelism() const override { return pool_.num_threads(); }

  StatusOr<void*> alloc(size_t bytes) override {
    const size_t rounded = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (rounded < bytes) return resource_exhausted("cpu alloc: size overflow");
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr)
      return resource_exhausted("cpu alloc of " + std::to_string(bytes) + " bytes failed");
    return p;
  }
  void free(void* ptr) override { std::free(ptr); }

  Status copy_h2d(void* dst, const void* src, size_t bytes) override {
    return copy(dst, src, bytes, "copy_h2d");
  }
  Status copy_d2h(void* dst, const void* src, size_t bytes) override {
    return copy(dst, src, bytes, "copy_d2h");
  }
  Status copy_d2d(void* dst, const void* src, size_t bytes) override {
    return copy(dst, src, bytes, "copy_d2d");
  }
  // The copies of a batch spread over the backend's threads; a large batch streams its stores
  // (copy_streaming). Synchronous, like every CPU op: done when it returns.
  Status copy_batch_async(CopyDir dir, const CopyRange* copies, size_t n) override {
    (void)dir;
    KVSPLIT_RETURN_IF_ERROR(check_copies("copy_batch_async", copies, n));
    copy_ranges(copies, n, &pool_);
    return ok_status();
  }
  // With async_copies the batch goes to the copy thread (FIFO: fence f landed means every fence
  // before it did too); otherwise the default (synchronous, fence 0).
  StatusOr<uint64_t> copy_batch_fenced(CopyDir dir, const CopyRange* copies, size_t n) override {
    if (!async_copies_) return Backend::copy_batch_fenced(dir, copies, n);
    KVSPLIT_RETURN_IF_ERROR(check_copies("copy_batch_fenced", copies, n));
    std::lock_guard<std::mutex> lock(copy_mu_);
    if (!copy_thread_.joinable()) copy_thread_ = std::thread([this] { copy_loop(); });
    const uint64_t fence = ++queued_fence_;
    copy_queue_.push_back(
        FencedBatch{fence, std::vector<CopyRange>(copies, copies + n), CopyClock::now()});
    copy_cv_.notify_all();
    return fence;
  }
  StatusOr<bool> wait_fence(uint64_t fence, int64_t timeout_us) override {
    if (fence == 0) return true;
    std::unique_lock<std::mutex> lock(copy_mu_);
    if (fence > queued_fence_)
      return invalid_argument("wait_fence: unknown fence " + std::to_string(fence));
    auto landed = [&] { return landed_fence_ >= fence; };
    if (timeout_us < 0)
      copy_cv_.wait(lock, landed);
    else if (timeout_us > 0)
      copy_cv_.wait_for(lock, std::chrono::microseconds(timeout_us), landed);
    return landed();
  }

 private:
  static Status check_copies(const char* what, const CopyRange* copies, size_t n) {
    for (size_t i = 0; i < n; ++i)
      if (copies[i].bytes > 0 && (copies[i].dst == nullptr || copies[i].src == nullptr))
        return invalid_argument(std::string(what) + ": null pointer in copy " + str(int64_t(i)));
    return ok_status();
  }
  // Copies a checked batch: spread over `pool`'s threads when it is large (streaming stores),
  // on the calling thread otherwise or without a pool.
  static void copy_ranges(const CopyRange* copies, size_t n, ThreadPool* pool) {
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) total += copies[i].bytes;
    const bool streaming = total >= kStreamCopyBytes;
    auto run = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        auto* dst = static_cast<std::byte*>(copies[i].dst);
        const auto* src = static_cast<const std::byte*>(copies[i].src);
        if (streaming)
          copy_streaming(dst, src, copies[i].bytes);
        else if (copies[i].bytes > 0)
          std::memcpy(dst, src, copies[i].bytes);
      }
    };
    const int64_t count = static_cast<int64_t>(n);
    if (!streaming || count < 2 || pool == nullptr || pool->num_threads() < 2)
      run(0, count);
    else
      pool->parallel_range(count, 1, run);
  }
  void copy_loop() {
    std::unique_lock<std::mutex> lock(copy_mu_);
    for (;;) {
      copy_cv_.wait(lock, [&] { return copy_stop_ || !copy_queue_.empty(); });
      if (copy_queue_.empty()) return;  // stopping, and every batch has landed
      FencedBatch batch = std::move(copy_queue_.front());
      copy_queue_.pop_front();
      lock.unlock();
      if (copy_delay_.count() > 0) std::this_thread::sleep_until(batch.queued + copy_delay_);
      copy_ranges(batch.copies.data(), batch.copies.size(), nullptr);
      lock.lock();
      landed_fence_ = batch.fence;
      copy_cv_.notify_all();
    }
  }
  // Lands every queued batch, then ends the copy thread.
  void stop_copy_thread() {
    {
      std::lock_guard<std::mutex> lock(copy_mu_);
      copy_stop_ = true;
      copy_cv_.notify_all();
    }
    if (copy_thread_.joinable()) copy_thread_.join();
  }

 public:
  Status memset_zero(void* dst, size_t bytes) override {
    if (bytes == 0) return ok_status();
    if (dst == nullptr) return invalid_argument("memset_zero: null destination");
    std::memset(dst, 0, bytes);
    return ok_status();
  }
  Status synchronize() override { return ok_status(); }

  int device() const override { return device_; }
  bool can_read_from(const Backend& src) override {
    return src.kind() == DeviceKind::kCpu && (src.device() == device_ || !no_peer_access_);
  }
  Status copy_from(void* dst, const Backend& src, const void* src_ptr, size_t bytes) override {
    if (src.kind() != DeviceKind::kCpu) return invalid_argument("copy_from: not a CPU backend");
    return copy(dst, src_ptr, bytes, "copy_from");
  }

  StatusOr<MatrixView> upload_matrix(const void* host, DType dtype, int64_t rows,
                                     int64_t cols) override;
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
  Status attention_prefill(const AttentionArgs& args) override {
    return cpu_attention_prefill(args, pool_);
  }
  Status attention_decode(const AttentionArgs& args, const backend::SplitPlan& plan) override {
    return cpu_attention_decode(args, plan, pool_);
  }
  Status merge_attention_states(const float* const* o, const float* const* lse, int num_parts,
                                int64_t rows, int head_dim, float* out, float* lse_out) override;
  Status quantize_kv_page(const void* src, DType src_dtype, const kernels::QuantPageLayout& layout,
                          kernels::KvPrecision to, void* dst) override {
    return cpu_quantize_kv_page(src, src_dtype, layout, to, dst);
  }
  Status dequantize_kv_page(const void* src, kernels::KvPrecision from,
                            const kernels::QuantPageLayout& layout, void* dst,
                            DType dst_dtype) override {
    return cpu_dequantize_kv_page(src, from, layout, dst, dst_dtype);
  }
  Status summarize_kv_page(const void* src, DType src_dtype, const kernels::QuantPageLayout& layout,
                           kernels::KvSummaryElem* dst) override {
    return cpu_summarize_kv_page(src, src_dtype, layout, dst);
  }

 private:
  struct PackedInfo {
    int64_t rows;
    int64_t cols;
    DType dtype;  // element type of the packed copy
  };

  static Status copy(void* dst, const void* src, size_t bytes, const char* what) {
    if (bytes == 0) return ok_status();
    if (dst == nullptr || src == nullptr)
      return invalid_argument(std::string(what) + ": null pointer");
    std::memmove(dst, src, bytes);
    return ok_status();
  }
  // True when `w` is a view returned by upload_matrix (packed layout).
  bool is_packed(const MatrixView& w) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = packed_.find(w.data);
    return it != packed_.end() && it->second.rows == w.rows && it->second.cols == w.cols &&
           it->second.dtype == w.dtype;
  }
  // Splits [0, n) into tasks of at least kMinElemsPerTask / work_per_item items.
  void parallel_items(int64_t n, int64_t work_per_item,
                      const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t grain =
        std::max<int64_t>(1, kMinElemsPerTask / std::max<int64_t>(1, work_per_item));
    if (n <= grain) {
      if (n > 0) fn(0, n);
      return;
    }
    pool_.parallel_range(n, grain, fn);
  }

  ThreadPool pool_;
  int device_ = 0;
  bool no_peer_access_ = false;
  // Fenced copies (BackendOptions::async_copies): batches in order on the copy thread.
  using CopyClock = std::chrono::steady_clock;
  struct FencedBatch {
    uint64_t fence = 0;
    std::vector<CopyRange> copies;
    CopyClock::time_point queued;
  };
  const bool async_copies_ = false;
  const std::chrono::microseconds copy_delay_{0};
  std::mutex copy_mu_;
  std::condition_variable copy_cv_;     // a batch queued or landed; stop
  std::deque<FencedBatch> copy_queue_;  // guarded by copy_mu_
  uint64_t queued_fence_ = 0;           // the last fence handed out; guarded
  uint64_t landed_fence_ = 0;           // every fence <= this has landed; guarded
  bool copy_stop_ = false;              // guarded
  std::thread copy_thread_;             // started by the first fenced batch
  mutable std::mutex mu_;
  std::unordered_map<const void*, PackedInfo> packed_;  // owned packed weights, freed with us
};

StatusOr<MatrixView> CpuBackend::upload_matrix(const void* host, DType dtype, int64_t rows,
                                               int64_t cols) {
  if (rows < 0 || cols < 0) {
    return invalid_argument("upload_matrix: negative shape [" + str(rows) + ", " + str(cols) + "]");
  }
  if (host == nullptr && rows * cols > 0)
    return invalid_argument("upload_matrix: null host pointer");
  // f32 stays f32; bf16/f16 stay 16-bit (gemm widens them exactly): half the decode bytes.
  const size_t bytes =
      static_cast<size_t>(std::max<int64_t>(1, cpu::packed_size(rows, cols))) * dtype_size(dtype);
  KVSPLIT_ASSIGN_OR_RETURN(void* dst, alloc(bytes));
  if (rows * cols > 0) cpu::pack_matrix(host, dtype, rows, cols, dst, dtype, &pool_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    packed_[dst] = PackedInfo{rows, cols, dtype};
  }
  return MatrixView{dst, dtype, rows, cols};
}

Status CpuBackend::embedding(const int32_t* ids, int num_tokens, const MatrixView& table,
                             float* out) {
  if (num_tokens < 0) return invalid_argument("embedding: negative num_tokens");
  if (num_tokens == 0) return ok_status();
  if (ids == nullptr || out == nullptr || table.data == nullptr) {
    return invalid_argument("embedding: null ids, table or out");
  }
  for (int t = 0; t < num_tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= table.rows) {
      return invalid_argument("embedding: token id " + str(ids[t]) + " at position " + str(t) +
                              " is outside the vocabulary [0, " + str(table.rows) + ")");
    }
  }
  const int64_t dim = table.cols;
  const bool packed = is_packed(table);
  for (int t = 0; t < num_tokens; ++t) {
    float* o = out + t * dim;
    if (packed) {
      cpu::unpack_row(table.data, table.dtype, table.rows, dim, ids[t], o);
    } else if (table.dtype == DType::kF32) {
      std::memcpy(o, static_cast<const float*>(table.data) + int64_t{ids[t]} * dim,
                  dim * sizeof(float));
    } else {
      const uint16_t* row = static_cast<const uint16_t*>(table.data) + int64_t{ids[t]} * dim;
      for (int64_t c = 0; c < dim; ++c) {
        o[c] = table.dtype == DType::kBF16 ? cpu::bf16_to_f32(row[c]) : cpu::f16_to_f32(row[c]);
      }
    }
  }
  return ok_status();
}

namespace {
// llama2.c rmsnorm: float sum of squares in order, ss/dim + eps, 1/sqrtf, out = w * (s * x).
void rmsnorm_row(const float* x, const float* w, int dim, float eps, float* out) {
  float ss = 0.f;
  for (int j = 0; j < dim; ++j) ss += x[j] * x[j];
  ss = ss / static_cast<float>(dim) + eps;
  const float s = 1.0f / sqrtf(ss);
  for (int j = 0; j < dim; ++j) out[j] = w[j] * (s * x[j]);
}

Status check_norm_args(const char* op, const void* x, const float* w, int num_tokens, int dim,
                       float eps, const float* out) {
  if (num_tokens < 0 || dim <= 0) {
    return invalid_argument(std::string(op) + ": need num_tokens >= 0 and dim > 0, got " +
                            str(num_tokens) + ", " + str(dim));
  }
  if (!(eps >= 0.f)) return invalid_argument(std::string(op) + ": eps must be >= 0");
  if (num_tokens > 0 && (x == nullptr || w == nullptr || out == nullptr)) {
    return invalid_argument(std::string(op) + ": null pointer");
  }
  return ok_status();
}
}  // namespace

Status CpuBackend::rmsnorm(const float* x, const float* weight, int num_tokens, int dim, float eps,
                           float* out) {
  KVSPLIT_RETURN_IF_ERROR(check_norm_args("rmsnorm", x, weight, num_tokens, dim, eps, out));
  parallel_items(num_tokens, dim, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) rmsnorm_row(x + t * dim, weight, dim, eps, out + t * dim);
  });
  return ok_status();
}

Status CpuBackend::add_rmsnorm(float* residual, const float* x, const float* weight, int num_tokens,
                               int dim, float eps, float* out) {
  KVSPLIT_RETURN_IF_ERROR(
      check_norm_args("add_rmsnorm", residual, weight, num_tokens, dim, eps, out));
  if (num_tokens > 0 && x == nullptr) return invalid_argument("add_rmsnorm: null x");
  parallel_items(num_tokens, dim, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* r = residual + t * dim;
      const float* xt = x + t * dim;
      for (int j = 0; j < dim; ++j) r[j] += xt[j];
      rmsnorm_row(r, weight, dim, eps, out + t * dim);
    }
  });
  return ok_status();
}

Status CpuBackend::gemm(const float* x, int m, const MatrixView& w, const float* bias, float* out,
                        bool accumulate) {
  if (m < 0 || w.rows < 0 || w.cols < 0) {
    return invalid_argument("gemm: negative shape m=" + str(m) + " W=[" + str(w.rows) + ", " +
                            str(w.cols) + "]");
  }
  if (m == 0 || w.rows == 0) return ok_status();
  if (out == nullptr || (w.cols > 0 && (x == nullptr || w.data == nullptr))) {
    return invalid_argument("gemm: null x, W or out");
  }
  cpu::GemmWeights gw;
  gw.n = w.rows;
  gw.k = w.cols;
  gw.dtype = w.dtype;
  if (is_packed(w)) {
    gw.packed = w.data;
  } else {
    gw.raw = w.data;
  }
  cpu::gemm(x, m, gw, bias, out, accumulate, pool_);
  return ok_status();
}

Status CpuBackend::rope(float* q, float* k, const int32_t* positions, int num_tokens, int num_heads,
                        int num_kv_heads, const RopeArgs& args) {
  if (num_tokens < 0 || num_heads < 0 || num_kv_heads < 0)
    return invalid_argument("rope: negative size");
  if (args.head_dim <= 0 || args.rotary_dim <= 0 || args.rotary_dim > args.head_dim ||
      args.rotary_dim % 2 != 0) {
    return invalid_argument(
        "rope: need 0 < rotary_dim <= head_dim and rotary_dim even, got rotary_dim=" +
        str(args.rotary_dim) + " head_dim=" + str(args.head_dim));
  }
  if (num_tokens == 0) return ok_status();
  if (positions == nullptr || args.inv_freq == nullptr)
    return invalid_argument("rope: null positions or inv_freq");
  if ((num_heads > 0 && q == nullptr) || (num_kv_heads > 0 && k == nullptr))
    return invalid_argument("rope: null q or k");
  if (!(std::isfinite(args.attention_factor) && args.attention_factor > 0.0f))
    return invalid_argument("rope: attention_factor " + std::to_string(args.attention_factor) +
                            " must be finite and > 0");
  const bool interleaved = args.style == RopeStyle::kInterleaved;
  const int half = args.rotary_dim / 2;
  const int hd = args.head_dim;
  parallel_items(num_tokens, int64_t{num_heads + num_kv_heads} * hd, [&](int64_t b, int64_t e) {
    std::vector<float> cs(2 * half);
    for (int64_t t = b; t < e; ++t) {
      // cos/sin once per (token, pair), shared by all heads.
      for (int i = 0; i < half; ++i) {
        kernels::rope_cos_sin(positions[t], args.inv_freq[i], args.attention_factor, &cs[2 * i],
                              &cs[2 * i + 1]);
      }
      auto rotate_heads = [&](float* base, int heads) {
        for (int h = 0; h < heads; ++h) {
          float* xh = base + (t * heads + h) * int64_t{hd};
          for (int i = 0; i < half; ++i) {
            int a, bb;
            kernels::rope_pair(interleaved, args.rotary_dim, i, &a, &bb);
            kernels::rope_apply(xh, a, bb, cs[2 * i], cs[2 * i + 1]);
          }
        }
      };
      if (num_heads > 0) rotate_heads(q, num_heads);
      if (num_kv_heads > 0) rotate_heads(k, num_kv_heads);
    }
  });
  return ok_status();
}

Status CpuBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  if (n < 0) return invalid_argument("swiglu: negative n");
  if (n == 0) return ok_status();
  if (gate == nullptr || up == nullptr || out == nullptr)
    return invalid_argument("swiglu: null pointer");
  parallel_items(n, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + expf(-g)) * up[i];
    }
  });
  return ok_status();
}

Status CpuBackend::merge_attention_states(const float* const* o, const float* const* lse,
                                          int num_parts, int64_t rows, int head_dim, float* out,
                                          float* lse_out) {
  if (num_parts < 1 || num_parts > kMaxMergeParts)
    return invalid_argument("merge_attention_states: num_parts " + str(num_parts) +
                            " outside [1, " + str(kMaxMergeParts) + "]");
  if (rows < 0 || head_dim <= 0)
    return invalid_argument("merge_attention_states: bad rows / head_dim");
  if (rows == 0) return ok_status();
  if (o == nullptr || lse == nullptr || out == nullptr)
    return invalid_argument("merge_attention_states: null pointer");
  for (int p = 0; p < num_parts; ++p)
    if (o[p] == nullptr || lse[p] == nullptr)
      return invalid_argument("merge_attention_states: null part " + str(p));
  parallel_items(rows, 2 * head_dim * num_parts, [&](int64_t b, int64_t e) {
    float w[kMaxMergeParts];
    for (int64_t r = b; r < e; ++r) {
      const float m = kernels::merge_weights(lse, num_parts, r, w);
      kernels::merge_row(o, w, num_parts, r, head_dim, 0, head_dim, out + r * head_dim);
      if (lse_out != nullptr) lse_out[r] = kernels::merged_lse(m, w, num_parts);
    }
  });
  return ok_status();
}

Status CpuBackend::kv_append(const LayerKv& kv, const float* k, const float* v,
                             const int32_t* slot_mapping, int num_tokens) {
  if (kv.dtype != DType::kF32) {
    return unimplemented("kv_append: the CPU backend stores f32 pages only, got " +
                         std::string(dtype_name(kv.dtype)));
  }
  if (num_tokens < 0) return invalid_argument("kv_append: negative num_tokens");
  if (num_tokens == 0) return ok_status();
  if (kv.data == nullptr || k == nullptr || v == nullptr || slot_mapping == nullptr) {
    return invalid_argument("kv_append: null pointer");
  }
  if (kv.num_blocks <= 0 || kv.num_kv_heads <= 0 || kv.block_size <= 0 || kv.head_dim <= 0) {
    return invalid_argument("kv_append: bad page layout");
  }
  const int64_t num_slots = int64_t{kv.num_blocks} * kv.block_size;
  for (int t = 0; t < num_tokens; ++t) {
    if (slot_mapping[t] >= num_slots) {
      return invalid_argument("kv_append: slot " + str(slot_mapping[t]) + " of token " + str(t) +
                              " is past the pool (" + str(num_slots) + " slots)");
    }
  }
  const kernels::PagedKvLayout layout{kv.num_kv_heads, kv.block_size, kv.head_dim};
  float* pages = static_cast<float*>(kv.data);
  const int64_t row = int64_t{kv.num_kv_heads} * kv.head_dim;
  const size_t head_bytes = kv.head_dim * sizeof(float);
  parallel_items(num_tokens, 2 * row, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int32_t slot = slot_mapping[t];
      if (slot < 0) continue;
      const int32_t block = slot / kv.block_size;
      const int off = slot % kv.block_size;
      for (int h = 0; h < kv.num_kv_heads; ++h) {
        std::memcpy(pages + layout.offset(block, 0, h, off), k + t * row + h * kv.head_dim,
                    head_bytes);
        std::memcpy(pages + layout.offset(block, 1, h, off), v + t * row + h * kv.head_dim,
                    head_bytes);
      }
    }
  });
  return ok_status();
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, int64_t spin_micros, int device,
                                          bool emulate_no_peer_access) {
  BackendOptions o;
  o.threads = threads;
  o.spin_micros = spin_micros;
  o.device = device;
  o.emulate_no_peer_access = emulate_no_peer_access;
  return make_cpu_backend(o);
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace kvsplit::backend
