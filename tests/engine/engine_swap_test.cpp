// The temporal cut in the engine: sequences preempted under memory pressure are swapped out to the
// host tier and resumed without recompute, producing exactly the tokens they produce alone; every
// block and host slot comes back.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "kv/disk_tier.h"
#include "start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

const char* kSwapPrompts[] = {"Once upon a time", "The little dog", "Lily and Ben went",
                              "One day, a bird"};

struct SwapRun {
  std::vector<Collected> results;
  EngineStats stats;
  PoolStats pool;
  bool back_to_initial = false;
  int64_t disk_records = -1;      // left in the decoding worker's disk tier at the end
  int host_prefetch_blocks = -1;  // held by host prefetches in the decoding worker at the end
};

std::vector<Request> swap_requests() {
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.request_id = "s" + std::to_string(i);
    r.prompt = kSwapPrompts[i % 4];
    r.sampling.max_tokens = 90;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    r.sampling.seed = 500 + i;
    reqs.push_back(r);
  }
  return reqs;
}

// How a run copies: the host-tier prefetch on or off, the CPU backend's copy thread
// (EngineConfig::async_copies) and the delay before each fenced batch starts (a slow link).
struct CopySetup {
  bool host_prefetch = true;
  bool async_copies = false;
  int64_t delay_us = 0;
  kv::DiskFaultHook disk_faults;  // the decoding worker's disk tier (InternalOptions)
};

// Eight sequences pulled together into a colocated pool of 12 blocks (192 tokens): they outgrow
// it and are preempted.
SwapRun run_under_pressure(ServingMode serving, SwapMode mode, int64_t host_mb, int step_size = 1,
                           const std::string& disk_path = "",
                           std::optional<SwapMode> class_swap = std::nullopt, int shards = 1,
                           CopySetup copies = {}) {
  EngineConfig cfg = testing::stories_config(serving);
  cfg.temporal.host_prefetch = copies.host_prefetch;
  cfg.async_copies = copies.async_copies;
  EngineImpl::InternalOptions io;
  io.fenced_copy_delay_us = copies.delay_us;
  io.disk_fault_hook = copies.disk_faults;
  cfg.sla_classes[0].swap = class_swap;
  cfg.temporal.disk_path = disk_path;
  cfg.temporal.disk_capacity_mb = 64;
  cfg.num_decode_workers = 1;
  cfg.handoff_timeout_ms = 60000;
  cfg.kv_blocks_per_worker = 12 / shards;  // the same 12 blocks over the shard group
  cfg.block_size = 16;
  cfg.spatial.shards = shards;
  cfg.spatial.spatial_chunk_size = 16;  // every sequence alternates pages over the shards
  cfg.temporal.host_capacity_mb = host_mb;
  cfg.temporal.swap = mode;
  cfg.temporal.temporal_step_size = step_size;
  SwapRun run;
  auto engine = EngineImpl::create(cfg, io);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return run;
  const std::vector<int> initial = testing::free_blocks(**engine);
  std::vector<RequestHandle> handles;
  const std::vector<Request> reqs = swap_requests();
  {
    // All eight start together on the decoding pool (one block each there), however the prefill
    // thread is scheduled: handed over one at a time, each could finish before the next arrived
    // and the pool would never be outgrown.
    testing::StartTogether together(**engine, serving);
    for (const Request& r : reqs) {
      auto h = (*engine)->submit(r);
      EXPECT_TRUE(h.ok()) << h.status().to_string();
      if (h.ok()) handles.push_back(*h);
    }
    const int n = static_cast<int>(reqs.size());
    EXPECT_TRUE(together.release(n, n));
  }
  for (RequestHandle& h : handles) run.results.push_back(collect(h));
  run.back_to_initial = testing::pools_back_to(**engine, initial);
  run.disk_records = (*engine)->worker_snapshots().back().kv_disk_records;
  run.host_prefetch_blocks = (*engine)->worker_snapshots().back().kv_host_prefetch_blocks;
  run.stats = (*engine)->stats();
  // The decoding pool's counters (the last pool: colocated-0, or decode-0 after prefill-0).
  run.pool = run.stats.pools.back();
  return run;
}

std::vector<Collected> alone() {
  std::vector<Collected> out;
  auto big = Engine::create(testing::stories_config(ServingMode::kColocated));
  EXPECT_TRUE(big.ok());
  for (const Request& r : swap_requests()) out.push_back(collect(*(*big)->submit(r)));
  return out;
}

