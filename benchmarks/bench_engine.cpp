// bench_engine: prefill and decode throughput of the forward pass on one backend, with the
// machine's read bandwidth and fp32 FMA peak measured in the same run as denominators.
//
//   bench_engine --model synthetic:llama-110m --batches 1,4,16,64 --prompt-len 128
//   bench_engine ... --kv-policy semantic      # decode steps with the semantic cut's scoring and
//                                              # page transitions (SequenceCut) after each step
//   bench_engine --model synthetic:stories260k --threads 1 --write-profile profile.json
//                                              # the policy simulator's cost profile (docs/kvm.md)
//
// Decode "weight streaming bandwidth" = bytes of every weight matrix read per step / step time
// (each step reads all weights once, whatever the batch); prefill FLOP/s counts 2 flops per
// multiply-add of the matmuls plus attention (QK^T and PV over the causal triangle), timed as
// the median (and fastest) of --prefill-calls calls of the same prefill step.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/machine_probe.h"
#include "common/cli_options.h"
#include "common/thread_pool.h"
#include "engine/engine_impl.h"
#include "kernels/common/kv_quant.h"
#include "kv/kv_pool.h"
#include "kvm/profile.h"
#include "kvm/simulator.h"
#include "kvm/trace.h"
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
  // The layers' matmuls, run for every token; the LM head runs only for rows that produce
  // logits (a prefill's last token per sequence, every decode token).
  double matmul_flops_per_token = 0;
  double lm_head_flops_per_row = 0;
};

Costs model_costs(const model::ModelConfig& c, const model::ModelWeights& w,
                  const model::LlamaModel& llama) {
  Costs k;
  // What a decode step streams: the matrices at the dtype the backend holds them in (the CPU
  // backend keeps bf16/f16 as 16-bit, CUDA converts to its weight dtype).
  k.weight_bytes = llama.matmul_weight_bytes();
  auto flops = [](const model::WeightTensor& t) { return 2.0 * static_cast<double>(t.numel()); };
  auto mat = [&](const model::WeightTensor& t) { k.matmul_flops_per_token += flops(t); };
  for (const auto& l : w.layers) {
    mat(l.wq);
    mat(l.wk);
    mat(l.wv);
    mat(l.wo);
    mat(l.w_gate);
    mat(l.w_up);
    mat(l.w_down);
  }
  k.lm_head_flops_per_row = flops(w.lm_head.present() ? w.lm_head : w.embedding);
  return k;
}

int fail(const Status& st) {
  std::fprintf(stderr, "bench_engine: %s\n", st.to_string().c_str());
  return 1;
}

