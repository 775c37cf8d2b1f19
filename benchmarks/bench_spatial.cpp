// Spatial cut benchmarks (issue 13, kv-cuts.md §4), on the CPU backend (or --backend cuda):
//   decode    long-context decode (default 8K, 16K, 32K tokens of context) of B sequences whose KV
//             is spread over 1, 2 and 4 shards: tokens/s, exchange bytes per step against the
//             formula, and the merge's share of the sharded attention time;
//   capacity  with P blocks per shard, the longest context that runs (reserve + one decode step)
//             on 1, 2 and 4 shards, against the goal N x (unsharded limit) - one chunk.
// The context is not prefilled (32K tokens of prefill on a few cores take far too long): its KV
// pages are filled with deterministic random values (a function of the sequence, layer, page and
// element, so every shard count sees the same KV), then decode steps run from there.
//
//   bench_spatial                       # the full sweep (8K/16K/32K x 1/2/4 shards, B = 1) and
//                                       # capacity (4096 tokens per shard); under 2 min, 2 cores
//   bench_spatial --quick               # a few seconds: 1K/2K contexts, small pools
//   bench_spatial --decode --contexts 8192 --batch 4 --steps 4 --json
//   bench_spatial --decode --contexts 32768 --shards 1,2,4 --shard-compute both
//                                       # shards at once against shards in turns, same run
// --communicator auto|in_process|nccl picks the shard group's communicator as the engine does
// (kv.cuts.spatial.communicator); every output names the one used. The shards here are CPU
// backends, so auto and in_process exchange in-process and nccl is the rule's error.
// --backend cuda puts shard s on device s mod (visible devices), as the engine places a worker's
// shards (backend/shard_placement.h): one GPU gives virtual shards (a stream each), several one
// shard per GPU. Without a CUDA device it says it skipped and exits 0.
//   bench_spatial --backend cuda --decode --contexts 131072 --shards 1,2,4 --steps 4 --reps 2
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/shard_placement.h"
#include "common/cli_options.h"
#include "kv/kv_pool.h"
#include "model/llama_model.h"
#include "model/loader.h"

namespace {

using kvsplit::Status;
using kvsplit::model::SeqStep;
using Clock = std::chrono::steady_clock;

// CPU time of the whole process (every thread), seconds: on a machine shared with other jobs the
// wall time depends on the share of the cores the process gets (more threads, more share), this
// does not.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
  std::string model = "synthetic:llama-110m";
  int threads = 2;
  std::vector<int> contexts = {8192, 16384, 32768};
  std::vector<int> shards = {1, 2, 4};
  std::vector<int> batches = {1};
  int chunk = 1024;  // spatial_chunk_size (tokens)
  int block_size = 16;
  int steps = 6, warmup = 1, reps = 3;
  int capacity_tokens = 4096;  // --capacity: pool size of each shard, in tokens
  int force_chunk = -1;        // >= 0: split-K chunk of the unsharded decode (a control)
  int64_t peer_spin_us = 0;    // idle polling of the peer shards' threads (engine: 0)
  int peer_threads = 0;        // > 0: threads of each peer shard's backend (default: --threads)
  std::string shard_compute = "at-once";  // at-once | in-turns | both
  std::string communicator = "auto";      // auto | in_process | nccl
  std::string backend = "cpu";            // cpu | cuda (every shard)
  bool decode = false, capacity = false, json = false, quick = false;
};

// The 1-, 5- and 15-minute load averages (Linux /proc/loadavg), "?" elsewhere: the machine's
// load beside each measurement.
std::string load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  double a = 0, b = 0, c = 0;
  const int n = std::fscanf(f, "%lf %lf %lf", &a, &b, &c);
  std::fclose(f);
  if (n != 3) return "?";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", a, b, c);
  return buf;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A shard group of `num_shards` backends of o.backend (the home one is `home`), `blocks` blocks
// each.
struct Group {
  std::unique_ptr<kvsplit::backend::Backend> home;
  std::unique_ptr<kvsplit::kv::KvPool> pool;
  std::string communicator = "-";  // the group's communicator's name ("-": one shard)
};