void expect_tokens_alone(const SwapRun& run, const std::vector<Collected>& ref) {
  ASSERT_EQ(run.results.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_FALSE(run.results[i].timed_out);
    ASSERT_TRUE(run.results[i].final_event.status.ok())
        << run.results[i].final_event.status.to_string();
    EXPECT_EQ(run.results[i].tokens, ref[i].tokens) << "request " << i;
    EXPECT_EQ(run.results[i].tokens.size(), 90u);
  }
}

class EngineSwap : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EngineSwap, SwapAlwaysResumesWithoutRecomputeAndKeepsTokens) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  const SwapRun run = run_under_pressure(GetParam(), SwapMode::kAlways, 16);
  expect_tokens_alone(run, ref);
  const PoolStats& p = run.pool;
  EXPECT_GT(run.stats.preemptions, 0);
  EXPECT_GT(p.kv_swaps_out, 0);
  EXPECT_EQ(p.kv_swaps_in, p.kv_swaps_out);  // every swapped sequence resumed
  EXPECT_EQ(p.kv_swap_choices, p.kv_swaps_out);
  EXPECT_EQ(p.kv_recompute_choices, 0);
  EXPECT_EQ(p.kv_swap_fallbacks, 0);
  EXPECT_GT(p.kv_swap_bytes, 0);
  // Every preemption was a swap: nothing was recomputed.
  EXPECT_EQ(run.stats.preemptions, p.kv_swaps_out);
  EXPECT_TRUE(run.back_to_initial);
  EXPECT_EQ(p.kv_pages_host, 0);
  EXPECT_EQ(p.kv_host_bytes_used, 0);
}

// The spatial cut under memory pressure: sequences spread over a shard group are swapped out of
// every shard (host tier, or the disk tier when there is none) instead of being recomputed and
// resume with the greedy tokens they produce alone, unsharded; every shard's blocks, the host
// slots and the disk records come back.
TEST_P(EngineSwap, ShardedSequencesSwapOutOfEveryShardAndResume) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  for (int shards : {2, 3}) {
    for (bool disk : {false, true}) {
      SCOPED_TRACE(std::to_string(shards) + " shards, " + (disk ? "disk" : "host") + " tier");
      testing::TempDir dir;
      const SwapRun run = run_under_pressure(GetParam(), SwapMode::kAlways, disk ? 0 : 16, 1,
                                             disk ? dir.path().string() : "", std::nullopt, shards);
      ASSERT_EQ(run.results.size(), ref.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_FALSE(run.results[i].timed_out);
        ASSERT_TRUE(run.results[i].final_event.status.ok())
            << run.results[i].final_event.status.to_string();
        EXPECT_EQ(run.results[i].tokens.size(), 90u);
        // Greedy rows are token-exact; sampled rows may differ in the last fp bits of the
        // sharded merge (docs/kv-cuts.md, spatial cut), so only their length is checked.
        if (i % 2 == 0) {
          EXPECT_EQ(run.results[i].tokens, ref[i].tokens) << "request " << i;
        }
      }
      const PoolStats& p = run.pool;
      EXPECT_EQ(p.kv_shards, shards);
      EXPECT_GT(run.stats.preemptions, 0);
      EXPECT_GT(p.kv_swaps_out, 0);
      EXPECT_EQ(run.stats.preemptions, p.kv_swaps_out);  // none recomputed
      EXPECT_EQ(p.kv_swaps_in, p.kv_swaps_out);
      EXPECT_EQ(p.kv_swap_fallbacks, 0);
      EXPECT_EQ(p.kv_swaps_to_disk, disk ? p.kv_swaps_out : 0);
      EXPECT_TRUE(run.back_to_initial);  // every shard's blocks (the group's free count)
      EXPECT_EQ(p.kv_pages_remote, 0);
      EXPECT_EQ(p.kv_pages_host, 0);
      EXPECT_EQ(p.kv_host_bytes_used, 0);
      EXPECT_EQ(run.disk_records, 0);
    }
  }
}

TEST_P(EngineSwap, SwapNeverRecomputesAndKeepsTokens) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  const SwapRun run = run_under_pressure(GetParam(), SwapMode::kNever, 16);
  expect_tokens_alone(run, ref);
  const PoolStats& p = run.pool;
  EXPECT_GT(run.stats.preemptions, 0);
  EXPECT_EQ(p.kv_swaps_out, 0);
  EXPECT_EQ(p.kv_swap_choices, 0);
  EXPECT_TRUE(run.back_to_initial);
}

