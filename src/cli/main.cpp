// kvsplit: the command-line tool. Subcommands: generate, perplexity, info, tokenize, policy.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/shard_placement.h"
#include "cli/common_flags.h"
#include "cli/cut_flags.h"
#include "cli/exit_codes.h"
#include "cli/perplexity.h"
#include "cli/policy.h"
#include "cli/stdout_writer.h"
#include "cli/tokenize.h"
#include "common/check.h"
#include "common/cli_options.h"
#include "common/config_rules.h"
#include "common/guided_flags.h"
#include "kernels/common/kv_quant.h"
#include "kv/kv_pool.h"
#include "model/default_model.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sampling/sampler.h"
#include "sched/batch_generate.h"
#include "sched/swap_cost.h"

namespace {

using namespace kvsplit;
using cli::CommonFlags;
using cli::fail;

// Fills model/tokenizer defaults; prints the choice to stderr.
void resolve_model(CommonFlags& f) {
  if (!f.model.empty()) return;
  model::DefaultModel d = model::resolve_default_model();
  f.model = d.model;
  if (f.tokenizer.empty()) f.tokenizer = d.tokenizer;
  std::fprintf(stderr, "%s\n", d.note.c_str());
}

struct GenerateFlags {
  std::vector<std::string> prompts;
  int max_tokens = 256;
  float temperature = 1.0f;
  float top_p = 0.9f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;  // unset: from the clock
  bool ignore_eos = false;
  std::vector<std::string> stop;
  int min_tokens = 0;
  std::vector<std::string> logit_bias;  // "ID=BIAS"
  GuidedFlags guided;
  bool json = false;
  int block_size = 16;
  int max_batch_tokens = 512;
  int split_chunk = -1;
  cli::CutFlags cut;
  // Temporal cut.
  int kv_blocks = 0;  // 0: as many as the batch needs (no preemption)
  std::string swap = "auto";
  int temporal_step_size = 1;
  std::string prefix_cache = "off";
  std::string disk_path;
  int64_t disk_capacity_mb = 1024;
  bool disk_direct_io = false;
  std::string disk_write_behind = "on";
  // Spatial cut.
  int spatial_shards = 1;
  int spatial_chunk_size = 4096;
  int spatial_min_context = 0;
  std::string spatial_communicator = "auto";
  // Speculative decoding.
  std::string speculative = "none";
  int num_speculative_tokens = 4;
  int prompt_lookup_min = 1;
  int prompt_lookup_max = 4;
};

// Warns on stderr about the flags given to `kvsplit generate` that this run does not read.
void warn_ignored_flags(const CLI::App& gen, const GenerateFlags& gf, const cli::ResolvedCut& rc) {
  cli::warn_ignored_cut_flags(gen, rc.policy);
  if (gf.spatial_shards <= 1) {
    const std::string s = given_flags(
        gen, {"--spatial-chunk-size", "--spatial-min-context", "--spatial-communicator"});
    if (!s.empty()) spdlog::warn("{}: no effect without --spatial-shards > 1", s);
  }
  if (gf.speculative == "none") {
    const std::string s = given_flags(
        gen, {"--num-speculative-tokens", "--prompt-lookup-min", "--prompt-lookup-max"});
    if (!s.empty()) spdlog::warn("{}: no effect without --speculative ngram", s);
  } else if (rc.policy != cuts::semantic::KvPolicy::kFull) {
    spdlog::warn(
        "--speculative: no effect with --kv-cache-compression / --kv-policy other than "
        "full (the cut scores and drops pages one decode token at a time)");
  }
  if (gf.disk_path.empty()) {
    const std::string s =
        given_flags(gen, {"--disk-capacity-mb", "--disk-direct-io", "--disk-write-behind"});
    if (!s.empty()) spdlog::warn("{}: no effect without --disk-path", s);
  }
}

int run_generate(const CLI::App& gen, CommonFlags& cf, const GenerateFlags& gf) {
  auto rc = cli::resolve_cut(gf.cut, gf.block_size);
  if (!rc.ok()) return fail(rc.status());
  warn_ignored_flags(gen, gf, *rc);
  // Before the model loads: a --guided-json @file that cannot be read fails at once.
  auto guided = guided_from_flags(gen, gf.guided);
  if (!guided.ok()) return fail(guided.status());
  if (gf.prompt_lookup_min > gf.prompt_lookup_max) {
    return fail(
        invalid_argument(fmt::format("--prompt-lookup-min {} must be <= --prompt-lookup-max {}",
                                     gf.prompt_lookup_min, gf.prompt_lookup_max)));
  }
  auto run = cli::load_run_model(cf);
  if (!run.ok()) return fail(run.status());
  model::LoadedModel* loaded = &(*run)->loaded;
  const model::ModelConfig& cfg = loaded->config;
  auto* backend = &(*run)->backend;
  auto* llama = &(*run)->llama;

  std::vector<std::string> prompts = gf.prompts;
  if (prompts.empty()) prompts.emplace_back("");
  const uint64_t base_seed =
      gf.seed ? *gf.seed
              : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  // An explicit --max-tokens below --min-tokens is a contradiction; the default (a cap, not a
  // request) is raised to --min-tokens instead.
  const bool max_given = gen.count("--max-tokens") > 0;
  if (max_given && gf.min_tokens > gf.max_tokens) {
    return fail(invalid_argument(
        fmt::format("--min-tokens {} exceeds --max-tokens {}", gf.min_tokens, gf.max_tokens)));
  }
  const int max_tokens = max_given ? gf.max_tokens : std::max(gf.max_tokens, gf.min_tokens);
  std::vector<std::pair<int32_t, float>> logit_bias;
  for (const std::string& entry : gf.logit_bias)
    logit_bias.push_back(*parse_logit_bias_entry(entry));  // kLogitBiasEntry checked the form
  std::vector<sched::GenerationInput> inputs(prompts.size());
  // As llama2.c's run.c caps its steps at the context: a --max-tokens the context cannot hold after
  // a prompt is capped to what it leaves (finish_reason "length") before the sampling parameters
  // are checked, so that any value the flag takes runs; the server refuses such a request instead.
  // Said once for the batch, with each capped prompt's own cap; the default (256) is a cap, not a
  // request, and capping it says nothing.
  constexpr int kCapsShown = 8;
  std::string caps;  // "prompt 0 at most 510 tokens, prompt 2 at most 300 tokens"
  int num_capped = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto ids = loaded->tokenizer->encode(prompts[i], /*add_bos=*/true);
    if (!ids.ok()) return fail(ids.status());
    inputs[i].prompt_ids = std::move(ids).value();
    SamplingParams& p = inputs[i].params;
    p.temperature = gf.temperature;
    p.top_p = gf.top_p == 0.0f ? 1.0f : gf.top_p;  // 0: no nucleus cut (llama2.c's -p 0)
    p.top_k = gf.top_k;
    p.min_p = gf.min_p;
    p.repetition_penalty = gf.repetition_penalty;
    p.presence_penalty = gf.presence_penalty;
    p.frequency_penalty = gf.frequency_penalty;
    // A prompt longer than the context (room <= 0) is refused by generate_batch.
    const int room = cfg.max_seq_len - static_cast<int>(inputs[i].prompt_ids.size()) + 1;
    p.max_tokens = std::min(max_tokens, std::max(room, 1));
    if (room > 0 && max_tokens > room && num_capped++ < kCapsShown)
      caps += fmt::format("{}prompt {} at most {} tokens", caps.empty() ? "" : ", ", i, room);
    p.ignore_eos = gf.ignore_eos;
    p.stop = gf.stop;
    // Capped with max_tokens at the context (as max_tokens is): generation ends there whatever
    // min_tokens asks.
    p.min_tokens = std::min(gf.min_tokens, p.max_tokens);
    p.logit_bias = logit_bias;
    p.guided = *guided;
    p.seed = sampling::stream_seed(base_seed, i);
  }
  if (num_capped > 0 && gen.count("--max-tokens") > 0) {
    if (num_capped > kCapsShown) caps += fmt::format(" and {} more", num_capped - kCapsShown);
    spdlog::warn(
        "--max-tokens {} exceeds what the context of {} leaves after the prompt in {} of {} "
        "prompts, capped to what each prompt leaves: {}",
        gf.max_tokens, cfg.max_seq_len, num_capped, inputs.size(), caps);
  }

