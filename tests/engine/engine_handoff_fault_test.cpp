// A KV handoff copy that fails (disaggregated mode; EngineImpl::InternalOptions::
// handoff_copy_fault_hook): the decode worker fails that request with the copy's error (it has its
// first token from the prefill worker, then the final event), releases the blocks it reserved,
// caches none of them, and tells the prefill worker, which releases the pinned pages. The other
// requests of the run keep the tokens of a run without faults, and every block of every pool is
// free afterwards.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "sched/kv_handoff.h"
#include "start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

std::vector<Request> mixed_requests(int n) {
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog", "Tom and his mom"};
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.request_id = "r" + std::to_string(i);
    r.prompt = prompts[i % 4];
    r.sampling.max_tokens = 12 + (i * 5) % 20;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = i % 2 ? 0.9f : 0.0f;
    r.sampling.seed = 700 + i;
    out.push_back(r);
  }
  return out;
}

// The request failed by an injected copy fault: its first token (sampled by the prefill worker,
// the same as without the fault), then one final kError event with the copy's error.
void expect_failed_copy(const Collected& got, const Collected& want, const std::string& id) {
  ASSERT_FALSE(got.timed_out) << id;
  EXPECT_EQ(got.finals, 1) << id;
  EXPECT_EQ(got.events_after_final, 0) << id;
  EXPECT_EQ(got.final_event.finish_reason, FinishReason::kError) << id;
  EXPECT_EQ(got.final_event.status.code(), StatusCode::kInternal) << id;
  // Which request, where, and the copy's own error.
  const std::string& msg = got.final_event.status.message();
  EXPECT_EQ(msg.rfind("KV handoff of request " + id + " to decode-", 0), 0u) << msg;
  EXPECT_NE(msg.find(": injected fault"), std::string::npos) << msg;
  ASSERT_EQ(got.tokens.size(), 1u) << id;
  ASSERT_FALSE(want.tokens.empty());
  EXPECT_EQ(got.tokens[0], want.tokens[0]) << id;
}

void expect_as_without_faults(const Collected& got, const Collected& want, const std::string& id) {
  ASSERT_FALSE(got.timed_out) << id;
  EXPECT_TRUE(got.final_event.status.ok()) << id << ": " << got.final_event.status.to_string();
  EXPECT_EQ(got.tokens, want.tokens) << id;
  EXPECT_EQ(got.finals, 1) << id;
}

// Fails the handoff copies of the requests `ids` (whichever decode worker admits them, in
// whatever order) with kInternal.
sched::HandoffCopyFaultHook fail_copies_of(std::set<std::string> ids) {
  return [ids = std::move(ids)](const std::string& id) {
    return ids.count(id) > 0
               ? internal_error("injected fault: the KV handoff copy of " + id + " failed")
               : ok_status();
  };
}

// Two decode workers, eight requests at once; the copies of r2 and r5 fail. Only those two fail,
// and the engine serves the next request as before.
TEST(EngineHandoffFault, AFailedCopyFailsItsRequestAloneAndLeavesEveryPoolEmpty) {
  KVSPLIT_REQUIRE_MODELS();
  const EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  const std::vector<Request> reqs = mixed_requests(8);
  auto ref = Engine::create(cfg);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const std::vector<Collected> want = testing::run_all(**ref, reqs);
  ASSERT_EQ(want.size(), reqs.size());
  EngineImpl::InternalOptions io;
  io.handoff_copy_fault_hook = fail_copies_of({"r2", "r5"});
  auto engine = EngineImpl::create(cfg, io);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  const std::vector<Collected> got = testing::run_all(e, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string& id = reqs[i].request_id;
    if (id == "r2" || id == "r5") {
      expect_failed_copy(got[i], want[i], id);
    } else {
      expect_as_without_faults(got[i], want[i], id);
    }
  }
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EngineStats s = e.stats();
  EXPECT_EQ(s.requests_failed, 2);
  EXPECT_EQ(s.requests_finished, 6);
  Request again = reqs[2];  // the same request under another id: its copy succeeds
  again.request_id = "r2-again";
  expect_as_without_faults(collect(*e.submit(again)), want[2], again.request_id);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(e.stats().requests_failed, 2);
}

