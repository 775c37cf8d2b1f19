// The Backend contract (architecture.md §3): device memory, a stream, and the ops the forward pass
// needs. The forward pass in src/model/ calls only these. Every pointer argument named `*_dev`
// or documented as "device" points into memory returned by this backend's alloc(); for the CPU
// backend that is ordinary host memory.
//
// Dimension vocabulary: num_seqs, num_tokens, num_heads, num_kv_heads, head_dim, block_size,
// num_blocks, kv_len. Activations are f32 and row-major.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/dtype.h"
#include "backend/split_plan.h"
#include "kernels/common/kv_quant.h"
#include "kvsplit/status.h"

namespace kvsplit::backend {

enum class DeviceKind { kCpu, kCuda };

// A weight matrix on the backend's device, row-major [rows, cols] (rows = out_features,
// cols = in_features, as stored by llama2.c and HF). Non-owning.
struct MatrixView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

enum class RopeStyle : uint8_t {
  kInterleaved,  // llama2.c: rotate adjacent pairs (x[2i], x[2i+1])
  kHalf,         // HF rotate_half: pairs (x[i], x[i + rotary_dim/2])
};

struct RopeArgs {
  RopeStyle style = RopeStyle::kInterleaved;
  int head_dim = 0;
  int rotary_dim = 0;  // dims rotated from the start of each head (== head_dim for Llama)
  const float* inv_freq = nullptr;  // device [rotary_dim / 2], scaling already applied by the model
  // Multiplies cos and sin (HF `attention_scaling`): 1 except for YaRN. Finite and > 0.
  float attention_factor = 1.0f;
};

// One layer's paged KV memory. Layout [num_blocks, 2 (K, V), num_kv_heads, block_size, head_dim]
// (see kernels/common/paged_kv.h for the index math).
struct LayerKv {
  void* data = nullptr;  // device
  DType dtype = DType::kF32;
  int num_blocks = 0;
  int num_kv_heads = 0;
  int block_size = 0;
  int head_dim = 0;
};

// Sequences of one attention call. Queries of sequence s are rows
// [query_start[s], query_start[s+1]) of q; they sit at positions kv_len[s] - q_len .. kv_len[s]-1
// and attend causally to KV positions [0, their own position], or with a sliding window W > 0 to
// [max(0, position - W + 1), position] (kernels::window_first_key). All arrays are device memory.
struct AttentionArgs {
  const float* q = nullptr;  // [num_tokens, num_heads, head_dim]
  float* out = nullptr;      // [num_tokens, num_heads, head_dim]
  LayerKv kv;
  int num_seqs = 0;
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.f;                      // usually 1/sqrt(head_dim)
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* kv_lens = nullptr;       // [num_seqs] context length including this step's tokens
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] physical block ids
  int max_blocks_per_seq = 0;
  int max_query_len = 0;
  int max_kv_len = 0;
  // Sliding window (Mistral, Qwen2 sliding layers): each query attends its last `window` positions
  // (itself included). 0: full causal attention. A decode call's SplitPlan must be made for the
  // same window (it splits only the keys the query attends).
  int window = 0;

  // ---- Mixed-precision pages (semantic cut, kernels/common/kv_quant.h). ----
  // nullptr: every page is full precision in `kv` (the fast path). Otherwise page (s, i) is read at
  // precision page_precision[s, i] (a kernels::KvPrecision) and block_tables[s, i] is its id in
  // the arena of that precision: `kv` for kFull; int8_pages / int4_pages (each
  // [num_blocks, layout.bytes(p)] bytes of this layer, layout = {num_kv_heads, block_size,
  // head_dim}) for kInt8 / kInt4; ignored for kEvicted (skipped: the page contributes nothing).
  const uint8_t* page_precision = nullptr;  // [num_seqs, max_blocks_per_seq]
  const void* int8_pages = nullptr;
  int num_int8_blocks = 0;
  const void* int4_pages = nullptr;
  int num_int4_blocks = 0;