kvsplit::StatusOr<Group> make_group(const Options& o, const kvsplit::kv::KvShape& shape,
                                    int num_shards, int blocks) {
  kvsplit::backend::BackendOptions bo;
  bo.threads = o.threads;
  Group g;
  KVSPLIT_ASSIGN_OR_RETURN(g.home, kvsplit::backend::create_backend(o.backend, bo));
  kvsplit::kv::KvPoolConfig pc;
  pc.num_blocks = blocks;
  pc.block_size = o.block_size;
  KVSPLIT_ASSIGN_OR_RETURN(g.pool, kvsplit::kv::KvPool::create(*g.home, pc, shape));
  if (num_shards > 1) {
    std::vector<std::unique_ptr<kvsplit::backend::Backend>> peers;
    std::vector<int32_t> devices;  // CUDA: the visible devices, the home's (0) first
    if (o.backend == "cuda")
      for (int d = 0; d < kvsplit::backend::visible_devices("cuda"); ++d) devices.push_back(d);
    for (int s = 1; s < num_shards; ++s) {
      kvsplit::backend::BackendOptions so = bo;
      so.device = s;  // CPU: a virtual device id per shard
      if (o.backend == "cuda") {
        KVSPLIT_ASSIGN_OR_RETURN(so.device, kvsplit::backend::shard_device(devices, 0, s));
      }
      so.spin_micros = o.peer_spin_us;  // 0 by default, as the engine sets them up
      if (o.peer_threads > 0) so.threads = o.peer_threads;
      KVSPLIT_ASSIGN_OR_RETURN(auto be, kvsplit::backend::create_backend(o.backend, so));
      peers.push_back(std::move(be));
    }
    KVSPLIT_RETURN_IF_ERROR(g.pool->add_shards(std::move(peers), o.chunk));
    const auto mode = kvsplit::parse_spatial_communicator(o.communicator);  // CLI-checked
    KVSPLIT_ASSIGN_OR_RETURN(auto comm, kvsplit::backend::make_shard_communicator(
                                            mode.value_or(kvsplit::SpatialCommunicator::kAuto),
                                            g.pool->shard_backends()));
    g.communicator = comm.comm->name();
    g.pool->set_communicator(std::move(comm.comm));
  }
  return g;
}

// Writes positions [0, tokens) of `table` (sequence `seq`): page i lives on shard pages[i].shard
// at block blocks[i]; every layer's K and V get values in [-1, 1) that depend on (seq, layer,
// page, element) only, not on where the page lives.
Status fill_kv(kvsplit::kv::KvPool& pool, const kvsplit::kv::BlockTable& table, int seq,
               int tokens) {
  const kvsplit::kv::KvShape& sh = pool.shape();
  const int bs = pool.block_size();
  const size_t page_floats = size_t(2) * sh.num_kv_heads * bs * sh.head_dim;  // [2, Hkv, bs, d]
  std::vector<float> page(page_floats);
  for (int i = 0; i < kvsplit::kv::BlockTable::blocks_for(tokens, bs); ++i) {
    const int s = table.pages.empty() ? 0 : table.pages[i].shard;
    kvsplit::kv::KvPool& shard = pool.shard(s);
    for (int l = 0; l < sh.num_layers; ++l) {
      const uint64_t key = splitmix64((uint64_t(seq) << 40) ^ (uint64_t(l) << 32) ^ uint64_t(i));
      for (size_t j = 0; j < page_floats; ++j)
        page[j] = static_cast<float>(splitmix64(key + j) >> 40) * (2.0f / 16777216.0f) - 1.0f;
      const kvsplit::backend::LayerKv kv = shard.layer(l);
      auto* dst = static_cast<char*>(kv.data) + size_t(table.blocks[i]) * page_floats * 4;
      KVSPLIT_RETURN_IF_ERROR(
          shard.backend().copy_h2d(dst, page.data(), page_floats * sizeof(float)));
    }
  }
  for (int s = 0; s < pool.num_shards(); ++s)
    KVSPLIT_RETURN_IF_ERROR(pool.shard(s).backend().synchronize());
  return kvsplit::ok_status();
}