  const SwapMode swap = parse_swap_mode(gf.swap).value_or(SwapMode::kAuto);  // CLI-checked
  kv::KvPoolConfig pc;
  pc.block_size = gf.block_size;
  const int needed = std::max(1, sched::blocks_needed(inputs, gf.block_size, cfg.max_seq_len));
  pc.num_blocks = gf.kv_blocks > 0 ? gf.kv_blocks : needed;
  sched::SequenceCut::size_tiers(rc->policy, rc->semantic, pc.num_blocks, (*llama)->kv_shape(),
                                 &pc);
  // With shards every shard's pages keep their originals in this (home) host tier, as the
  // engine sizes it: sized for one shard, demotions were refused once it filled.
  if (rc->policy != cuts::semantic::KvPolicy::kFull && gf.spatial_shards > 1)
    pc.host_bytes =
        std::min<int64_t>(pc.host_bytes * gf.spatial_shards, rc->semantic.host_capacity_mb << 20);
  if (pc.num_blocks < needed && swap != SwapMode::kNever) {
    // The temporal cut's room in the host tier, never more than the whole batch; the one tier
    // (with the semantic cut's originals) is at most --host-capacity-mb.
    const int64_t block_bytes = kv::KvPool::block_bytes(pc, (*llama)->kv_shape());
    const int64_t cap = rc->semantic.host_capacity_mb << 20;
    pc.host_bytes = std::min(cap, pc.host_bytes + std::min(cap, needed * block_bytes));
  }
  auto pool = kv::KvPool::create(**backend, pc, (*llama)->kv_shape());
  if (!pool.ok()) return fail(pool.status());
  if (gf.prefix_cache == "on") (*pool)->enable_prefix_cache();
  // As the engine refuses it at start: the spatial cut has no sliding-window attention (the run
  // failed with UNIMPLEMENTED midway, once a sequence first overflowed onto a peer).
  if (gf.spatial_shards > 1 && cfg.has_sliding_window())
    return fail(unimplemented(
        "--spatial-shards > 1: the spatial cut does not support sliding-window attention, and the "
        "model has windowed layers (sliding_window)"));
  if (gf.spatial_shards > 1) {  // the spatial cut: --kv-blocks pages on each shard
    std::vector<std::unique_ptr<backend::Backend>> peers;
    // CUDA: shard s on visible device s mod count (the home runs on device 0); the CPU backend's
    // shards get virtual device ids 1, 2, ...
    std::vector<int32_t> devices;
    if (cf.backend == "cuda")
      for (int d = 0; d < std::max(1, backend::visible_devices("cuda")); ++d) devices.push_back(d);
    for (int s = 1; s < gf.spatial_shards; ++s) {
      backend::BackendOptions so;
      so.threads = cf.threads;
      so.device = s;
      if (!devices.empty()) so.device = *backend::shard_device(devices, 0, s);
      so.spin_micros = 0;  // idle shard threads sleep (kv-cuts.md "Shards compute at once")
      auto be = backend::create_backend(cf.backend, so);
      if (!be.ok()) return fail(be.status().with_prefix("--spatial-shards"));
      peers.push_back(std::move(be).value());
    }
    Status st = (*pool)->add_shards(std::move(peers), gf.spatial_chunk_size);
    if (!st.ok()) return fail(st.with_prefix("--spatial-chunk-size"));
    // CLI-checked value; the rule and its errors: backend/communicator.h.
    const SpatialCommunicator mode =
        parse_spatial_communicator(gf.spatial_communicator).value_or(SpatialCommunicator::kAuto);
    auto comm = backend::make_shard_communicator(mode, (*pool)->shard_backends());
    if (!comm.ok()) return fail(comm.status().with_prefix("--spatial-communicator"));
    spdlog::log(comm->fell_back ? spdlog::level::warn : spdlog::level::info,
                "spatial cut: {} shards, communicator {}", gf.spatial_shards, comm->reason);
    (*pool)->set_communicator(std::move(comm->comm));
  }
  if (!gf.disk_path.empty()) {
    Status st = (*pool)->open_disk_tier(gf.disk_path, gf.disk_capacity_mb << 20, gf.disk_direct_io);
    if (!st.ok()) return fail(st.with_prefix("--disk-path"));
    (*pool)->set_disk_write_behind(gf.disk_write_behind == "on");
  }

