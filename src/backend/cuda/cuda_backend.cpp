// CudaBackend (see cuda_backend.h).
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernel_args.h"
#include "common/log.h"
#include "kernels/attention/merge_partials.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/common/float_bits.h"
#include "kernels/kv_pages/copy_pieces.h"
#include "kernels/kv_pages/kv_page_ops.h"
#include "kernels/ops/ops.h"
#include "kernels/sampling/sampling.h"

namespace kvsplit::backend::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : (t == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF);
}

float element_as_float(const void* data, DType t, int64_t i) {
  uint16_t b;
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      std::memcpy(&b, static_cast<const uint16_t*>(data) + i, 2);
      return kernels::half_bits_to_float(b);
    case DType::kBF16:
      std::memcpy(&b, static_cast<const uint16_t*>(data) + i, 2);
      return kernels::bf16_bits_to_float(b);
  }
  return 0.f;
}

Status check_attention_shape(const AttentionArgs& a) {
  if (a.kv.num_kv_heads != a.num_kv_heads || a.kv.head_dim != a.head_dim)
    return invalid_argument(
        "cuda attention: LayerKv shape does not match the call (kv heads " +
        std::to_string(a.kv.num_kv_heads) + " vs " + std::to_string(a.num_kv_heads) +
        ", head_dim " + std::to_string(a.kv.head_dim) + " vs " + std::to_string(a.head_dim) + ")");
  return ok_status();
}

// Pinned host allocations (alloc_host) of every CudaBackend of the process that are mapped into
// the devices' address space at their host address (unified addressing): the only host memory the
// copy kernel may touch. Process-wide, as the memory is portable: a shard group's backends copy
// into the home pool's host tier.
class MappedHostRanges {
 public:
  void add(const void* p, size_t bytes) {
    const std::lock_guard<std::mutex> lock(mu_);
    ranges_[reinterpret_cast<uintptr_t>(p)] = bytes;
  }
  void remove(const void* p) {
    const std::lock_guard<std::mutex> lock(mu_);
    ranges_.erase(reinterpret_cast<uintptr_t>(p));
  }
  // Every range's host side (dst for d2h, src for h2d) lies inside one registered allocation.
  bool contains_host_sides(Backend::CopyDir dir, const Backend::CopyRange* copies, size_t n) const {
    const std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; ++i) {
      const Backend::CopyRange& c = copies[i];
      if (c.bytes == 0) continue;
      const auto a =
          reinterpret_cast<uintptr_t>(dir == Backend::CopyDir::kDeviceToHost ? c.dst : c.src);
      auto it = ranges_.upper_bound(a);
      if (it == ranges_.begin()) return false;
      --it;
      if (a - it->first > it->second || c.bytes > it->second - (a - it->first)) return false;
    }
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> ranges_;  // start -> bytes
};

MappedHostRanges& mapped_host_ranges() {
  static MappedHostRanges* r = new MappedHostRanges();  // never destroyed (static order)
  return *r;
}

// Thread blocks of one copy-kernel launch: 32 blocks keep 1 MiB of loads in flight, far more
// than the link's bandwidth-delay product (55 GB/s x ~2 us), and leave the rest of the device to
// the work that runs beside a fenced copy.
constexpr int kCopyKernelBlocks = 32;

}  // namespace

StatusOr<std::unique_ptr<Backend>> CudaBackend::create(int device,
                                                       const CudaBackendOptions& options) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return unavailable(std::string("backend 'cuda': no usable CUDA device (") +
                       (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + ")");
  }
  if (device < 0 || device >= count)
    return invalid_argument("backend 'cuda': device " + std::to_string(device) + " outside [0, " +
                            std::to_string(count) + ")");
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->device_ = device;
  b->options_ = options;
  const DeviceScope on_device(device);  // the caller's thread keeps its own device afterwards
  KVSPLIT_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  KVSPLIT_CUDA_RETURN(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  b->num_sms_ = prop.multiProcessorCount;
  b->name_ = "cuda (" + std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) +
             " SMs, sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", weights " +
             std::string(dtype_name(options.weight_dtype)) + ")";
  KVSPLIT_CUDA_RETURN(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking),
                      "cudaStreamCreate");
  KVSPLIT_CUDA_RETURN(cudaEventCreateWithFlags(&b->staging_done_, cudaEventDisableTiming),
                      "cudaEventCreate");
  KVSPLIT_CUDA_RETURN(cudaStreamCreateWithFlags(&b->copy_stream_, cudaStreamNonBlocking),
                      "cudaStreamCreate(copy)");
  KVSPLIT_CUDA_RETURN(cudaEventCreateWithFlags(&b->compute_mark_, cudaEventDisableTiming),
                      "cudaEventCreate");
  KVSPLIT_CUBLAS_RETURN(cublasCreate(&b->cublas_), "cublasCreate");
  KVSPLIT_CUBLAS_RETURN(cublasSetStream(b->cublas_, b->stream_), "cublasSetStream");
  void* flag = nullptr;
  KVSPLIT_CUDA_RETURN(cudaMalloc(&flag, sizeof(int)), "cudaMalloc(error flag)");
  b->error_flag_ = static_cast<int*>(flag);
  KVSPLIT_CUDA_RETURN(cudaMemsetAsync(b->error_flag_, 0, sizeof(int), b->stream_), "cudaMemset");
  KVSPLIT_LOG_INFO("created backend {}", b->name_);
  return std::unique_ptr<Backend>(std::move(b));
}

