// The KV cuts in the serving engine (EngineConfig::kv_policy): a semantic cut that never demotes
// leaves the greedy tokens unchanged, an aggressive one demotes and still finishes every request,
// per-class settings apply, and after finishes and cancels every allocator of every pool (full
// pool, int8 / int4 arenas, summaries, host tier) is back to zero used.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/config_rules.h"
#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;
using testing::run_all;

const char* kPrompts[] = {"Once upon a time", "Lily wanted to", "The dog",
                          "Tom and his mom",  "The sun was",    "A big red ball"};

// Thresholds 0: pages are scored every step but never leave full precision.
SemanticCutConfig never_degrade() {
  SemanticCutConfig c;
  c.semantic_threshold = 0.f;
  c.evict_threshold = 0.f;
  c.score_interval = 1;
  return c;
}

// Every page outside the sinks and the last 16 tokens goes down the ladder after one low step.
SemanticCutConfig aggressive() {
  SemanticCutConfig c;
  c.semantic_threshold = 0.99f;
  c.evict_threshold = 0.f;
  c.demote_after_steps = 1;
  c.score_interval = 1;
  c.sink_tokens = 4;
  c.recent_tokens = 16;
  return c;
}

// aggressive(), and pages evicted from relevance 0.5 after one scored step.
SemanticCutConfig evicting() {
  SemanticCutConfig c = aggressive();
  c.evict_threshold = 0.5f;
  c.evict_after_steps = 1;
  return c;
}

// Every request of `got` (the results of `reqs`) finished without error.
void expect_all_finished(const std::vector<Collected>& got, const std::vector<Request>& reqs) {
  ASSERT_EQ(got.size(), reqs.size());
  for (const Collected& c : got) {
    ASSERT_FALSE(c.timed_out);
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
  }
}

EngineConfig cut_config(ServingMode mode, KvPolicy policy, const SemanticCutConfig& sc) {
  EngineConfig c = testing::stories_config(mode);
  c.block_size = 16;
  c.kv_policy = policy;
  c.semantic = sc;
  c.handoff_timeout_ms = 60000;
  return c;
}

std::vector<Request> long_greedy(int n, int max_tokens, const std::string& cls = "") {
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.request_id = fmt::format("{}r{}", cls, i);
    r.prompt = kPrompts[i % 6];
    r.sampling.temperature = 0.f;
    r.sampling.max_tokens = max_tokens - 20 * (i % 3);
    r.sampling.ignore_eos = true;
    r.sla_class = cls;
    out.push_back(r);
  }
  return out;
}

int64_t demotions(const EngineStats& s) {
  int64_t n = 0;
  for (const PoolStats& p : s.pools) n += p.kv_demotions;
  return n;
}