struct DecodeResult {
  int context = 0, shards = 0, batch = 0, shards_used = 0;
  bool at_once = true;       // the shards compute their partials at once (ForwardOptions)
  std::string communicator;  // the group's ("-": one shard)
  double tokens_per_s = 0, ms_per_step = 0;
  double cpu_ms_per_step = 0;  // process CPU time (all threads) per step
  double exchange_bytes = 0, formula_bytes = 0, exchange_ms = 0;  // per step
  double formula_all_bytes = 0;  // per step, had every peer taken part (as before 2026-12-06)
  double attention_ms = 0, merge_ms = 0;  // per step (sharded path)
  std::vector<int32_t> ids;               // sequence 0's greedy tokens
};

// Bytes the shard group exchanges per decode step (sharded_attention.h): for each layer and
// each active peer shard (`peers`: a peer holding a page of some sequence up to its new position),
// the home sends the rows' queries (B x Hq x d floats) and the peer sends back its partial
// (output B x Hq x d and lse B x Hq); the new K/V rows (2 x Hkv x d each) go only to the shard
// owning their position, so `peer_rows` of the B rows (those whose position is on a shard other
// than the home) are sent once each. All f32. With peers = S - 1 it is the scheme before
// 2026-12-06, when every peer took part.
int64_t formula_bytes(const kvsplit::model::ModelConfig& c, int peers, int batch, int peer_rows) {
  const int64_t q_partial = int64_t{c.num_heads} * c.head_dim + c.num_heads * (c.head_dim + 1);
  const int64_t kv = int64_t{2} * c.num_kv_heads * c.head_dim;
  return int64_t{c.num_layers} * (peers * batch * q_partial + peer_rows * kv) *
         int64_t(sizeof(float));
}

// One configuration (context, shards, batch): its shard group, model and sequences, decoding
// greedily from position `context`. Blocks of steps are timed one at a time, so the
// configurations of a sweep can take turns (the same machine load for each).
class DecodeCase {
 public:
  static kvsplit::StatusOr<std::unique_ptr<DecodeCase>> create(const Options& o,
                                                               const kvsplit::model::LoadedModel& m,
                                                               int context, int num_shards,
                                                               int batch, bool at_once) {
    const kvsplit::model::ModelConfig& c = m.config;
    auto dc = std::unique_ptr<DecodeCase>(new DecodeCase(o));
    const int total = context + o.warmup + o.reps * o.steps;  // positions each sequence ends with
    // Per shard: every sequence's chunks round-robin, plus one chunk of slack.
    const int chunks = (total + o.chunk - 1) / o.chunk;
    const int blocks =
        batch * ((chunks + num_shards - 1) / num_shards + 1) * (o.chunk / o.block_size);
    const kvsplit::kv::KvShape shape{c.num_layers, c.num_kv_heads, c.head_dim};
    KVSPLIT_ASSIGN_OR_RETURN(dc->g_, make_group(o, shape, num_shards, blocks));
    KVSPLIT_ASSIGN_OR_RETURN(dc->model_, kvsplit::model::LlamaModel::create(m, *dc->g_.home));
    dc->tables_.resize(batch);
    dc->r_.context = context;
    dc->r_.shards = num_shards;
    dc->r_.batch = batch;
    dc->r_.at_once = at_once;
    dc->r_.communicator = dc->g_.communicator;
    for (int b = 0; b < batch; ++b) {
      dc->tables_[b].spread = num_shards > 1;
      if (!dc->g_.pool->reserve(dc->tables_[b], total))
        return kvsplit::resource_exhausted("bench: the pool cannot hold the sequences");
      KVSPLIT_RETURN_IF_ERROR(fill_kv(*dc->g_.pool, dc->tables_[b], b, context));
      dc->tokens_.push_back(3 + b);
    }
    dc->c_ = &c;
    dc->r_.shards_used = dc->tables_[0].shards_used();
    for (int t = 0; t < o.warmup; ++t) KVSPLIT_RETURN_IF_ERROR(dc->step());
    return dc;
  }
  ~DecodeCase() {
    for (auto& t : tables_) g_.pool->release(t);
  }