  sched::BatchOptions bo;
  bo.max_batch_tokens = gf.max_batch_tokens;
  bo.forward.force_chunk_tokens = gf.split_chunk;
  bo.kv_policy = rc->policy;
  bo.semantic = rc->semantic;
  bo.prefill_tokens = rc->prefill;
  bo.swap = swap;
  bo.temporal_step_size = gf.temporal_step_size;
  bo.spatial_min_context = gf.spatial_min_context;
  bo.speculative.method =
      gf.speculative == "ngram" ? SpeculativeMethod::kNgram : SpeculativeMethod::kNone;
  bo.speculative.num_speculative_tokens = gf.num_speculative_tokens;
  bo.speculative.prompt_lookup_min = gf.prompt_lookup_min;
  bo.speculative.prompt_lookup_max = gf.prompt_lookup_max;
  kv::SwapStats swap_stats;
  bo.swap_stats = &swap_stats;
  bo.prefix_salt = kv::PrefixCache::salt_of("");
  sched::SequenceCutStats cut_stats;
  bo.cut_stats = &cut_stats;
  // Output in prompt order: with one prompt (no --json) its text as it comes; else each prompt's
  // JSON line (--json) or "[i] prompt text" line once it and every prompt before it finished.
  // The first write that fails (a full disk, a closed pipe) cancels the prompts not finished
  // (BatchOptions::cancel: their KV goes back to the pool, nothing more is generated): exit 1.
  cli::StdoutWriter writer;
  std::atomic<bool> cancel{false};
  bo.cancel = &cancel;
  const bool stream = !gf.json && prompts.size() == 1;
  const backend::Communicator* comm = (*pool)->communicator();
  auto line_of = [&](size_t i, const sched::GenerationOutput& o) {
    if (!gf.json) return "[" + std::to_string(i) + "] " + prompts[i] + o.text + "\n";
    nlohmann::json j;
    j["prompt"] = prompts[i];
    j["prompt_token_ids"] = inputs[i].prompt_ids;
    j["output_token_ids"] = o.output_ids;
    j["text"] = o.text;
    j["finish_reason"] = finish_reason_name(o.finish_reason);
    j["cached_tokens"] = o.cached_tokens;
    j["effective_kv_byte_seconds"] = o.effective_kv_byte_seconds;
    j["kv_token_seconds"] = o.kv_token_seconds;
    j["swapped_out_pages"] = o.swapped_out_pages;
    j["recomputed_tokens"] = o.recomputed_tokens;
    j["preemptions"] = o.preemptions;
    j["shards"] = o.shards;
    j["window_dropped_pages"] = o.window_dropped_pages;
    if (bo.speculative.enabled()) {
      j["spec_draft_tokens"] = o.spec_draft_tokens;
      j["spec_accepted_tokens"] = o.spec_accepted_tokens;
    }
    // With a shard group: its communicator ("in-process" or "nccl").
    if (comm != nullptr) j["communicator"] = comm->name();
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  };
  std::vector<std::optional<std::string>> lines(prompts.size());  // finished, not yet printed
  size_t printed = 0;                                             // lines printed
  if (stream) {
    bo.on_text = [&](int, std::string_view text) {
      if (!writer.write(text, /*flush=*/true)) cancel = true;
    };
  } else {
    bo.on_finish = [&](int i, const sched::GenerationOutput& o) {
      lines[static_cast<size_t>(i)] = line_of(static_cast<size_t>(i), o);
      for (; printed < lines.size() && lines[printed]; ++printed) {
        if (!writer.write(*lines[printed], /*flush=*/true)) cancel = true;
        lines[printed].reset();
      }
    };
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto out = sched::generate_batch(**llama, **pool, loaded->tokenizer.get(), inputs, bo);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!out.ok()) return fail(out.status());