TEST_P(EngineSwap, LongResumeIntervalStillFinishesEverything) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  // Paused sequences wait 8 steps of the others before they are considered again.
  const SwapRun run = run_under_pressure(GetParam(), SwapMode::kAlways, 16, /*step_size=*/8);
  expect_tokens_alone(run, ref);
  EXPECT_GT(run.pool.kv_swaps_out, 0);
  EXPECT_EQ(run.pool.kv_swaps_in, run.pool.kv_swaps_out);
  EXPECT_TRUE(run.back_to_initial);
}

TEST_P(EngineSwap, DiskTierTakesTheSwapsWithoutAHostTierAndPrefetchesThem) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  testing::TempDir dir;
  const SwapRun run =
      run_under_pressure(GetParam(), SwapMode::kAlways, /*host_mb=*/0, 1, dir.path().string());
  expect_tokens_alone(run, ref);
  EXPECT_GT(run.pool.kv_swaps_to_disk, 0);
  EXPECT_EQ(run.pool.kv_swaps_to_disk, run.pool.kv_swaps_out);
  EXPECT_EQ(run.pool.kv_swaps_in, run.pool.kv_swaps_out);
  EXPECT_EQ(run.pool.kv_disk_faults, 0);
  // kv.disk.write_behind is on by default: every disk swap-out returned before its write.
  EXPECT_EQ(run.pool.kv_disk_write_behind, run.pool.kv_swaps_to_disk);
  EXPECT_EQ(run.pool.kv_disk_write_behind_rescues, 0);
  // Every resume read from disk is a prefetch hit or a miss; sequences that wait for room are
  // read a step ahead, so some resume without waiting.
  EXPECT_EQ(run.pool.kv_prefetch_hits + run.pool.kv_prefetch_misses, run.pool.kv_swaps_in);
  EXPECT_GT(run.pool.kv_prefetch_hits, 0);
  std::printf("prefetch: %lld hits, %lld misses\n",
              static_cast<long long>(run.pool.kv_prefetch_hits),
              static_cast<long long>(run.pool.kv_prefetch_misses));
  EXPECT_TRUE(run.back_to_initial);
}

// Every read of the disk tier fails (EIO): each swap-in the worker tries falls back to recompute
// (Worker::swap_in_ready: release_kv, then the prompt and its tokens again), with the tokens of an
// unbounded pool, and every device block and disk record comes back.
TEST_P(EngineSwap, DiskReadsThatFailFallBackToRecomputeAndLeaveNothing) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  testing::TempDir dir;
  CopySetup copies;
  copies.disk_faults = kv::inject_next(kv::IoOp::kRead, kv::InjectedFault::kIoError, 1 << 20);
  const SwapRun run = run_under_pressure(GetParam(), SwapMode::kAlways, /*host_mb=*/0, 1,
                                         dir.path().string(), std::nullopt, 1, copies);
  expect_tokens_alone(run, ref);
  EXPECT_GT(run.pool.kv_swaps_to_disk, 0);
  EXPECT_EQ(run.pool.kv_swaps_in, 0);  // not one read came back
  EXPECT_GT(run.pool.kv_swap_fallbacks, 0);
  EXPECT_GT(run.pool.kv_disk_faults, 0);
  EXPECT_TRUE(run.back_to_initial);
  EXPECT_EQ(run.disk_records, 0);
}