  // ---- Scoring side outputs (decode only) for sequences s with score_seqs[s] != 0. ----
  // With z_h(t) = scale * q_h . k_t over the resident tokens t < kv_len and m_h = max_t z_h(t):
  //   token_relevance[s, t] = max(token_relevance[s, t], max_h exp(z_h(t) - m_h)), resident t;
  //   page_bound[s, i] = max(page_bound[s, i],
  //       max_{h,p} exp(scale * sum_d max(q_hd * kmin_pgd, q_hd * kmax_pgd) - m_h))
  //   for pages i < ceil(kv_len / block_size) with summary_slots[s, i] >= 0 (any precision), kmin
  //   and kmax read from part p < summary_parts of summaries[summary_slots[s, i]] (g: the kv head
  //   of h). scale must be > 0.
  // A sequence with no resident token has m_h = -inf: its page bounds become +inf. Summaries come
  // from full-precision pages (summarize_kv_page), so the bound covers a page's original keys; a
  // quantized page's attended (dequantized) keys may exceed it by the quantization error.
  const uint8_t* score_seqs = nullptr;     // [num_seqs]; nullptr: no side outputs
  float* token_relevance = nullptr;        // [num_seqs, max_blocks_per_seq * block_size]
  const int32_t* summary_slots = nullptr;  // [num_seqs, max_blocks_per_seq], -1: no summary
  // f16 bits [num_summary_slots, summary_parts, 2 (min, max), num_kv_heads, head_dim]
  // (kv_quant.h "key summaries"); summary_parts >= 1 and divides block_size.
  const kernels::KvSummaryElem* summaries = nullptr;
  int num_summary_slots = 0;
  int summary_parts = 1;
  float* page_bound = nullptr;  // [num_seqs, max_blocks_per_seq]
  // The scoring of a sequence split over shards (spatial cut, kv-cuts.md §4), decode only; the
  // CPU and CUDA backends implement them (others return kUnimplemented). head_max non-null: the
  // call also writes m_h of every sequence, head_max[s, h] (-inf: no resident key). score_max
  // non-null: a scoring-only call: out and lse are not computed, and the side outputs use
  // m_h = score_max[s, h] (the maximum over the whole sequence, every shard's head_max merged)
  // instead of the call's own maximum, so relevance is normalized over the whole sequence.
  float* head_max = nullptr;         // [num_seqs, num_heads]
  const float* score_max = nullptr;  // [num_seqs, num_heads]

  // ---- Partial attention (spatial cut, kv-cuts.md §4). ----
  // Non-null: lse[t, h] = log sum_j exp(scale * q_th . k_j) over the keys query row t, head h
  // attends (resident keys, causal), or -inf when it attends none (its `out` row is then 0).
  // `out` stays normalized, so results over disjoint key sets merge exactly with
  // Backend::merge_attention_states.
  float* lse = nullptr;  // [num_tokens, num_heads]
};

// Per-row parameters of Backend::sample_tokens (host memory). Ranges as SamplingParams
// (temperature finite >= 0, top_p in (0, 1], min_p in [0, 1], top_k >= 0; 0 / 1 turn filters off).
struct SamplingRow {
  float temperature = 1.f;  // < 1e-5: greedy
  float top_p = 1.f;
  float min_p = 0.f;
  int32_t top_k = 0;
  uint64_t seed = 0;  // the request's seed
  uint64_t step = 0;  // the request's draw index (e.g. tokens generated so far)
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // e.g. "cpu (2 threads, avx512)"
  // Parallel execution units (threads on CPU, SMs on GPU); the split-K planner uses it.
  virtual int parallelism() const = 0;