  // Times `steps` steps; the result keeps the fastest block (and that block's stats).
  Status time_block() {
    // The formulas of this block's steps: which shard owns each new position is fixed by the
    // tables reserved up front.
    int64_t formula = 0, formula_all = 0;
    for (int t = 0; t < o_.steps; ++t) {
      int peer_rows = 0;
      std::vector<char> active(r_.shards, 0);  // every page is resident (fill_kv)
      for (const auto& table : tables_) {
        const int page = (r_.context + pos_ + t) / o_.block_size;
        peer_rows += r_.shards > 1 && table.page(page).shard != 0;
        for (int p = 0; p <= page; ++p) active[table.page(p).shard] = 1;
      }
      if (r_.shards > 1) {
        const int peers = static_cast<int>(std::count(active.begin() + 1, active.end(), 1));
        formula += formula_bytes(*c_, peers, r_.batch, peer_rows);
        formula_all += formula_bytes(*c_, r_.shards - 1, r_.batch, peer_rows);
      }
    }
    const auto a = model_->sharding_stats();
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    for (int t = 0; t < o_.steps; ++t) KVSPLIT_RETURN_IF_ERROR(step());
    const double wall = seconds_since(t0);
    const double cpu = process_cpu_seconds() - cpu0;
    if (wall >= best_) return kvsplit::ok_status();
    best_ = wall;
    const auto b = model_->sharding_stats();
    const double n = o_.steps;
    r_.tokens_per_s = r_.batch * n / wall;
    r_.ms_per_step = 1e3 * wall / n;
    r_.cpu_ms_per_step = 1e3 * cpu / n;
    r_.exchange_bytes = double(b.exchange.bytes - a.exchange.bytes) / n;
    r_.formula_bytes = double(formula) / n;
    r_.formula_all_bytes = double(formula_all) / n;
    r_.exchange_ms = 1e3 * (b.exchange.seconds - a.exchange.seconds) / n;
    r_.attention_ms = 1e3 * (b.attention_seconds - a.attention_seconds) / n;
    r_.merge_ms = 1e3 * (b.merge_seconds - a.merge_seconds) / n;
    return kvsplit::ok_status();
  }
  const DecodeResult& result() const { return r_; }

 private:
  explicit DecodeCase(const Options& o) : o_(o) {}

  Status step() {
    const int batch = r_.batch;
    std::vector<SeqStep> steps(batch);
    for (int b = 0; b < batch; ++b) {
      steps[b].tokens = std::span<const int32_t>(&tokens_[b], 1);
      steps[b].start_pos = r_.context + pos_;
      steps[b].table = &tables_[b];
      steps[b].logits = SeqStep::Logits::kArgmax;
    }
    ids_.clear();
    logits_.clear();
    kvsplit::model::ForwardOptions fo;
    fo.force_chunk_tokens = o_.force_chunk;
    fo.concurrent_shards = r_.at_once;
    KVSPLIT_RETURN_IF_ERROR(model_->forward(steps, *g_.pool, &logits_, fo, &ids_));
    for (int b = 0; b < batch; ++b) tokens_[b] = ids_[b];
    r_.ids.push_back(ids_[0]);
    ++pos_;
    return kvsplit::ok_status();
  }

  const Options& o_;
  const kvsplit::model::ModelConfig* c_ = nullptr;
  Group g_;
  std::unique_ptr<kvsplit::model::LlamaModel> model_;
  std::vector<kvsplit::kv::BlockTable> tables_;
  std::vector<int32_t> tokens_, ids_;
  std::vector<float> logits_;
  int pos_ = 0;  // steps run
  double best_ = 1e30;
  DecodeResult r_;
};