CudaBackend::~CudaBackend() {
  const DeviceScope on_device(device_);
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [fence, ev] : fences_) cudaEventDestroy(ev);
  for (cudaEvent_t ev : spare_events_) cudaEventDestroy(ev);
  for (cudaEvent_t ev : time_marks_) cudaEventDestroy(ev);
  if (compute_mark_) cudaEventDestroy(compute_mark_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  for (void* w : weights_) cudaFree(w);
  for (void* p :
       {act16_, plan_dev_, partials_, score_max_, sample_rows_, static_cast<void*>(error_flag_)})
    if (p) cudaFree(p);
  if (pinned_) cudaFreeHost(pinned_);
  if (cublas_) cublasDestroy(cublas_);
  if (staging_done_) cudaEventDestroy(staging_done_);
  if (stream_) cudaStreamDestroy(stream_);
}

StatusOr<void*> CudaBackend::alloc(size_t bytes) {
  const DeviceScope on_device(device_);
  void* p = nullptr;
  KVSPLIT_CUDA_RETURN(cudaMallocAsync(&p, bytes ? bytes : 1, stream_), "cudaMallocAsync");
  return p;
}

void CudaBackend::free(void* ptr) {
  const DeviceScope on_device(device_);
  if (ptr) cudaFreeAsync(ptr, stream_);
}

Status CudaBackend::copy_h2d(void* dst, const void* src, size_t bytes) {
  const DeviceScope on_device(device_);
  if (bytes == 0) return ok_status();
  KVSPLIT_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                      "copy_h2d");
  // The caller may reuse `src` right away (pageable memory): wait for the copy.
  KVSPLIT_CUDA_RETURN(cudaStreamSynchronize(stream_), "copy_h2d sync");
  return ok_status();
}

Status CudaBackend::copy_d2h(void* dst, const void* src, size_t bytes) {
  const DeviceScope on_device(device_);
  // The owner's read: read_for_peer's ordered copy, then this thread's error flag.
  KVSPLIT_RETURN_IF_ERROR(read_for_peer(dst, src, bytes));
  return check_error_flag();
}

Status CudaBackend::enqueue_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                 const char* what) {
  return enqueue_copy(dst, src, bytes, kind, what, stream_);
}

Status CudaBackend::enqueue_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                 const char* what, cudaStream_t stream) {
  if (bytes == 0) return ok_status();
  KVSPLIT_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, kind, stream), what);
  return ok_status();
}

Status CudaBackend::copy_d2d(void* dst, const void* src, size_t bytes) {
  const DeviceScope on_device(device_);
  return enqueue_copy(dst, src, bytes, cudaMemcpyDeviceToDevice, "copy_d2d");
}

Status CudaBackend::memset_zero(void* dst, size_t bytes) {
  const DeviceScope on_device(device_);
  if (bytes == 0) return ok_status();
  KVSPLIT_CUDA_RETURN(cudaMemsetAsync(dst, 0, bytes, stream_), "memset");
  return ok_status();
}

Status CudaBackend::synchronize() {
  const DeviceScope on_device(device_);
  KVSPLIT_CUDA_RETURN(cudaStreamSynchronize(stream_), "synchronize");
  return check_error_flag();
}

StatusOr<void*> CudaBackend::alloc_host(size_t bytes) {
  const DeviceScope on_device(device_);
  void* p = nullptr;
  // Portable: every device's copies see it as pinned (a shard group's pages share the home
  // pool's host tier).
  // Mapped: the copy kernel reads and writes it in place (copy_batch_*). Where mapping is refused
  // (a platform without it), the memory is still pinned and only the copy engines move it.
  const size_t n = bytes ? bytes : 1;
  if (cudaHostAlloc(&p, n, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess) {
    (void)cudaGetLastError();
    p = nullptr;
    KVSPLIT_CUDA_RETURN(cudaHostAlloc(&p, n, cudaHostAllocPortable), "cudaHostAlloc(host tier)");
    return p;
  }
  // Under unified addressing the device address is the host address; only then may the kernel
  // take the host pointers it is given as they are.
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, p, 0) == cudaSuccess && dev == p)
    mapped_host_ranges().add(p, n);
  else
    (void)cudaGetLastError();
  return p;
}

