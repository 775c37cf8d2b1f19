// sched::generate_batch's cancel flag and on_finish (BatchOptions): what `kvsplit generate` uses
// to stop at its first failed write. A cancel ends every unfinished input with kCancelled after
// no further forward pass and returns every page to the pool (device blocks, host tier slots,
// disk records); on_finish hands each finished input its output as it finishes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "disk_write_gate.h"
#include "e2e_util.h"
#include "kv/disk_tier.h"
#include "kv/swap.h"

namespace kvsplit::testing {
namespace {

std::vector<sched::GenerationInput> prompts(const model::Tokenizer& tok,
                                            const std::vector<int>& max_tokens) {
  const char* texts[] = {"Once upon a time", "The dog", "Lily went", "A bird"};
  std::vector<sched::GenerationInput> v;
  for (size_t i = 0; i < max_tokens.size(); ++i) {
    sched::GenerationInput in;
    in.prompt_ids = *tok.encode(texts[i % 4], true);
    in.params = greedy(max_tokens[i]);
    in.params.ignore_eos = true;
    v.push_back(in);
  }
  return v;
}

void expect_pool_empty(const kv::KvPool& pool) {
  EXPECT_EQ(pool.allocator().num_used(), 0);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
  if (pool.disk() != nullptr) {
    EXPECT_EQ(pool.disk()->stats().records, 0);
    EXPECT_EQ(pool.disk()->stats().extents_used, 0);
  }
}

// The flag set by the first text (as the CLI sets it when writing that text fails): every input
// ends kCancelled with the tokens of the step that produced that text, and nothing more.
TEST(BatchCancel, ACancelFromOnTextEndsEveryInputAfterThatStep) {
  KVSPLIT_REQUIRE_MODELS();
  auto e = make_engine("llama2c", 2, 256);
  ASSERT_NE(e, nullptr);
  const auto inputs = prompts(*e->loaded.tokenizer, {200, 200, 200, 200});
  std::atomic<bool> cancel{false};
  std::vector<int> tokens_at_cancel;  // each input's tokens when the flag was set
  int texts_after_cancel = 0;
  sched::BatchOptions bo;
  bo.cancel = &cancel;
  bo.on_text = [&](int, std::string_view) {
    if (cancel) ++texts_after_cancel;
    cancel = true;
  };
  int finished = 0;
  bo.on_finish = [&](int, const sched::GenerationOutput&) { ++finished; };
  auto out = sched::generate_batch(*e->model, *e->pool, e->loaded.tokenizer.get(), inputs, bo);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), inputs.size());
  int total = 0;
  for (size_t i = 0; i < out->size(); ++i) {
    EXPECT_EQ((*out)[i].finish_reason, FinishReason::kCancelled) << i;
    total += static_cast<int>((*out)[i].output_ids.size());
  }
  // All four prompts fit the first step's budget: each sampled its first token in that step,
  // whose texts came out (the others' texts of that step counted after the flag), then nothing.
  EXPECT_EQ(total, 4);
  EXPECT_EQ(texts_after_cancel, 3);
  EXPECT_EQ(finished, 0);  // not called for cancelled inputs
  expect_pool_empty(*e->pool);
}

TEST(BatchCancel, AFlagSetBeforeTheBatchRunsNothing) {
  KVSPLIT_REQUIRE_MODELS();
  auto e = make_engine("llama2c", 2, 64);
  ASSERT_NE(e, nullptr);
  const auto inputs = prompts(*e->loaded.tokenizer, {50, 50});
  std::atomic<bool> cancel{true};
  sched::BatchOptions bo;
  bo.cancel = &cancel;
  auto out = sched::generate_batch(*e->model, *e->pool, e->loaded.tokenizer.get(), inputs, bo);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  for (const sched::GenerationOutput& o : *out) {
    EXPECT_EQ(o.finish_reason, FinishReason::kCancelled);
    EXPECT_TRUE(o.output_ids.empty());
  }
  expect_pool_empty(*e->pool);
}

