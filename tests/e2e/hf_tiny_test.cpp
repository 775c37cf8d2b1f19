// The hf-tiny checkpoints written by HF transformers (llama3-tiny: Llama-3 RoPE scaling in the
// pre-5 rope_theta/rope_scaling form; qwen2-tiny: qkv bias, tied embeddings, sharded f16 weights
// and the transformers-5 rope_parameters form with theta 1e6; mistral-tiny: MQA, explicit
// head_dim) against transformers' own fp32 results in golden/hf_tiny_greedy.jsonl: the logits
// after the prompt and the greedy continuation, on the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_pool.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sched/batch_generate.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

struct TinyEngine {
  model::LoadedModel loaded;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<kv::KvPool> pool;
};

// `tweak` may change the loaded config before the model is built.
std::unique_ptr<TinyEngine> make_tiny(const std::string& name,
                                      void (*tweak)(model::ModelConfig*) = nullptr) {
  auto e = std::make_unique<TinyEngine>();
  auto loaded = model::load_model(model_path("hf-tiny/" + name), {});
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  if (!loaded.ok()) return nullptr;
  e->loaded = std::move(loaded).value();
  if (tweak) tweak(&e->loaded.config);
  auto be = backend::create_backend("cpu", 2);
  EXPECT_TRUE(be.ok()) << be.status().to_string();
  if (!be.ok()) return nullptr;
  e->backend = std::move(be).value();
  auto m = model::LlamaModel::create(e->loaded, *e->backend);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return nullptr;
  e->model = std::move(m).value();
  kv::KvPoolConfig pc;
  pc.num_blocks = 64;
  pc.block_size = 16;
  auto pool = kv::KvPool::create(*e->backend, pc, e->model->kv_shape());
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return nullptr;
  e->pool = std::move(pool).value();
  return e;
}

// Max |logit - HF's| after a prefill of `ids`.
double last_logits_error(TinyEngine& e, const std::vector<int32_t>& ids,
                         const std::vector<float>& want) {
  kv::BlockTable table;
  EXPECT_TRUE(e.pool->reserve(table, static_cast<int>(ids.size())));
  model::SeqStep s;
  s.tokens = ids;
  s.start_pos = 0;
  s.table = &table;
  s.logits = model::SeqStep::Logits::kLast;
  std::vector<float> logits;
  Status st = e.model->forward({&s, 1}, *e.pool, &logits);
  e.pool->release(table);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(logits.size(), want.size());
  if (!st.ok() || logits.size() != want.size()) return INFINITY;
  double err = 0;
  for (size_t v = 0; v < want.size(); ++v)
    err = std::max(err, std::fabs(double(logits[v]) - want[v]));
  return err;
}

bool have_hf_tiny() {
  return std::filesystem::exists(model_path("golden/hf_tiny_greedy.jsonl")) &&
         std::filesystem::exists(model_path("hf-tiny/llama3-tiny/config.json"));
}

// HF rounds its fp32 logits to 6 decimals in the golden file; f16 weights are upcast exactly.
// Measured: at most about 5e-6 on every case.
constexpr double kLogitTolerance = 2e-5;

TEST(HfTiny, LogitsAndGreedyTokensMatchTransformers) {
  if (!have_hf_tiny()) GTEST_SKIP() << "hf-tiny not found under " << models_dir();
  const auto cases = read_jsonl(model_path("golden/hf_tiny_greedy.jsonl"));
  ASSERT_GE(cases.size(), 15u);
  std::map<std::string, std::unique_ptr<TinyEngine>> engines;
  for (const auto& c : cases) {
    const std::string name = c["model"];
    const std::string prompt = c["prompt"];
    SCOPED_TRACE(name + " '" + prompt + "'");
    auto& e = engines[name];
    if (!e) e = make_tiny(name);
    ASSERT_NE(e, nullptr);
    const auto ids = c["prompt_token_ids"].get<std::vector<int32_t>>();
    auto enc = e->loaded.tokenizer->encode(prompt, true);
    ASSERT_TRUE(enc.ok()) << enc.status().to_string();
    EXPECT_EQ(*enc, ids);
    EXPECT_LT(last_logits_error(*e, ids, c["last_prompt_logits"].get<std::vector<float>>()),
              kLogitTolerance);
    const int max_tokens = c["max_tokens"];
    if (max_tokens == 0) continue;  // a logits-only case
    sched::GenerationInput in;
    in.prompt_ids = ids;
    in.params.temperature = 0.0f;
    in.params.max_tokens = max_tokens;
    in.params.ignore_eos = true;
    auto out = sched::generate_batch(*e->model, *e->pool, e->loaded.tokenizer.get(), {in});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ((*out)[0].output_ids, c["output_token_ids"].get<std::vector<int32_t>>());
  }
  EXPECT_EQ(engines.size(), 3u);
}

// The check above is sensitive to RoPE: qwen2-tiny with theta 10 000 (what a loader that ignores
// `rope_parameters` would use) and llama3-tiny without its Llama-3 scaling both miss HF's logits.
TEST(HfTiny, WrongRopeIsDetected) {
  if (!have_hf_tiny()) GTEST_SKIP() << "hf-tiny not found under " << models_dir();
  const auto cases = read_jsonl(model_path("golden/hf_tiny_greedy.jsonl"));
  auto find = [&](const std::string& model) {
    for (const auto& c : cases) {
      if (c["model"] == model && c["prompt_token_ids"].size() > 4) return c;
    }
    return nlohmann::json();
  };
  auto qwen = make_tiny("qwen2-tiny", [](model::ModelConfig* c) { c->rope_theta = 10000.0f; });
  auto llama = make_tiny("llama3-tiny", [](model::ModelConfig* c) { c->rope_scaling.reset(); });
  ASSERT_NE(qwen, nullptr);
  ASSERT_NE(llama, nullptr);
  for (auto [e, model] : {std::pair{qwen.get(), "qwen2-tiny"}, {llama.get(), "llama3-tiny"}}) {
    const auto c = find(model);
    ASSERT_FALSE(c.is_null()) << model;
    EXPECT_GT(last_logits_error(*e, c["prompt_token_ids"].get<std::vector<int32_t>>(),
                                c["last_prompt_logits"].get<std::vector<float>>()),
              100 * kLogitTolerance)
        << model;
  }
}

}  // namespace
}  // namespace kvsplit::testing