void CudaBackend::free_host(void* ptr) {
  const DeviceScope on_device(device_);
  if (!ptr) return;
  mapped_host_ranges().remove(ptr);
  cudaFreeHost(ptr);
}

// `dst` / `src` is pinned (alloc_host): the copy is truly asynchronous; synchronize() completes it
// and checks the kernels' error flag, as copy_d2h does.
Status CudaBackend::copy_d2h_async(void* dst, const void* src, size_t bytes) {
  const DeviceScope on_device(device_);
  return enqueue_copy(dst, src, bytes, cudaMemcpyDeviceToHost, "copy_d2h_async");
}

Status CudaBackend::copy_h2d_async(void* dst, const void* src, size_t bytes) {
  const DeviceScope on_device(device_);
  return enqueue_copy(dst, src, bytes, cudaMemcpyHostToDevice, "copy_h2d_async");
}

Status CudaBackend::copy_batch_async(CopyDir dir, const CopyRange* copies, size_t n) {
  const DeviceScope on_device(device_);
  return enqueue_batch(dir, copies, n, stream_);
}

StatusOr<uint64_t> CudaBackend::copy_batch_fenced(CopyDir dir, const CopyRange* copies, size_t n) {
  const DeviceScope on_device(device_);
  // After the compute stream's work so far: the destination block may have been read or written
  // by kernels queued before it was freed, and a d2h source is written by them.
  KVSPLIT_CUDA_RETURN(cudaEventRecord(compute_mark_, stream_), "cudaEventRecord");
  KVSPLIT_CUDA_RETURN(cudaStreamWaitEvent(copy_stream_, compute_mark_, 0), "cudaStreamWaitEvent");
  KVSPLIT_RETURN_IF_ERROR(enqueue_batch(dir, copies, n, copy_stream_));
  cudaEvent_t ev = nullptr;
  if (!spare_events_.empty()) {
    ev = spare_events_.back();
    spare_events_.pop_back();
  } else {
    KVSPLIT_CUDA_RETURN(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  }
  const cudaError_t e = cudaEventRecord(ev, copy_stream_);
  if (e != cudaSuccess) {
    // The copies were queued: let them land before the caller frees or reuses their blocks.
    // The event is not reused (its state after a failed record is not to be trusted).
    (void)cudaStreamSynchronize(copy_stream_);
    (void)cudaEventDestroy(ev);
    KVSPLIT_CUDA_RETURN(e, "cudaEventRecord(fence)");
  }
  const uint64_t fence = ++next_fence_;
  fences_.emplace(fence, ev);
  return fence;
}

StatusOr<bool> CudaBackend::wait_fence(uint64_t fence, int64_t timeout_us) {
  const DeviceScope on_device(device_);
  auto it = fences_.find(fence);
  if (fence == 0 || it == fences_.end()) {
    if (fence > next_fence_)
      return invalid_argument("wait_fence: unknown fence " + std::to_string(fence));
    return true;  // landed and reported before
  }
  cudaEvent_t ev = it->second;
  cudaError_t e = cudaSuccess;
  if (timeout_us < 0) {
    e = cudaEventSynchronize(ev);
  } else {
    // Polled: a blocking event wait cannot time out. The poll interval stays far below the
    // step times the bound is set against (a ms or more).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(timeout_us);
    while ((e = cudaEventQuery(ev)) == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is no error: leave nothing for the next check
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  fences_.erase(it);
  spare_events_.push_back(ev);
  KVSPLIT_CUDA_RETURN(e, "fenced copy");
  return true;
}

bool CudaBackend::kernel_can_copy(CopyDir dir, const CopyRange* copies, size_t n) const {
  for (size_t i = 0; i < n; ++i)
    if (!kernels::copy_piece_supported({copies[i].dst, copies[i].src, copies[i].bytes}))
      return false;
  return mapped_host_ranges().contains_host_sides(dir, copies, n);
}

StatusOr<int> CudaBackend::mark_time() {
  const DeviceScope on_device(device_);
  if (time_marks_used_ == time_marks_.size()) {
    cudaEvent_t ev = nullptr;
    KVSPLIT_CUDA_RETURN(cudaEventCreate(&ev), "cudaEventCreate(time mark)");
    time_marks_.push_back(ev);
  }
  KVSPLIT_CUDA_RETURN(cudaEventRecord(time_marks_[time_marks_used_], stream_),
                      "cudaEventRecord(time mark)");
  return static_cast<int>(time_marks_used_++);
}

StatusOr<double> CudaBackend::seconds_between(int from, int to) {
  const DeviceScope on_device(device_);
  const auto n = static_cast<int>(time_marks_used_);
  if (from < 0 || to < 0 || from >= n || to >= n)
    return invalid_argument("seconds_between: unknown time mark");
  KVSPLIT_CUDA_RETURN(cudaEventSynchronize(time_marks_[to]), "time mark wait");
  KVSPLIT_CUDA_RETURN(cudaEventSynchronize(time_marks_[from]), "time mark wait");
  float ms = 0.f;
  KVSPLIT_CUDA_RETURN(cudaEventElapsedTime(&ms, time_marks_[from], time_marks_[to]),
                      "cudaEventElapsedTime");
  return 1e-3 * static_cast<double>(ms);
}

Status CudaBackend::enqueue_batch(CopyDir dir, const CopyRange* copies, size_t n,
                                  cudaStream_t stream) {
  if (n == 0) return ok_status();
  if (copy_method_ != BatchCopyMethod::kDma) {
    if (kernel_can_copy(dir, copies, n)) {
      std::vector<kernels::CopyPiece> pieces(n);
      for (size_t i = 0; i < n; ++i) pieces[i] = {copies[i].dst, copies[i].src, copies[i].bytes};
      return kernels::launch_copy_pieces(pieces.data(), n, kCopyKernelBlocks, stream);
    }
    if (copy_method_ == BatchCopyMethod::kKernel)
      return invalid_argument(
          "copy batch: the copy kernel cannot take this batch (a range not 16-byte aligned, or "
          "host memory not from alloc_host) and the method is kernel-only");
  }
#if CUDART_VERSION >= 12080
  if (batch_copies_) {
    std::vector<void*> dsts(n);
    std::vector<const void*> srcs(n);
    std::vector<size_t> sizes(n);
    for (size_t i = 0; i < n; ++i) {
      dsts[i] = copies[i].dst;
      srcs[i] = copies[i].src;
      sizes[i] = copies[i].bytes;
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // after the kernels queued before it
    size_t first = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t e =
        cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, &attr, &first, 1, stream);
#else  // CUDA 12.8-12.9: the same call with a failed-copy index
    size_t failed = 0;
    const cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, &attr,
                                               &first, 1, &failed, stream);
#endif
    if (e == cudaSuccess) {
      batch_accepted_ = true;
      batch_not_supported_run_ = 0;
      return ok_status();
    }
    (void)cudaGetLastError();
    batch_not_supported_run_ = e == cudaErrorNotSupported ? batch_not_supported_run_ + 1 : 0;
    if (batch_copy_api_missing(e) ||
        batch_copy_unsupported_here(e, batch_not_supported_run_, batch_accepted_)) {
      // A driver older than the runtime's batch API, or a platform that refuses every batch:
      // copy one by one from now on.
      batch_copies_ = false;
      KVSPLIT_LOG_WARN(
          "{}: cudaMemcpyBatchAsync is not available ({}: {}); batches of copies that the copy "
          "kernel cannot take now go as one cudaMemcpyAsync per piece",
          name_, cudaGetErrorName(e), cudaGetErrorString(e));
    } else if (!batch_refusal_logged_) {
      // The batch itself was refused (the driver may refuse pageable host memory under stream
      // order): its pieces go one by one below, where a really bad pointer fails with its own
      // error. Logged once, not turned off: other batches may be accepted.
      batch_refusal_logged_ = true;
      KVSPLIT_LOG_WARN(
          "{}: cudaMemcpyBatchAsync refused a batch of {} copies ({}: {}); it and any such "
          "batch later go as one cudaMemcpyAsync per piece",
          name_, n, cudaGetErrorName(e), cudaGetErrorString(e));
    }
  }
#endif
  const cudaMemcpyKind kind =
      dir == CopyDir::kDeviceToHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (size_t i = 0; i < n; ++i)
    KVSPLIT_RETURN_IF_ERROR(enqueue_copy(copies[i].dst, copies[i].src, copies[i].bytes, kind,
                                         "copy_batch_async", stream));
  return ok_status();
}

Status CudaBackend::bind_thread() {
  KVSPLIT_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
  return ok_status();
}

bool CudaBackend::can_read_from(const Backend& src) {
  if (src.kind() != DeviceKind::kCuda) return false;
  if (src.device() == device_) return true;
  int ok = 0;
  if (cudaDeviceCanAccessPeer(&ok, device_, src.device()) != cudaSuccess || !ok) return false;
  // Peer access is enabled from this backend's device; the calling thread (often another
  // worker's, bound to its own device once: bind_thread) gets its current device back, or its
  // next launches would go to a stream of another device and fail.
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) return false;
  if (cudaSetDevice(device_) != cudaSuccess) return false;
  cudaError_t e = cudaDeviceEnablePeerAccess(src.device(), 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // clear the sticky "already enabled" error
    e = cudaSuccess;
  }
  if (prev != device_ && cudaSetDevice(prev) != cudaSuccess) return false;
  return e == cudaSuccess;
}

Status CudaBackend::copy_from(void* dst, const Backend& src, const void* src_ptr, size_t bytes) {
  const DeviceScope on_device(device_);
  if (bytes == 0) return ok_status();
  if (src.kind() != DeviceKind::kCuda) return invalid_argument("copy_from: not a CUDA backend");
  const auto& from = static_cast<const CudaBackend&>(src);
  if (&from != this) {
    // The copy reads what the source's stream writes (a kv_append, a restore): it waits for
    // everything queued there so far, as a copy on the source's own stream would.
    cudaEvent_t ready = nullptr;
    {
      const DeviceScope on_source(from.device_);
      KVSPLIT_CUDA_RETURN(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming),
                          "copy_from: cudaEventCreate");
      const cudaError_t rec = cudaEventRecord(ready, from.stream_);
      if (rec != cudaSuccess) {
        (void)cudaEventDestroy(ready);
        KVSPLIT_CUDA_RETURN(rec, "copy_from: cudaEventRecord");
      }
    }
    const cudaError_t wait = cudaStreamWaitEvent(stream_, ready, 0);
    (void)cudaEventDestroy(ready);  // released once it completes
    KVSPLIT_CUDA_RETURN(wait, "copy_from: cudaStreamWaitEvent");
  }
  if (src.device() == device_) {
    KVSPLIT_CUDA_RETURN(cudaMemcpyAsync(dst, src_ptr, bytes, cudaMemcpyDeviceToDevice, stream_),
                        "copy_from");
  } else {
    KVSPLIT_CUDA_RETURN(cudaMemcpyPeerAsync(dst, device_, src_ptr, src.device(), bytes, stream_),
                        "cudaMemcpyPeerAsync");
  }
  return ok_status();
}