  // ---- memory (bytes; device pointers) ----
  virtual StatusOr<void*> alloc(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  virtual Status copy_h2d(void* dst_dev, const void* src_host, size_t bytes) = 0;
  virtual Status copy_d2h(void* dst_host, const void* src_dev, size_t bytes) = 0;
  virtual Status copy_d2d(void* dst_dev, const void* src_dev, size_t bytes) = 0;
  virtual Status memset_zero(void* dst_dev, size_t bytes) = 0;
  // Waits for all work queued on the backend's stream.
  virtual Status synchronize() = 0;

  // ---- host memory (the KV host tier) ----
  // Host memory for device<->host copies: page-locked on CUDA (cudaHostAlloc, portable to every
  // device), so the copies run at the link's bandwidth and may be asynchronous; 4 KiB-aligned
  // ordinary memory elsewhere (this default). Not zeroed. Free it with free_host.
  virtual StatusOr<void*> alloc_host(size_t bytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    if (rounded < bytes) return resource_exhausted("alloc_host: size overflow");
    void* p = std::aligned_alloc(4096, rounded);
    if (!p) return resource_exhausted("alloc_host of " + std::to_string(bytes) + " bytes failed");
    return p;
  }
  virtual void free_host(void* ptr) { std::free(ptr); }
  // True when alloc_host returns page-locked memory.
  virtual bool host_memory_pinned() const { return false; }
  // Copies between device memory and host memory from alloc_host, queued on the backend's stream:
  // the host side must not be read (d2h) or reused (h2d) before synchronize(). The default copies
  // at once (the CPU backend's copies are synchronous anyway).
  virtual Status copy_d2h_async(void* dst_host, const void* src_dev, size_t bytes) {
    return copy_d2h(dst_host, src_dev, bytes);
  }
  virtual Status copy_h2d_async(void* dst_dev, const void* src_host, size_t bytes) {
    return copy_h2d(dst_dev, src_host, bytes);
  }
  // Many such copies in one direction, queued as one batch (cudaMemcpyBatchAsync on CUDA: one
  // call instead of one per page and layer, whose fixed cost would otherwise cap the link far
  // below its bandwidth for pages of a few KB). Copies within a batch must not overlap. The same
  // rule as above: the host side is done only after synchronize().
  enum class CopyDir : uint8_t { kDeviceToHost, kHostToDevice };
  struct CopyRange {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  // How a batch moves, where a backend has more than one way (CUDA: a copy kernel whose threads
  // read and write the pinned host tier directly, kernels/kv_pages/copy_pieces.h, or the copy
  // engines, one cudaMemcpyBatchAsync transfer per range). kAuto: the backend's choice (CUDA: the
  // kernel when every range of the batch allows it, else the copy engines). kKernel: the kernel
  // only; a batch it cannot take (a range not 16-byte aligned, host memory not from alloc_host)
  // is kInvalidArgument. kDma: the copy engines only. A backend with one way (the CPU backend's
  // memcpy) accepts every method and copies as before. For same-run A/B measurements
  // (bench_temporal --swap-bandwidth) and as the escape hatch should one way misbehave.
  enum class BatchCopyMethod : uint8_t { kAuto, kKernel, kDma };
  virtual void set_batch_copy_method(BatchCopyMethod method) { (void)method; }
  virtual Status copy_batch_async(CopyDir dir, const CopyRange* copies, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const CopyRange& c = copies[i];
      Status st = dir == CopyDir::kDeviceToHost ? copy_d2h_async(c.dst, c.src, c.bytes)
                                                : copy_h2d_async(c.dst, c.src, c.bytes);
      if (!st.ok()) return st;
    }
    return ok_status();
  }

  // ---- fenced copies (asynchronous restores) ----
  // A batch like copy_batch_async, queued where it can run beside the backend's compute (a
  // second stream on CUDA, ordered after the work already queued on the compute stream; the copy
  // thread of a CPU backend created with BackendOptions::async_copies), and a fence that says
  // when it has landed. 0: the copies are already done (this default copies and synchronizes).
  // synchronize() does not wait for fenced copies. Until wait_fence says done, the destination
  // must not be read and neither side reused or freed; a fence not yet reported done must be
  // waited for (wait_fence with a timeout < 0) before the backend is destroyed.
  virtual StatusOr<uint64_t> copy_batch_fenced(CopyDir dir, const CopyRange* copies, size_t n) {
    KVSPLIT_RETURN_IF_ERROR(copy_batch_async(dir, copies, n));
    KVSPLIT_RETURN_IF_ERROR(synchronize());
    return uint64_t{0};
  }
  // Waits at most `timeout_us` microseconds (0: polls; < 0: until it lands) for `fence`: true
  // when its copies have landed and are visible to work queued from now on, false on timeout. A
  // fence reported done once is forgotten: later calls with it return true. A failed copy is
  // its error.
  virtual StatusOr<bool> wait_fence(uint64_t fence, int64_t timeout_us) {
    (void)fence;
    (void)timeout_us;
    return true;
  }

  // ---- timing on the device's clock ----
  // mark_time(): a point on the backend's stream after the work queued so far (CUDA: an event
  // recorded with timing), as a handle for seconds_between. seconds_between(from, to): waits
  // until `to` is reached, then the time from `from` to `to`, in seconds: the device time of the
  // work queued between them, with no host round trip in it, so spans can be measured without
  // synchronizing the stream inside them. Handles stay valid until release_time_marks() (no wait;
  // marks not yet reached may be released). This default reads the host clock at the call, which
  // is exact for a backend whose calls finish their work before returning (the CPU backend's).
  // A backend is driven by one thread at a time, its marks too; release_time_marks releases all
  // of them, so one user at a time times with a backend (the spatial cut's ShardedAttention).
  virtual StatusOr<int> mark_time() {
    host_marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(host_marks_.size()) - 1;
  }
  virtual StatusOr<double> seconds_between(int from, int to) {
    const int n = static_cast<int>(host_marks_.size());
    if (from < 0 || to < 0 || from >= n || to >= n)
      return invalid_argument("seconds_between: unknown time mark");
    return std::chrono::duration<double>(host_marks_[to] - host_marks_[from]).count();
  }
  virtual void release_time_marks() { host_marks_.clear(); }

  // ---- device ----
  // The device this backend runs on: the CUDA device index, or the CPU backend's virtual device
  // id (BackendOptions::device; every CPU backend shares host memory).
  virtual int device() const = 0;
  // Makes the calling thread use this backend's device (cudaSetDevice). A worker calls it once on
  // its own thread before its first step.
  virtual Status bind_thread() { return ok_status(); }
  // Whether copy_from(src) may read `src`'s memory directly: same device, or a CUDA peer device
  // with peer access (enabled by this call where the driver allows it). Not const: may enable it.
  virtual bool can_read_from(const Backend& src) = 0;
  // Copies `bytes` of `src`'s memory into this backend's memory on this backend's stream, directly
  // (requires can_read_from(src)): a device copy, or cudaMemcpyPeerAsync between devices.
  virtual Status copy_from(void* dst_dev, const Backend& src, const void* src_dev,
                           size_t bytes) = 0;
  // Reads `bytes` of this backend's device memory into host memory for a caller on another
  // worker's thread (the staged KV handoff: the destination reads the source's pages): ordered
  // after the work queued so far, returned when done, and touching no state the owning thread
  // uses (the CUDA backend's index-error flag is left for its owner's next synchronize).
  virtual Status read_for_peer(void* dst_host, const void* src_dev, size_t bytes) {
    KVSPLIT_RETURN_IF_ERROR(copy_d2h(dst_host, src_dev, bytes));
    return synchronize();
  }

  // Makes a weight usable by gemm/embedding on this device. `host` may point into a memory-mapped
  // file that outlives the backend; the CPU backend returns views of f32 data without copying.
  virtual StatusOr<MatrixView> upload_matrix(const void* host, DType dtype, int64_t rows,
                                             int64_t cols) = 0;

  // ---- ops (all activations f32, device memory) ----
  // out[t, :] = table[ids[t], :]; ids outside [0, table.rows) -> kInvalidArgument.
  virtual Status embedding(const int32_t* ids, int num_tokens, const MatrixView& table,
                           float* out) = 0;
  // out[t] = x[t] / rms(x[t]) * weight; x, out [num_tokens, dim]; weight [dim] f32.
  virtual Status rmsnorm(const float* x, const float* weight, int num_tokens, int dim, float eps,
                         float* out) = 0;
  // residual += x; out = rmsnorm(residual). Fused to save a pass over memory.
  virtual Status add_rmsnorm(float* residual, const float* x, const float* weight, int num_tokens,
                             int dim, float eps, float* out) = 0;
  // out[m, w.rows] (= or +=) x[m, w.cols] * w^T (+ bias[w.rows]). The summation order of every
  // output element is independent of m (batch invariance).
  virtual Status gemm(const float* x, int m, const MatrixView& w, const float* bias, float* out,
                      bool accumulate) = 0;
  // In-place rotary embedding of q [num_tokens, num_heads, head_dim] and
  // k [num_tokens, num_kv_heads, head_dim] at positions[num_tokens].
  virtual Status rope(float* q, float* k, const int32_t* positions, int num_tokens, int num_heads,
                      int num_kv_heads, const RopeArgs& args) = 0;
  // out[i] = silu(gate[i]) * up[i], n elements.
  virtual Status swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // Scatters k, v [num_tokens, num_kv_heads, head_dim] into the pages at slot_mapping[t]
  // (= block_id * block_size + offset); a negative slot skips the token.
  virtual Status kv_append(const LayerKv& kv, const float* k, const float* v,
                           const int32_t* slot_mapping, int num_tokens) = 0;
  // Causal attention for prefill (or chunked-prefill) sequences, reading all KV from pages.
  virtual Status attention_prefill(const AttentionArgs& args) = 0;
  // Decode attention (one query per sequence) over pages, split along kv_len per `plan`
  // (FlashDecoding); partial (o, m, l) states are merged with kernels/common/softmax_state.h.
  virtual Status attention_decode(const AttentionArgs& args, const backend::SplitPlan& plan) = 0;

  // ---- quantized KV pages (semantic cut; layouts and math in kernels/common/kv_quant.h) ----
  // src: one full-precision page of one layer, [2, num_kv_heads, block_size, head_dim] of
  // src_dtype (the bytes of LayerKv page `block`), every slot written; dst: layout.bytes(to)
  // bytes. to is kInt8 or kInt4. Both device memory.
  virtual Status quantize_kv_page(const void* src, DType src_dtype,
                                  const kernels::QuantPageLayout& layout, kernels::KvPrecision to,
                                  void* dst) {
    (void)src, (void)src_dtype, (void)layout, (void)to, (void)dst;
    return unimplemented("backend " + name() + ": quantize_kv_page is not implemented");
  }
  // Inverse of quantize_kv_page: writes a full-precision page of dst_dtype from src
  // (layout.bytes(from) bytes, from kInt8 or kInt4).
  virtual Status dequantize_kv_page(const void* src, kernels::KvPrecision from,
                                    const kernels::QuantPageLayout& layout, void* dst,
                                    DType dst_dtype) {
    (void)src, (void)from, (void)layout, (void)dst, (void)dst_dtype;
    return unimplemented("backend " + name() + ": dequantize_kv_page is not implemented");
  }
  // Per-channel min and max of the keys of each of the page's layout.summary_parts parts: dst f16
  // bits [summary_parts, 2 (min, max), num_kv_heads, head_dim], the min rounded down and the max
  // up (kv_quant.h "key summaries"). src as quantize_kv_page.
  virtual Status summarize_kv_page(const void* src, DType src_dtype,
                                   const kernels::QuantPageLayout& layout,
                                   kernels::KvSummaryElem* dst) {
    (void)src, (void)src_dtype, (void)layout, (void)dst;
    return unimplemented("backend " + name() + ": summarize_kv_page is not implemented");
  }

  // ---- spatial cut: merge of partial attention over disjoint key sets ----
  // For each row r in [0, rows) (one query token and head) and parts p in [0, num_parts):
  // with M = max_p lse[p][r] and w_p = exp(lse[p][r] - M):
  //   out[r, :] = sum_p w_p * o[p][r, :] / sum_p w_p   (0 when every lse[p][r] is -inf),
  //   lse_out[r] = M + log(sum_p w_p)                   (-inf then; lse_out may be null).
  // o[p]: [rows, head_dim] f32, lse[p]: [rows] f32, all device memory of this backend; the arrays
  // of pointers are host memory. 1 <= num_parts <= kMaxMergeParts. `out` may alias no input.
  static constexpr int kMaxMergeParts = 16;
  virtual Status merge_attention_states(const float* const* o, const float* const* lse,
                                        int num_parts, int64_t rows, int head_dim, float* out,
                                        float* lse_out) {
    (void)o, (void)lse, (void)num_parts, (void)rows, (void)head_dim, (void)out, (void)lse_out;
    return unimplemented("backend " + name() + ": merge_attention_states is not implemented");
  }

  // Optional op: ids[r] = a token sampled from logits[r, 0..vocab) with rows[r] (temperature,
  // min-p, top-k, top-p, then one Philox4x32-10 draw at counter (seed, step); semantics in
  // kernels/sampling/sampling.h). logits: device [num_rows, vocab] f32; rows: host [num_rows];
  // ids: device [num_rows] int32. Deterministic per (logits row, seed, step), whatever else is in
  // the batch. Penalties are not applied. The default is kUnimplemented: the CPU backend samples
  // on the host through src/sampling (a different RNG: xorshift64*, as llama2.c).
  // True when sample_tokens is implemented (the model then picks greedy tokens on the device and
  // copies back 4 bytes per row instead of a vocab-sized logits row).
  virtual bool has_sample_tokens() const { return false; }
  // Whether attention runs for a model with this head_dim and GQA group (query heads per KV
  // head); kUnimplemented naming what is not compiled. LlamaModel::create asks, so a model the
  // kernels cannot run is refused when it is loaded. The default (the CPU backend): every shape.
  virtual Status check_model_attention(int head_dim, int gqa_group) const {
    (void)head_dim, (void)gqa_group;
    return ok_status();
  }
  virtual Status sample_tokens(const float* logits, int num_rows, int vocab,
                               const SamplingRow* rows, int32_t* ids) {
    (void)logits, (void)num_rows, (void)vocab, (void)rows, (void)ids;
    return unimplemented("backend " + name() +
                         ": sample_tokens is not implemented (sample on the host)");
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> host_marks_;  // the default mark_time's
};

// Options of create_backend(). Fields a backend does not use are ignored unless noted.
struct BackendOptions {
  int threads = 0;  // CPU backend threads; <= 0: the number of hardware threads
  int device = 0;   // CUDA device index; the CPU backend's virtual device id (a name only)
  // CPU backend: refuse direct reads from other CPU backends (can_read_from false), so that the
  // staged KV copy (the route of GPUs without peer access) runs on CPU machines too.
  bool emulate_no_peer_access = false;
  // Storage type of weights given to upload_matrix(); unset: the backend's default (CUDA: bf16).
  // The CPU backend accepts only kF32, which changes nothing there (f32 weights stay f32 and
  // 16-bit weights of the file stay 16-bit); kBF16 / kF16 are kInvalidArgument for it.
  std::optional<DType> weight_dtype;
  // CPU backend: how long idle pool threads poll for the next op before sleeping (microseconds);
  // < 0: ThreadPool::kDefaultSpinMicros, 0: never poll (every op wakes sleeping threads).
  int64_t spin_micros = -1;
  // CPU backend: copy_batch_fenced runs on a copy thread beside the compute threads (the CUDA
  // backend's second stream), so restores are asynchronous as on a GPU. Off: fenced copies are
  // synchronous (fence 0), and results never depend on timing.
  bool async_copies = false;
  // CPU backend with async_copies, for tests: each fenced batch starts this many microseconds
  // after it was queued (a slow link), so a bounded wait can be seen to expire.
  int64_t fenced_copy_delay_us = 0;
};

// Creates the backend named `name` ("cpu", or "cuda" when built with CUDA). `threads` <= 0 picks
// the number of hardware threads. An unknown or unavailable backend is kInvalidArgument /
// kUnavailable with a clear message, never a silent fallback.
StatusOr<std::unique_ptr<Backend>> create_backend(std::string_view name, int threads = 0);
StatusOr<std::unique_ptr<Backend>> create_backend(std::string_view name,
                                                  const BackendOptions& options);
// Devices a backend named `name` can use: CUDA's visible devices (0 without a driver or device),
// 1 for "cpu", 0 for an unknown name.
int visible_devices(std::string_view name);

// Owns one allocation on a backend; frees it on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* backend, void* ptr, size_t bytes)
      : backend_(backend), ptr_(ptr), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.backend_ = nullptr;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  static StatusOr<DeviceBuffer> make(Backend& backend, size_t bytes) {
    KVSPLIT_ASSIGN_OR_RETURN(void* p, backend.alloc(bytes));
    return DeviceBuffer(&backend, p, bytes);
  }
  void reset() {
    if (backend_ && ptr_) backend_->free(ptr_);
    backend_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kvsplit::backend