  size_t generated = 0, cancelled = 0;
  for (const sched::GenerationOutput& o : *out) {
    generated += o.output_ids.size();
    if (o.finish_reason == FinishReason::kCancelled) ++cancelled;
  }
  if (writer.failed()) {
    return fail(internal_error(
        fmt::format("{}; generation stopped there: {} tokens generated, {} of {} prompts cancelled",
                    writer.status().message(), generated, cancelled, prompts.size())));
  }
  KVSPLIT_CHECK(stream || printed == prompts.size());  // every prompt finished, none cancelled
  if (stream && !writer.write("\n", /*flush=*/true)) return fail(writer.status());
  if (Status st = cli::flush_stdout(); !st.ok()) return fail(st);
  if (cf.verbose || !gf.json) {
    std::fprintf(stderr, "%zu prompts, %zu tokens generated in %.3f s (%.1f tok/s)\n",
                 prompts.size(), generated, secs, secs > 0 ? generated / secs : 0.0);
    if (swap_stats.swaps_out > 0 || pc.num_blocks < needed) {
      int recomputed = 0;
      for (const sched::GenerationOutput& o : *out) recomputed += o.recomputed_tokens;
      std::fprintf(stderr,
                   "kv: %d blocks (%d needed without preemption), swap %s: swapped out %lld "
                   "sequences (%lld pages; %lld to disk), in %lld (prefetch %lld hits, %lld "
                   "misses); disk faults %lld; %d tokens recomputed\n",
                   pc.num_blocks, needed, sched::swap_mode_name(swap),
                   static_cast<long long>(swap_stats.swaps_out),
                   static_cast<long long>(swap_stats.pages_out),
                   static_cast<long long>(swap_stats.to_disk),
                   static_cast<long long>(swap_stats.swaps_in),
                   static_cast<long long>(swap_stats.prefetch_hits),
                   static_cast<long long>(swap_stats.prefetch_misses),
                   static_cast<long long>(swap_stats.disk_faults), recomputed);
    }
    if (bo.speculative.enabled()) {
      int64_t drafts = 0, accepted = 0;
      for (const sched::GenerationOutput& o : *out) {
        drafts += o.spec_draft_tokens;
        accepted += o.spec_accepted_tokens;
      }
      std::fprintf(stderr,
                   "speculative %s: %lld draft tokens, %lld accepted (%.1f%%): %lld of the %zu "
                   "tokens generated came without a forward pass of their own\n",
                   speculative_method_name(bo.speculative.method), static_cast<long long>(drafts),
                   static_cast<long long>(accepted),
                   drafts > 0 ? 100.0 * static_cast<double>(accepted) / drafts : 0.0,
                   static_cast<long long>(accepted), generated);
    }
    if (rc->policy != cuts::semantic::KvPolicy::kFull) {
      const kv::PageOpStats& o = cut_stats.ops;
      std::fprintf(stderr,
                   "kv policy %s: resident KV vs full avg %.3f, peak %.3f; demotions %lld, "
                   "evictions %lld, recalls %lld (%lld at int8/int4)\n",
                   cuts::semantic::kv_policy_name(rc->policy),
                   cut_stats.steps > 0 ? cut_stats.resident_fraction_sum / cut_stats.steps : 1.0,
                   cut_stats.steps > 0 ? cut_stats.peak_resident_fraction : 1.0,
                   static_cast<long long>(o.demoted_to_int8 + o.demoted_to_int4),
                   static_cast<long long>(o.evicted), static_cast<long long>(o.restored),
                   static_cast<long long>(o.restored_quantized));
    }
  }
  return 0;
}

