// Effective-KV accounting (docs/kvm.md "Effective-KV accounting"): a request's
// Usage::effective_kv_byte_seconds and kv_token_seconds against the formula evaluated on what a
// test can observe independently (token event times, the model's shape, page sizes of each rung),
// through a handoff, for a cancelled request, and summed per SLA class and tenant.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"
#include "engine/start_together.h"
#include "kernels/common/kv_quant.h"
#include "kv/block_allocator.h"

namespace kvsplit {
namespace {

using Clock = std::chrono::steady_clock;
using sched::KvAccount;

// The shape of stories260K from its llama2.c header (dim, hidden, layers, heads, kv heads, ...),
// read from the file: the page sizes below do not come from the engine.
struct Shape {
  int layers = 0, kv_heads = 0, head_dim = 0;
};
Shape stories_shape() {
  Shape s;
  int32_t h[7] = {};
  FILE* f = std::fopen(testing::model_path("stories260K.bin").c_str(), "rb");
  if (f == nullptr) return s;
  const size_t n = std::fread(h, sizeof(int32_t), 7, f);
  std::fclose(f);
  if (n != 7) return s;
  s.layers = h[2];
  s.kv_heads = h[4];
  s.head_dim = h[0] / h[3];
  return s;
}

constexpr int kBlock = 16;

// Bytes of one page of every layer: f32 K and V for full precision (the CPU pool's dtype), the
// quantized layout (codes, scales, zero points) for int8 / int4.
int64_t page_bytes(const Shape& s, kernels::KvPrecision p) {
  if (p == kernels::KvPrecision::kFull)
    return int64_t{2} * s.kv_heads * kBlock * s.head_dim * 4 * s.layers;
  return kernels::QuantPageLayout{s.kv_heads, kBlock, s.head_dim}.bytes(p) * s.layers;
}

struct Events {
  std::vector<TokenEvent> tokens;  // the non-final events that carried a token
  TokenEvent final_event;
  bool timed_out = false;
};

Events collect_events(RequestHandle handle,
                      std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  Events e;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    TokenEvent ev;
    if (!handle.next(&ev, std::chrono::milliseconds(50))) {
      if (Clock::now() > deadline) {
        e.timed_out = true;
        return e;
      }
      continue;
    }
    if (ev.final) {
      e.final_event = ev;
      return e;
    }
    if (!ev.token_ids.empty()) e.tokens.push_back(ev);
  }
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Expected {
  double byte_seconds = 0;
  double token_seconds = 0;
};

// Full precision, no prefix cache, one prefill chunk: the pages hold the prompt from admission
// (queue_ms after submission; tokens computed: 0) to the first token (ttft_ms); after token k
// (k = 1..n, at its event's time) they hold prompt + k - 1 tokens in blocks_for(...) pages, until
// token k + 1; the final event (at token n) releases them.
Expected full_precision_formula(const Events& e, int prompt, int64_t full_page) {
  Expected x;
  const Timings& t = e.final_event.timings;
  x.byte_seconds = static_cast<double>(kv::BlockTable::blocks_for(prompt, kBlock)) * full_page *
                   (t.ttft_ms - t.queue_ms) / 1e3;
  for (size_t k = 0; k + 1 < e.tokens.size(); ++k) {
    const int computed = prompt + static_cast<int>(k);
    const double dt = seconds(e.tokens[k].time, e.tokens[k + 1].time);
    x.byte_seconds +=
        static_cast<double>(kv::BlockTable::blocks_for(computed, kBlock)) * full_page * dt;
    x.token_seconds += computed * dt;
  }
  return x;
}

Request greedy_request(const std::string& id, int max_tokens) {
  Request r;
  r.request_id = id;
  r.prompt = "Once upon a time";
  r.sampling.temperature = 0.f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

EngineConfig accounting_config(ServingMode mode) {
  EngineConfig c = testing::stories_config(mode);
  c.block_size = kBlock;
  c.handoff_timeout_ms = 60000;
  return c;
}

class EngineAccounting : public ::testing::TestWithParam<ServingMode> {};

// kv_policy full: byte-seconds = the integral of pages * full page bytes and token-seconds that
// of the computed tokens, over the token events' times; in disaggregated mode the sequence keeps
// accumulating across the handoff (prefill worker, then decode worker).
TEST_P(EngineAccounting, FullPrecisionIsPagesTimesPageBytesOverTime) {
  KVSPLIT_REQUIRE_MODELS();
  const Shape shape = stories_shape();
  ASSERT_GT(shape.layers, 0);
  auto engine = EngineImpl::create(accounting_config(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  for (int max_tokens : {1, 40}) {
    auto h = (*engine)->submit(greedy_request(fmt::format("full-{}", max_tokens), max_tokens));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const Events e = collect_events(*h);
    ASSERT_FALSE(e.timed_out);
    ASSERT_TRUE(e.final_event.status.ok()) << e.final_event.status.to_string();
    ASSERT_EQ(static_cast<int>(e.tokens.size()), max_tokens);
    const Usage& u = e.final_event.usage;
    const Expected x =
        full_precision_formula(e, u.prompt_tokens, page_bytes(shape, kernels::KvPrecision::kFull));
    EXPECT_GT(u.effective_kv_byte_seconds, 0);
    EXPECT_NEAR(u.effective_kv_byte_seconds, x.byte_seconds, 0.01 * x.byte_seconds) << max_tokens;
    if (max_tokens == 1) {
      EXPECT_EQ(u.kv_token_seconds, 0);  // the prompt's pages were never written before the end
    } else {
      EXPECT_GT(u.kv_token_seconds, 0);
      EXPECT_NEAR(u.kv_token_seconds, x.token_seconds, 0.01 * x.token_seconds);
      // Consistency: the tokens fit in the pages, so tokens * page bytes / page tokens <= bytes.
      EXPECT_LE(u.kv_token_seconds * page_bytes(shape, kernels::KvPrecision::kFull) / kBlock,
                u.effective_kv_byte_seconds * 1.0001);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineAccounting,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? std::string("Colocated")
                                                                        : std::string("Disagg");
                         });

// Records every final sequence's accounting trace (KvAccount::set_trace_for_tests).
class TraceRecorder {
 public:
  explicit TraceRecorder(EngineImpl& engine) {
    KvAccount::set_trace_for_tests(true);
    engine.set_final_observer_for_tests([this](const sched::Sequence& seq, const TokenEvent&) {
      std::lock_guard<std::mutex> lock(mu_);
      traces_[seq.id()] = seq.kv_account.trace();
    });
  }
  ~TraceRecorder() { KvAccount::set_trace_for_tests(false); }
  std::vector<KvAccount::Point> trace(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return traces_[id];
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<KvAccount::Point>> traces_;
};

// An aggressive semantic cut demotes pages to int8 and int4 on known steps: every accounting
// point's bytes are its pages per rung times that rung's page bytes, the points fall on the token
// events with the tokens computed by then, and the usage is the integral of those bytes (and
// tokens), below what the same tokens cost at full precision.
TEST(EngineAccountingMix, SemanticCutIntegratesEachRungAtItsPageBytes) {
  KVSPLIT_REQUIRE_MODELS();
  const Shape shape = stories_shape();
  ASSERT_GT(shape.layers, 0);
  EngineConfig c = accounting_config(ServingMode::kColocated);
  c.kv_policy = KvPolicy::kSemantic;
  c.semantic.semantic_threshold = 0.99f;  // every page outside the windows goes down the ladder
  c.semantic.evict_threshold = 0.f;       // ... but is never evicted
  c.semantic.recall_threshold = 1.f;      // ... nor recalled while relevance < 1
  c.semantic.demote_after_steps = 1;
  c.semantic.score_interval = 1;
  c.semantic.sink_tokens = 4;
  c.semantic.recent_tokens = 16;
  auto engine = EngineImpl::create(c);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  TraceRecorder rec(**engine);
  auto h = (*engine)->submit(greedy_request("mix", 120));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const Events e = collect_events(*h);
  ASSERT_FALSE(e.timed_out);
  ASSERT_TRUE(e.final_event.status.ok()) << e.final_event.status.to_string();
  ASSERT_EQ(e.tokens.size(), 120u);
  const Usage& u = e.final_event.usage;
  const std::vector<KvAccount::Point> trace = rec.trace("mix");
  ASSERT_GE(trace.size(), e.tokens.size() + 1);

  const int64_t full = page_bytes(shape, kernels::KvPrecision::kFull);
  const int64_t b8 = page_bytes(shape, kernels::KvPrecision::kInt8);
  const int64_t b4 = page_bytes(shape, kernels::KvPrecision::kInt4);
  ASSERT_LT(b8, full);
  ASSERT_LT(b4, b8);
  const int64_t summary = int64_t{2} * shape.kv_heads * shape.head_dim * 2 * shape.layers;
  int mixed_points = 0, quantized_rungs = 0;
  double byte_seconds = 0, token_seconds = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const sched::KvLevel& l = trace[i].level;
    // Every quantized page also holds its key summary on the device (f16 min and max).
    EXPECT_EQ(l.bytes,
              l.pages_full * full + l.pages_int8 * (b8 + summary) + l.pages_int4 * (b4 + summary))
        << i;
    mixed_points += l.pages_full > 0 && (l.pages_int8 > 0 || l.pages_int4 > 0);
    quantized_rungs |= (l.pages_int8 > 0 ? 1 : 0) | (l.pages_int4 > 0 ? 2 : 0);
    if (i + 1 < trace.size()) {
      EXPECT_LE(trace[i].time, trace[i + 1].time) << i;
      const double dt = seconds(trace[i].time, trace[i + 1].time);
      byte_seconds += static_cast<double>(l.bytes) * dt;
      token_seconds += static_cast<double>(l.tokens) * dt;
    }
  }
  EXPECT_GT(mixed_points, 0) << "the cut never held full and quantized pages at once";
  EXPECT_EQ(quantized_rungs, 3) << "int8 and int4 pages were not both held";
  // The points are the token events (tokens computed by then; nothing evicted, so every page
  // is resident and holds its tokens), and the last one releases everything at the final event.
  size_t p = 0;
  for (size_t k = 0; k < e.tokens.size(); ++k) {
    while (p < trace.size() && trace[p].time < e.tokens[k].time) ++p;
    ASSERT_LT(p, trace.size()) << "no accounting point at token " << k;
    if (k + 1 == e.tokens.size()) break;  // the last token's step finishes the request
    const sched::KvLevel& l = trace[p].level;
    EXPECT_EQ(trace[p].time, e.tokens[k].time) << k;
    EXPECT_EQ(l.tokens, u.prompt_tokens + static_cast<int64_t>(k)) << k;
    EXPECT_EQ(l.pages_full + l.pages_int8 + l.pages_int4,
              kv::BlockTable::blocks_for(u.prompt_tokens + static_cast<int>(k), kBlock))
        << k;
  }
  EXPECT_EQ(trace.back().level, sched::KvLevel{});
  EXPECT_EQ(trace.back().time, e.final_event.time);

  EXPECT_NEAR(u.effective_kv_byte_seconds, byte_seconds, 0.01 * byte_seconds);
  EXPECT_NEAR(u.kv_token_seconds, token_seconds, 0.01 * token_seconds);
  // The same tokens at full precision over the same times cost more.
  const Expected x = full_precision_formula(e, u.prompt_tokens, full);
  EXPECT_LT(u.effective_kv_byte_seconds, 0.99 * x.byte_seconds);
  EXPECT_NEAR(u.kv_token_seconds, x.token_seconds, 0.01 * x.token_seconds);  // nothing evicted
}

// A request cancelled mid-generation reports what it held until the cancel.
TEST(EngineAccountingMix, CancelledRequestStillReports) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(accounting_config(ServingMode::kColocated));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const Request r = greedy_request("to-cancel", 500);
  // Stepped to its fifth token and cancelled there, held (decoding freely up to the cancel, it
  // could finish first on a slow machine).
  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  std::vector<int32_t> tokens;
  ASSERT_TRUE(testing::step_to_tokens(**engine, 0, *h, 5, &tokens)) << "finished before the cancel";
  ASSERT_TRUE((*engine)->cancel("", "to-cancel"));
  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  const Events e = collect_events(*h);
  ASSERT_FALSE(e.timed_out);
  EXPECT_EQ(e.final_event.finish_reason, FinishReason::kCancelled);
  const Usage& u = e.final_event.usage;
  EXPECT_GT(u.effective_kv_byte_seconds, 0);
  EXPECT_GT(u.kv_token_seconds, 0);
  const EngineStats s = (*engine)->stats();
  ASSERT_EQ(s.kv_accounting.size(), 1u);
  EXPECT_EQ(s.kv_accounting[0].requests, 1);
  EXPECT_EQ(s.kv_accounting[0].effective_kv_byte_seconds, u.effective_kv_byte_seconds);
}

// EngineStats::kv_accounting is the sum of the final events' usage per (class, tenant).
TEST(EngineAccountingMix, PerClassAndTenantSumsEqualTheRequestsUsage) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = accounting_config(ServingMode::kColocated);
  SlaClass batch;
  batch.name = "batch";
  batch.max_ttft_ms = 60000;
  batch.max_itl_ms = 60000;
  c.sla_classes.push_back(batch);
  auto engine = EngineImpl::create(c);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  struct Sum {
    int64_t requests = 0;
    double bytes = 0, tokens = 0;
  };
  std::map<std::pair<std::string, std::string>, Sum> want;
  std::vector<std::pair<Request, RequestHandle>> handles;
  for (int i = 0; i < 8; ++i) {
    Request r = greedy_request(fmt::format("r{}", i), 10 + 7 * i);
    r.tenant = i % 2 == 0 ? "tenant-a" : "tenant \"b\"\n";
    r.sla_class = i % 3 == 0 ? "batch" : "";
    auto h = (*engine)->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.emplace_back(r, *h);
  }
  for (auto& [r, h] : handles) {
    const Events e = collect_events(h);
    ASSERT_FALSE(e.timed_out);
    ASSERT_TRUE(e.final_event.status.ok());
    Sum& s = want[{r.sla_class.empty() ? "default" : r.sla_class, r.tenant}];
    ++s.requests;
    s.bytes += e.final_event.usage.effective_kv_byte_seconds;
    s.tokens += e.final_event.usage.kv_token_seconds;
    EXPECT_GT(e.final_event.usage.effective_kv_byte_seconds, 0);
  }
  const EngineStats s = (*engine)->stats();
  ASSERT_EQ(s.kv_accounting.size(), want.size());
  auto it = want.begin();
  for (const KvAccounting& a : s.kv_accounting) {  // ordered by class, then tenant
    EXPECT_EQ(a.sla_class, it->first.first);
    EXPECT_EQ(a.tenant, it->first.second);
    EXPECT_EQ(a.requests, it->second.requests);
    EXPECT_NEAR(a.effective_kv_byte_seconds, it->second.bytes, 1e-9 * it->second.bytes);
    EXPECT_NEAR(a.kv_token_seconds, it->second.tokens, 1e-9 * it->second.tokens);
    ++it;
  }
}

}  // namespace
}  // namespace kvsplit