Status CudaBackend::read_for_peer(void* dst_host, const void* src_dev, size_t bytes) {
  const DeviceScope on_device(device_);
  if (bytes == 0) return ok_status();
  // Enqueueing on and waiting for stream_ are thread-safe; the error flag (and last_flag_op_)
  // stay the owner's: its next synchronize reports what its own kernels flagged.
  KVSPLIT_CUDA_RETURN(cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, stream_),
                      "read_for_peer");
  KVSPLIT_CUDA_RETURN(cudaStreamSynchronize(stream_), "read_for_peer sync");
  return ok_status();
}

Status CudaBackend::check_error_flag() {
  // In the compute stream's order: read after everything queued so far, and reset before anything
  // queued later (the legacy default stream does not order against the non-blocking stream_).
  int flag = 0;
  KVSPLIT_CUDA_RETURN(
      cudaMemcpyAsync(&flag, error_flag_, sizeof(int), cudaMemcpyDeviceToHost, stream_),
      "error flag");
  KVSPLIT_CUDA_RETURN(cudaStreamSynchronize(stream_), "error flag sync");
  if (flag == 0) return ok_status();
  KVSPLIT_CUDA_RETURN(cudaMemsetAsync(error_flag_, 0, sizeof(int), stream_), "error flag reset");
  return invalid_argument(
      std::string("cuda: an index input was out of range in a recent ") + last_flag_op_ +
      " call (block id, slot, token id or a split plan that leaves keys out); that item was "
      "skipped");
}