// One decode worker, held before its forward pass while six sequences start together (their
// offers arrive together, so mostly in one admission pass): its third and fourth copies fail
// (sched::fail_handoff_copies). Two requests fail, whichever they are; the other four, admitted
// beside them, keep their tokens.
TEST(EngineHandoffFault, TheThirdAndFourthCopiesFailAndTheOthersStartingTogetherRun) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  cfg.num_decode_workers = 1;
  const std::vector<Request> reqs = mixed_requests(6);
  auto ref = Engine::create(cfg);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const std::vector<Collected> want = testing::run_all(**ref, reqs);
  ASSERT_EQ(want.size(), reqs.size());
  EngineImpl::InternalOptions io;
  io.handoff_copy_fault_hook = sched::fail_handoff_copies(2, 2);
  auto engine = EngineImpl::create(cfg, io);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  std::vector<RequestHandle> handles;
  {
    testing::StartTogether together(e, ServingMode::kDisaggregated);
    for (const Request& r : reqs) {
      auto h = e.submit(r);
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      handles.push_back(*h);
    }
    // The decode worker ends up holding the four whose copies succeeded.
    EXPECT_TRUE(together.release(6, 4));
  }
  int failed = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Collected got = collect(handles[i]);
    const std::string& id = reqs[i].request_id;
    if (got.final_event.finish_reason == FinishReason::kError) {
      ++failed;
      expect_failed_copy(got, want[i], id);
    } else {
      expect_as_without_faults(got, want[i], id);
    }
  }
  EXPECT_EQ(failed, 2);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(e.stats().requests_failed, 2);
}

// With the decode pool's prefix cache: a failed copy caches none of its pages (a later request of
// the same prompt copies them all again and keeps its tokens), and a failed copy of a request
// whose leading pages were shared from the cache gives those back (every block is free after).
TEST(EngineHandoffFault, AFailedCopyCachesNothingAndGivesBackItsSharedPages) {
  KVSPLIT_REQUIRE_MODELS();
  constexpr int kBlock = 16;
  constexpr int kPrompt = 100;  // 6 full pages and 4 tokens
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  cfg.num_decode_workers = 1;
  cfg.block_size = kBlock;
  cfg.prefix_cache = true;
  Request r;
  std::mt19937 rng(23);
  for (int i = 0; i < kPrompt; ++i) r.prompt_token_ids.push_back(3 + static_cast<int>(rng() % 500));
  r.sampling.max_tokens = 16;
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 9;
  auto ref = Engine::create(cfg);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const Collected want = collect(*(*ref)->submit(r));
  ASSERT_TRUE(want.final_event.status.ok()) << want.final_event.status.to_string();
  EngineImpl::InternalOptions io;
  io.handoff_copy_fault_hook = fail_copies_of({"a", "c"});
  auto engine = EngineImpl::create(cfg, io);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  auto decode = [&e] { return e.stats().pools.back(); };  // decode-0
  const int64_t pages = (kPrompt + kBlock - 1) / kBlock, full = kPrompt / kBlock;
  r.request_id = "a";  // fails: nothing copied, nothing cached
  expect_failed_copy(collect(*e.submit(r)), want, "a");
  EXPECT_EQ(decode().handoff_pages_copied, 0);
  EXPECT_EQ(decode().kv_prefix_cache_pages, 0);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  r.request_id = "b";  // every page copied (none cached by a), then cached
  expect_as_without_faults(collect(*e.submit(r)), want, "b");
  EXPECT_EQ(decode().handoff_pages_copied, pages);
  EXPECT_EQ(decode().handoff_pages_cached, 0);
  r.request_id = "c";  // shares b's full pages, then its copy of the last one fails
  expect_failed_copy(collect(*e.submit(r)), want, "c");
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  r.request_id = "d";  // shares them again
  expect_as_without_faults(collect(*e.submit(r)), want, "d");
  EXPECT_EQ(decode().handoff_pages_copied, pages + (pages - full));
  EXPECT_EQ(decode().handoff_pages_cached, full);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(e.stats().requests_failed, 2);
}

}  // namespace
}  // namespace kvsplit