// Cancelling sequences whose swap-in was read ahead and not yet used: the reads are dropped and
// every device block, host slot and disk record comes back.
// Two sequences that each need the whole pool by their end, preempted by recompute (a recompute
// samples nothing and ends on a block boundary, and a prefilling sequence is never a victim):
// the lower-priority one is preempted once and restarts when the other can finish; both finish
// with their tokens alone, whatever the pool's slack.
TEST(EngineSwapRecompute, TwoSequencesEachFillingThePoolTakeTurnsAndFinish) {
  KVSPLIT_REQUIRE_MODELS();
  for (int blocks : {8, 9, 10, 13}) {
    SCOPED_TRACE("pool of " + std::to_string(blocks) + " blocks");
    EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
    cfg.block_size = 16;
    cfg.kv_blocks_per_worker = blocks;
    cfg.temporal.swap = SwapMode::kNever;
    auto engine = EngineImpl::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<int> initial = testing::free_blocks(**engine);
    std::vector<Request> reqs(2);
    for (int i = 0; i < 2; ++i) {
      reqs[i].request_id = "fill" + std::to_string(i);
      reqs[i].prompt_token_ids = std::vector<int32_t>(16, 40 + 7 * i);  // exactly one block
      // 16 + 112 = 128 tokens: 8 blocks, the whole of the smallest pool.
      reqs[i].sampling.max_tokens = 112;
      reqs[i].sampling.ignore_eos = true;
      reqs[i].sampling.temperature = 0;
    }
    // The first served first and preempted last whatever the machine's timing (the victim's
    // predictor ranks priority before the step-interval EWMA).
    reqs[0].priority = 1;
    std::vector<Collected> ref;
    for (const Request& r : reqs) ref.push_back(collect(*(*engine)->submit(r)));
    std::vector<RequestHandle> handles;
    {
      // Both pulled before either runs (submitted to a running worker, the first could finish
      // before the second was pulled on a slow machine, and nothing was preempted).
      testing::StartTogether together(**engine, ServingMode::kColocated);
      for (const Request& r : reqs) handles.push_back(*(*engine)->submit(r));
      ASSERT_TRUE(together.release(2, 0));
    }
    std::vector<int> preemptions;
    for (int i = 0; i < 2; ++i) {
      const Collected got = collect(handles[i], std::chrono::seconds(120));
      ASSERT_FALSE(got.timed_out) << "request " << i << " made no progress";
      ASSERT_TRUE(got.final_event.status.ok()) << got.final_event.status.to_string();
      EXPECT_EQ(got.tokens, ref[i].tokens) << "request " << i;
      EXPECT_EQ(got.tokens.size(), 112u);
      preemptions.push_back(got.final_event.timings.preemptions);
    }
    // The lower-priority one is preempted once, and its restart waits until the other can reach
    // its last position (without that rule it was preempted again at each of the other's blocks).
    EXPECT_EQ(preemptions[0], 0);
    EXPECT_EQ(preemptions[1], 1);
    EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  }
}

// MigrateKv of a swapped-out sequence's pages from the host tier back to the device (the KV
// cache manager's migrate_to_emptiest_shard prefers such sequences): with every page back, the
// Scheduler resumes it once its next token has room (it used to stay waiting with all its KV,
// which no rule resumed: it never finished). Three sequences in 12 blocks of 16 tokens, 16-token
// prompts: at the 5th block each, C (the lowest priority) is swapped out with 4 pages; A ends at
// position 79 and frees 5, so C's pages fit until B takes its 9th block (about 33 steps later).
// The swapped sequence waits far longer than that (temporal_step_size); the test lets the worker
// through a step at a time and catches it at a held step boundary.
TEST(EngineSwapMigrate, ASequenceMigratedBackFromTheHostTierResumes) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 12;
  cfg.temporal.swap = SwapMode::kAlways;
  cfg.temporal.host_capacity_mb = 16;
  cfg.temporal.temporal_step_size = 100000;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  std::vector<Request> reqs(3);
  const int max_tokens[] = {64, 176, 112};  // B needs the whole pool by its end
  for (int i = 0; i < 3; ++i) {
    reqs[i].request_id = std::string(1, static_cast<char>('A' + i));
    reqs[i].prompt_token_ids = std::vector<int32_t>(16, 40 + 7 * i);
    reqs[i].sampling.max_tokens = max_tokens[i];
    reqs[i].sampling.ignore_eos = true;
    reqs[i].sampling.temperature = 0;
    reqs[i].priority = 2 - i;
  }
  std::vector<Collected> ref;
  for (const Request& r : reqs) ref.push_back(collect(*e.submit(r)));
  auto send = [&](sched::WorkerCommand c) {
    auto f = e.send_command(0, std::move(c));
    EXPECT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    return f.get();
  };
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) handles.push_back(*e.submit(r));
  bool migrated = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!migrated && std::chrono::steady_clock::now() < deadline) {
    const sched::CommandReply rep = send(sched::SnapshotState{});
    bool a_done = true;
    const sched::SequenceState* c = nullptr;
    for (const sched::SequenceState& q : rep.state.sequences) {
      a_done = a_done && q.key.request_id != "A";
      int device_pages = 0;
      for (int n : q.pages_per_shard) device_pages += n;
      if (q.key.request_id == "C" && !q.running && q.preemptions > 0 && q.num_blocks > 0 &&
          device_pages == 0)
        c = &q;
    }
    if (c != nullptr && a_done) {
      const sched::CommandReply m = send(sched::MigrateKv{c->key, 0, -1, 0});
      migrated = m.status.ok();
      if (!migrated) {
        EXPECT_EQ(m.status.code(), StatusCode::kResourceExhausted) << m.status.to_string();
      }
    }
    if (migrated) break;
    // One step at a time: the worker holds again by itself after one step (a hold released and
    // set again from here let it run many steps when this thread was slow, and C's window of
    // about 33 steps could pass unseen).
    const int64_t steps = rep.state.steps;
    e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kOneStep);
    while (send(sched::SnapshotState{}).state.steps == steps &&
           std::chrono::steady_clock::now() < deadline) {
    }
  }
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  ASSERT_TRUE(migrated) << "C was never caught swapped out with room to bring it back";
  for (int i = 0; i < 3; ++i) {
    const Collected got = collect(handles[i], std::chrono::seconds(30));
    ASSERT_FALSE(got.timed_out) << "request " << reqs[i].request_id << " never finished";
    ASSERT_TRUE(got.final_event.status.ok()) << got.final_event.status.to_string();
    EXPECT_EQ(got.tokens, ref[i].tokens) << "request " << reqs[i].request_id;
  }
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const PoolStats p = e.stats().pools[0];
  EXPECT_EQ(p.kv_pages_host, 0);
  EXPECT_EQ(p.kv_host_bytes_used, 0);
  // Every sequence swapped out came back in, C by the resume of no pages after its migration.
  EXPECT_GT(p.kv_swaps_out, 0);
  EXPECT_EQ(p.kv_swaps_in, p.kv_swaps_out);
}

