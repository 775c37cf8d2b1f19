// The io_uring backend of BlockIo (built when CMake found liburing: KVSPLIT_HAVE_LIBURING).
// Submitters share the submission queue under a mutex; one reaper thread owns the completion
// queue. liburing allows exactly that split (one thread per side). Requests are handed to the
// reaper through `inflight_` under the same mutex, so the hand-over is ordered for TSan too (the
// kernel's side of the ring is invisible to it).
#include <limits.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "common/check.h"
#include "kv/block_io.h"

#if KVSPLIT_HAVE_LIBURING
#include <liburing.h>
#endif

namespace kvsplit::kv {

#if KVSPLIT_HAVE_LIBURING
namespace {

constexpr uint64_t kStopTag = 0;                     // user_data of the NOP that stops the reaper
constexpr int64_t kAsyncBytes = int64_t{256} << 10;  // IOSQE_ASYNC from this request size
constexpr std::chrono::seconds kSubmitRetry{10};     // how long a transient refusal is retried
constexpr int kMaxRetries = 64;  // EAGAIN / EINTR completions of one request requeued

class UringBlockIo final : public BlockIo {
 public:
  static StatusOr<std::unique_ptr<BlockIo>> create(int queue_depth) {
    auto io = std::unique_ptr<UringBlockIo>(new UringBlockIo());
    const int rc = io_uring_queue_init(static_cast<unsigned>(queue_depth), &io->ring_, 0);
    if (rc < 0) return unavailable(std::string("io_uring_queue_init: ") + std::strerror(-rc));
    io->ring_ok_ = true;
    io->max_inflight_ = io->ring_.cq.ring_entries;
    io->reaper_ = std::thread([p = io.get()] { p->reap(); });
    return std::unique_ptr<BlockIo>(std::move(io));
  }