Status CudaBackend::reserve(void** buf, size_t* cap, size_t bytes) {
  if (*cap >= bytes) return ok_status();
  const size_t grown =
      std::max(bytes, *cap * 2);  // geometric: a slowly growing need reallocates rarely
  if (*buf) KVSPLIT_CUDA_RETURN(cudaFreeAsync(*buf, stream_), "cudaFreeAsync");
  *buf = nullptr;
  *cap = 0;
  KVSPLIT_CUDA_RETURN(cudaMallocAsync(buf, grown, stream_), "cudaMallocAsync(scratch)");
  *cap = grown;
  return ok_status();
}

StatusOr<void*> CudaBackend::staging(size_t bytes) {
  KVSPLIT_CUDA_RETURN(cudaEventSynchronize(staging_done_), "staging wait");
  if (pinned_cap_ < bytes) {
    if (pinned_) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_cap_ = 0;
    KVSPLIT_CUDA_RETURN(cudaMallocHost(&pinned_, bytes), "cudaMallocHost");
    pinned_cap_ = bytes;
  }
  return pinned_;
}

StatusOr<MatrixView> CudaBackend::upload_matrix(const void* host, DType dtype, int64_t rows,
                                                int64_t cols) {
  const DeviceScope on_device(device_);
  if (!host || rows <= 0 || cols <= 0)
    return invalid_argument("upload_matrix: empty or null matrix");
  const DType target = options_.weight_dtype;
  const int64_t n = rows * cols;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(target);
  void* dev = nullptr;
  KVSPLIT_CUDA_RETURN(cudaMalloc(&dev, bytes), "cudaMalloc(weights)");
  weights_.push_back(dev);
  // Convert on the host through pinned staging in chunks (weights may be memory-mapped f32).
  constexpr int64_t kChunk = int64_t{1} << 22;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t cnt = std::min(kChunk, n - begin);
    KVSPLIT_ASSIGN_OR_RETURN(void* stage, staging(static_cast<size_t>(cnt) * dtype_size(target)));
    if (dtype == target) {
      std::memcpy(stage, static_cast<const char*>(host) + begin * dtype_size(dtype),
                  cnt * dtype_size(dtype));
    } else {
      for (int64_t i = 0; i < cnt; ++i) {
        const float f = element_as_float(host, dtype, begin + i);
        if (target == DType::kF32) {
          static_cast<float*>(stage)[i] = f;
        } else {
          static_cast<uint16_t*>(stage)[i] = target == DType::kF16 ? kernels::float_to_half_bits(f)
                                                                   : kernels::float_to_bf16_bits(f);
        }
      }
    }
    KVSPLIT_CUDA_RETURN(cudaMemcpyAsync(static_cast<char*>(dev) + begin * dtype_size(target), stage,
                                        cnt * dtype_size(target), cudaMemcpyHostToDevice, stream_),
                        "upload_matrix copy");
    KVSPLIT_CUDA_RETURN(cudaEventRecord(staging_done_, stream_), "cudaEventRecord");
  }
  return MatrixView{dev, target, rows, cols};
}