TEST(EngineSwapPrefetch, CancelDuringAPrefetchReleasesEverything) {
  KVSPLIT_REQUIRE_MODELS();
  testing::TempDir dir;
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.kv_blocks_per_worker = 12;
  cfg.block_size = 16;
  cfg.temporal.swap = SwapMode::kAlways;
  cfg.temporal.disk_path = dir.path().string();
  cfg.temporal.disk_capacity_mb = 64;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  // The worker a step at a time from the first (housekeeping, cancels included, goes on while it
  // is held), held on the first step boundary where a read-ahead is pending. (Sampled at random
  // boundaries of a free-running worker, a pending read-ahead could be missed every time.)
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  std::vector<RequestHandle> handles;
  const std::vector<Request> reqs = swap_requests();
  for (const Request& r : reqs) handles.push_back(*e.submit(r));
  const bool caught =
      testing::step_until(e, 0, [&] { return e.worker_snapshots()[0].kv_prefetch_pending > 0; });
  ASSERT_TRUE(caught) << "no read-ahead seen pending";
  for (const Request& r : reqs) e.cancel(r.tenant, r.request_id);
  for (RequestHandle& h : handles) {
    const Collected c = collect(h);
    EXPECT_FALSE(c.timed_out);
  }
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const auto settled = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  sched::WorkerSnapshot w = e.worker_snapshots().back();
  while ((w.kv_disk_records != 0 || w.kv_prefetch_pending != 0) &&
         std::chrono::steady_clock::now() < settled) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    w = e.worker_snapshots().back();
  }
  EXPECT_GT(w.kv_prefetch_dropped, 0);
  EXPECT_EQ(w.kv_prefetch_pending, 0);
  EXPECT_EQ(w.kv_disk_records, 0);
  EXPECT_EQ(w.kv_host_slots_used, 0);
  EXPECT_EQ(w.pool.kv_pages_host, 0);
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
}

