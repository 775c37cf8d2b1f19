#include "cli/perplexity.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "cli/exit_codes.h"
#include "common/cli_options.h"
#include "common/file_read.h"
#include "common/json_util.h"
#include "kv/page_ops.h"
#include "sched/sequence_cut.h"

namespace kvsplit::cli {
namespace {

constexpr size_t kMaxTextBytes = size_t{256} << 20;

struct Totals {
  double nll = 0;  // sum of -log p(target)
  int64_t tokens = 0;
  sched::SequenceCutStats cut;
};

// -log softmax(logits)[target], in double. A row with a NaN or +inf entry, or no finite one (a
// model whose activations overflow) is an error rather than a NaN perplexity: every entry enters
// the softmax here, not just the largest.
StatusOr<double> token_nll(const float* logits, int vocab, int32_t target, int pos) {
  double m = -std::numeric_limits<double>::infinity();
  bool bad = false;
  for (int i = 0; i < vocab; ++i) {
    bad = bad || std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity();
    m = std::max<double>(m, logits[i]);
  }
  if (bad || !std::isfinite(m)) {
    return internal_error("the model produced no usable logits (NaN or infinite) at position " +
                          std::to_string(pos) +
                          ": its activations overflow float32 (check the weights)");
  }
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
  return -(static_cast<double>(logits[target]) - m - std::log(sum));
}

// Scores one window w (>= 2 tokens) from an empty KV cache: the first `prefill` tokens in one
// chunk (0: all of them without a cut, one with a cut), then one token per decode step with the
// cut acting after each step.
Status score_window(model::LlamaModel& llama, kv::KvPool& pool, std::span<const int32_t> w,
                    int prefill, const ResolvedCut& rc, const model::ForwardOptions& fo,
                    Totals* totals) {
  const int n = static_cast<int>(w.size());
  const int vocab = llama.config().vocab_size;
  sched::SequenceCut cut(rc.policy, rc.semantic);
  kv::BlockTable table;
  struct Release {
    kv::KvPool& pool;
    kv::BlockTable& table;
    ~Release() { pool.release(table); }
  } release{pool, table};

  // --prefill 0: the whole window in one chunk at full KV; with a cut on, every token is fed as
  // generation (a window prefilled whole would leave the cut no decode step to act in).
  const int whole = rc.policy == cuts::semantic::KvPolicy::kFull ? n : 1;
  const int p = std::clamp(prefill > 0 ? prefill : whole, 1, n);
  if (!pool.reserve(table, p)) return resource_exhausted("KV pool too small for the window");
  std::vector<float> logits;
  model::SeqStep first;
  first.tokens = w.subspan(0, p);
  first.start_pos = 0;
  first.table = &table;
  first.logits = model::SeqStep::Logits::kAll;
  KVSPLIT_RETURN_IF_ERROR(llama.forward(std::span(&first, 1), pool, &logits, fo));
  for (int r = 0; r + 1 < n && r < p; ++r) {
    KVSPLIT_ASSIGN_OR_RETURN(
        const double nll,
        token_nll(logits.data() + static_cast<size_t>(r) * vocab, vocab, w[r + 1], r));
    totals->nll += nll;
    ++totals->tokens;
  }
  for (int pos = p; pos + 1 < n; ++pos) {
    if (!pool.reserve(table, pos + 1))
      return resource_exhausted("KV pool too small for the window");
    // Recalls queued after the last step: the landed ones join this step (a bounded wait).
    KVSPLIT_RETURN_IF_ERROR(cut.settle(pool, table, std::chrono::steady_clock::now()));
    model::SeqStep d;
    d.tokens = w.subspan(pos, 1);
    d.start_pos = pos;
    d.table = &table;
    d.logits = model::SeqStep::Logits::kLast;
    cut.prepare(d, pool.block_size());
    logits.clear();
    KVSPLIT_RETURN_IF_ERROR(llama.forward(std::span(&d, 1), pool, &logits, fo));
    KVSPLIT_ASSIGN_OR_RETURN(const double nll, token_nll(logits.data(), vocab, w[pos + 1], pos));
    totals->nll += nll;
    ++totals->tokens;
    KVSPLIT_RETURN_IF_ERROR(cut.finish(pool, table, pos + 1));
  }
  totals->cut.add(cut.stats());
  return ok_status();
}

StatusOr<std::vector<std::vector<int32_t>>> read_sequences(const PerplexityFlags& f,
                                                           const model::Tokenizer& tok) {
  std::vector<std::vector<int32_t>> seqs;
  if (!f.text.empty() == !f.jsonl.empty())
    return invalid_argument("give exactly one of --text FILE and --jsonl FILE");
  if (!f.text.empty()) {
    KVSPLIT_ASSIGN_OR_RETURN(std::string text,
                             common::read_regular_file(f.text, kMaxTextBytes, "text"));
    KVSPLIT_RETURN_IF_ERROR(model::check_no_dropped_text(tok, text, f.text));
    KVSPLIT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode(text, /*add_bos=*/true));
    seqs.push_back(std::move(ids));
    return seqs;
  }
  KVSPLIT_ASSIGN_OR_RETURN(std::string body,
                           common::read_regular_file(f.jsonl, kMaxTextBytes, "jsonl"));
  size_t line_no = 0, begin = 0;
  while (begin < body.size()) {
    size_t end = body.find('\n', begin);
    if (end == std::string::npos) end = body.size();
    const std::string line = body.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = f.jsonl + ":" + std::to_string(line_no) + ": ";
    // The shared parser: nesting depth capped, a key given twice refused (not the last kept).
    KVSPLIT_ASSIGN_OR_RETURN(common::Json j,
                             common::parse_json(line, f.jsonl + ":" + std::to_string(line_no)));
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      return invalid_argument(where + "expected a JSON object with a string \"text\"");
    const std::string text = j["text"].get<std::string>();
    if (Status st = model::check_no_dropped_text(tok, text, "text"); !st.ok())
      return invalid_argument(where + st.message());
    auto ids = tok.encode(text, /*add_bos=*/true);
    if (!ids.ok()) return ids.status().with_prefix(where);
    seqs.push_back(std::move(ids).value());
  }
  if (seqs.empty()) return invalid_argument(f.jsonl + ": no lines");
  return seqs;
}

}  // namespace