Status CudaBackend::embedding(const int32_t* ids, int num_tokens, const MatrixView& table,
                              float* out) {
  const DeviceScope on_device(device_);
  last_flag_op_ = "embedding";
  return kernels::launch_embedding(ids, num_tokens, table.data, table.dtype, table.rows, table.cols,
                                   out, error_flag_, stream_);
}

Status CudaBackend::rmsnorm(const float* x, const float* weight, int num_tokens, int dim, float eps,
                            float* out) {
  const DeviceScope on_device(device_);
  return kernels::launch_rmsnorm(x, weight, num_tokens, dim, eps, out, nullptr, stream_);
}

Status CudaBackend::add_rmsnorm(float* residual, const float* x, const float* weight,
                                int num_tokens, int dim, float eps, float* out) {
  const DeviceScope on_device(device_);
  if (num_tokens > 0 && !residual) return invalid_argument("add_rmsnorm: null residual");
  return kernels::launch_rmsnorm(x, weight, num_tokens, dim, eps, out, residual, stream_);
}

Status CudaBackend::gemm(const float* x, int m, const MatrixView& w, const float* bias, float* out,
                         bool accumulate) {
  const DeviceScope on_device(device_);
  if (m < 0 || w.rows <= 0 || w.cols <= 0) return invalid_argument("gemm: bad shape");
  if (m == 0) return ok_status();
  if (!x || !out || !w.data) return invalid_argument("gemm: null pointer");
  if (w.rows > INT32_MAX || w.cols > INT32_MAX) return invalid_argument("gemm: matrix too large");
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  const void* xin = x;
  if (w.dtype != DType::kF32) {
    // Tensor-core GEMM: activations rounded to the weight type, fp32 accumulation and output.
    KVSPLIT_RETURN_IF_ERROR(reserve(&act16_, &act16_cap_, size_t(m) * k * 2));
    KVSPLIT_RETURN_IF_ERROR(
        kernels::launch_convert_f32(x, int64_t{m} * k, act16_, w.dtype, stream_));
    xin = act16_;
  }
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  // Row-major out[m, n] = x[m, k] * w[n, k]^T is column-major out^T[n, m] = w^T' * x^T.
  KVSPLIT_CUBLAS_RETURN(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w.data,
                                     cuda_type(w.dtype), k, xin, cuda_type(w.dtype), k, &beta, out,
                                     CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx");
  if (bias) KVSPLIT_RETURN_IF_ERROR(kernels::launch_add_bias(out, bias, m, n, stream_));
  return ok_status();
}

Status CudaBackend::rope(float* q, float* k, const int32_t* positions, int num_tokens,
                         int num_heads, int num_kv_heads, const RopeArgs& args) {
  const DeviceScope on_device(device_);
  kernels::RopeParams p;
  p.q = q;
  p.k = k;
  p.positions = positions;
  p.inv_freq = args.inv_freq;
  p.num_tokens = num_tokens;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = args.head_dim;
  p.rotary_dim = args.rotary_dim;
  p.interleaved = args.style == RopeStyle::kInterleaved;
  p.attention_factor = args.attention_factor;
  return kernels::launch_rope(p, stream_);
}

Status CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  const DeviceScope on_device(device_);
  return kernels::launch_swiglu(gate, up, n, out, stream_);
}