// The host tier's prefetch (docs/kv-cuts.md, "Swap predictor and prefetch"): a sequence about
// to resume gets its blocks and its host -> device copy a step early, on the worker's copy thread
// (async_copies). Every request gets the tokens it gets alone (greedy and seeded sampling) with
// the prefetch off, on with its copies made at once (hits), on the copy thread, and on with each
// copy held 50 ms on a slow link, still in flight when that step runs (the swap-in is put off a
// step while other rows run: deferred, else a miss); every swap-in from the host tier is a hit or
// a miss; every block, slot and prefetch comes back.
class EngineSwapHostPrefetch : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EngineSwapHostPrefetch, SameTokensOffLandedAndInFlight) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  struct Case {
    const char* name;
    CopySetup copies;
  };
  // Copied at once (no copy thread): every prefetch a swap-in uses has landed, so hits are
  // certain. On the copy thread they depend on timing (the loaded sanitizer runs), so only the
  // accounting is asserted there.
  const Case cases[] = {{"off", {false, true, 0}},
                        {"on, copied at once", {true, false, 0}},
                        {"on, copy thread", {true, true, 0}},
                        {"on, in flight", {true, true, 50000}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const SwapRun run =
        run_under_pressure(GetParam(), SwapMode::kAlways, 16, 1, "", std::nullopt, 1, c.copies);
    expect_tokens_alone(run, ref);
    const PoolStats& p = run.pool;
    EXPECT_GT(p.kv_swaps_out, 0);
    EXPECT_EQ(p.kv_swaps_in, p.kv_swaps_out);
    EXPECT_EQ(p.kv_swap_fallbacks, 0);
    EXPECT_EQ(p.kv_host_prefetch_hits + p.kv_host_prefetch_misses, p.kv_swaps_in);
    // A prefetch is used by one swap-in or dropped.
    EXPECT_LE(p.kv_host_prefetches - p.kv_host_prefetch_dropped, p.kv_swaps_in);
    EXPECT_GE(p.kv_host_prefetches, p.kv_host_prefetch_dropped);
    if (!c.copies.host_prefetch) {
      EXPECT_EQ(p.kv_host_prefetches, 0);
      EXPECT_EQ(p.kv_host_prefetch_hits, 0);
      EXPECT_EQ(p.kv_host_prefetch_dropped, 0);
    } else {
      EXPECT_GT(p.kv_host_prefetches, 0);
      if (!c.copies.async_copies) {
        EXPECT_GT(p.kv_host_prefetch_hits, 0);
      } else if (c.copies.delay_us > 0) {
        EXPECT_GT(p.kv_host_prefetch_deferred, 0);  // others decoded while the copy flew
      }
    }
    if (!c.copies.host_prefetch || !c.copies.async_copies) {
      EXPECT_EQ(p.kv_host_prefetch_deferred, 0);  // nothing was ever in flight
    }
    std::printf(
        "%s: %lld host prefetches, %lld hits, %lld misses, %lld dropped, %lld deferred, %lld "
        "swap-ins\n",
        c.name, static_cast<long long>(p.kv_host_prefetches),
        static_cast<long long>(p.kv_host_prefetch_hits),
        static_cast<long long>(p.kv_host_prefetch_misses),
        static_cast<long long>(p.kv_host_prefetch_dropped),
        static_cast<long long>(p.kv_host_prefetch_deferred), static_cast<long long>(p.kv_swaps_in));
    EXPECT_TRUE(run.back_to_initial);
    EXPECT_EQ(run.host_prefetch_blocks, 0);
    EXPECT_EQ(p.kv_pages_full, 0);
    EXPECT_EQ(p.kv_pages_host, 0);
    EXPECT_EQ(p.kv_host_bytes_used, 0);
  }
}

// The spatial cut: sharded sequences' host prefetches place their blocks over the group; the
// greedy tokens are those alone, and every shard's blocks come back.
TEST_P(EngineSwapHostPrefetch, ShardedSequencesPrefetchOntoTheGroup) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  const SwapRun run = run_under_pressure(GetParam(), SwapMode::kAlways, 16, 1, "", std::nullopt, 2,
                                         CopySetup{true, true, 0});
  ASSERT_EQ(run.results.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(run.results[i].final_event.status.ok());
    if (i % 2 == 0) {
      EXPECT_EQ(run.results[i].tokens, ref[i].tokens) << "request " << i;
    }
  }
  EXPECT_GT(run.pool.kv_host_prefetches, 0);
  EXPECT_EQ(run.pool.kv_host_prefetch_hits + run.pool.kv_host_prefetch_misses,
            run.pool.kv_swaps_in);
  EXPECT_TRUE(run.back_to_initial);
  EXPECT_EQ(run.host_prefetch_blocks, 0);
  EXPECT_EQ(run.pool.kv_pages_full, 0);
}

