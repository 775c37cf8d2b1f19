// bench_engine: prefill and decode throughput of the forward pass on one backend, with the
// machine's read bandwidth and fp32 FMA peak measured in the same run as denominators.
//
//   bench_engine --model synthetic:llama-110m --batches 1,4,16,64 --prompt-len 128
//   bench_engine ... --kv-policy semantic      # decode steps with the semantic cut's scoring and
//                                              # page transitions (SequenceCut) after each step
//
// Decode "weight streaming bandwidth" = bytes of every weight matrix read per step / step time
// (each step reads all weights once, whatever the batch); prefill FLOP/s counts 2 flops per
// multiply-add of the matmuls plus attention (QK^T and PV over the causal triangle).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/machine_probe.h"
#include "common/thread_pool.h"
#include "kv/kv_pool.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sched/sequence_cut.h"

namespace {

using namespace kvsplit;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Costs {
  double weight_bytes = 0;  // all matmul weights (embedding lookup excluded)
  double matmul_flops_per_token = 0;
};

Costs model_costs(const model::ModelConfig& c, const model::ModelWeights& w) {
  Costs k;
  auto mat = [&](const model::WeightTensor& t) {
    // The CPU backend computes in f32 from f32 copies of f16/bf16 weights.
    k.weight_bytes += static_cast<double>(t.numel()) * 4.0;
    k.matmul_flops_per_token += 2.0 * static_cast<double>(t.numel());
  };
  for (const auto& l : w.layers) {
    mat(l.wq);
    mat(l.wk);
    mat(l.wv);
    mat(l.wo);
    mat(l.w_gate);
    mat(l.w_up);
    mat(l.w_down);
  }
  mat(w.lm_head.present() ? w.lm_head : w.embedding);
  return k;
}

int fail(const Status& st) {
  std::fprintf(stderr, "bench_engine: %s\n", st.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_engine: prefill and decode throughput vs measured machine peaks"};
  std::string model_path = "synthetic:llama-110m";
  std::string backend_name = "cpu";
  std::vector<int> batches = {1, 4, 16, 64};
  int prompt_len = 128;
  int decode_steps = 8;
  int threads = 0;
  int block_size = 16;
  bool skip_probe = false;
  int64_t spin_micros = -1;
  std::string kv_policy = "full";
  SemanticCutConfig sc;
  app.add_option("--model", model_path, "model path or synthetic:<preset>");
  app.add_option("--backend", backend_name, "cpu or cuda");
  app.add_option("--batches", batches, "batch sizes")->delimiter(',');
  app.add_option("--prompt-len", prompt_len, "prompt tokens per sequence (prefill)")
      ->check(CLI::PositiveNumber);
  app.add_option("--decode-steps", decode_steps, "timed decode steps per batch size")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "CPU threads (0: all)");
  app.add_option("--block-size", block_size, "KV page size");
  app.add_flag("--skip-probe", skip_probe, "do not measure bandwidth / FMA peak");
  app.add_option("--spin-us", spin_micros,
                 "CPU: how long idle pool threads poll before sleeping (-1: default, 0: never)");
  app.add_option("--kv-policy", kv_policy,
                 "KV cut run on every decode step: full | semantic | streaming | h2o");
  app.add_option("--score-interval", sc.score_interval, "decode steps between scorings");
  app.add_option("--semantic-threshold", sc.semantic_threshold, "demotion threshold");
  app.add_option("--evict-threshold", sc.evict_threshold, "eviction threshold");
  app.add_option("--sink-tokens", sc.sink_tokens, "tokens never degraded at the start");
  app.add_option("--recent-tokens", sc.recent_tokens, "tokens never degraded at the end");
  CLI11_PARSE(app, argc, argv);
  auto policy = cuts::semantic::parse_kv_policy(kv_policy);
  if (!policy.ok()) return fail(policy.status());
  if (Status st = cuts::semantic::validate(sc, "--"); !st.ok()) return fail(st);
  spdlog::set_level(spdlog::level::warn);

  model::LoadOptions lo;
  lo.load_tokenizer = false;
  auto loaded = model::load_model(model_path, lo);
  if (!loaded.ok()) return fail(loaded.status());
  const model::ModelConfig& cfg = loaded->config;
  backend::BackendOptions bopt;
  bopt.threads = threads;
  bopt.spin_micros = spin_micros;
  auto be = backend::create_backend(backend_name, bopt);
  if (!be.ok()) return fail(be.status());
  auto llama = model::LlamaModel::create(*loaded, **be);
  if (!llama.ok()) return fail(llama.status());
  const Costs costs = model_costs(cfg, loaded->weights);
  const int nthreads = (*be)->parallelism();

  double bw_gbs = 0, peak_gflops = 0;
  if (!skip_probe && backend_name == "cpu") {
    ThreadPool pool(nthreads);
    bw_gbs = backend::cpu::measure_read_bandwidth_gbs(pool);
    peak_gflops = backend::cpu::measure_fma_peak_gflops(pool);
  }
  std::printf(
      "model %s: %d layers, dim %d, hidden %d, heads %d/%d, vocab %d; weights %.1f MB (f32)\n",
      loaded->source.c_str(), cfg.num_layers, cfg.dim, cfg.hidden_dim, cfg.num_heads,
      cfg.num_kv_heads, cfg.vocab_size, costs.weight_bytes / 1e6);
  std::printf("backend %s; measured read bandwidth %.1f GB/s, fp32 FMA peak %.1f GFLOP/s\n",
              (*be)->name().c_str(), bw_gbs, peak_gflops);
  std::printf("\n%6s | %14s %10s %8s | %13s %11s %8s %8s\n", "batch", "prefill tok/s", "GFLOP/s",
              "of peak", "decode tok/s", "weight GB/s", "of bw", "speedup");

  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int ctx_needed = prompt_len + decode_steps + 2;
  if (ctx_needed > cfg.max_seq_len) {
    return fail(invalid_argument("prompt-len + decode-steps exceed the model context"));
  }
  kv::KvPoolConfig pc;
  pc.block_size = block_size;
  pc.num_blocks = max_batch * kv::BlockTable::blocks_for(ctx_needed, block_size);
  sched::SequenceCut::size_tiers(*policy, sc, pc.num_blocks, (*llama)->kv_shape(), &pc);
  auto pool = kv::KvPool::create(**be, pc, (*llama)->kv_shape());
  if (!pool.ok()) return fail(pool.status());

  double decode_b1 = 0;
  for (int b : batches) {
    std::vector<kv::BlockTable> tables(b);
    std::vector<std::vector<int32_t>> prompts(b);
    std::vector<model::SeqStep> steps(b);
    std::vector<std::unique_ptr<sched::SequenceCut>> cuts(b);
    for (auto& c : cuts) {
      if (*policy != KvPolicy::kFull) c = std::make_unique<sched::SequenceCut>(*policy, sc);
    }
    double cut_s = 0;  // time in SequenceCut::finish over the timed steps
    sched::SequenceCutStats cut_stats;
    for (int i = 0; i < b; ++i) {
      if (!(*pool)->reserve(tables[i], ctx_needed))
        return fail(resource_exhausted("pool too small"));
      prompts[i].resize(prompt_len);
      for (int t = 0; t < prompt_len; ++t)
        prompts[i][t] = 3 + (t * 7 + i * 13) % (std::min(cfg.vocab_size, 259) - 3);
      steps[i] = model::SeqStep{prompts[i], 0, &tables[i], model::SeqStep::Logits::kLast};
    }
    std::vector<float> logits;
    // Prefill: the b prompts in one step (b * prompt_len tokens).
    auto t0 = Clock::now();
    Status st = (*llama)->forward(steps, **pool, &logits);
    const double prefill_s = seconds_since(t0);
    if (!st.ok()) return fail(st);
    const double tokens = static_cast<double>(b) * prompt_len;
    const double attn_flops = static_cast<double>(b) * cfg.num_layers * 2.0 * 2.0 * cfg.num_heads *
                              cfg.head_dim * (prompt_len * (prompt_len + 1) / 2.0);
    const double prefill_gflops =
        (tokens * costs.matmul_flops_per_token + attn_flops) / prefill_s / 1e9;

    // Decode: one warm-up step, then timed steps, one token per sequence each.
    std::vector<int32_t> next(b, 5);
    int pos = prompt_len;
    auto decode_step = [&]() -> Status {
      logits.clear();
      for (int i = 0; i < b; ++i) {
        steps[i] = model::SeqStep{std::span<const int32_t>(&next[i], 1), pos, &tables[i],
                                  model::SeqStep::Logits::kLast};
        if (cuts[i]) cuts[i]->prepare(steps[i], block_size);
      }
      ++pos;
      KVSPLIT_RETURN_IF_ERROR((*llama)->forward(steps, **pool, &logits));
      const auto c0 = Clock::now();
      for (int i = 0; i < b; ++i) {
        if (cuts[i]) KVSPLIT_RETURN_IF_ERROR(cuts[i]->finish(**pool, tables[i], pos));
      }
      cut_s += seconds_since(c0);
      return ok_status();
    };
    if (Status s = decode_step(); !s.ok()) return fail(s);
    cut_s = 0;
    t0 = Clock::now();
    for (int s = 0; s < decode_steps; ++s) {
      if (Status e = decode_step(); !e.ok()) return fail(e);
    }
    const double decode_s = seconds_since(t0) / decode_steps;
    const double decode_tps = b / decode_s;
    const double weight_gbs = costs.weight_bytes / decode_s / 1e9;
    if (b == 1) decode_b1 = decode_tps;
    std::printf("%6d | %14.1f %10.1f %7.1f%% | %13.1f %11.2f %7.1f%% %7.2fx\n", b,
                tokens / prefill_s, prefill_gflops,
                peak_gflops > 0 ? 100.0 * prefill_gflops / peak_gflops : 0.0, decode_tps,
                weight_gbs, bw_gbs > 0 ? 100.0 * weight_gbs / bw_gbs : 0.0,
                decode_b1 > 0 ? decode_tps / decode_b1 : 0.0);
    if (*policy != KvPolicy::kFull) {
      for (const auto& c : cuts) cut_stats.add(c->stats());
      std::printf(
          "       | kv cut %s: %.3f ms of %.3f ms per decode step in SequenceCut::finish "
          "(%.2f%%); %lld scored steps, %lld demotions, %lld evictions, %lld recalls\n",
          kv_policy.c_str(), 1e3 * cut_s / decode_steps, 1e3 * decode_s,
          100.0 * cut_s / decode_steps / decode_s, static_cast<long long>(cut_stats.scored_steps),
          static_cast<long long>(cut_stats.ops.demoted_to_int8 + cut_stats.ops.demoted_to_int4),
          static_cast<long long>(cut_stats.ops.evicted),
          static_cast<long long>(cut_stats.ops.restored));
    }
    for (auto& t : tables) (*pool)->release(t);
  }
  std::printf(
      "\nprefill: %d-token prompts, all of a batch in one step; decode: context %d, %d timed "
      "steps; kv policy %s (score_interval %d)\n",
      prompt_len, prompt_len, decode_steps, kv_policy.c_str(), sc.score_interval);
  return 0;
}