int run_decode_sweep(const Options& o, const kvsplit::model::LoadedModel& m) {
  const kvsplit::model::ModelConfig& c = m.config;
  if (!o.json) {
    std::printf(
        "decode: %s, %s backend, %d threads per shard, block %d, spatial_chunk_size %d, the "
        "best of %d blocks of %d steps (the shard counts of a context take turns) after %d "
        "warm-up, f32 KV (%lld KiB per token), peer shards %d threads each\n"
        "  mode: \"at-once\" = the shards compute their partials at the same time, each on its "
        "own backend's threads; \"in-turns\" = one after another on the home's thread. \"vs 1\" "
        "is the ratio of tokens/s to the 1-shard run of the same context and batch; \"/turns\" "
        "the ratio of ms/step at once to in turns (same S; < 1: at once is faster); \"cpu ms\": "
        "the process's CPU time per step, all threads (the fastest block's).\n"
        "  Exchange per step (formula) = L x 4 B x (A x B x (Hq*d [q] + Hq*(d+1) [partial o, "
        "lse]) + P x 2*Hkv*d [new K,V rows, to their owner only]) = %d x (A x B x %lld B + P "
        "x %lld B), A = active peers (holding a page of some sequence up to its position), P = "
        "rows whose position is on a peer shard; \"all-peer B\" is the scheme in which every "
        "peer took part (A = S-1). The partials alone (kv-cuts.md §4's B x "
        "Hq x (d+2) per layer, here d+1: o is sent normalized with its lse) are %lld B per peer "
        "and row.\n"
        "  merge share = merge / (shard attention + merge) time of the sharded layers, both on "
        "the device's clock (CUDA events; the host clock on the CPU backend): the merge kernel's "
        "time, and per layer the longest shard's span from its K/V append to the end of its "
        "partial; no host wait inside either.\n"
        "  comm: the shard group's communicator (--communicator %s).\n"
        "  load average at the start: %s\n",
        m.source.c_str(), o.backend.c_str(), o.threads, o.block_size, o.chunk, o.reps, o.steps,
        o.warmup,
        static_cast<long long>(int64_t{c.num_layers} * 2 * c.num_kv_heads * c.head_dim * 4 / 1024),
        o.peer_threads > 0 ? o.peer_threads : o.threads, c.num_layers,
        static_cast<long long>(formula_bytes(c, 1, 1, 0) / c.num_layers),
        static_cast<long long>(int64_t{2} * c.num_kv_heads * c.head_dim * 4),
        static_cast<long long>(int64_t{c.num_layers} * c.num_heads * (c.head_dim + 1) * 4),
        o.communicator.c_str(), load_average().c_str());
    std::printf("%7s %3s %2s %8s %9s %8s %7s %7s %6s %6s %12s %12s %12s %7s %9s %8s %7s %5s %10s\n",
                "context", "B", "S", "mode", "tok/shard", "tok/s", "ms/step", "cpu ms", "vs 1",
                "/turns", "exch B/step", "formula B", "all-peer B", "exch ms", "attn ms",
                "merge ms", "merge%", "same", "comm");
  }
  int rc = 0;
  for (int ctx : o.contexts) {
    for (int batch : o.batches) {
      // Every shard count of this context and batch set up, then timed in turns.
      // With --shard-compute both, each S > 1 has a case computing its shards in turns and one
      // at once (two shard groups, in that order: the at-once row compares with the in-turns
      // one), timed in turns like the rest.
      std::vector<std::unique_ptr<DecodeCase>> cases;
      for (int s : o.shards) {
        for (int mode = 0; mode < 2; ++mode) {
          const bool at_once = mode == 1;
          if (s > 1 && o.shard_compute != "both" && at_once != (o.shard_compute == "at-once"))
            continue;
          if (s == 1 && mode == 0) continue;  // one shard: one case (no shards to run in turns)
          auto dc = DecodeCase::create(o, m, ctx, s, batch, at_once);
          if (!dc.ok()) {
            std::fprintf(stderr, "decode context %d, %d shards, B %d: %s\n", ctx, s, batch,
                         dc.status().to_string().c_str());
            rc = 1;
            continue;
          }
          cases.push_back(std::move(dc).value());
        }
      }
      // Each row is printed (and flushed) as soon as its case's last block is timed, so a run
      // cut short keeps the rows done: the 1-shard base and an at-once case's in-turns partner
      // come before it in `cases`.
      std::optional<DecodeResult> base;
      auto print_row = [&](const DecodeCase& dc) {
        const DecodeResult* r = &dc.result();
        const int s = r->shards;
        if (s == 1) base = *r;
        const double vs1 = base ? r->tokens_per_s / base->tokens_per_s : 0;
        const double sharded = r->attention_ms + r->merge_ms;
        const double share = sharded > 0 ? r->merge_ms / sharded : 0;
        const bool same = base && base->ids == r->ids;
        const int per_shard = ctx / std::max(1, r->shards_used);
        // ms/step at once over in turns, same S (both modes ran).
        double vs_turns = 0;
        for (auto& other : cases)
          if (other->result().shards == s && s > 1 && r->at_once && !other->result().at_once)
            vs_turns = r->ms_per_step / other->result().ms_per_step;
        const char* mode = s == 1 ? "-" : r->at_once ? "at-once" : "in-turns";
        if (o.json) {
          std::printf(
              "{\"bench\":\"spatial_decode\",\"backend\":\"%s\",\"model\":\"%s\",\"context\":%d,"
              "\"batch\":%d,"
              "\"shards\":%d,\"mode\":\"%s\",\"at_once_over_in_turns\":%s,\"shards_used\":%d,"
              "\"chunk\":%d,\"tokens_per_shard\":%d,"
              "\"steps\":%d,\"reps\":%d,\"tokens_per_s\":%.3f,\"ms_per_step\":%.3f,\"cpu_ms_per_"
              "step\":%.3f,"
              "\"vs_1_shard\":%s,\"exchange_bytes_per_step\":%.0f,\"formula_bytes_per_step\":%.0f,"
              "\"formula_every_peer_bytes_per_step\":%.0f,"
              "\"exchange_ms_per_step\":%.4f,\"attention_ms_per_step\":%.3f,"
              "\"merge_ms_per_step\":%.4f,\"merge_share\":%.5f,\"same_tokens_as_1_shard\":%s,"
              "\"communicator\":\"%s\",\"load_average\":\"%s\"}\n",
              o.backend.c_str(), m.source.c_str(), ctx, batch, s, mode,
              vs_turns > 0 ? std::to_string(vs_turns).c_str() : "null", r->shards_used, o.chunk,
              per_shard, o.steps, o.reps, r->tokens_per_s, r->ms_per_step, r->cpu_ms_per_step,
              base ? std::to_string(vs1).c_str() : "null", r->exchange_bytes, r->formula_bytes,
              r->formula_all_bytes, r->exchange_ms, r->attention_ms, r->merge_ms, share,
              base ? (same ? "true" : "false") : "null", r->communicator.c_str(),
              load_average().c_str());
        } else {
          std::printf(
              "%7d %3d %2d %8s %9d %8.2f %7.1f %7.1f %6.2f %6s %12.0f %12.0f %12.0f %7.3f %9.2f "
              "%8.3f %6.2f%% %5s %10s\n",
              ctx, batch, s, mode, per_shard, r->tokens_per_s, r->ms_per_step, r->cpu_ms_per_step,
              vs1, vs_turns > 0 ? std::to_string(vs_turns).substr(0, 5).c_str() : "-",
              r->exchange_bytes, r->formula_bytes, r->formula_all_bytes, r->exchange_ms,
              r->attention_ms, r->merge_ms, 100 * share, base ? (same ? "yes" : "NO") : "-",
              r->communicator.c_str());
        }
        std::fflush(stdout);
      };
      for (int rep = 0; rep < o.reps; ++rep) {
        for (auto& dc : cases) {
          if (Status st = dc->time_block(); !st.ok())
            return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
          if (rep == o.reps - 1) print_row(*dc);
        }
      }
    }
  }
  if (!o.json)
    std::printf(
        "  (\"same\": the greedy tokens equal the 1-shard run's; attn/merge ms are 0 for 1 shard, "
        "which runs the unsharded attention)\n  load average at the end: %s\n",
        load_average().c_str());
  return rc;
}

