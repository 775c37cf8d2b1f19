// The worker command inbox through EngineImpl::send_command: snapshots, scheduler changes that
// take effect, KV release with bit-exact recompute, tenant scoping, errors, and after shutdown.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"
#include "engine/start_together.h"

namespace kvsplit {
namespace {

using sched::CommandReply;
using testing::collect;
using testing::Collected;

CommandReply send(EngineImpl& e, size_t worker, sched::WorkerCommand c) {
  auto f = e.send_command(worker, std::move(c));
  EXPECT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  return f.get();
}

Request long_request(const std::string& id, int max_tokens = 200) {
  Request r;
  r.request_id = id;
  r.tenant = "tenant-a";
  r.prompt = "Once upon a time";
  r.sampling.temperature = 0.0f;
  r.sampling.ignore_eos = true;
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(EngineInbox, SnapshotAndErrors) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(testing::stories_config(ServingMode::kColocated));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ASSERT_EQ((*engine)->num_workers(), 1u);
  CommandReply r = send(**engine, 0, sched::SnapshotState{});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.state.worker, "colocated-0");
  EXPECT_EQ(r.state.free_blocks, r.state.total_blocks);
  EXPECT_EQ(r.state.total_blocks, 512);
  EXPECT_EQ(r.state.scheduler.max_batch_tokens, 128);
  EXPECT_TRUE(r.state.sequences.empty());

  r = send(**engine, 7, sched::SnapshotState{});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("worker index 7 out of range [0, 1)"), std::string::npos);

  r = send(**engine, 0, sched::SetSchedulerParams{.max_batch_tokens = 0});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("max_batch_tokens: must be in [1, 1048576], got 0"),
            std::string::npos)
      << r.status.message();
  EXPECT_EQ(r.state.scheduler.max_batch_tokens, 128);  // unchanged
  r = send(**engine, 0, sched::SetSchedulerParams{.max_batch_tokens = 32, .min_chunk_tokens = 64});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("min_chunk_tokens: must be in [1, 32], got 64"),
            std::string::npos);

  // The prompts a worker holds follow its budget: a step's budget at the smallest chunk.
  EXPECT_EQ(r.state.max_prefill_seqs, 16);
  r = send(**engine, 0, sched::SetSchedulerParams{.max_batch_tokens = 1024});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.state.max_prefill_seqs, 1024 / r.state.scheduler.min_chunk_tokens);
  EXPECT_GT(r.state.max_prefill_seqs, 16);
  r = send(**engine, 0, sched::SetSchedulerParams{.max_batch_tokens = 128});
  EXPECT_EQ(r.state.max_prefill_seqs, 16);

  r = send(**engine, 0, sched::ReleaseKv{{"tenant-a", "nobody"}});
  EXPECT_EQ(r.status.code(), StatusCode::kNotFound);

  (*engine)->shutdown(std::chrono::milliseconds(0));
  r = send(**engine, 0, sched::SnapshotState{});
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
}

