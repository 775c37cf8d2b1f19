#include "kv/block_io.h"

#include <limits.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <thread>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "kv/checksum.h"

namespace kvsplit::kv {

std::string_view io_backend_name(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "uring";
    case IoBackend::kThreads:
      return "threads";
  }
  return "?";
}

StatusOr<IoBackend> parse_io_backend(std::string_view name) {
  for (IoBackend b : {IoBackend::kAuto, IoBackend::kUring, IoBackend::kThreads})
    if (name == io_backend_name(b)) return b;
  return invalid_argument("I/O backend '" + std::string(name) +
                          "': expected auto, uring or threads");
}

int64_t IoRequest::bytes() const {
  int64_t n = 0;
  for (const iovec& v : iov) n += static_cast<int64_t>(v.iov_len);
  return n;
}

bool IoCompletion::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

IoResult IoCompletion::wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return result_;
}

void IoCompletion::complete(IoResult result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVSPLIT_CHECK_MSG(!done_, "IoCompletion completed twice");
    result_ = result;
    done_ = true;
  }
  cv_.notify_all();
}

IoResult with_digest(const IoRequest& r, IoResult result) {
  if (r.op != IoOp::kRead || !r.digest || result.error != 0 || result.bytes != r.bytes())
    return result;
  result.digest = xxh3_64(r.iov, r.digest_seed, 0, r.digest_bytes);
  result.digested = true;
  return result;
}

std::shared_ptr<IoCompletion> try_inline_read(const IoRequest& r) {
#ifdef RWF_NOWAIT
  if (r.op != IoOp::kRead || !r.inline_if_cached || r.iov.empty()) return nullptr;
  const int64_t want = r.bytes();
  ssize_t n;
  do n = ::preadv2(r.fd, r.iov.data(), static_cast<int>(r.iov.size()), r.offset, RWF_NOWAIT);
  while (n < 0 && errno == EINTR);
  // EAGAIN (not all cached), EOPNOTSUPP (a file system without RWF_NOWAIT: one cheap syscall per
  // small read, so it is not remembered), a short read or an error: the backend runs the request
  // again and reports its own result. A partial copy into the buffers is overwritten by that read.
  if (n != want) return nullptr;
  auto c = std::make_shared<IoCompletion>(want);
  c->served_inline_ = true;
  c->complete(with_digest(r, IoResult{static_cast<int64_t>(n), 0}));
  return c;
#else
  (void)r;
  return nullptr;
#endif
}

namespace {

// Runs one request with preadv/pwritev, retrying EINTR. A transfer the kernel does only in part
// goes on with the rest: a device that fills up mid-write reports ENOSPC (from the next call)
// with the bytes written so far, not a short count the caller cannot tell from data loss, and a
// read served in part is not a fault. A read stops at 0 bytes (end of file: the caller treats the
// short count as a fault).
IoResult run_vectored(const IoRequest& r) {
  const bool read = r.op == IoOp::kRead;
  const int64_t total = r.bytes();
  std::vector<iovec> rest;  // the iovecs not yet moved, once a transfer fell short
  const iovec* iov = r.iov.data();
  int count = static_cast<int>(r.iov.size());
  int64_t done = 0;
  while (done < total) {
    const ssize_t n = read ? ::preadv(r.fd, iov, count, r.offset + done)
                           : ::pwritev(r.fd, iov, count, r.offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoResult{done, errno};
    }
    if (n == 0) break;  // end of file, or no progress and no error: short for the caller
    done += n;
    if (done == total) break;
    if (rest.empty()) rest.assign(iov, iov + count);
    size_t skip = static_cast<size_t>(n);  // drop the written bytes from the front of rest
    size_t first = static_cast<size_t>(rest.size()) - static_cast<size_t>(count);
    while (skip >= rest[first].iov_len) skip -= rest[first++].iov_len;
    rest[first].iov_base = static_cast<char*>(rest[first].iov_base) + skip;
    rest[first].iov_len -= skip;
    iov = rest.data() + first;
    count = static_cast<int>(rest.size() - first);
  }
  return IoResult{done, 0};
}

// preadv/pwritev on `threads` helper threads fed by one FIFO queue.
class ThreadBlockIo final : public BlockIo {
 public:
  explicit ThreadBlockIo(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~ThreadBlockIo() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();  // workers drain the queue before they stop
  }

  std::shared_ptr<IoCompletion> submit(IoRequest request) override {
    KVSPLIT_CHECK(request.iov.size() <= IOV_MAX && request.bytes() <= kMaxIoBytes);
    if (auto done = try_inline_read(request)) return done;
    auto c = std::make_shared<IoCompletion>(request.bytes());
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(Item{std::move(request), c});
    }
    cv_.notify_one();
    return c;
  }
  IoBackend backend() const override { return IoBackend::kThreads; }

 private:
  struct Item {
    IoRequest request;
    std::shared_ptr<IoCompletion> completion;
  };

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      item.completion->complete(with_digest(item.request, run_vectored(item.request)));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<BlockIo> make_thread_block_io(int threads) {
  return std::make_unique<ThreadBlockIo>(threads);
}

namespace {
StatusOr<std::unique_ptr<BlockIo>> create_backend(const IoOptions& options) {
  if (options.queue_depth < 1 || options.queue_depth > 4096)
    return invalid_argument("I/O queue_depth " + std::to_string(options.queue_depth) +
                            ": expected 1..4096");
  if (options.threads < 1 || options.threads > 64)
    return invalid_argument("I/O threads " + std::to_string(options.threads) + ": expected 1..64");
  if (options.backend == IoBackend::kThreads) return make_thread_block_io(options.threads);
  StatusOr<std::unique_ptr<BlockIo>> ring = make_uring_block_io(options.queue_depth);
  if (ring.ok() || options.backend == IoBackend::kUring) return ring;
  // kAuto: fall back, and say so once per process.
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    KVSPLIT_LOG_WARN("block I/O: io_uring not used ({}); using preadv/pwritev on {} threads",
                     ring.status().message(), options.threads);
  return make_thread_block_io(options.threads);
}
}  // namespace

StatusOr<std::unique_ptr<BlockIo>> BlockIo::create(const IoOptions& options) {
  StatusOr<std::unique_ptr<BlockIo>> io = create_backend(options);
  if (io.ok() && options.wrap) return options.wrap(std::move(io).value());
  return io;
}

}  // namespace kvsplit::kv