// Waits until every worker is idle with nothing held in any allocator of its pool (published
// after each step, hence the polling); on timeout, reports what is still held.
void expect_all_allocators_free(EngineImpl& engine) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string held;
  while (true) {
    held.clear();
    for (const sched::WorkerSnapshot& w : engine.worker_snapshots()) {
      const PoolStats& p = w.pool;
      if (p.kv_blocks_free != p.kv_blocks_total || p.kv_pages_full != 0 || p.kv_pages_int8 != 0 ||
          p.kv_pages_int4 != 0 || p.kv_pages_evicted != 0 || w.kv_summary_slots_used != 0 ||
          w.kv_host_slots_used != 0 || p.kv_host_bytes_used != 0 || p.running != 0 ||
          p.waiting != 0) {
        held += fmt::format(
            "{}: free {}/{} full {} int8 {} int4 {} evicted {} summaries {} host slots {} "
            "running {} waiting {}; ",
            p.name, p.kv_blocks_free, p.kv_blocks_total, p.kv_pages_full, p.kv_pages_int8,
            p.kv_pages_int4, p.kv_pages_evicted, w.kv_summary_slots_used, w.kv_host_slots_used,
            p.running, p.waiting);
      }
    }
    if (held.empty() || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(held, "");
}

class EngineKvCut : public ::testing::TestWithParam<ServingMode> {};

// Scoring without transitions changes nothing the model computes: greedy tokens equal the
// golden (llama2.c run.c) and, on long generations, those of the engine without the cut.
TEST_P(EngineKvCut, NeverDegradingSemanticCutKeepsGreedyTokens) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(cut_config(GetParam(), KvPolicy::kSemantic, never_degrade()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  int checked = testing::expect_greedy_goldens(**engine);
  EXPECT_GE(checked, 4);

  const std::vector<Request> reqs = long_greedy(6, 300);
  auto off = Engine::create(cut_config(GetParam(), KvPolicy::kFull, SemanticCutConfig{}));
  ASSERT_TRUE(off.ok()) << off.status().to_string();
  const std::vector<Collected> want = run_all(**off, reqs);
  const std::vector<Collected> got = run_all(**engine, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  ASSERT_EQ(want.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_FALSE(got[i].timed_out);
    EXPECT_TRUE(got[i].final_event.status.ok()) << got[i].final_event.status.to_string();
    EXPECT_EQ(got[i].tokens, want[i].tokens) << reqs[i].request_id;
  }
  const EngineStats s = (*engine)->stats();
  EXPECT_EQ(demotions(s), 0);
  for (const PoolStats& p : s.pools) EXPECT_EQ(p.kv_evictions, 0) << p.name;
  expect_all_allocators_free(**engine);
}

TEST_P(EngineKvCut, AggressiveSemanticCutDemotesAndReleasesEverything) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(cut_config(GetParam(), KvPolicy::kSemantic, aggressive()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<Request> reqs = long_greedy(8, 300);
  const std::vector<Collected> got = run_all(**engine, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_FALSE(got[i].timed_out) << reqs[i].request_id;
    EXPECT_EQ(got[i].finals, 1);
    EXPECT_TRUE(got[i].final_event.status.ok()) << got[i].final_event.status.to_string();
    EXPECT_EQ(got[i].final_event.finish_reason, FinishReason::kLength);
    EXPECT_EQ(static_cast<int>(got[i].tokens.size()), reqs[i].sampling.max_tokens);
  }
  const EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.requests_finished, static_cast<int64_t>(reqs.size()));
  EXPECT_EQ(s.requests_failed, 0);
  EXPECT_GT(demotions(s), 0);
  for (const PoolStats& p : s.pools) {
    if (p.name.rfind("prefill", 0) == 0) {
      EXPECT_EQ(p.kv_demotions, 0) << "pages change state only where sequences decode";
      EXPECT_EQ(p.kv_host_bytes_total, 0);
    } else {
      EXPECT_GT(p.kv_host_bytes_total, 0) << p.name;
    }
  }
  expect_all_allocators_free(**engine);
}

// Evictions too (evict_threshold above most relevances), with recalls where a query needs a
// page again; every request still finishes and nothing is left held.
TEST_P(EngineKvCut, EvictingSemanticCutReleasesEverything) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(cut_config(GetParam(), KvPolicy::kSemantic, evicting()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<Request> reqs = long_greedy(6, 250);
  const std::vector<Collected> got = run_all(**engine, reqs);
  ASSERT_NO_FATAL_FAILURE(expect_all_finished(got, reqs));
  const EngineStats s = (*engine)->stats();
  int64_t evictions = 0;
  for (const PoolStats& p : s.pools) evictions += p.kv_evictions;
  EXPECT_GT(evictions, 0);
  expect_all_allocators_free(**engine);
}

// Key summaries in parts (SemanticCutConfig::summary_parts) reach every worker's pool: with one
// part per token (16) the bound is tight enough to call back about half as many evicted pages as
// summaries of whole pages do on the same requests (on stories260K 4 parts change little:
// docs/kv-cuts.md "Summaries in parts"), and nothing is left held.
TEST_P(EngineKvCut, SummariesInPartsRecallFewerPages) {
  KVSPLIT_REQUIRE_MODELS();
  int64_t recalls[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    SemanticCutConfig sc = evicting();
    sc.recall_threshold = 1.f;
    sc.summary_parts = i == 0 ? 1 : 16;
    auto engine = EngineImpl::create(cut_config(GetParam(), KvPolicy::kSemantic, sc));
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<Request> reqs = long_greedy(4, 200);
    const std::vector<Collected> got = run_all(**engine, reqs);
    ASSERT_NO_FATAL_FAILURE(expect_all_finished(got, reqs));
    for (const PoolStats& p : (*engine)->stats().pools) recalls[i] += p.kv_recalls;
    expect_all_allocators_free(**engine);
  }
  EXPECT_GT(recalls[0], 50);
  EXPECT_LT(recalls[1], recalls[0] * 3 / 4);
}

// Evicted pages recalled at int4, at most one per sequence and step: the pool stats count them
// (and the cold ones among them), every request finishes and nothing is left held.
TEST_P(EngineKvCut, RecallsAtInt4AreCountedAndReleaseEverything) {
  KVSPLIT_REQUIRE_MODELS();
  SemanticCutConfig sc = evicting();
  sc.recall_threshold = 0.6f;
  sc.recall_precision = RecallPrecision::kInt4;
  sc.max_recalls_per_step = 1;
  auto engine = EngineImpl::create(cut_config(GetParam(), KvPolicy::kSemantic, sc));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<Request> reqs = long_greedy(4, 200);
  const std::vector<Collected> got = run_all(**engine, reqs);
  ASSERT_NO_FATAL_FAILURE(expect_all_finished(got, reqs));
  for (const Collected& c : got) EXPECT_FALSE(c.tokens.empty());
  int64_t recalls = 0, quantized = 0, cold = 0;
  for (const PoolStats& p : (*engine)->stats().pools) {
    recalls += p.kv_recalls;
    quantized += p.kv_recalls_quantized;
    cold += p.kv_recalls_cold;
  }
  EXPECT_GT(quantized, 0);
  EXPECT_LE(quantized, recalls);
  EXPECT_LE(cold, quantized);
  expect_all_allocators_free(**engine);
}

// Recalls copied on each worker's copy thread (EngineConfig::async_copies) and waited for without
// a bound give the synchronous engine's tokens, at full precision and at int4 (a quantized
// recall's original lands in a full block first, then is quantized); with a 0 ms bound some
// steps may run without a late recall, and every request still finishes and nothing is left
// held either way.
TEST_P(EngineKvCut, AsynchronousRecallsWaitedForKeepTheTokens) {
  KVSPLIT_REQUIRE_MODELS();
  for (RecallPrecision rung : {RecallPrecision::kFull, RecallPrecision::kInt4}) {
    SCOPED_TRACE(rung == RecallPrecision::kFull ? "full" : "int4");
    SemanticCutConfig sc = evicting();
    sc.recall_threshold = 0.6f;
    sc.recall_wait_ms = -1;
    sc.recall_precision = rung;
    const std::vector<Request> reqs = long_greedy(4, 200);
    auto sync = EngineImpl::create(cut_config(GetParam(), KvPolicy::kSemantic, sc));
    ASSERT_TRUE(sync.ok()) << sync.status().to_string();
    const std::vector<Collected> want = run_all(**sync, reqs);
    int64_t recalls = 0;
    for (const PoolStats& p : (*sync)->stats().pools) recalls += p.kv_recalls;
    EXPECT_GT(recalls, 0) << "the workload must recall pages";
    for (double wait_ms : {-1.0, 0.0}) {
      SCOPED_TRACE(wait_ms);
      EngineConfig cfg = cut_config(GetParam(), KvPolicy::kSemantic, sc);
      cfg.async_copies = true;
      cfg.semantic.recall_wait_ms = wait_ms;
      auto engine = EngineImpl::create(cfg);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      const std::vector<Collected> got = run_all(**engine, reqs);
      ASSERT_EQ(got.size(), reqs.size());
      int64_t late = 0, async_recalls = 0, quantized = 0;
      for (const PoolStats& p : (*engine)->stats().pools) {
        late += p.kv_recalls_late;
        async_recalls += p.kv_recalls;
        quantized += p.kv_recalls_quantized;
      }
      for (size_t i = 0; i < reqs.size(); ++i) {
        ASSERT_FALSE(got[i].timed_out);
        EXPECT_TRUE(got[i].final_event.status.ok()) << got[i].final_event.status.to_string();
        EXPECT_EQ(got[i].tokens.size(), want[i].tokens.size());
        if (wait_ms < 0) {
          EXPECT_EQ(got[i].tokens, want[i].tokens) << reqs[i].request_id;
        }
      }
      if (wait_ms < 0) {
        EXPECT_EQ(late, 0);
        // The same recalls, less those queued after a sequence's last step (released
        // unapplied).
        EXPECT_GT(async_recalls, 0);
        EXPECT_LE(async_recalls, recalls);
        if (rung == RecallPrecision::kInt4) {
          EXPECT_GT(quantized, 0);
        }
      }
      expect_all_allocators_free(**engine);
    }
  }
}

// The two baselines drop pages irreversibly; they run through the same path.
TEST_P(EngineKvCut, BaselinesRunAndReleaseEverything) {
  KVSPLIT_REQUIRE_MODELS();
  for (KvPolicy policy : {KvPolicy::kStreaming, KvPolicy::kH2O}) {
    SemanticCutConfig sc = aggressive();
    sc.heavy_tokens = 16;
    auto engine = EngineImpl::create(cut_config(GetParam(), policy, sc));
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<Request> reqs = long_greedy(4, 200);
    const std::vector<Collected> got = run_all(**engine, reqs);
    ASSERT_EQ(got.size(), reqs.size());
    for (const Collected& c : got) {
      ASSERT_FALSE(c.timed_out);
      EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
      EXPECT_EQ(c.final_event.finish_reason, FinishReason::kLength);
    }
    int64_t evictions = 0;
    for (const PoolStats& p : (*engine)->stats().pools) evictions += p.kv_evictions;
    EXPECT_GT(evictions, 0) << kv_policy_name(policy);
    expect_all_allocators_free(**engine);
  }
}

TEST_P(EngineKvCut, CancelMidGenerationReleasesEverything) {
  KVSPLIT_REQUIRE_MODELS();
  SemanticCutConfig sc = aggressive();
  sc.evict_threshold = 0.5f;
  auto engine = EngineImpl::create(cut_config(GetParam(), KvPolicy::kSemantic, sc));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  std::vector<Request> reqs = long_greedy(8, 480);
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) {
    auto h = (*engine)->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  // Cancel once pages have gone down the ladder (long before the 480 tokens are done).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (demotions((*engine)->stats()) < 16 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(demotions((*engine)->stats()), 16);
  for (const Request& r : reqs) (*engine)->cancel(r.tenant, r.request_id);
  int cancelled = 0;
  for (RequestHandle& h : handles) {
    Collected c = collect(h);
    ASSERT_FALSE(c.timed_out);
    EXPECT_EQ(c.finals, 1);
    cancelled += c.final_event.finish_reason == FinishReason::kCancelled;
  }
  EXPECT_GT(cancelled, 0);
  expect_all_allocators_free(**engine);
}

// A class whose settings never demote keeps its requests' pages at full precision (and their
// tokens), while the default class's aggressive settings demote.
TEST_P(EngineKvCut, PerClassSettingsApply) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = cut_config(GetParam(), KvPolicy::kSemantic, aggressive());
  SlaClass keep;
  keep.name = "keep";
  keep.semantic = never_degrade();
  cfg.sla_classes.push_back(keep);
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineConfig off_cfg = cut_config(GetParam(), KvPolicy::kFull, SemanticCutConfig{});
  off_cfg.sla_classes = cfg.sla_classes;
  auto off = Engine::create(off_cfg);
  ASSERT_TRUE(off.ok()) << off.status().to_string();

  std::vector<Request> reqs = long_greedy(4, 300, "keep");
  const std::vector<Collected> want = run_all(**off, reqs);
  const std::vector<Collected> got = run_all(**engine, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_FALSE(got[i].timed_out);
    EXPECT_EQ(got[i].tokens, want[i].tokens) << reqs[i].request_id;
  }
  EXPECT_EQ(demotions((*engine)->stats()), 0);

  const std::vector<Collected> def = run_all(**engine, long_greedy(4, 300));
  for (const Collected& c : def) EXPECT_TRUE(c.final_event.status.ok());
  EXPECT_GT(demotions((*engine)->stats()), 0);
  expect_all_allocators_free(**engine);
}

TEST(EngineKvCutConfig, SettingsAreValidatedWithTheFieldPath) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = cut_config(ServingMode::kColocated, KvPolicy::kSemantic, aggressive());
  cfg.semantic.smoothing = 0.f;
  auto bad = Engine::create(cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("semantic.smoothing"), std::string::npos)
      << bad.status().message();

  cfg = cut_config(ServingMode::kColocated, KvPolicy::kSemantic, aggressive());
  cfg.semantic.summary_parts = 3;  // does not divide block_size 16
  bad = Engine::create(cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("semantic.summary_parts"), std::string::npos)
      << bad.status().message();

  cfg = cut_config(ServingMode::kColocated, KvPolicy::kSemantic, aggressive());
  SlaClass voice;
  voice.name = "voice";
  voice.semantic = SemanticCutConfig{};
  voice.semantic->semantic_threshold = 1.5f;
  cfg.sla_classes.push_back(voice);
  bad = Engine::create(cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sla_classes.voice.kv.semantic_threshold"),
            std::string::npos)
      << bad.status().message();

  cfg = cut_config(ServingMode::kColocated, KvPolicy::kSemantic, aggressive());
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  std::vector<SlaClass> classes = {SlaClass{}};
  classes[0].semantic = SemanticCutConfig{};
  classes[0].semantic->score_interval = 0;
  const Status st = (*engine)->update_sla_classes(classes);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sla_classes.default.kv.score_interval"), std::string::npos)
      << st.message();
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineKvCut,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

}  // namespace
}  // namespace kvsplit