  ~UringBlockIo() override {
    if (!ring_ok_) return;
    {
      std::unique_lock<std::mutex> lock(mu_);
      space_cv_.wait(lock, [&] { return inflight_.empty(); });
      io_uring_sqe* sqe = next_sqe(lock);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, kStopTag);
      submit_locked(lock);
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  std::shared_ptr<IoCompletion> submit(IoRequest request) override {
    KVSPLIT_CHECK(request.iov.size() <= IOV_MAX && request.bytes() <= kMaxIoBytes);
    if (auto done = try_inline_read(request)) return done;
    auto c = std::make_shared<IoCompletion>(request.bytes());
    std::unique_lock<std::mutex> lock(mu_);
    space_cv_.wait(lock, [&] { return inflight_.size() < max_inflight_; });
    const uint64_t id = next_id_++;
    Item& item = inflight_[id];
    item.request = std::move(request);
    item.completion = c;
    queue(lock, id, item, item.request.iov.data(), static_cast<int>(item.request.iov.size()));
    submit_locked(lock);  // the reaper completes it (with the kernel's error, if any)
    return c;
  }
  IoBackend backend() const override { return IoBackend::kUring; }
  bool refuse_submits_for_testing(int n) override {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_submits_ = n;
    return true;
  }

 private:
  struct Item {
    IoRequest request;
    std::shared_ptr<IoCompletion> completion;
    int64_t done = 0;         // bytes moved by its earlier parts (a short transfer goes on)
    std::vector<iovec> rest;  // the iovecs of the part in flight, once a transfer fell short
    int retries = 0;          // EAGAIN / EINTR completions requeued
  };

  UringBlockIo() = default;

  // Queues the SQE of `item` (id `id`) for `count` iovecs at `iov`, `item.done` bytes into the
  // request (callers hold `lock` on mu_).
  void queue(std::unique_lock<std::mutex>& lock, uint64_t id, const Item& item, const iovec* iov,
             int count) {
    io_uring_sqe* sqe = next_sqe(lock);
    const IoRequest& r = item.request;
    const auto n = static_cast<unsigned>(count);
    const auto offset = static_cast<uint64_t>(r.offset + item.done);
    if (r.op == IoOp::kRead)
      io_uring_prep_readv(sqe, r.fd, iov, n, offset);
    else
      io_uring_prep_writev(sqe, r.fd, iov, n, offset);
    // A buffered request the page cache can serve runs inline in io_uring_submit, on the
    // submitting thread: for a large one that serializes its copy with whatever the submitter
    // does next (the disk tier checksums the previous record). IOSQE_ASYNC hands it to the
    // kernel's io-wq workers instead, so copies and checksums overlap; small requests stay
    // inline, where the hand-off would cost more than the copy.
    if (r.bytes() - item.done >= kAsyncBytes) sqe->flags |= IOSQE_ASYNC;
    io_uring_sqe_set_data64(sqe, id);
  }

  // A transfer the kernel did only in part (res > 0 bytes of what was left) goes on with the
  // rest, as the threads backend's does: a device that fills up mid-write then reports the next
  // part's error (ENOSPC) with the bytes written, and a read the page cache served in part is not
  // a fault. A read stops at 0 bytes (end of file). A completion of -EAGAIN or -EINTR (nothing
  // moved) is queued again, a bounded number of times. True when the rest was queued and
  // submitted (the item stays in flight).
  bool continue_on(uint64_t id, int res) {
    std::unique_lock<std::mutex> lock(mu_);
    Item& item = inflight_.at(id);
    const IoRequest& r = item.request;
    const bool again = (res == -EAGAIN || res == -EINTR) && item.retries < kMaxRetries;
    if (!again && (res <= 0 || item.done + res >= r.bytes())) return false;
    if (item.rest.empty()) item.rest = r.iov;
    if (again) {
      ++item.retries;
    } else {
      // Drop the bytes moved from the front of the iovecs of the part just done.
      auto first = item.rest.begin();
      size_t skip = static_cast<size_t>(res);
      while (skip >= first->iov_len) skip -= (first++)->iov_len;
      first->iov_base = static_cast<char*>(first->iov_base) + skip;
      first->iov_len -= skip;
      item.rest.erase(item.rest.begin(), first);
      item.done += res;
    }
    queue(lock, id, item, item.rest.data(), static_cast<int>(item.rest.size()));
    submit_locked(lock);
    return true;
  }

  // A free SQE (callers hold `lock` on mu_); when the queue is full, its SQEs are submitted
  // first (the kernel consumes SQEs at submit).
  io_uring_sqe* next_sqe(std::unique_lock<std::mutex>& lock) {
    io_uring_sqe* sqe;
    while ((sqe = io_uring_get_sqe(&ring_)) == nullptr) submit_locked(lock);
    return sqe;
  }
  // Hands the queued SQEs to the kernel (callers hold `lock` on mu_). A queued SQE cannot be
  // taken back: io_uring_submit makes it visible to the kernel before io_uring_enter, and an
  // io_uring_enter that fails leaves it in the ring for the next one, where the kernel would
  // still read its iovecs and write into its buffers. So a refusal the kernel documents as
  // transient (EAGAIN: no memory for the request now; EBUSY: completions to reap first) is
  // retried, mu_ released meanwhile so that the reaper can take completions, for up to
  // kSubmitRetry; any other refusal, or one that lasts, stops the process: failing the requests
  // would free memory the kernel may still use. refuse_submits_ (tests) stands in for EAGAIN
  // without calling the kernel, which leaves the SQEs queued just as a failed enter does.
  void submit_locked(std::unique_lock<std::mutex>& lock) {
    const auto deadline = std::chrono::steady_clock::now() + kSubmitRetry;
    for (;;) {
      int rc;
      if (refuse_submits_ > 0) {
        --refuse_submits_;
        rc = -EAGAIN;
      } else {
        rc = io_uring_submit(&ring_);
      }
      if (rc >= 0) return;
      if (rc == -EINTR) continue;
      if ((rc != -EAGAIN && rc != -EBUSY) || std::chrono::steady_clock::now() > deadline) {
        const std::string msg =
            "io_uring_submit refused queued requests: " + std::string(std::strerror(-rc)) +
            " (they cannot be withdrawn; see block_io_uring.cpp)";
        KVSPLIT_CHECK_MSG(false, msg.c_str());
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock.lock();
    }
  }

  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc;
      do rc = io_uring_wait_cqe(&ring_, &cqe);
      while (rc == -EINTR || rc == -EAGAIN);
      KVSPLIT_CHECK_MSG(rc == 0, "io_uring_wait_cqe failed");
      const uint64_t id = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (id == kStopTag) return;
      if (continue_on(id, res)) continue;
      Item item;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = inflight_.find(id);
        KVSPLIT_CHECK(it != inflight_.end());
        item = std::move(it->second);
        inflight_.erase(it);
      }
      space_cv_.notify_all();
      // The digest of a read (IoRequest::digest) is computed here, beside the submitter, which
      // only compares it; the data was just copied by the kernel (shared cache).
      item.completion->complete(res < 0 ? IoResult{item.done, -res}
                                        : with_digest(item.request, IoResult{item.done + res, 0}));
    }
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  size_t max_inflight_ = 0;
  std::mutex mu_;  // the submission queue, inflight_, next_id_
  std::condition_variable space_cv_;
  std::map<uint64_t, Item> inflight_;
  uint64_t next_id_ = 1;    // 0 is kStopTag
  int refuse_submits_ = 0;  // tests: submits to refuse with EAGAIN (refuse_submits_for_testing)
  std::thread reaper_;
};

}  // namespace

bool have_io_uring_support() { return true; }

StatusOr<std::unique_ptr<BlockIo>> make_uring_block_io(int queue_depth) {
  return UringBlockIo::create(queue_depth);
}

#else  // !KVSPLIT_HAVE_LIBURING

bool have_io_uring_support() { return false; }

StatusOr<std::unique_ptr<BlockIo>> make_uring_block_io(int) {
  return unavailable("this build has no io_uring backend (liburing not found at build time)");
}

#endif

}  // namespace kvsplit::kv