// Holds the forward pass of the workers of `role` at a step boundary where `ready` holds for the
// last worker's snapshot three times 20 ms apart with no step in between; true once caught (the
// hold is then on), false after `limit`.
template <typename Ready>
bool hold_when(EngineImpl& e, sched::WorkerRole role, Ready ready,
               std::chrono::seconds limit = std::chrono::seconds(60)) {
  auto held = [&] {
    // A command is answered at the worker's next step boundary: a step that was past its hold
    // check when the hold was set has ended by then, and the next one holds.
    auto reply = e.send_command(e.worker_snapshots().size() - 1, sched::SnapshotState{});
    if (reply.wait_for(std::chrono::seconds(30)) != std::future_status::ready) return false;
    int64_t steps = -1;
    for (int k = 0; k < 3; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const sched::WorkerSnapshot w = e.worker_snapshots().back();
      if (!ready(w) || (steps >= 0 && w.steps != steps)) return false;
      steps = w.steps;
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    e.set_test_hold(role, sched::TestHold::kForward);
    if (held()) return true;
    e.set_test_hold(role, sched::TestHold::kNone);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// Submits swap_requests() and holds `role` once `ready` holds (hold_when). The state lasts a few
// steps, so a loaded machine can miss it during one run of the workload: then that run is drained
// and the workload submitted again, up to four times. The caught run's handles are in `handles`.
template <typename Ready>
bool submit_and_hold_when(EngineImpl& e, sched::WorkerRole role, Ready ready,
                          std::vector<RequestHandle>* handles) {
  for (int round = 0; round < 4; ++round) {
    handles->clear();
    for (const Request& r : swap_requests()) handles->push_back(*e.submit(r));
    if (hold_when(e, role, ready, std::chrono::seconds(15))) return true;
    for (RequestHandle& h : *handles) (void)collect(h);
  }
  return false;
}

EngineConfig host_prefetch_config(ServingMode mode) {
  EngineConfig cfg = testing::stories_config(mode);
  cfg.num_decode_workers = 1;
  cfg.handoff_timeout_ms = 60000;
  cfg.kv_blocks_per_worker = 12;
  cfg.block_size = 16;
  cfg.temporal.swap = SwapMode::kAlways;
  cfg.temporal.host_capacity_mb = 16;
  cfg.async_copies = true;
  return cfg;
}

// Requests cancelled while their host prefetch's copy is in flight (each held 200 ms): the
// copies are waited for, the reserved blocks and the host slots come back, nothing is held.
TEST(EngineSwapHostPrefetch, CancelDuringAHostPrefetchLeavesEveryPoolEmpty) {
  KVSPLIT_REQUIRE_MODELS();
  EngineImpl::InternalOptions io;
  io.fenced_copy_delay_us = 200000;
  auto engine = EngineImpl::create(host_prefetch_config(ServingMode::kColocated), io);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  std::vector<RequestHandle> handles;
  const std::vector<Request> reqs = swap_requests();
  ASSERT_TRUE(submit_and_hold_when(
      e, sched::WorkerRole::kColocated,
      [](const sched::WorkerSnapshot& w) { return w.kv_host_prefetch_pending > 0; }, &handles))
      << "no host prefetch seen pending";
  const sched::WorkerSnapshot caught = e.worker_snapshots().back();
  EXPECT_GT(caught.kv_host_prefetch_blocks, 0);
  for (const Request& r : reqs) e.cancel(r.tenant, r.request_id);
  for (RequestHandle& h : handles) EXPECT_FALSE(collect(h).timed_out);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const sched::WorkerSnapshot w = e.worker_snapshots().back();
  EXPECT_GE(w.pool.kv_host_prefetch_dropped,
            caught.pool.kv_host_prefetch_dropped + caught.kv_host_prefetch_pending);
  EXPECT_EQ(w.kv_host_prefetch_pending, 0);
  EXPECT_EQ(w.kv_host_prefetch_blocks, 0);
  EXPECT_EQ(w.pool.kv_pages_full, 0);
  EXPECT_EQ(w.kv_host_slots_used, 0);
  EXPECT_EQ(w.pool.kv_pages_host, 0);
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
}

// Memory pressure: a higher-priority handoff that fits only with the blocks a host prefetch
// holds is admitted at once (the prefetch is dropped, counted; its sequence keeps its host copy
// and resumes later): it neither waits nor preempts anyone. Every request gets its tokens alone;
// every block comes back.
TEST(EngineSwapHostPrefetch, AHandoffThatNeedsThePrefetchedBlocksTakesThem) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  // Copies held 200 ms: a prefetch started at a step boundary is still held at the next one.
  EngineImpl::InternalOptions io;
  io.fenced_copy_delay_us = 200000;
  auto engine = EngineImpl::create(host_prefetch_config(ServingMode::kDisaggregated), io);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  const std::vector<Request> reqs = swap_requests();
  std::vector<RequestHandle> handles;
  // The decode worker holds the rest of the eight (none still to be handed off), one swapped out
  // with a host prefetch: its published free blocks count the prefetched ones.
  ASSERT_TRUE(submit_and_hold_when(
      e, sched::WorkerRole::kDecode,
      [&e](const sched::WorkerSnapshot& w) {
        const PoolStats prefill = e.worker_snapshots().front().pool;
        return w.kv_host_prefetch_blocks >= 1 && prefill.running + prefill.waiting == 0;
      },
      &handles))
      << "no host prefetch seen held";
  const sched::WorkerSnapshot caught = e.worker_snapshots().back();
  const int owned = caught.pool.running + caught.pool.waiting;
  const int64_t preemptions = e.stats().preemptions;
  const int really_free = caught.pool.kv_blocks_free - caught.kv_host_prefetch_blocks;
  const int need = really_free + 1;  // its pages fit only with a prefetched block
  ASSERT_LE(need, caught.pool.kv_blocks_free);
  Request big;
  big.request_id = "big";
  big.priority = 5;
  big.prompt_token_ids = std::vector<int32_t>(need * 16 - 8, 57);
  big.sampling.max_tokens = 8;
  big.sampling.ignore_eos = true;
  big.sampling.temperature = 0;
  RequestHandle big_handle = *e.submit(big);
  // Admitted while the decode worker's forward pass is still held: the prefetch gave way.
  const auto admitted_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  sched::WorkerSnapshot w = e.worker_snapshots().back();
  while (w.pool.running + w.pool.waiting == owned &&
         std::chrono::steady_clock::now() < admitted_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    w = e.worker_snapshots().back();
  }
  EXPECT_EQ(w.pool.running + w.pool.waiting, owned + 1)
      << "caught: " << caught.pool.kv_blocks_free << " free (" << caught.kv_host_prefetch_blocks
      << " prefetched), " << need << " needed";
  EXPECT_EQ(w.steps, caught.steps);  // no step ran: the admission took the blocks
  EXPECT_GT(w.pool.kv_host_prefetch_dropped, caught.pool.kv_host_prefetch_dropped);
  EXPECT_LT(w.kv_host_prefetch_blocks, caught.kv_host_prefetch_blocks);
  EXPECT_EQ(e.stats().preemptions, preemptions);  // nobody paused for it
  e.set_test_hold(sched::WorkerRole::kDecode, sched::TestHold::kNone);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Collected got = collect(handles[i]);
    ASSERT_FALSE(got.timed_out);
    ASSERT_TRUE(got.final_event.status.ok()) << got.final_event.status.to_string();
    EXPECT_EQ(got.tokens, ref[i].tokens) << "request " << i;
  }
  const Collected big_got = collect(big_handle);
  ASSERT_TRUE(big_got.final_event.status.ok()) << big_got.final_event.status.to_string();
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const Collected big_alone = collect(*e.submit(big));
  EXPECT_EQ(big_got.tokens, big_alone.tokens);
  EXPECT_EQ(big_got.tokens.size(), 8u);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const sched::WorkerSnapshot end = e.worker_snapshots().back();
  EXPECT_EQ(end.kv_host_prefetch_blocks, 0);
  EXPECT_EQ(end.pool.kv_pages_full, 0);
  EXPECT_EQ(end.kv_host_slots_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineSwapHostPrefetch,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

TEST_P(EngineSwap, ClassOverridesTheEngineSwapMode) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Collected> ref = alone();
  // The engine says never, the (only) class says always.
  const SwapRun run =
      run_under_pressure(GetParam(), SwapMode::kNever, 16, 1, "", SwapMode::kAlways);
  expect_tokens_alone(run, ref);
  EXPECT_GT(run.pool.kv_swaps_out, 0);
  EXPECT_EQ(run.pool.kv_recompute_choices, 0);
  EXPECT_TRUE(run.back_to_initial);
}

TEST(EngineSwapConfig, BadTemporalConfigNamesTheField) {
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.temporal.temporal_step_size = 0;
  auto e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("temporal.temporal_step_size"), std::string::npos)
      << e.status().to_string();
  cfg = testing::stories_config(ServingMode::kColocated);
  cfg.temporal.host_capacity_mb = -1;
  e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("temporal.host_capacity_mb"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineSwap,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

}  // namespace
}  // namespace kvsplit
