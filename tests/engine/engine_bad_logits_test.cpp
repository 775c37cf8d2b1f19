// A model whose activations overflow float32 (stories260K with its first attention norm weights
// scaled to 1e30: every weight finite, so it loads) gives logits of NaN and infinities. The
// request fails with a clear INTERNAL error naming the position, never a stream of token 0, every
// block returns, and the prefix cache keeps none of its pages.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "model/tokenizer.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

// stories260K.bin with rms_att (after the 7-int header and the 512 x 64 embedding; 5 layers x
// 64) set to 1e30.
std::string write_overflowing_model(const kvsplit::testing::TempDir& dir) {
  std::ifstream in(testing::model_path("stories260K.bin"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const size_t first = 28 + size_t{512} * 64 * 4;
  EXPECT_GE(bytes.size(), first + 320 * 4);
  const float huge = 1e30f;
  for (size_t k = 0; k < 320; ++k) std::memcpy(bytes.data() + first + k * 4, &huge, 4);
  const std::string path = dir.file("stories260K.bin");
  std::ofstream(path, std::ios::binary) << bytes;
  // The tokenizer beside it, as the loader looks for it.
  std::ifstream tin(testing::model_path("tok512.bin"), std::ios::binary);
  std::ofstream(dir.file("tok512.bin"), std::ios::binary) << tin.rdbuf();
  return path;
}

Request request(float temperature) {
  Request r;
  r.prompt = "Once upon a time, there was a little girl named Lily.";
  r.sampling.max_tokens = 8;
  r.sampling.temperature = temperature;
  r.sampling.seed = 3;
  return r;
}

TEST(EngineBadLogits, NonFiniteLogitsFailTheRequestClearly) {
  KVSPLIT_REQUIRE_MODELS();
  kvsplit::testing::TempDir dir;
  const std::string model = write_overflowing_model(dir);
  for (const ServingMode mode : {ServingMode::kColocated, ServingMode::kDisaggregated}) {
    EngineConfig cfg = testing::stories_config(mode);
    cfg.model = model;
    cfg.prefix_cache = true;
    cfg.block_size = 8;  // the prompt fills at least one page
    auto engine = Engine::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<int> initial = testing::free_blocks(**engine);
    auto tok = model::load_tokenizer(testing::model_path("tok512.bin"), 512);
    ASSERT_TRUE(tok.ok());
    const int last = static_cast<int>((*tok)->encode(request(0).prompt, true)->size()) - 1;
    // Greedy: the model's argmax path (-1); sampled: the sampler's row.
    for (const float temperature : {0.0f, 0.8f}) {
      const Collected c = collect(*(*engine)->submit(request(temperature)));
      ASSERT_FALSE(c.timed_out);
      EXPECT_EQ(c.final_event.status.code(), StatusCode::kInternal)
          << c.final_event.status.to_string();
      EXPECT_NE(c.final_event.status.message().find("no usable logits"), std::string::npos)
          << c.final_event.status.to_string();
      EXPECT_NE(c.final_event.status.message().find("at position " + std::to_string(last)),
                std::string::npos)
          << c.final_event.status.to_string();  // the prompt's last position
      EXPECT_TRUE(c.tokens.empty()) << "a token was picked from unusable logits";
    }
    EXPECT_TRUE(testing::pools_back_to(**engine, initial));
    // The failed step's pages are not kept for later prompts (they may hold a backend's fault).
    for (const PoolStats& pool : (*engine)->stats().pools) EXPECT_EQ(pool.kv_prefix_cache_pages, 0);
    EXPECT_EQ((*engine)->stats().requests_failed, 2);
  }
}

}  // namespace
}  // namespace kvsplit
