// Scheduler: fair prefill under a steady stream of short prompts on a colocated worker whose
// budget has no room for a chunk per prompt it holds. A long prompt that came first still gets a
// chunk at least once every kMaxPrefillYieldSteps + 1 steps (docs/kv-cuts.md "Fair time
// slicing"): the short prompts pulled after its last chunk rank after it, never-served or not.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "scheduler_test_util.h"

namespace kvsplit::sched {
namespace {

TEST(SchedulerFair, ALongPromptMovesWithinTheBoundWhileShortPromptsKeepArriving) {
  SchedulerConfig c = config(/*max_batch_tokens=*/480, /*colocated=*/true, /*min_chunk=*/16);
  c.block_size = 16;
  c.max_chunk_tokens = 32;
  c.max_num_seqs = 256;
  const Scheduler sched(c);
  constexpr int kHeld = 32;  // prompts the worker holds: 31 short ones and the long one
  constexpr int64_t kSteps = 100;
  struct Prompt {
    int target;
    int done = 0;
    int64_t last = -1;
    int64_t since = 0;
  };
  std::vector<Prompt> held = {{1024}};  // the long prompt, pulled first
  int64_t last_long = -1, longest_gap = 0;
  int long_steps = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    while (static_cast<int>(held.size()) < kHeld) held.push_back({16, 0, -1, step});
    std::vector<SchedSeq> wait;
    for (size_t i = 0; i < held.size(); ++i) {
      SchedSeq s = waiting(static_cast<int>(i), held[i].target, held[i].done,
                           (held[i].target + 15) / 16, 0, held[i].last);
      s.waiting_since = held[i].since;
      wait.push_back(s);
    }
    const SchedulerOutput out = sched.schedule({{}, wait, {}, 100000, 100000, step});
    for (const PrefillChunk& ch : out.prefill) {
      Prompt& p = held[ch.id];
      p.done += ch.tokens;
      p.last = step;
      if (ch.id != 0 || p.target != 1024) continue;
      longest_gap = std::max(longest_gap, step - last_long);
      last_long = step;
      ++long_steps;
    }
    std::erase_if(held, [](const Prompt& p) { return p.done >= p.target; });
    ASSERT_EQ(held[0].target, 1024);
  }
  // Its first chunk by step kMaxPrefillYieldSteps (it starts starving then), and then one every
  // kMaxPrefillYieldSteps + 1 steps at most (it yields in between).
  EXPECT_LE(longest_gap, kMaxPrefillYieldSteps + 1);
  EXPECT_GE(long_steps, kSteps / (kMaxPrefillYieldSteps + 1));
  EXPECT_GE(kSteps - 1 - last_long, 0);
  EXPECT_LE(kSteps - 1 - last_long, kMaxPrefillYieldSteps);
}

}  // namespace
}  // namespace kvsplit::sched