// Whether a context of `tokens` tokens runs: its pages reserve, and one decode step at position
// tokens - 1 succeeds over them.
kvsplit::StatusOr<bool> context_runs(Group& g, kvsplit::model::LlamaModel& model, int tokens,
                                     bool spread, bool step) {
  kvsplit::kv::BlockTable t;
  t.spread = spread;
  if (!g.pool->reserve(t, tokens)) return false;
  Status st = kvsplit::ok_status();
  if (step) {
    st = fill_kv(*g.pool, t, 0, tokens - 1);
    if (st.ok()) {
      const int32_t tok = 3;
      SeqStep s;
      s.tokens = std::span<const int32_t>(&tok, 1);
      s.start_pos = tokens - 1;
      s.table = &t;
      s.logits = SeqStep::Logits::kArgmax;
      std::vector<float> logits;
      std::vector<int32_t> ids;
      st = model.forward(std::vector<SeqStep>{s}, *g.pool, &logits, {}, &ids);
    }
  }
  g.pool->release(t);
  if (!st.ok()) return st;
  return true;
}

int run_capacity(const Options& o, const kvsplit::model::LoadedModel& m) {
  const kvsplit::model::ModelConfig& c = m.config;
  const int per_shard = (o.capacity_tokens + o.block_size - 1) / o.block_size;
  const kvsplit::kv::KvShape shape{c.num_layers, c.num_kv_heads, c.head_dim};
  if (!o.json)
    std::printf(
        "capacity: %d blocks of %d tokens per shard (%d tokens), spatial_chunk_size %d: the "
        "longest context that runs (its pages reserve and one decode step at its last position "
        "succeeds; one more token does not reserve)\n"
        "%3s %10s %10s %16s %5s %10s\n",
        per_shard, o.block_size, per_shard * o.block_size, o.chunk, "S", "longest", "x 1 shard",
        "goal N*U-chunk", "met", "comm");
  int rc = 0;
  int unsharded = 0;
  for (int s : o.shards) {
    auto g = make_group(o, shape, s, per_shard);
    if (!g.ok()) return std::fprintf(stderr, "%s\n", g.status().to_string().c_str()), 1;
    auto model = kvsplit::model::LlamaModel::create(m, *g->home);
    if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().to_string().c_str()), 1;
    // Binary search on the reservation (cheap), then one decode step at the longest.
    int lo = 0, hi = g->pool->total_blocks() * o.block_size + 1;  // runs(lo), !runs(hi)
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      auto ok = context_runs(*g, **model, mid, s > 1, false);
      if (!ok.ok()) return std::fprintf(stderr, "%s\n", ok.status().to_string().c_str()), 1;
      (*ok ? lo : hi) = mid;
    }
    auto ok = context_runs(*g, **model, lo, s > 1, true);
    if (!ok.ok() || !*ok) {
      std::fprintf(stderr, "capacity: %d shards: a decode step over %d tokens failed: %s\n", s, lo,
                   ok.ok() ? "no room" : ok.status().to_string().c_str());
      rc = 1;
      continue;
    }
    if (s == 1) unsharded = lo;
    const int goal = unsharded > 0 ? s * unsharded - (s > 1 ? o.chunk : 0) : 0;
    const bool met = unsharded > 0 && lo >= goal;
    if (o.json) {
      std::printf(
          "{\"bench\":\"spatial_capacity\",\"model\":\"%s\",\"shards\":%d,\"blocks_per_shard\":%d,"
          "\"block_size\":%d,\"chunk\":%d,\"longest_context\":%d,\"unsharded_limit\":%d,"
          "\"goal\":%d,\"met\":%s,\"communicator\":\"%s\"}\n",
          m.source.c_str(), s, per_shard, o.block_size, o.chunk, lo, unsharded, goal,
          unsharded > 0 ? (met ? "true" : "false") : "null", g->communicator.c_str());
    } else {
      std::printf("%3d %10d %10.2f %16d %5s %10s\n", s, lo,
                  unsharded > 0 ? double(lo) / unsharded : 0, goal,
                  unsharded > 0 ? (met ? "yes" : "NO") : "-", g->communicator.c_str());
    }
    std::fflush(stdout);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  Options o;
  CLI::App app{"spatial cut benchmarks (long-context decode over shards, capacity)"};
  app.add_option("--model", o.model,
                 "synthetic:<preset> (its context length is raised as needed with @ctx=N) or a "
                 "model path with a long enough context");
  app.add_option("--threads", o.threads, "CPU threads of each shard's backend");
  app.add_option("--backend", o.backend,
                 "every shard's backend: cpu, or cuda (shard s on device s mod visible devices)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--contexts", o.contexts, "decode: context lengths (tokens)")->delimiter(',');
  app.add_option("--shards", o.shards, "shard counts (1 first for the baselines)")
      ->delimiter(',')
      ->check(CLI::Range(1, 16));
  app.add_option("--batch", o.batches, "decode: batch sizes B (sequences of the same context)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--chunk", o.chunk, "spatial_chunk_size (tokens, a multiple of --block-size)");
  app.add_option("--block-size", o.block_size, "tokens per KV page");
  app.add_option("--steps", o.steps, "decode: timed steps")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", o.warmup, "decode: untimed steps first")->check(CLI::Range(0, 1000));
  app.add_option("--reps", o.reps,
                 "decode: timed blocks of --steps steps, the shard counts in turns (best of)")
      ->check(CLI::Range(1, 100));
  app.add_option("--force-chunk", o.force_chunk,
                 "decode: split-K chunk (tokens) of the unsharded (home) decode attention instead "
                 "of the planner's; a control: a shard group also splits each sequence's keys");
  app.add_option("--peer-spin-us", o.peer_spin_us,
                 "how long idle threads of the peer shards poll before sleeping (microseconds; "
                 "the engine uses 0: a sleeping shard must not hold a core; the home shard keeps "
                 "the default)");
  app.add_option("--peer-threads", o.peer_threads,
                 "threads of each peer shard's backend (default: --threads, as the engine)")
      ->check(CLI::Range(0, 256));
  app.add_option("--shard-compute", o.shard_compute,
                 "decode: the shards compute their partials at-once (each on its own backend's "
                 "threads, the engine's way), in-turns (one after another), or both (compared in "
                 "the same run)")
      ->check(CLI::IsMember({"at-once", "in-turns", "both"}));
  app.add_option("--communicator", o.communicator,
                 "the shard group's communicator, as kv.cuts.spatial.communicator: auto, "
                 "in_process or nccl (nccl needs CUDA shards on distinct GPUs: an error here)")
      ->check(CLI::IsMember({"auto", "in_process", "nccl"}));
  app.add_option("--capacity-tokens", o.capacity_tokens, "capacity: pool size per shard (tokens)");
  app.add_flag("--decode", o.decode, "run the decode sweep (default: both)");
  app.add_flag("--capacity", o.capacity, "run the capacity search (default: both)");
  app.add_flag("--json", o.json, "one JSON object per configuration, nothing else on stdout");
  app.add_flag(
      "--quick", o.quick,
      "a fast sanity run: contexts 1024,2048, chunk 256, 1 x 3 steps, 512 tokens per shard "
      "(each where its flag is not given)");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (o.quick) {  // its sizes where the flag was not given
    if (app.count("--contexts") == 0) o.contexts = {1024, 2048};
    if (app.count("--chunk") == 0) o.chunk = 256;
    if (app.count("--steps") == 0) o.steps = 3;
    if (app.count("--reps") == 0) o.reps = 1;
    if (app.count("--capacity-tokens") == 0) o.capacity_tokens = 512;
  }
  if (!o.decode && !o.capacity) o.decode = o.capacity = true;
  if (o.block_size <= 0 || o.chunk <= 0 || o.chunk % o.block_size != 0 || o.capacity_tokens <= 0)
    return std::fprintf(stderr, "--chunk must be a positive multiple of --block-size\n"), 1;
  std::sort(o.shards.begin(), o.shards.end());
  if (o.backend == "cuda" && kvsplit::backend::visible_devices("cuda") == 0) {
    std::printf("bench_spatial: skipped (no CUDA device)\n");
    return 0;
  }

  // The context the runs need: the longest decode, and the largest group's capacity.
  int64_t need = 0;
  if (o.decode)
    for (int c : o.contexts)
      need = std::max<int64_t>(need, int64_t{c} + o.warmup + int64_t{o.reps} * o.steps);
  if (o.capacity)
    need = std::max<int64_t>(need, int64_t{o.shards.back()} * (o.capacity_tokens + o.block_size));
  std::string spec = o.model;
  const bool synthetic = spec.rfind("synthetic:", 0) == 0;
  if (synthetic && spec.find("ctx=") == std::string::npos)
    spec += (spec.find('@') == std::string::npos ? "@ctx=" : ",ctx=") + std::to_string(need);
  kvsplit::model::LoadOptions lo;
  lo.load_tokenizer = false;
  auto loaded = kvsplit::model::load_model(spec, lo);
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str()), 1;
  if (loaded->config.max_seq_len < need)
    std::fprintf(stderr, "warning: %s has a context of %d tokens; the runs need %lld\n",
                 spec.c_str(), loaded->config.max_seq_len, static_cast<long long>(need));
  int rc = 0;
  if (o.decode) rc |= run_decode_sweep(o, *loaded);
  if (o.capacity) rc |= run_capacity(o, *loaded);
  return rc;
}
