// DiskTier under threads (run under TSan by CI: label `concurrency`): one thread submits, another
// finishes the ops and reads back; several threads write, read and free at once.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kv/disk_tier.h"
#include "test_util.h"

namespace kvsplit::kv {
namespace {

using Bytes = std::vector<std::byte>;

Bytes pattern(size_t n, uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

class DiskTierConcurrencyTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == IoBackend::kUring && !BlockIo::create(IoOptions{IoBackend::kUring}).ok())
      GTEST_SKIP() << "io_uring unavailable here";
    DiskTierConfig c;
    c.path = dir_.path().string();
    c.extent_bytes = 16 << 10;
    c.capacity_bytes = 256 * c.extent_bytes;
    c.io.backend = GetParam();
    auto t = DiskTier::open(c);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tier_ = std::move(t).value();
  }
  testing::TempDir dir_;
  std::unique_ptr<DiskTier> tier_;
};

// The worker submits writes; a second thread waits for each and reads the record back.
TEST_P(DiskTierConcurrencyTest, SubmitOnOneThreadCompleteOnAnother) {
  constexpr int kRecords = 120;
  std::vector<Bytes> payloads;
  for (int i = 0; i < kRecords; ++i) payloads.push_back(pattern(1000 + 997 * (i % 40), i));
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, DiskOp>> handed;  // (index, op) from the submitter
  bool submitted_all = false;
  std::atomic<int> verified{0}, refused{0};

  std::thread completer([&] {
    for (;;) {
      std::pair<int, DiskOp> item;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return submitted_all || !handed.empty(); });
        if (handed.empty()) return;
        item = std::move(handed.front());
        handed.pop_front();
      }
      auto& [i, op] = item;
      ASSERT_TRUE(tier_->wait(op).ok());
      Bytes back(payloads[i].size());
      const std::span<std::byte> dst(back);
      ASSERT_TRUE(tier_->read_sync(op.record(), {&dst, 1}, {1, uint64_t(i)}).ok());
      EXPECT_EQ(back, payloads[i]);
      ASSERT_TRUE(tier_->free(op.record()).ok());
      ++verified;
    }
  });
  for (int i = 0; i < kRecords; ++i) {
    const std::span<const std::byte> src(payloads[i]);
    StatusOr<DiskOp> op = tier_->write({&src, 1}, {1, uint64_t(i)});
    if (!op.ok()) {  // the completer frees space as it goes; full is a value, not a bug
      ASSERT_EQ(op.status().code(), StatusCode::kResourceExhausted);
      ++refused;
      std::this_thread::yield();
      --i;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      handed.emplace_back(i, std::move(op).value());
    }
    cv.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    submitted_all = true;
  }
  cv.notify_one();
  completer.join();
  EXPECT_EQ(verified.load(), kRecords);
  const DiskTierStats s = tier_->stats();
  EXPECT_EQ(s.writes, kRecords);
  EXPECT_EQ(s.reads, kRecords);
  EXPECT_EQ(s.extents_used, 0);
  EXPECT_EQ(s.records, 0);
  EXPECT_EQ(s.fault_count(DiskFault::kCapacity), refused.load());
}

// Several workers share one tier: writes, polls, reads and frees interleave.
TEST_P(DiskTierConcurrencyTest, ThreadsShareOneTier) {
  constexpr int kThreads = 4, kRounds = 40;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const Bytes p = pattern(3000 + 4096 * (r % 7), t * 1000 + r);
        const std::span<const std::byte> src(p);
        const RecordKey key{uint64_t(t), uint64_t(r)};
        StatusOr<DiskOp> w = tier_->write({&src, 1}, key);
        ASSERT_TRUE(w.ok()) << w.status().to_string();  // 4 x 5 extents at most: always fits
        std::optional<Status> done;
        while (!(done = tier_->poll(w.value()))) std::this_thread::yield();
        ASSERT_TRUE(done->ok());
        Bytes back(p.size());
        const std::span<std::byte> dst(back);
        ASSERT_TRUE(tier_->read_sync(w->record(), {&dst, 1}, key).ok());
        EXPECT_EQ(back, p);
        (void)tier_->stats();
        ASSERT_TRUE(tier_->free(w->record()).ok());
        ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), kThreads * kRounds);
  EXPECT_EQ(tier_->stats().extents_used, 0);
  EXPECT_EQ(tier_->stats().writes, kThreads * kRounds);
}

INSTANTIATE_TEST_SUITE_P(Backends, DiskTierConcurrencyTest,
                         ::testing::Values(IoBackend::kThreads, IoBackend::kUring),
                         [](const auto& info) { return std::string(io_backend_name(info.param)); });

}  // namespace
}  // namespace kvsplit::kv