Status CudaBackend::kv_append(const LayerKv& kv, const float* k, const float* v,
                              const int32_t* slot_mapping, int num_tokens) {
  const DeviceScope on_device(device_);
  last_flag_op_ = "kv_append";
  return kernels::launch_kv_append(
      kv_append_params(kv, k, v, slot_mapping, num_tokens, error_flag_), stream_);
}

Status CudaBackend::attention_prefill(const AttentionArgs& args) {
  const DeviceScope on_device(device_);
  KVSPLIT_RETURN_IF_ERROR(check_attention_shape(args));
  KVSPLIT_RETURN_IF_ERROR(check_sharded_scoring_args(args, /*decode=*/false));
  kernels::PagedAttentionParams p = attention_params(args);
  p.error_flag = error_flag_;
  last_flag_op_ = "attention";
  if (needs_mixed_attention(args))
    return kernels::launch_mixed_prefill(mixed_attention_params(args, p), stream_);
  return kernels::launch_paged_prefill(p, stream_);
}

Status CudaBackend::attention_decode(const AttentionArgs& args, const backend::SplitPlan& plan) {
  const DeviceScope on_device(device_);
  KVSPLIT_RETURN_IF_ERROR(check_attention_shape(args));
  KVSPLIT_RETURN_IF_ERROR(check_sharded_scoring_args(args, /*decode=*/true));
  // kv_lens live on the device: the kernels flag a plan that leaves keys out.
  KVSPLIT_RETURN_IF_ERROR(backend::check_split_plan(plan, args.num_seqs, args.kv.block_size,
                                                    args.window, /*host_kv_lens=*/nullptr));
  kernels::PagedAttentionParams p = attention_params(args);
  p.error_flag = error_flag_;
  last_flag_op_ = "attention";
  if (args.score_max != nullptr)  // scoring only, against the given maxima (no out, no lse)
    return kernels::launch_mixed_score(mixed_attention_params(args, p), args.score_max, stream_);
  p.max_splits = std::max(plan.max_splits, 1);
  if (plan.has_splits()) {
    const size_t n = static_cast<size_t>(args.num_seqs);
    // num_splits, split_offset, then the bounds of a plan over attended pages (split_begin).
    if (!plan.image_equals(plan_uploaded_)) {
      plan_uploaded_.clear();
      const size_t bytes = plan.image_words() * sizeof(int32_t);
      KVSPLIT_ASSIGN_OR_RETURN(void* stage, staging(bytes));
      plan.write_image(static_cast<int32_t*>(stage));
      KVSPLIT_RETURN_IF_ERROR(reserve(&plan_dev_, &plan_cap_, bytes));
      KVSPLIT_CUDA_RETURN(cudaMemcpyAsync(plan_dev_, stage, bytes, cudaMemcpyHostToDevice, stream_),
                          "split plan upload");
      KVSPLIT_CUDA_RETURN(cudaEventRecord(staging_done_, stream_), "cudaEventRecord");
      const int32_t* uploaded = static_cast<const int32_t*>(stage);
      plan_uploaded_.assign(uploaded, uploaded + plan.image_words());
    }
    const size_t heads = static_cast<size_t>(plan.total_splits) * args.num_heads;
    KVSPLIT_RETURN_IF_ERROR(
        reserve(&partials_, &partials_cap_, heads * (args.head_dim + 2) * sizeof(float)));
    p.chunk_tokens = plan.chunk_tokens;
    p.num_splits = static_cast<const int32_t*>(plan_dev_);
    p.split_offset = static_cast<const int32_t*>(plan_dev_) + n;
    if (!plan.split_begin.empty()) p.split_begin = static_cast<const int32_t*>(plan_dev_) + 2 * n;
    p.part_o = static_cast<float*>(partials_);
    p.part_m = p.part_o + heads * args.head_dim;
    p.part_l = p.part_m + heads;
  }
  if (needs_mixed_attention(args)) {
    kernels::MixedAttentionParams mp = mixed_attention_params(args, p);
    if (args.score_seqs) {
      const size_t bytes = static_cast<size_t>(std::max(args.num_seqs, 1)) * args.num_heads * 4;
      KVSPLIT_RETURN_IF_ERROR(reserve(&score_max_, &score_max_cap_, bytes));
      mp.score_max = static_cast<float*>(score_max_);
    }
    return kernels::launch_mixed_decode(mp, stream_);  // attention, merge and scoring
  }
  KVSPLIT_RETURN_IF_ERROR(kernels::launch_paged_decode(p, stream_));
  if (plan.has_splits()) KVSPLIT_RETURN_IF_ERROR(kernels::launch_merge_states(p, stream_));
  return ok_status();
}