// on_finish: each finished input once, in the order they finish, with what the batch returns for
// it. Set from there (as the CLI does when a finished prompt's line cannot be written), the flag
// cancels the inputs still running.
TEST(BatchCancel, OnFinishInFinishOrderAndACancelFromIt) {
  KVSPLIT_REQUIRE_MODELS();
  auto e = make_engine("llama2c", 2, 256);
  ASSERT_NE(e, nullptr);
  const auto inputs = prompts(*e->loaded.tokenizer, {30, 5, 12});
  std::vector<std::pair<int, sched::GenerationOutput>> finished;
  sched::BatchOptions bo;
  bo.on_finish = [&](int i, const sched::GenerationOutput& o) { finished.emplace_back(i, o); };
  auto out = sched::generate_batch(*e->model, *e->pool, e->loaded.tokenizer.get(), inputs, bo);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(finished.size(), 3u);
  const int order[] = {1, 2, 0};  // 5, 12 then 30 tokens
  for (size_t k = 0; k < 3; ++k) {
    const auto& [i, o] = finished[k];
    EXPECT_EQ(i, order[k]) << k;
    const sched::GenerationOutput& r = (*out)[static_cast<size_t>(i)];
    EXPECT_EQ(o.output_ids, r.output_ids) << i;
    EXPECT_EQ(o.text, r.text) << i;
    EXPECT_EQ(o.finish_reason, FinishReason::kLength) << i;
    EXPECT_EQ(o.finish_reason, r.finish_reason) << i;
    EXPECT_EQ(o.effective_kv_byte_seconds, r.effective_kv_byte_seconds) << i;
    EXPECT_EQ(o.kv_token_seconds, r.kv_token_seconds) << i;
  }
  expect_pool_empty(*e->pool);

  std::atomic<bool> cancel{false};
  bo.cancel = &cancel;
  bo.on_finish = [&](int, const sched::GenerationOutput&) { cancel = true; };
  auto cut = sched::generate_batch(*e->model, *e->pool, e->loaded.tokenizer.get(), inputs, bo);
  ASSERT_TRUE(cut.ok()) << cut.status().to_string();
  EXPECT_EQ((*cut)[1].finish_reason, FinishReason::kLength);
  EXPECT_EQ((*cut)[1].output_ids, (*out)[1].output_ids);
  for (size_t i : {0u, 2u}) {
    EXPECT_EQ((*cut)[i].finish_reason, FinishReason::kCancelled) << i;
    // Stopped with input 1's 5 tokens, a prefix of what the whole run gave.
    EXPECT_EQ((*cut)[i].output_ids.size(), 5u) << i;
    EXPECT_TRUE(std::equal((*cut)[i].output_ids.begin(), (*cut)[i].output_ids.end(),
                           (*out)[i].output_ids.begin()))
        << i;
  }
  expect_pool_empty(*e->pool);
}

// Polls `done` every 200 us until it holds or `limit` has passed; whether it holds.
template <class F>
bool wait_until(F done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Opens `gate` once the batch is cancelled and a write is held, then either generate_batch has
// returned (one that does not wait for the writes its cancel detached) or kGrace has passed (one
// waiting for the held write, which cannot end before). kGrace bounds the time from the flag to
// the cancel's release at the start of the next step (no I/O, no forward pass): past it, a run
// only loses its power to catch a missing wait, it cannot fail spuriously. The 60 s bounds keep a
// broken batch (a swap-in waiting for a held write before any cancel) from hanging the test: it
// then fails on the counts. Sets *held_at_open to the writes held when it opened.
std::thread open_after_cancel(std::shared_ptr<kv::WriteGate> gate, const std::atomic<bool>& cancel,
                              const std::atomic<bool>& returned, int* held_at_open) {
  return std::thread([gate = std::move(gate), &cancel, &returned, held_at_open] {
    constexpr std::chrono::milliseconds kGrace{500}, kLong{60000};
    (void)wait_until([&] { return cancel.load(); }, kLong);
    (void)wait_until([&] { return gate->num_held() > 0; }, kLong);
    (void)wait_until([&] { return returned.load(); }, kGrace);
    *held_at_open = gate->num_held();
    gate->open();
  });
}

// A pool too small for the batch: preempted inputs are swapped out (host tier, or a disk tier
// with write-behind) when the cancel comes. Their pages come back too: host slots, disk records.
// On disk, a gate holds every write from the start, and the cancel comes with the first text
// after a swap-out: its write is in flight when the flag is set, so the cancel's release detaches
// it, and generate_batch must wait for it to end (the gate opens after the cancel) to free its
// record before returning.
TEST(BatchCancel, SwappedOutInputsGiveTheirHostAndDiskPagesBack) {
  KVSPLIT_REQUIRE_MODELS();
  for (const bool disk : {false, true}) {
    SCOPED_TRACE(disk ? "disk tier" : "host tier");
    auto e = make_engine("llama2c", 1, 512);
    ASSERT_NE(e, nullptr);
    kv::KvPoolConfig pc;
    pc.num_blocks = 12;  // 4 inputs of 160 positions need 40 blocks of 16
    pc.block_size = 16;
    if (!disk) pc.host_bytes = int64_t{64} << 20;
    auto pool = kv::KvPool::create(*e->backend, pc, e->model->kv_shape());
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    TempDir dir;
    auto gate = std::make_shared<kv::WriteGate>();
    if (disk) {
      kv::DiskTierConfig dc;
      dc.path = dir.path().string();
      dc.capacity_bytes = 64 << 20;
      dc.extent_bytes = 16 << 10;
      dc.io.wrap = [g = gate](std::unique_ptr<kv::BlockIo> io) -> std::unique_ptr<kv::BlockIo> {
        return std::make_unique<kv::GatedIo>(std::move(io), g);
      };
      auto tier = kv::DiskTier::open(dc);
      ASSERT_TRUE(tier.ok()) << tier.status().to_string();
      (*pool)->attach_disk(std::move(tier).value());
      (*pool)->set_disk_write_behind(true);
      gate->close();
    }
    const auto inputs = prompts(*e->loaded.tokenizer, {160, 160, 160, 160});
    std::atomic<bool> cancel{false}, returned{false};
    int texts = 0;
    int in_flight_at_cancel = 0;  // swap writes not ended when the flag was set (disk)
    kv::SwapStats swaps;
    sched::BatchOptions bo;
    bo.swap = SwapMode::kAlways;
    bo.swap_stats = &swaps;
    bo.cancel = &cancel;
    bo.on_text = [&](int, std::string_view) {
      ++texts;
      if (cancel) return;
      if (!disk) {
        cancel = texts == 300;
        return;
      }
      // On the batch's thread: the pool's staged writes (none can end while the gate holds).
      for (kv::KvPool::SwapWrite& w : (*pool)->swap_writes())
        in_flight_at_cancel += !w.ended.load(std::memory_order_acquire);
      cancel = in_flight_at_cancel > 0;
    };
    int held_at_open = 0;
    std::thread opener;
    if (disk) opener = open_after_cancel(gate, cancel, returned, &held_at_open);
    auto out = sched::generate_batch(*e->model, **pool, e->loaded.tokenizer.get(), inputs, bo);
    returned = true;
    if (opener.joinable()) opener.join();
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_GT(swaps.swaps_out, 0);
    int cancelled = 0, total = 0;
    for (const sched::GenerationOutput& o : *out) {
      cancelled += o.finish_reason == FinishReason::kCancelled;
      total += static_cast<int>(o.output_ids.size());
    }
    EXPECT_GT(cancelled, 0);
    EXPECT_LT(total, 4 * 160);
    if (disk) {
      EXPECT_GE(in_flight_at_cancel, 1);
      EXPECT_GE(held_at_open, 1);  // held from before the flag until after the cancel
      EXPECT_TRUE((*pool)->swap_writes().empty());
    }
    expect_pool_empty(**pool);
  }
}

}  // namespace
}  // namespace kvsplit::testing