int run_info(CommonFlags& cf) {
  resolve_model(cf);
  model::LoadOptions lo;
  lo.tokenizer_path = cf.tokenizer;
  auto loaded = model::load_model(cf.model, lo);
  if (!loaded.ok()) return fail(loaded.status());
  const model::ModelConfig& c = loaded->config;
  nlohmann::json j;
  j["source"] = loaded->source;
  j["architecture"] = c.architecture;
  j["dim"] = c.dim;
  j["hidden_dim"] = c.hidden_dim;
  j["num_layers"] = c.num_layers;
  j["num_heads"] = c.num_heads;
  j["num_kv_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_seq_len"] = c.max_seq_len;
  j["rope_theta"] = c.rope_theta;
  j["rope_type"] = c.rope_scaling ? model::rope_type_name(c.rope_scaling->type) : "default";
  j["rope_style"] = c.rope_style == backend::RopeStyle::kInterleaved ? "interleaved" : "half";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  // Each layer's sliding window (0: full attention) and how far back every query reads (0: the
  // whole context), so that a window the config implies (Mistral's default) is visible.
  j["layer_window"] = c.layer_window.empty() ? std::vector<int>(c.num_layers, 0) : c.layer_window;
  j["kv_window"] = c.kv_window();
  j["eos_token_ids"] = c.eos_token_ids;
  j["tokenizer"] = loaded->tokenizer ? std::string(loaded->tokenizer->kind()) : "none";
  // KV bytes per token at each rung of the semantic cut's ladder (pages of 16 tokens, all layers;
  // layouts in kernels/common/kv_quant.h). Full precision is f32 on the CPU, f16/bf16 on CUDA.
  if (c.head_dim % 2 == 0) {
    const kernels::QuantPageLayout ql{c.num_kv_heads, 16, c.head_dim};
    const double full_elems = 2.0 * c.num_kv_heads * c.head_dim * c.num_layers;
    nlohmann::json b;
    b["full_f32"] = full_elems * 4;
    b["full_f16"] = full_elems * 2;
    b["int8"] = static_cast<double>(ql.bytes(kernels::KvPrecision::kInt8)) * c.num_layers / 16;
    b["int4"] = static_cast<double>(ql.bytes(kernels::KvPrecision::kInt4)) * c.num_layers / 16;
    // The key summary a page below full keeps beside it (and alone once evicted).
    b["summary"] = 2.0 * c.num_kv_heads * c.head_dim *
                   static_cast<double>(sizeof(kernels::KvSummaryElem)) * c.num_layers / 16;
    j["kv_bytes_per_token"] = b;
  }
  std::cout << j.dump(2) << "\n";
  if (Status st = cli::flush_stdout(); !st.ok()) return fail(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A stdout pipe whose reader has gone (`kvsplit generate ... | head -c 10`) is a write that
  // fails (EPIPE), handled as any failed write (cli/stdout_writer.h: the work stops, exit 1 with
  // one line on stderr), rather than a SIGPIPE that kills the process where it stands.
  std::signal(SIGPIPE, SIG_IGN);
  auto logger = spdlog::stderr_color_mt("kvsplit");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::warn);

  CLI::App app{"kvsplit: a decode-side LLM inference engine"};
  app.require_subcommand(1);

  CommonFlags gen_common;
  GenerateFlags gf;
  CLI::App* gen =
      app.add_subcommand("generate", "generate text for one or more prompts (one batch)");
  cli::add_common(gen, gen_common);
  // One value per --prompt: "--prompt Once upon" (unquoted) is refused instead of running the two
  // prompts "Once" and "upon".
  gen->add_option("-p,--prompt", gf.prompts,
                  "prompt (repeat the flag for several; they run as one batch)")
      ->allow_extra_args(false);
  gen->add_option("-n,--max-tokens", gf.max_tokens,
                  "tokens to generate (the prefill's token counts as the first), >= 1; more than "
                  "the context leaves after a prompt are capped there, with a warning")
      ->check(kvsplit::kPositive);
  gen->add_option("-t,--temperature", gf.temperature, "0 = greedy");
  gen->add_option(
      "--top-p", gf.top_p,
      "nucleus sampling threshold, (0, 1]; 0 also turns the cut off, as llama2.c's -p 0");
  gen->add_option("--top-k", gf.top_k, "keep the k most likely tokens (0 or -1 = off)");
  gen->add_option("--min-p", gf.min_p, "drop tokens below min-p * max probability");
  gen->add_option("--repetition-penalty", gf.repetition_penalty, "HF repetition penalty (1 = off)");
  gen->add_option("--presence-penalty", gf.presence_penalty, "OpenAI presence penalty");
  gen->add_option("--frequency-penalty", gf.frequency_penalty, "OpenAI frequency penalty");
  gen->add_option(
      "-s,--seed", gf.seed,
      "RNG seed of the first prompt (as run.c's -s); the others get seeds derived from it "
      "(sampling::stream_seed); default: from the clock");
  gen->add_flag("--ignore-eos", gf.ignore_eos, "do not stop on the model's EOS ids");
  // One value per --stop: `--stop X text` must not read `text` as a second stop string.
  gen->add_option("--stop", gf.stop, "stop string (repeatable: --stop a --stop b)")
      ->allow_extra_args(false);
  gen->add_option("--min-tokens", gf.min_tokens,
                  "tokens to generate before EOS, a stop token id or a stop string may end "
                  "generation (vLLM's min_tokens)")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--logit-bias", gf.logit_bias,
                  "ID=BIAS: add BIAS in [-100, 100] to token ID's logit (repeatable)")
      ->allow_extra_args(false)
      ->check(kLogitBiasEntry);
  add_guided_options(gen, gf.guided);
  gen->add_flag("--json", gf.json, "print one JSON line per prompt");
  gen->add_option("--block-size", gf.block_size, "KV page size in tokens")
      ->check(CLI::Range(1, 1024));
  gen->add_option("--max-batch-tokens", gf.max_batch_tokens, "token budget per step")
      ->check(kvsplit::kPositive);
  gen->add_option("--kv-blocks", gf.kv_blocks,
                  "device KV pages (0: as many as the batch needs; fewer: preemption)")
      ->check(kvsplit::kNonNegative);
  gen->add_option("--swap", gf.swap,
                  "preempted sequences: swap to the host tier (always), recompute (never), or "
                  "whichever the cost model predicts is cheaper (auto)")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  gen->add_option("--temporal-step-size", gf.temporal_step_size,
                  "steps a swapped-out sequence waits before it is considered again")
      ->check(kvsplit::kPositive)
      ->capture_default_str();
  gen->add_option("--prefix-cache", gf.prefix_cache,
                  "share full prompt pages between the prompts (admitted one per step)")
      ->check(CLI::IsMember({"on", "off"}));
  gen->add_option("--disk-path", gf.disk_path,
                  "disk tier directory below the host tier (its data file is wiped on open)");
  gen->add_option("--disk-capacity-mb", gf.disk_capacity_mb, "disk tier size (MiB)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  gen->add_flag("--disk-direct-io", gf.disk_direct_io,
                "disk tier with O_DIRECT (records bypass the page cache)");
  gen->add_option("--disk-write-behind", gf.disk_write_behind,
                  "a disk swap-out returns while its record is written (staged copy kept)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  gen->add_option("--spatial-shards", gf.spatial_shards,
                  "spatial cut: shards of the KV pool, each --kv-blocks pages (cuda: shard s on "
                  "visible device s mod count)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  gen->add_option("--spatial-chunk-size", gf.spatial_chunk_size,
                  "spatial cut: tokens per chunk placed on one shard (a multiple of --block-size)")
      ->check(kvsplit::kPositive)
      ->capture_default_str();
  gen->add_option("--spatial-min-context", gf.spatial_min_context,
                  "spatial cut: spread sequences whose prompt + max tokens exceed this (0 = all)")
      ->check(kvsplit::kNonNegative)
      ->capture_default_str();
  gen->add_option("--spatial-communicator", gf.spatial_communicator,
                  "spatial cut: how shards exchange: nccl when every shard is a cuda backend on "
                  "its own GPU and the binary has NCCL, else in-process (auto); in_process; nccl "
                  "(or an error)")
      ->check(CLI::IsMember({"auto", "in_process", "nccl"}))
      ->capture_default_str();
  gen->add_option(
         "--split-chunk", gf.split_chunk,
         "force decode split-K chunks of this many tokens (0 = no split; default: planner)")
      ->check(CLI::Range(0, 1 << 24));
  gen->add_option("--speculative", gf.speculative,
                  "speculative decoding: ngram (prompt lookup: drafts copied from where the "
                  "last n-gram occurred before, verified in one forward pass; same output) or "
                  "none")
      ->check(CLI::IsMember({"none", "ngram"}))
      ->capture_default_str();
  gen->add_option("--num-speculative-tokens", gf.num_speculative_tokens,
                  "speculative decoding: draft tokens per decode step at most")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  gen->add_option("--prompt-lookup-min", gf.prompt_lookup_min,
                  "speculative decoding: shortest n-gram looked up")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  gen->add_option("--prompt-lookup-max", gf.prompt_lookup_max,
                  "speculative decoding: longest n-gram looked up (tried first)")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  cli::add_cut_options(gen, gf.cut);
  gen->add_option(
         "--weight-dtype", gen_common.weight_dtype,
         "weight storage on the device: auto (the backend's default; cuda: bf16), f32, bf16 "
         "or f16. The cpu backend accepts auto and f32, which change nothing there (it keeps "
         "f32 weights f32 and the file's 16-bit weights 16-bit); bf16/f16 are cuda only")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16"}));

  CommonFlags ppl_common;
  cli::PerplexityFlags pf;
  CLI::App* ppl = app.add_subcommand(
      "perplexity", "teacher-forced NLL and perplexity of a text, under a KV policy");
  cli::add_perplexity_options(ppl, ppl_common, pf);

  CommonFlags info_common;
  CLI::App* info = app.add_subcommand("info", "print a model's configuration as JSON");
  cli::add_common(info, info_common);

  cli::TokenizeFlags tf;
  CLI::App* tokenize =
      app.add_subcommand("tokenize", "print token ids of texts (HF tokenizers' default encoding)");
  cli::add_tokenize_options(tokenize, tf);

  cli::PolicyFlags polf;
  CLI::App* policy = cli::add_policy_command(app, polf);

  kvsplit::strict_options(app, {"--prompt"});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int printed = app.exit(e);  // prints help, or the error with a usage hint
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr)
      std::fprintf(stderr, "(a text with spaces takes quotes: --prompt \"Once upon\")\n");
    if (printed != 0) return cli::kExitBadInput;
    Status st = cli::flush_stdout();  // --help's text
    return st.ok() ? 0 : fail(st);
  }
  if (gen->parsed()) {
    if (gen_common.verbose) spdlog::set_level(spdlog::level::info);
    return run_generate(*gen, gen_common, gf);
  }
  if (ppl->parsed()) {
    if (ppl_common.verbose) spdlog::set_level(spdlog::level::info);
    return cli::run_perplexity(*ppl, ppl_common, pf);
  }
  if (info->parsed()) return run_info(info_common);
  if (tokenize->parsed()) return cli::run_tokenize(tf);
  if (policy->parsed()) return cli::run_policy(policy, polf);
  return 0;
}