void add_perplexity_options(CLI::App* app, CommonFlags& common, PerplexityFlags& f) {
  add_common(app, common);
  app->add_option("--text", f.text, "text file, scored as one stream in windows of --ctx");
  app->add_option("--jsonl", f.jsonl, "JSONL of {\"text\": ...}, each line its own sequence");
  app->add_option("--ctx", f.ctx,
                  "window in tokens (0: the model's context length; more is capped there, with a "
                  "warning)")
      ->check(kvsplit::kNonNegative);
  app->add_option("--block-size", f.block_size, "KV page size in tokens")
      ->check(CLI::Range(1, 1024));
  app->add_option("--split-chunk", f.split_chunk,
                  "force decode split-K chunks of this many tokens (0 = no split; default: "
                  "planner)")
      ->check(CLI::Range(0, 1 << 24));
  app->add_flag("--json", f.json, "print one JSON line");
  add_cut_options(app, f.cut);
}

int run_perplexity(const CLI::App& app, CommonFlags& common, const PerplexityFlags& f) {
  auto rc = resolve_cut(f.cut, f.block_size);
  if (!rc.ok()) return fail(rc.status());
  warn_ignored_cut_flags(app, rc->policy);
  auto run = load_run_model(common);
  if (!run.ok()) return fail(run.status());
  model::LlamaModel& llama = *(*run)->llama;
  const model::ModelConfig& cfg = llama.config();
  if (!(*run)->loaded.tokenizer) return fail(invalid_argument("the model has no tokenizer"));
  auto seqs = read_sequences(f, *(*run)->loaded.tokenizer);
  if (!seqs.ok()) return fail(seqs.status());
  const int ctx = f.ctx > 0 ? std::min(f.ctx, cfg.max_seq_len) : cfg.max_seq_len;
  if (ctx < 2) return fail(invalid_argument("--ctx must be >= 2"));
  if (f.ctx > cfg.max_seq_len) {  // as generate caps --max-tokens: said, not silent
    spdlog::warn("--ctx {} exceeds the model's context of {}: windows of {} tokens", f.ctx,
                 cfg.max_seq_len, ctx);
  }

  kv::KvPoolConfig pc;
  pc.block_size = f.block_size;
  const int pages = kv::BlockTable::blocks_for(ctx, f.block_size);
  pc.num_blocks = pages;
  sched::SequenceCut::size_tiers(rc->policy, rc->semantic, pages, llama.kv_shape(), &pc);
  auto pool = kv::KvPool::create(*(*run)->backend, pc, llama.kv_shape());
  if (!pool.ok()) return fail(pool.status());
  model::ForwardOptions fo;
  fo.force_chunk_tokens = f.split_chunk;

  Totals totals;
  int windows = 0;
  for (const std::vector<int32_t>& ids : *seqs) {
    for (size_t start = 0; start + 1 < ids.size(); start += static_cast<size_t>(ctx)) {
      const size_t len = std::min(static_cast<size_t>(ctx), ids.size() - start);
      if (len < 2) break;
      Status st = score_window(llama, **pool, std::span(ids).subspan(start, len), rc->prefill, *rc,
                               fo, &totals);
      if (!st.ok()) return fail(st);
      ++windows;
    }
  }
  if (totals.tokens == 0) return fail(invalid_argument("no window of at least 2 tokens to score"));
  const kv::KvPool& kvp = **pool;
  if (kvp.allocator().num_used() != 0 || kvp.host_allocator().num_used() != 0 ||
      kvp.summary_allocator().num_used() != 0 ||
      kvp.arena_allocator(kernels::KvPrecision::kInt8).num_used() != 0 ||
      kvp.arena_allocator(kernels::KvPrecision::kInt4).num_used() != 0) {
    return fail(internal_error("KV pages left after the run"));
  }

  const double nll = totals.nll / static_cast<double>(totals.tokens);
  const sched::SequenceCutStats& cs = totals.cut;
  const double avg_resident =
      cs.steps > 0 ? cs.resident_fraction_sum / static_cast<double>(cs.steps) : 1.0;
  const double peak_resident = cs.steps > 0 ? cs.peak_resident_fraction : 1.0;
  nlohmann::json j;
  j["tokens"] = totals.tokens;
  j["nll"] = nll;
  j["ppl"] = std::exp(nll);
  j["avg_resident_kv_fraction"] = avg_resident;
  j["peak_resident_kv_fraction"] = peak_resident;
  j["demotions"] = cs.ops.demoted_to_int8 + cs.ops.demoted_to_int4;
  j["evictions"] = cs.ops.evicted;
  j["recalls"] = cs.ops.restored;
  j["recalls_quantized"] = cs.ops.restored_quantized;  // evicted pages back at int8 / int4
  j["recalls_confirmed"] = cs.ops.recalls_confirmed;   // of those, then taken on to full
  j["recalls_cold"] = cs.ops.recalls_cold;             // of those, evicted again first
  // Pages per rung: the average over the decode steps of each window's pages at each rung.
  const char* kRungs[] = {"full", "int8", "int4", "evicted"};
  double avg_pages[4] = {};
  for (int r = 0; r < 4; ++r) {
    avg_pages[r] =
        cs.steps > 0 ? static_cast<double>(cs.page_steps[r]) / static_cast<double>(cs.steps) : 0.0;
    j["avg_pages"][kRungs[r]] = avg_pages[r];
  }
  j["policy"] = cuts::semantic::kv_policy_name(rc->policy);
  j["windows"] = windows;
  j["decode_steps"] = cs.steps;
  j["scored_steps"] = cs.scored_steps;
  j["demotions_to_int8"] = cs.ops.demoted_to_int8;
  j["demotions_to_int4"] = cs.ops.demoted_to_int4;
  j["originals_written"] = cs.ops.originals_written;
  j["refused_host_full"] = cs.ops.refused_host_full;
  j["refused_no_space"] = cs.ops.refused_no_space;
  j["recalls_late"] = cs.ops.restores_late;
  j["recall_ms_mean"] = cs.ops.restored > 0
                            ? 1e3 * cs.ops.restore_seconds / static_cast<double>(cs.ops.restored)
                            : 0.0;
  if (f.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%lld tokens in %d windows of <= %d: nll %.4f, ppl %.4f (policy %s)\n",
                static_cast<long long>(totals.tokens), windows, ctx, nll, std::exp(nll),
                cuts::semantic::kv_policy_name(rc->policy));
    if (rc->policy != cuts::semantic::KvPolicy::kFull || cs.steps > 0) {
      std::printf(
          "resident KV vs full: avg %.3f, peak %.3f; demotions %lld (int8 %lld, int4 %lld), "
          "evictions %lld, recalls %lld\n",
          avg_resident, peak_resident,
          static_cast<long long>(cs.ops.demoted_to_int8 + cs.ops.demoted_to_int4),
          static_cast<long long>(cs.ops.demoted_to_int8),
          static_cast<long long>(cs.ops.demoted_to_int4), static_cast<long long>(cs.ops.evicted),
          static_cast<long long>(cs.ops.restored));
      std::printf(
          "pages per rung (average over the decode steps): full %.2f, int8 %.2f, int4 %.2f, "
          "evicted %.2f\n",
          avg_pages[0], avg_pages[1], avg_pages[2], avg_pages[3]);
    }
  }
  if (Status st = flush_stdout(); !st.ok()) return fail(st);
  return 0;
}

}  // namespace kvsplit::cli
