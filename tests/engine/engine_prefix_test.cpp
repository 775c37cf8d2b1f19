// The prefix cache in the engine: a tenant's repeated prompt reuses its pages (same tokens,
// usage.cached_tokens > 0); another tenant with the same prompt shares nothing; every block is
// available again afterwards (cached pages are evictable).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

const char* kLong =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "sunshine. One day, she saw a big dog in the park and";

Request req(const std::string& tenant, const std::string& salt, int i) {
  Request r;
  r.tenant = tenant;
  r.cache_salt = salt;
  r.prompt = kLong;
  r.sampling.max_tokens = 24;
  r.sampling.temperature = i % 2 ? 0.7f : 0.f;
  r.sampling.seed = 3;
  return r;
}

class EnginePrefix : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EnginePrefix, SameTenantSharesOtherTenantsDoNot) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.prefix_cache = true;
  cfg.block_size = 16;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  EngineConfig plain = testing::stories_config(GetParam());
  auto ref_engine = Engine::create(plain);
  ASSERT_TRUE(ref_engine.ok());
  for (int i = 0; i < 2; ++i) {
    const Collected ref = collect(*(*ref_engine)->submit(req("a", "", i)));
    const Collected first = collect(*(*engine)->submit(req("a", "", i)));
    const Collected again = collect(*(*engine)->submit(req("a", "", i)));
    const Collected other = collect(*(*engine)->submit(req("b", "", i)));
    const Collected salted = collect(*(*engine)->submit(req("a", "s1", i)));
    for (const Collected* c : {&first, &again, &other, &salted}) {
      ASSERT_TRUE(c->final_event.status.ok()) << c->final_event.status.to_string();
      EXPECT_EQ(c->tokens, ref.tokens);
    }
    const int prompt = first.final_event.usage.prompt_tokens;
    EXPECT_EQ(again.final_event.usage.cached_tokens, (prompt - 1) / 16 * 16) << i;
    if (i == 0) {
      EXPECT_EQ(first.final_event.usage.cached_tokens, 0);
      EXPECT_EQ(other.final_event.usage.cached_tokens, 0);   // tenant b: nothing shared
      EXPECT_EQ(salted.final_event.usage.cached_tokens, 0);  // another cache_salt
    }
  }
  const EngineStats s = (*engine)->stats();
  int64_t hits = 0, pages = 0;
  for (const PoolStats& p : s.pools) {
    hits += p.kv_prefix_hits;
    pages += p.kv_prefix_cache_pages;
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(pages, 0);
  // Cached pages count as available: every pool is back to its size.
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

INSTANTIATE_TEST_SUITE_P(Modes, EnginePrefix,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

}  // namespace
}  // namespace kvsplit
