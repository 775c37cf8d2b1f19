// Cache-aware handoff routing's memory: which decode worker was sent which leading pages of a
// prompt, bounded, least recently sent forgotten first.
#include "sched/prefix_routes.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvsplit::sched {
namespace {

TEST(PrefixRoutes, CountsTheLeadingPagesSentToEachWorker) {
  PrefixRoutes r(100);
  const std::vector<uint64_t> a = {11, 12, 13, 14};
  EXPECT_EQ(r.leading_pages(a, 3), (std::vector<int>{0, 0, 0}));
  r.record(std::vector<uint64_t>{11, 12, 13}, 1);
  r.record(std::vector<uint64_t>{11}, 2);
  EXPECT_EQ(r.leading_pages(a, 3), (std::vector<int>{0, 3, 1}));
  // Another prompt that shares the first two pages (a chain: same hashes) then differs.
  r.record(std::vector<uint64_t>{11, 12, 21}, 0);
  EXPECT_EQ(r.leading_pages(a, 3), (std::vector<int>{2, 3, 1}));
  EXPECT_EQ(r.leading_pages(std::vector<uint64_t>{11, 12, 21}, 3), (std::vector<int>{3, 2, 1}));
  // A gap ends the run: a page not sent there makes later pages irrelevant.
  r.record(std::vector<uint64_t>{14}, 2);
  EXPECT_EQ(r.leading_pages(a, 3)[2], 1);
  // Workers past the ones asked about, and past kMaxWorkers, are not counted.
  EXPECT_EQ(r.leading_pages(a, 1), (std::vector<int>{2}));
  r.record(a, PrefixRoutes::kMaxWorkers);
  EXPECT_EQ(r.leading_pages(a, PrefixRoutes::kMaxWorkers + 1).back(), 0);
  EXPECT_EQ(r.size(), 5u);
}

TEST(PrefixRoutes, ForgetsTheLeastRecentlySentBeyondItsCapacity) {
  PrefixRoutes r(4);
  r.record(std::vector<uint64_t>{1, 2, 3}, 0);
  r.record(std::vector<uint64_t>{1}, 1);  // page 1 sent again: now the most recent
  r.record(std::vector<uint64_t>{4, 5}, 0);
  EXPECT_EQ(r.size(), 4u);
  // Page 3 went first: a prompt is recorded last page first, so it is forgotten from its end
  // (page 1 was also sent again since). Prompt 1, 2, 3 now matches two pages on worker 0.
  EXPECT_EQ(r.leading_pages(std::vector<uint64_t>{1, 2, 3}, 2), (std::vector<int>{2, 1}));
  EXPECT_EQ(r.leading_pages(std::vector<uint64_t>{4, 5}, 1), (std::vector<int>{2}));
  // Re-sending the same pages many times keeps the bookkeeping bounded and the pages known.
  for (int i = 0; i < 1000; ++i) r.record(std::vector<uint64_t>{4, 5}, 0);
  EXPECT_EQ(r.size(), 4u);
  EXPECT_EQ(r.leading_pages(std::vector<uint64_t>{4, 5}, 1), (std::vector<int>{2}));
  EXPECT_EQ(r.leading_pages(std::vector<uint64_t>{1}, 2), (std::vector<int>{1, 1}));
  // An offer taken back from a worker (not delivered there) is forgotten for that worker only.
  r.forget(std::vector<uint64_t>{1}, 0);
  EXPECT_EQ(r.leading_pages(std::vector<uint64_t>{1}, 2), (std::vector<int>{0, 1}));
  r.forget(std::vector<uint64_t>{4, 5}, 0);
  EXPECT_EQ(r.leading_pages(std::vector<uint64_t>{4, 5}, 1), (std::vector<int>{0}));
  EXPECT_EQ(r.size(), 2u);
  PrefixRoutes none(0);
  none.record(std::vector<uint64_t>{1}, 0);
  EXPECT_EQ(none.size(), 0u);
}

}  // namespace
}  // namespace kvsplit::sched