TEST(EngineInbox, SchedulerParamsTakeEffect) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(testing::stories_config(ServingMode::kColocated));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  CommandReply r = send(**engine, 0, sched::SetSchedulerParams{.max_num_seqs = 1});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.state.scheduler.max_num_seqs, 1);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 4; ++i) {
    auto h = (*engine)->submit(long_request("s" + std::to_string(i), 40));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  // While they run, the worker never owns more than one sequence.
  int max_owned = 0, snapshots = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((*engine)->stats().requests_finished < 4 && std::chrono::steady_clock::now() < deadline) {
    r = send(**engine, 0, sched::SnapshotState{});
    ASSERT_TRUE(r.status.ok());
    max_owned = std::max(max_owned, static_cast<int>(r.state.sequences.size()));
    ++snapshots;
  }
  EXPECT_EQ(max_owned, 1) << snapshots << " snapshots";
  for (RequestHandle& h : handles) {
    Collected c = collect(h);
    ASSERT_FALSE(c.timed_out);
    EXPECT_TRUE(c.final_event.status.ok());
    EXPECT_EQ(c.tokens.size(), 40u);
  }
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// ReleaseKv drops the KV and the sequence recomputes it, also where it could swap it out.
TEST(EngineInbox, ReleaseKvRecomputesBitExactlyAndIsTenantScoped) {
  KVSPLIT_REQUIRE_MODELS();
  for (const bool tiers : {false, true}) {
    SCOPED_TRACE(tiers ? "swap to a host tier" : "no tiers");
    EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
    if (tiers) {
      cfg.temporal.host_capacity_mb = 1;
      cfg.temporal.swap = SwapMode::kAlways;
    }
    auto engine = EngineImpl::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<int> initial = testing::free_blocks(**engine);
    Collected alone = collect(*(*engine)->submit(long_request("alone")));
    ASSERT_TRUE(alone.final_event.status.ok());

    // Let it decode a little, a step at a time, and keep the worker held between steps there (the
    // inbox is still served; decoding freely up to the hold, it could finish first).
    (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
    auto h = (*engine)->submit(long_request("r"));
    ASSERT_TRUE(h.ok());
    std::vector<int32_t> tokens;
    ASSERT_TRUE(testing::step_to_tokens(**engine, 0, *h, 5, &tokens));

    CommandReply r = send(**engine, 0, sched::ReleaseKv{{"tenant-b", "r"}});
    EXPECT_EQ(r.status.code(), StatusCode::kNotFound);  // another tenant's request: not found
    r = send(**engine, 0, sched::SnapshotState{});
    ASSERT_EQ(r.state.sequences.size(), 1u);
    EXPECT_TRUE(r.state.sequences[0].running);
    EXPECT_GT(r.state.sequences[0].num_blocks, 0);
    EXPECT_LT(r.state.free_blocks, r.state.total_blocks);

    r = send(**engine, 0, sched::ReleaseKv{{"tenant-a", "r"}});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    ASSERT_EQ(r.state.sequences.size(), 1u);
    EXPECT_FALSE(r.state.sequences[0].running);
    EXPECT_EQ(r.state.sequences[0].num_blocks, 0);
    EXPECT_EQ(r.state.sequences[0].num_computed, 0);
    EXPECT_EQ(r.state.sequences[0].preemptions, 1);
    EXPECT_EQ(r.state.free_blocks, r.state.total_blocks);

    (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
    Collected rest = collect(*h);
    ASSERT_FALSE(rest.timed_out);
    ASSERT_TRUE(rest.final_event.status.ok()) << rest.final_event.status.to_string();
    tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
    EXPECT_EQ(tokens, alone.tokens);  // the recompute rebuilt the same KV
    EXPECT_EQ(rest.final_event.timings.preemptions, 1);
    EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  }
}

// A prompt the worker took from the router waits for its prefill with its pages reserved:
// ReleaseKv gives those back too, and the prompt is computed later all the same.
TEST(EngineInbox, ReleaseKvOfAWaitingPromptGivesBackItsPages) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(testing::stories_config(ServingMode::kColocated));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  // Held before its first forward pass: the worker admits the prompt (its pages reserved) and
  // serves the inbox, but computes nothing.
  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto h = (*engine)->submit(long_request("w", 8));
  ASSERT_TRUE(h.ok());
  CommandReply r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    r = send(**engine, 0, sched::SnapshotState{});
  } while ((r.state.sequences.empty() || r.state.sequences[0].num_blocks == 0) &&
           std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(r.state.sequences.size(), 1u);
  ASSERT_FALSE(r.state.sequences[0].running);
  ASSERT_GT(r.state.sequences[0].num_blocks, 0);
  EXPECT_LT(r.state.free_blocks, r.state.total_blocks);

  r = send(**engine, 0, sched::ReleaseKv{{"tenant-a", "w"}});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ASSERT_EQ(r.state.sequences.size(), 1u);
  EXPECT_EQ(r.state.sequences[0].num_blocks, 0);
  EXPECT_EQ(r.state.free_blocks, r.state.total_blocks);

  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  Collected c = collect(*h);
  ASSERT_FALSE(c.timed_out);
  ASSERT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
  EXPECT_EQ(c.tokens.size(), 8u);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

}  // namespace
}  // namespace kvsplit

namespace kvsplit {
namespace {

// Per-worker devices, round-robin over EngineConfig::devices (prefill workers first), and the
// KV handoff route each pair of devices takes: same device, or a peer copy (CPU backends of
// different virtual devices can read each other, as GPUs with peer access).
TEST(EngineDevices, RoundRobinAndHandoffRoutes) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);  // 1 prefill, 2 decode
  cfg.devices = {0, 1};
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ASSERT_EQ((*engine)->num_workers(), 3u);
  const int want_device[] = {0, 1, 0};
  for (size_t w = 0; w < 3; ++w) {
    EXPECT_EQ(send(**engine, w, sched::SnapshotState{}).state.device, want_device[w]) << w;
  }
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 8; ++i) {
    auto h = (*engine)->submit(long_request("d" + std::to_string(i), 12));
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  for (RequestHandle& h : handles) EXPECT_TRUE(collect(h).final_event.status.ok());
  int64_t total = 0;
  for (size_t w = 1; w < 3; ++w) {
    const sched::WorkerState st = send(**engine, w, sched::SnapshotState{}).state;
    const int64_t same = st.handoffs_by_route[static_cast<int>(sched::KvCopyRoute::kSameDevice)];
    const int64_t peer = st.handoffs_by_route[static_cast<int>(sched::KvCopyRoute::kPeer)];
    EXPECT_EQ(st.handoffs_by_route[static_cast<int>(sched::KvCopyRoute::kStaged)], 0);
    if (st.device == 0) {
      EXPECT_EQ(peer, 0) << st.worker;  // prefill-0 is on device 0 too
    }
    if (st.device == 1) {
      EXPECT_EQ(same, 0) << st.worker;
    }
    total += same + peer;
  }
  EXPECT_EQ(total, 8);

  cfg.devices = {0, 2000};
  EXPECT_EQ(EngineImpl::create(cfg).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvsplit
