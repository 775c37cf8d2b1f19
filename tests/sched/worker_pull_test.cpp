// Worker::admit_from_router against a fake model, a step at a time (TestHold::kOneStep):
// WorkerOptions::max_prefill_seqs bounds the prompts pulled and not started, not the preempted
// sequences that wait in the same list.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/check.h"
#include "kv/kv_pool.h"
#include "model/tokenizer.h"
#include "sampling/sampler.h"
#include "sampling/stop.h"
#include "sched/router.h"
#include "sched/worker.h"

namespace kvsplit::sched {
namespace {

constexpr int kVocab = 64;

// Always picks token 10 (its logit is the largest); no KV is read or written.
class FixedTokenModel final : public StepModel {
 public:
  Status forward(std::span<const model::SeqStep> seqs, kv::KvPool&, std::vector<float>* logits,
                 std::vector<int32_t>* ids) override {
    for (const model::SeqStep& s : seqs) {
      if (s.logits == model::SeqStep::Logits::kLast) {
        for (int v = 0; v < kVocab; ++v) logits->push_back(v == 10 ? 5.f : 0.f);
      } else if (s.logits == model::SeqStep::Logits::kArgmax) {
        ids->push_back(10);
      }
    }
    return ok_status();
  }
  int vocab_size() const override { return kVocab; }
};

class CountingSink final : public FinishSink {
 public:
  void on_final(const Sequence&, const TokenEvent&) override { finals.fetch_add(1); }
  std::atomic<int> finals{0};
};

std::unique_ptr<Sequence> greedy_seq(const std::string& id, int64_t arrival, int32_t priority,
                                     int prompt, int max_tokens) {
  static const std::unique_ptr<model::Tokenizer> tok = model::make_byte_tokenizer(kVocab);
  auto seq = std::make_unique<Sequence>();
  seq->ctl = std::make_shared<RequestControl>(id);
  seq->arrival = arrival;
  seq->priority = priority;
  seq->params.temperature = 0;
  seq->params.max_tokens = max_tokens;
  seq->params.ignore_eos = true;
  seq->num_prompt = prompt;
  for (int i = 0; i < prompt; ++i) seq->tokens.push_back(3 + i);
  seq->sampler = std::make_unique<sampling::Sampler>(seq->params, 1);
  seq->stop =
      std::make_unique<sampling::StopChecker>(seq->params, std::vector<int32_t>{}, max_tokens);
  seq->decoder = std::make_unique<model::StreamDecoder>(*tok, seq->tokens.back());
  seq->submit_time = seq->phase_start = Clock::now();
  seq->queue_deadline = seq->submit_time + std::chrono::hours(1);
  return seq;
}

// One colocated worker on a router, with a pool of `blocks` pages of 4 tokens.
struct Rig {
  explicit Rig(WorkerOptions options, int blocks) {
    router = std::make_unique<Router>(std::vector<SlaClass>{SlaClass{}}, [this] {
      if (worker) worker->wake();
    });
    shared.router = router.get();
    shared.sink = &sink;
    auto be = backend::create_backend("cpu", 1);
    KVSPLIT_CHECK(be.ok());
    kv::KvPoolConfig pc;
    pc.num_blocks = blocks;
    pc.block_size = 4;
    auto pool = kv::KvPool::create(**be, pc, kv::KvShape{1, 1, 4});
    KVSPLIT_CHECK(pool.ok());
    worker = std::make_unique<Worker>(options, std::move(be).value(),
                                      std::make_unique<FixedTokenModel>(), std::move(pool).value(),
                                      &shared);
    worker->start();
  }
  ~Rig() {
    worker->set_test_hold(TestHold::kNone);
    worker->request_stop();
    worker->join();
    worker->finalize_after_stop();
  }
  void push(std::unique_ptr<Sequence> seq) { ASSERT_TRUE(router->push(seq).ok()); }
  // One step with a forward pass (the worker is held at kForward before and after).
  bool step() {
    const int64_t before = worker->snapshot().steps;
    worker->set_test_hold(TestHold::kOneStep);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (worker->snapshot().steps == before && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    // Returns once the loop has seen it: the worker's own reset of kOneStep is done by then.
    worker->set_test_hold(TestHold::kForward);
    return worker->snapshot().steps > before;
  }
  WorkerState state() {
    auto done = std::make_shared<std::promise<CommandReply>>();
    auto reply = done->get_future();
    worker->post_command(SnapshotState{},
                         [done](CommandReply r) { done->set_value(std::move(r)); });
    KVSPLIT_CHECK(reply.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    return reply.get().state;
  }

  CountingSink sink;
  WorkerShared shared;
  std::unique_ptr<Router> router;
  std::unique_ptr<Worker> worker;
};

// Three low-priority requests outgrow a pool of 12 pages and preempt each other (by recompute)
// until two wait preempted: as many as max_prefill_seqs. A higher-priority request that fits the
// free pages is then pulled at the next step boundary, with no forward pass run meanwhile: the
// preempted ones are not prompts pulled and not started. Counting them, the worker left it in
// the router until one of them resumed.
TEST(WorkerPull, PreemptedSequencesDoNotFillMaxPrefillSeqs) {
  WorkerOptions o;
  o.role = WorkerRole::kColocated;
  o.max_num_seqs = 16;
  o.max_batch_tokens = 64;
  o.min_chunk_tokens = 4;
  o.max_prefill_seqs = 2;
  Rig rig(o, 12);
  rig.worker->set_test_hold(TestHold::kForward);
  for (int i = 0; i < 3; ++i) rig.push(greedy_seq("lo" + std::to_string(i), i, 0, 4, 40));
  int preempted_waiting = 0;
  for (int s = 0; s < 400 && preempted_waiting < 2; ++s) {
    ASSERT_TRUE(rig.step()) << "the worker did not step";
    const WorkerState st = rig.state();
    preempted_waiting = 0;
    int waiting = 0;
    for (const SequenceState& q : st.sequences) {
      waiting += !q.running;
      preempted_waiting += !q.running && q.preemptions > 0;
    }
    ASSERT_LE(waiting, 3);
    if (rig.router->num_queued() > 0) preempted_waiting = 0;  // all three pulled first
  }
  ASSERT_EQ(preempted_waiting, 2) << "two of the three never waited preempted together";
  ASSERT_GE(rig.state().free_blocks, 1);  // room for the new request's one page

  rig.push(greedy_seq("hi", 100, 5, 1, 2));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (rig.router->num_queued() > 0 && std::chrono::steady_clock::now() < until) {
    rig.worker->wake();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(rig.router->num_queued(), 0) << "the high-priority request stayed in the router";
  int hi_waiting = 0;
  for (const SequenceState& q : rig.state().sequences) hi_waiting += q.request_id == "hi";
  EXPECT_EQ(hi_waiting, 1);

  rig.worker->set_test_hold(TestHold::kNone);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (rig.sink.finals.load() < 4 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(rig.sink.finals.load(), 4);
  // The stats are published after the step that finished the last one.
  while (rig.worker->snapshot().pool.kv_blocks_free < 12 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(rig.worker->snapshot().pool.kv_blocks_free, 12);
}

}  // namespace
}  // namespace kvsplit::sched