Status CudaBackend::merge_attention_states(const float* const* o, const float* const* lse,
                                           int num_parts, int64_t rows, int head_dim, float* out,
                                           float* lse_out) {
  const DeviceScope on_device(device_);
  return kernels::launch_merge_partials(
      merge_partials_params(o, lse, num_parts, rows, head_dim, out, lse_out), stream_);
}

Status CudaBackend::quantize_kv_page(const void* src, DType src_dtype,
                                     const kernels::QuantPageLayout& layout,
                                     kernels::KvPrecision to, void* dst) {
  const DeviceScope on_device(device_);
  return kernels::launch_quantize_kv_page(src, src_dtype, layout, to, dst, stream_);
}

Status CudaBackend::dequantize_kv_page(const void* src, kernels::KvPrecision from,
                                       const kernels::QuantPageLayout& layout, void* dst,
                                       DType dst_dtype) {
  const DeviceScope on_device(device_);
  return kernels::launch_dequantize_kv_page(src, from, layout, dst, dst_dtype, stream_);
}

Status CudaBackend::summarize_kv_page(const void* src, DType src_dtype,
                                      const kernels::QuantPageLayout& layout,
                                      kernels::KvSummaryElem* dst) {
  const DeviceScope on_device(device_);
  return kernels::launch_summarize_kv_page(src, src_dtype, layout, dst, stream_);
}

Status CudaBackend::sample_tokens(const float* logits, int num_rows, int vocab,
                                  const SamplingRow* rows, int32_t* ids) {
  const DeviceScope on_device(device_);
  if (num_rows < 0) return invalid_argument("sample_tokens: negative num_rows");
  if (num_rows == 0) return ok_status();
  if (!rows) return invalid_argument("sample_tokens: null rows");
  const size_t bytes = static_cast<size_t>(num_rows) * sizeof(kernels::SampleRowParams);
  KVSPLIT_ASSIGN_OR_RETURN(void* stage, staging(bytes));
  auto* params = static_cast<kernels::SampleRowParams*>(stage);
  for (int r = 0; r < num_rows; ++r) {
    params[r] = sample_row_params(rows[r]);
    const Status st = kernels::validate_sample_params(params[r]);
    if (!st.ok())
      return invalid_argument("sample_tokens: row " + std::to_string(r) + ": " + st.message());
  }
  KVSPLIT_RETURN_IF_ERROR(reserve(&sample_rows_, &sample_rows_cap_, bytes));
  KVSPLIT_CUDA_RETURN(cudaMemcpyAsync(sample_rows_, stage, bytes, cudaMemcpyHostToDevice, stream_),
                      "sample_tokens params upload");
  KVSPLIT_CUDA_RETURN(cudaEventRecord(staging_done_, stream_), "cudaEventRecord");
  return kernels::launch_sample(logits, num_rows, vocab,
                                static_cast<const kernels::SampleRowParams*>(sample_rows_), ids,
                                stream_);
}

Status CudaBackend::check_model_attention(int head_dim, int gqa_group) const {
  return kernels::attention_shape_supported(head_dim, gqa_group);
}

}  // namespace kvsplit::backend::cuda

namespace kvsplit::backend {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

StatusOr<std::unique_ptr<Backend>> create_cuda_backend(int device,
                                                       const CudaBackendOptions& options) {
  if (options.weight_dtype != DType::kBF16 && options.weight_dtype != DType::kF16 &&
      options.weight_dtype != DType::kF32)
    return invalid_argument("backend 'cuda': unsupported weight dtype");
  return cuda::CudaBackend::create(device, options);
}

StatusOr<std::unique_ptr<Backend>> create_cuda_backend(int device) {
  return create_cuda_backend(device, CudaBackendOptions{});
}

}  // namespace kvsplit::backend
