// Asynchronous block I/O: vectored reads and writes of byte ranges at file offsets, completed on
// a helper thread. Two implementations behind one interface: io_uring (when liburing was found at
// build time and the kernel allows it at run time) and preadv/pwritev on helper threads.
//
// Thread-safety: submit() may be called from any thread, concurrently. Completions are signalled
// from the backend's helper thread; IoCompletion::wait()/done() may be called from any thread.
// Memory named by a request's iovecs is the caller's and must stay valid (and untouched by the
// caller) until its completion is done.
#pragma once

#include <sys/uio.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::kv {

enum class IoOp : uint8_t { kRead, kWrite };

// kAuto: io_uring when built with liburing and io_uring_queue_init succeeds, else kThreads (the
// fallback is logged once per process). kUring fails with kUnavailable when it cannot be used.
enum class IoBackend : uint8_t { kAuto, kUring, kThreads };
std::string_view io_backend_name(IoBackend b);
// "auto" | "uring" | "threads" -> the backend; kInvalidArgument otherwise.
StatusOr<IoBackend> parse_io_backend(std::string_view name);

class BlockIo;

struct IoOptions {
  IoBackend backend = IoBackend::kAuto;
  int queue_depth = 64;  // io_uring submission queue entries; in-flight requests are capped at 2x
  int threads = 2;       // helper threads of the preadv/pwritev backend
  // Tests: wraps the backend create() made (e.g. to hold requests in flight); unset: none.
  std::function<std::unique_ptr<BlockIo>(std::unique_ptr<BlockIo>)> wrap = nullptr;
};

// One request: `iov` (at most IOV_MAX entries, at most kMaxIoBytes in all) at `offset` of `fd`.
struct IoRequest {
  IoOp op = IoOp::kRead;
  int fd = -1;
  int64_t offset = 0;
  std::vector<iovec> iov;
  // Reads only: the backend may first try the read on the submitting thread with
  // preadv2(RWF_NOWAIT), which copies from the page cache and never waits for the device. When
  // the page cache holds all of it, the completion is done before submit() returns, with no
  // hand-off to a helper thread; otherwise the request runs as usual. Leave it off for O_DIRECT
  // files (the device would be read on the caller) and for large reads whose copy should overlap
  // the caller's work.
  bool inline_if_cached = false;
  // Reads only: when set, the backend computes xxh3_64 (kv/checksum.h) with `digest_seed` of the
  // first `digest_bytes` bytes read (-1: all of them) on the thread that read them, right after
  // the copy while they are still in its cache, and reports it in IoResult::digest. Only for a
  // read that moved every byte it asked for. The disk tier verifies records this way: the
  // checksum pass runs beside the caller instead of after it, over cache-hot data.
  bool digest = false;
  uint64_t digest_seed = 0;
  int64_t digest_bytes = -1;

  int64_t bytes() const;
};
inline constexpr int64_t kMaxIoBytes = int64_t{1} << 30;  // below Linux's MAX_RW_COUNT

// How a request ended: `bytes` transferred (fewer than requested: a short transfer) and the
// errno of a failure (0 on success).
struct IoResult {
  int64_t bytes = 0;
  int error = 0;
  bool digested = false;  // `digest` holds the request's digest (IoRequest::digest)
  uint64_t digest = 0;
};

// Backends: `result` of `request` with its digest added when the request asks for one and the
// read moved every byte. Call on the thread that did the read, right after it.
IoResult with_digest(const IoRequest& request, IoResult result);

// The completion of one request, shared by the submitter and the backend.
class IoCompletion {
 public:
  explicit IoCompletion(int64_t requested) : requested_(requested) {}
  int64_t requested() const { return requested_; }
  bool done() const;      // never blocks
  IoResult wait() const;  // blocks until done
  // Called exactly once, by the backend (or by the submitter for a request never submitted).
  void complete(IoResult result);
  // True when the request was served on the submitting thread (IoRequest::inline_if_cached).
  bool served_inline() const { return served_inline_; }

 private:
  friend std::shared_ptr<IoCompletion> try_inline_read(const IoRequest& request);
  const int64_t requested_;
  bool served_inline_ = false;  // set before the completion is shared
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  IoResult result_;
};

class BlockIo {
 public:
  // The backend `options.backend` asks for (see IoBackend). kInvalidArgument for bad options.
  static StatusOr<std::unique_ptr<BlockIo>> create(const IoOptions& options);
  // Destruction waits for every submitted request to complete.
  virtual ~BlockIo() = default;

  // Queues `request`; the returned completion is done once the kernel has finished it. Blocks
  // while the backend's in-flight limit is reached.
  virtual std::shared_ptr<IoCompletion> submit(IoRequest request) = 0;
  // kUring or kThreads: what actually runs.
  virtual IoBackend backend() const = 0;
  // Tests: the next n submissions to the kernel are refused as transient (EAGAIN) without calling
  // it, as io_uring_enter can refuse them; false where the backend has no such step (threads).
  virtual bool refuse_submits_for_testing(int /*n*/) { return false; }
};

// The backends' fast path for IoRequest::inline_if_cached: the completed request when the page
// cache held every byte of it, else nullptr (the data is not all cached, the request is not an
// eligible read, or the kernel lacks RWF_NOWAIT: the backend then runs it as usual).
std::shared_ptr<IoCompletion> try_inline_read(const IoRequest& request);

// True when this build has the io_uring backend (liburing found at build time).
bool have_io_uring_support();

// The backends (block_io.cpp, block_io_uring.cpp); create() picks one.
std::unique_ptr<BlockIo> make_thread_block_io(int threads);
// kUnavailable (with the errno text) when the build lacks liburing or the kernel refuses a ring.
StatusOr<std::unique_ptr<BlockIo>> make_uring_block_io(int queue_depth);

}  // namespace kvsplit::kv
