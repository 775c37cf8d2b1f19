// JobThread, the thread that drives one peer shard's backend (model/sharded_attention.h).
// Labelled concurrency with the other common tests, so it also runs under TSan.
#include "common/job_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace kvsplit {
namespace {

// Jobs run one at a time on the job thread; what the owner wrote before post() is visible to the
// job, what the job wrote is visible after wait(), and the job's Status comes back.
TEST(JobThread, RunsEachJobOnItsThreadAndReturnsItsStatus) {
  JobThread jt;
  std::vector<int> data(64, 0);
  std::thread::id seen;
  for (int round = 0; round < 2000; ++round) {
    data[round % data.size()] = round;  // written by the owner, read by the job
    int sum = -1;
    jt.post([&]() -> Status {
      seen = std::this_thread::get_id();
      sum = data[round % data.size()];
      if (round % 7 == 3) return internal_error("round " + std::to_string(round));
      return ok_status();
    });
    const Status st = jt.wait();
    ASSERT_EQ(sum, round);
    ASSERT_NE(seen, std::this_thread::get_id());
    if (round % 7 == 3) {
      ASSERT_EQ(st.code(), StatusCode::kInternal);
      ASSERT_EQ(st.message(), "round " + std::to_string(round));
    } else {
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  }
  EXPECT_TRUE(jt.wait().ok());  // nothing posted: ok at once
}

// Several job threads run at once (the shards of a group), beside the owner: every job and the
// owner meet at a rendezvous, which in turns they could not (each waits up to 20 s for the rest).
TEST(JobThread, SeveralRunAtOnce) {
  constexpr int kJobs = 3;
  std::atomic<int> arrived{0};
  auto meet = [&] {
    arrived.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (arrived.load() < kJobs + 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return arrived.load() == kJobs + 1;
  };
  std::vector<std::unique_ptr<JobThread>> jts;
  for (int i = 0; i < kJobs; ++i) jts.push_back(std::make_unique<JobThread>());
  for (auto& jt : jts)
    jt->post([&]() -> Status { return meet() ? ok_status() : internal_error("alone"); });
  EXPECT_TRUE(meet());
  for (auto& jt : jts) EXPECT_TRUE(jt->wait().ok());
}

// Destroying a JobThread whose job still runs waits for the job, then joins.
TEST(JobThread, DestructorWaitsForARunningJob) {
  bool done = false;
  {
    JobThread jt;
    jt.post([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      done = true;
      return ok_status();
    });
  }
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace kvsplit