// The policy simulator's cost profile (kvm::EngineProfile, docs/kvm.md): prefill steps of one
// prompt at two lengths (slope: ms per prompt token), decode steps at batch sizes 1 and 8 and
// contexts 32 and 256 (least squares for base + per sequence + per attended KV token), the KV
// bytes per token at each precision, a host memcpy for the copy bandwidth, and the engine's
// fixed per-step cost beyond the forward pass (a short run of the real engine against the
// simulator's prediction for it). Each forward timing is
// the fastest of a few repeats.
int write_profile(const std::string& path, const std::string& model_path,
                  const std::string& backend_name, int threads, int block_size,
                  const model::ModelConfig& cfg, model::LlamaModel& llama, backend::Backend& be) {
  constexpr int kMaxBatch = 8, kMaxCtx = 256, kReps = 5;
  if (kMaxCtx + kReps + 2 > cfg.max_seq_len) {
    return fail(invalid_argument("--write-profile: the model context is shorter than 264"));
  }
  kv::KvPoolConfig pc;
  pc.block_size = block_size;
  pc.num_blocks = kMaxBatch * kv::BlockTable::blocks_for(kMaxCtx + kReps + 2, block_size);
  auto pool = kv::KvPool::create(be, pc, llama.kv_shape());
  if (!pool.ok()) return fail(pool.status());
  const int vocab = std::min(cfg.vocab_size, 259) - 3;
  std::vector<float> logits;
  // b sequences prefilled to `ctx` tokens; returns the prefill time (ms) and leaves the tables.
  auto prefill = [&](int b, int ctx, std::vector<kv::BlockTable>& tables,
                     std::vector<std::vector<int32_t>>& prompts) -> StatusOr<double> {
    tables.assign(b, kv::BlockTable{});
    prompts.assign(b, std::vector<int32_t>(ctx));
    std::vector<model::SeqStep> steps(b);
    for (int i = 0; i < b; ++i) {
      if (!(*pool)->reserve(tables[i], kMaxCtx + kReps + 2))
        return resource_exhausted("pool too small");
      for (int t = 0; t < ctx; ++t) prompts[i][t] = 3 + (t * 7 + i * 13) % vocab;
      steps[i] = model::SeqStep{prompts[i], 0, &tables[i], model::SeqStep::Logits::kLast};
    }
    const auto t0 = Clock::now();
    KVSPLIT_RETURN_IF_ERROR(llama.forward(steps, **pool, &logits));
    return 1e3 * seconds_since(t0);
  };
  auto release = [&](std::vector<kv::BlockTable>& tables) {
    for (auto& t : tables) (*pool)->release(t);
  };
  std::vector<kv::BlockTable> tables;
  std::vector<std::vector<int32_t>> prompts;
  // Prefill: one prompt of 32, 128 and 256 tokens; fit ms = a * n + b * n * n / 2 (its tokens
  // and the KV tokens they attend; the step base comes from the decode fit).
  const int plen[3] = {32, 128, kMaxCtx};
  double pre[3] = {1e300, 1e300, 1e300};
  for (int rep = 0; rep < kReps; ++rep) {
    for (int k = 0; k < 3; ++k) {
      auto ms = prefill(1, plen[k], tables, prompts);
      if (!ms.ok()) return fail(ms.status());
      pre[k] = std::min(pre[k], *ms);
      release(tables);
    }
  }
  double pa = 0, pb = 0;
  {
    double s11 = 0, s12 = 0, s22 = 0, t1 = 0, t2 = 0;
    for (int k = 0; k < 3; ++k) {
      const double u = plen[k], w = plen[k] * (plen[k] / 2.0);
      s11 += u * u;
      s12 += u * w;
      s22 += w * w;
      t1 += u * pre[k];
      t2 += w * pre[k];
    }
    const double det = s11 * s22 - s12 * s12;
    if (det != 0) {
      pa = (t1 * s22 - t2 * s12) / det;
      pb = (s11 * t2 - s12 * t1) / det;
    }
    if (pa < 0) {  // fit the attention term alone
      pa = 0;
      pb = t2 / s22;
    }
    if (pb < 0) {
      pb = 0;
      pa = t1 / s11;
    }
  }
  // Decode: rows (1, b, b * ctx) -> step ms.
  std::vector<std::array<double, 3>> rows;
  std::vector<double> ys;
  for (int b : {1, kMaxBatch}) {
    for (int ctx : {32, kMaxCtx}) {
      auto ms = prefill(b, ctx, tables, prompts);
      if (!ms.ok()) return fail(ms.status());
      std::vector<int32_t> next(b, 5);
      std::vector<model::SeqStep> steps(b);
      double best = 1e300;
      for (int s = 0; s < kReps; ++s) {
        for (int i = 0; i < b; ++i) {
          steps[i] = model::SeqStep{std::span<const int32_t>(&next[i], 1), ctx + s, &tables[i],
                                    model::SeqStep::Logits::kLast};
        }
        const auto t0 = Clock::now();
        if (Status st = llama.forward(steps, **pool, &logits); !st.ok()) return fail(st);
        best = std::min(best, 1e3 * seconds_since(t0));
      }
      release(tables);
      rows.push_back({1.0, static_cast<double>(b), static_cast<double>(b) * ctx});
      ys.push_back(best);
    }
  }
  // Least squares: solve (A^T A) x = A^T y (3x3, Cramer's rule).
  double m[3][3] = {}, v[3] = {};
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int i = 0; i < 3; ++i) {
      v[i] += rows[r][i] * ys[r];
      for (int j = 0; j < 3; ++j) m[i][j] += rows[r][i] * rows[r][j];
    }
  }
  auto det3 = [](double a[3][3]) {
    return a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) -
           a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0]) +
           a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
  };
  const double d = det3(m);
  double x[3] = {};
  for (int k = 0; k < 3; ++k) {
    double mk[3][3];
    std::memcpy(mk, m, sizeof(mk));
    for (int i = 0; i < 3; ++i) mk[i][k] = v[i];
    x[k] = d != 0 ? det3(mk) / d : 0;
  }
  kvm::EngineProfile p;
  p.model = model_path;
  p.backend = backend_name;
  p.threads = threads;
  p.max_context = cfg.max_seq_len;
  p.step_base_ms = std::max(0.0, x[0]);
  p.decode_ms_per_seq = std::max(0.0, x[1]);
  p.decode_ms_per_kv_token = std::max(0.0, x[2]);
  p.prefill_ms_per_token = pa;
  p.prefill_ms_per_kv_token = pb;
  // The pool's real page size (its dtype, f32 on every backend today), not a guess per backend.
  p.kv_bytes_per_token_full =
      static_cast<double>((*pool)->bytes_per_block()) / static_cast<double>(block_size);
  if (cfg.head_dim % 2 == 0) {
    const kernels::QuantPageLayout ql{cfg.num_kv_heads, 16, cfg.head_dim};
    p.kv_bytes_per_token_int8 =
        static_cast<double>(ql.bytes(kernels::KvPrecision::kInt8)) * cfg.num_layers / 16;
    p.kv_bytes_per_token_int4 =
        static_cast<double>(ql.bytes(kernels::KvPrecision::kInt4)) * cfg.num_layers / 16;
  } else {
    p.kv_bytes_per_token_int8 = p.kv_bytes_per_token_full / 4;
    p.kv_bytes_per_token_int4 = p.kv_bytes_per_token_full / 8;
  }
  {  // host copy bandwidth: 64 MiB memcpy, fastest of 3
    std::vector<char> a(64 << 20, 1), b(64 << 20);
    double best = 1e300;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = Clock::now();
      std::memcpy(b.data(), a.data(), a.size());
      best = std::min(best, 1e3 * seconds_since(t0));
    }
    p.copy_bytes_per_ms =
        static_cast<double>(a.size()) / std::max(best, 1e-6) + b[a.size() / 2] * 0;
  }
  // The engine's fixed cost per step beyond the forward pass (sampling, token events, scheduling,
  // the worker loop's wake-ups): 8 requests through one colocated worker of the real engine,
  // timed from the first submit to the last final event, against what the simulator predicts for
  // the same requests with the forward costs alone; the difference per simulated step.
  constexpr int kCalRequests = 8, kCalPrompt = 32, kCalOutput = 48;
  double overhead_ms = 0, cal_wall_ms = 0, cal_sim_ms = 0, in_step_ms = 0;
  int64_t cal_steps = 0, cal_sim_steps = 0;
  {
    EngineConfig ec;
    ec.model = model_path;
    ec.backend = backend_name;
    ec.mode = ServingMode::kColocated;
    ec.num_decode_workers = 1;
    ec.threads_per_worker = threads;
    ec.block_size = block_size;
    ec.kv_blocks_per_worker = 256;
    auto engine = EngineImpl::create(ec);
    if (!engine.ok()) return fail(engine.status());
    // One run of the batch is some 15 ms: a single wake-up or page-fault burst doubles it. So a
    // warm-up run, then kCalRuns timed runs on the same engine; the median is kept.
    constexpr int kCalRuns = 7;
    std::vector<double> walls;
    int64_t steps_before = 0;
    for (int run = 0; run <= kCalRuns; ++run) {
      std::vector<RequestHandle> hs;
      const auto t0 = Clock::now();
      for (int i = 0; i < kCalRequests; ++i) {
        Request r;
        r.prompt_token_ids.assign(kCalPrompt, 3 + i + run);
        r.sampling.max_tokens = kCalOutput;
        r.sampling.ignore_eos = true;
        r.sampling.temperature = 0;
        auto h = (*engine)->submit(r);
        if (!h.ok()) return fail(h.status());
        hs.push_back(*h);
      }
      for (auto& h : hs) {
        TokenEvent ev;
        while (h.next(&ev, std::chrono::minutes(2)) && !ev.final) {
        }
      }
      if (run > 0) walls.push_back(1e3 * seconds_since(t0));
      const auto snaps = (*engine)->worker_snapshots();
      if (run == 0 && !snaps.empty()) steps_before = snaps[0].steps;
      if (run == kCalRuns && !snaps.empty() && snaps[0].steps > steps_before) {
        cal_steps = (snaps[0].steps - steps_before) / kCalRuns;
        in_step_ms = (snaps[0].sampling_ms + snaps[0].bookkeeping_ms) / snaps[0].steps;
      }
    }
    std::sort(walls.begin(), walls.end());
    cal_wall_ms = walls[walls.size() / 2];
    SlaClass cls;
    cls.name = "default";
    ec.sla_classes = {cls};
    std::vector<kvm::TraceRequest> trace(kCalRequests);
    for (kvm::TraceRequest& t : trace) {
      t.arrival_ms = 0;
      t.prompt_tokens = kCalPrompt;
      t.output_tokens = kCalOutput;
    }
    auto sim = kvm::simulate(ec, p, trace);
    if (!sim.ok()) return fail(sim.status().with_prefix("--write-profile: calibration"));
    cal_sim_ms = sim->end_ms;
    cal_sim_steps = sim->steps;
    if (cal_sim_steps > 0) overhead_ms = std::max(0.0, (cal_wall_ms - cal_sim_ms) / cal_sim_steps);
  }
  p.step_overhead_ms = overhead_ms;
  if (Status st = kvm::validate(p); !st.ok()) return fail(st);
  if (Status st = kvm::write_profile_file(path, p); !st.ok()) return fail(st);
  std::printf(
      "profile %s: step %.4f ms + %.5f ms/prompt token + %.7f ms/attended prompt KV token + "
      "%.4f ms/decoding seq + %.7f ms/KV token; KV bytes/token full %.0f int8 %.0f int4 %.0f; "
      "copy %.0f MB/s\n",
      path.c_str(), p.step_base_ms, p.prefill_ms_per_token, p.prefill_ms_per_kv_token,
      p.decode_ms_per_seq, p.decode_ms_per_kv_token, p.kv_bytes_per_token_full,
      p.kv_bytes_per_token_int8, p.kv_bytes_per_token_int4, p.copy_bytes_per_ms / 1e3);
  for (size_t r = 0; r < rows.size(); ++r) {
    const double fit = x[0] + x[1] * rows[r][1] + x[2] * rows[r][2];
    std::printf("  decode batch %2.0f, KV tokens %5.0f: measured %.4f ms, fitted %.4f ms\n",
                rows[r][1], rows[r][2], ys[r], fit);
  }
  std::printf(
      "  engine run of %d x %d+%d tokens (median of 7 after a warm-up): %.2f ms, %lld steps "
      "(sampling + bookkeeping %.4f "
      "ms/step); simulated with the forward costs alone: %.2f ms, %lld steps; step_overhead_ms "
      "%.4f\n",
      kCalRequests, kCalPrompt, kCalOutput, cal_wall_ms, static_cast<long long>(cal_steps),
      in_step_ms, cal_sim_ms, static_cast<long long>(cal_sim_steps), overhead_ms);
  for (int k = 0; k < 3; ++k) {
    std::printf("  prefill 1 x %3d: measured %.4f ms, fitted %.4f ms\n", plen[k], pre[k],
                pa * plen[k] + pb * plen[k] * (plen[k] / 2.0));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_engine: prefill and decode throughput vs measured machine peaks"};
  std::string model_path = "synthetic:llama-110m";
  std::string backend_name = "cpu";
  std::vector<int> batches = {1, 4, 16, 64};
  int prompt_len = 128;
  int decode_steps = 8;
  int prefill_calls = 5;
  int threads = 0;
  int block_size = 16;
  bool skip_probe = false;
  int64_t spin_micros = -1;
  std::string kv_policy = "full";
  SemanticCutConfig sc;
  std::string profile_path;
  app.add_option("--model", model_path, "model path or synthetic:<preset>");
  app.add_option("--backend", backend_name, "cpu or cuda");
  app.add_option("--batches", batches, "batch sizes")->delimiter(',');
  app.add_option("--prompt-len", prompt_len, "prompt tokens per sequence (prefill)")
      ->check(kvsplit::kPositive);
  app.add_option("--decode-steps", decode_steps, "timed decode steps per batch size")
      ->check(kvsplit::kPositive);
  app.add_option("--prefill-calls", prefill_calls,
                 "timed prefill calls per batch size (median and fastest reported; at least 5)")
      ->check(CLI::Range(5, 1000));
  app.add_option("--threads", threads, "CPU threads (0: all)");
  app.add_option("--block-size", block_size, "KV page size")->check(CLI::Range(1, 1024));
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
  app.add_option("--write-profile", profile_path,
                 "measure the policy simulator's cost profile (docs/kvm.md), write it as JSON "
                 "to this file, and exit");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
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
  if (!profile_path.empty()) {
    return write_profile(profile_path, model_path, backend_name, (*be)->parallelism(), block_size,
                         cfg, **llama, **be);
  }
  const Costs costs = model_costs(cfg, loaded->weights, **llama);
  const int nthreads = (*be)->parallelism();

  double bw_gbs = 0, peak_gflops = 0;
  if (!skip_probe && backend_name == "cpu") {
    ThreadPool pool(nthreads);
    bw_gbs = backend::cpu::measure_read_bandwidth_gbs(pool);
    peak_gflops = backend::cpu::measure_fma_peak_gflops(pool);
  }
  std::printf(
      "model %s: %d layers, dim %d, hidden %d, heads %d/%d, vocab %d; matmul weights %.1f MB as "
      "held\n",
      loaded->source.c_str(), cfg.num_layers, cfg.dim, cfg.hidden_dim, cfg.num_heads,
      cfg.num_kv_heads, cfg.vocab_size, costs.weight_bytes / 1e6);
  std::printf("backend %s; measured read bandwidth %.1f GB/s, fp32 FMA peak %.1f GFLOP/s\n",
              (*be)->name().c_str(), bw_gbs, peak_gflops);
  std::printf("\n%6s | %14s %10s %8s %8s | %13s %11s %8s %8s\n", "batch", "prefill tok/s",
              "GFLOP/s", "of peak", "fastest", "decode tok/s", "weight GB/s", "of bw", "speedup");

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
    // Warm-up: one untimed prefill of the same prompts (the timed one overwrites its KV), so the
    // scratch buffers' first growth and the thread pool's start are not timed.
    if (Status w = (*llama)->forward(steps, **pool, &logits); !w.ok()) return fail(w);
    logits.clear();  // forward appends rows
    // Prefill: the b prompts in one step (b * prompt_len tokens), prefill_calls times (each
    // overwrites the KV of the one before); the median call and the fastest.
    std::vector<double> call_s;
    for (int c = 0; c < prefill_calls; ++c) {
      logits.clear();
      const auto c0 = Clock::now();
      if (Status st = (*llama)->forward(steps, **pool, &logits); !st.ok()) return fail(st);
      call_s.push_back(seconds_since(c0));
    }
    std::sort(call_s.begin(), call_s.end());
    const size_t n = call_s.size();
    const double prefill_s = n % 2 ? call_s[n / 2] : 0.5 * (call_s[n / 2 - 1] + call_s[n / 2]);
    const double prefill_best_s = call_s.front();
    const double tokens = static_cast<double>(b) * prompt_len;
    const double attn_flops = static_cast<double>(b) * cfg.num_layers * 2.0 * 2.0 * cfg.num_heads *
                              cfg.head_dim * (prompt_len * (prompt_len + 1) / 2.0);
    // The LM head runs once per sequence (Logits::kLast), not per prompt token.
    const double prefill_gflop =
        (tokens * costs.matmul_flops_per_token + b * costs.lm_head_flops_per_row + attn_flops) /
        1e9;
    const double prefill_gflops = prefill_gflop / prefill_s;
    const double prefill_best_gflops = prefill_gflop / prefill_best_s;

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
    const auto t0 = Clock::now();
    for (int s = 0; s < decode_steps; ++s) {
      if (Status e = decode_step(); !e.ok()) return fail(e);
    }
    const double decode_s = seconds_since(t0) / decode_steps;
    const double decode_tps = b / decode_s;
    const double weight_gbs = costs.weight_bytes / decode_s / 1e9;
    if (b == 1) decode_b1 = decode_tps;
    std::printf("%6d | %14.1f %10.1f %7.1f%% %7.1f%% | %13.1f %11.2f %7.1f%% %7.2fx\n", b,
                tokens / prefill_s, prefill_gflops,
                peak_gflops > 0 ? 100.0 * prefill_gflops / peak_gflops : 0.0,
                peak_gflops > 0 ? 100.0 * prefill_best_gflops / peak_gflops : 0.0, decode_tps,
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
      "\nprefill: %d-token prompts, all of a batch in one step, median of %d timed calls "
      "(fastest: of peak of the fastest call); decode: context %d, %d timed steps; kv policy %s "
      "(score_interval %d)\n",
      prompt_len, prefill_calls, prompt_len, decode_steps, kv_policy.c_str(), sc.score_interval);
  return 0;
}
