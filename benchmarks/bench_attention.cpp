// Paged decode attention on the GPU: time per call and achieved bandwidth (mandatory bytes / time)
// for the shapes of issue 5, with and without split-K, against a read-only streaming kernel timed
// in the same run. Without CUDA (or without a device) it says so and exits 0.
//
//   bench_attention [--iters N] [--warmup N] [--mode plain|mixed] [--probe]
// plain: the all-full kernels. Mandatory bytes = every KV byte each query attends, once (for the
// `w4K` shapes, which decode with a 4096-key sliding window, the window's pages only) + q + out;
// compare the window rows with the same context's full attention. A row that reads under 2 x L2
// rotates its timed launches over `copies` copies of its pages (own pages, own block table:
// bench_attention_check.h) so that it reads HBM like the streaming reference; a row still under
// 2 x L2 (the copies did not fit) is marked L2-resident. Every row's output is checked: K is
// constant (uniform scores) and V of KV head h of page p is page_v_value(head_v_index(p, h)), so
// each query head's output must be the mean of its KV head's V over the attended keys' pages,
// computed on the host; a wrong output prints WRONG, says
// where on stderr, and makes the exit status non-zero.
// mixed: the mixed-precision kernels (semantic cut, kernels/attention/mixed_attention.h) over
// pages that are all full, all int8, all int4, or a mix of full / int8 / int4 / evicted; bytes
// actually read = each resident page once at its own size (bf16 page, or
// QuantPageLayout::bytes(p)) + q + out + tables, against the same streaming kernel. The `scored`
// rows add the scoring side outputs (every sequence scored: a second read of the resident K rows,
// counted in the bytes). --probe (with --mode mixed): all-full and all-int8 pages with each stage
// of the attention kernel left out in turn (MixedAttentionParams::probe: page info loaded once
// per block, no K/V row loads, no q.k, no P.V, and combinations): the time a stage costs is the
// difference from the full kernel's (outputs meaningless). Quote ratios, not absolutes.
#include <cstdio>

#if !defined(KVSPLIT_WITH_CUDA)
int main() {
  std::printf(
      "bench_attention: skipped (built without CUDA: nvcc was not found at configure time)\n");
  return 0;
}
#else

#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/split_plan.h"
#include "bench_attention_check.h"
#include "common/cli_options.h"
#include "kernels/attention/mixed_attention.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/bench/stream_read.h"
#include "kernels/common/kv_quant.h"

namespace {

struct Shape {
  const char* name;
  int num_seqs;
  int kv_len;
  int window = 0;  // sliding window (plain mode only): the keys read are the window's pages
};

#define CHECK_CUDA(expr)                                                      \
  do {                                                                        \
    cudaError_t e_ = (expr);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_)); \
      return 1;                                                               \
    }                                                                         \
  } while (0)
#define CHECK_OK(expr)                                                        \
  do {                                                                        \
    kvsplit::Status s_ = (expr);                                              \
    if (!s_.ok()) {                                                           \
      std::fprintf(stderr, "%s failed: %s\n", #expr, s_.to_string().c_str()); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

// Runs `fn` (it launches and returns the launch's Status) warmup + iters times; returns mean ms
// per call of the timed iterations. A refused launch stops the case: *st gets its status and the
// time returned means nothing (print FAILED, not numbers).
template <typename Fn>
float time_ms(cudaStream_t stream, int warmup, int iters, Fn&& fn, kvsplit::Status* st) {
  *st = kvsplit::ok_status();
  for (int i = 0; i < warmup && st->ok(); ++i) *st = fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, stream);
  for (int i = 0; i < iters && st->ok(); ++i) *st = fn();
  cudaEventRecord(b, stream);
  cudaEventSynchronize(b);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / static_cast<float>(iters);
}

using kvsplit::kernels::KvPrecision;

// One mix of page precisions: page i of a sequence gets pattern[i % size].
struct Mix {
  const char* name;
  std::vector<KvPrecision> pattern;
  bool scored;
};

// The mixed-precision kernels over `sh`: bytes actually read / time against the streaming read.
// probe: instead of every mix, all-full and all-int8 pages with each stage of the attention kernel
// left out in turn (MixedAttentionParams::probe): the time each stage costs is the difference.
// A refused launch prints FAILED in its row and adds one to *failed; returns 1 on a CUDA error.
int run_mixed(const Shape& sh, int sms, double l2_bytes, cudaStream_t stream, int warmup, int iters,
              bool probe, int* failed) {
  const kvsplit::kernels::QuantPageLayout ql{kKvHeads, kBlockSize, kHeadDim};
  const int blocks_per_seq = (sh.kv_len + kBlockSize - 1) / kBlockSize;
  const int num_pages = blocks_per_seq * sh.num_seqs;
  const size_t full_bytes = size_t{2} * kKvHeads * kBlockSize * kHeadDim * 2;  // bf16
  const size_t b8 = static_cast<size_t>(ql.bytes(KvPrecision::kInt8));
  const size_t b4 = static_cast<size_t>(ql.bytes(KvPrecision::kInt4));
  // Every page has a slot in every arena, so any mix can be laid out without reallocating.
  void *pages = nullptr, *arena8 = nullptr, *arena4 = nullptr;
  CHECK_CUDA(cudaMalloc(&pages, full_bytes * num_pages));
  CHECK_CUDA(cudaMalloc(&arena8, b8 * num_pages));
  CHECK_CUDA(cudaMalloc(&arena4, b4 * num_pages));
  // Finite values everywhere: bf16 0x3c3c ~0.0115; int8 codes 1 with f16 scales 0x0101; int4
  // nibbles 1 with f16 scales and zero points 0x1111.
  CHECK_CUDA(cudaMemset(pages, 0x3c, full_bytes * num_pages));
  CHECK_CUDA(cudaMemset(arena8, 0x01, b8 * num_pages));
  CHECK_CUDA(cudaMemset(arena4, 0x11, b4 * num_pages));
  std::vector<int32_t> ids(num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(42));
  std::vector<int32_t> kv_lens(sh.num_seqs, sh.kv_len), qs(sh.num_seqs + 1);
  for (int s = 0; s <= sh.num_seqs; ++s) qs[s] = s;
  const size_t q_elems = size_t(sh.num_seqs) * kHeads * kHeadDim;
  std::vector<float> q(q_elems, 0.01f);
  float *dq, *dout, *rel, *bound, *score_max;
  int32_t *dtab, *dlens, *dqs, *slots;
  uint8_t *dprec, *flags;
  unsigned* sink;
  const size_t tokens = size_t(num_pages) * kBlockSize;
  CHECK_CUDA(cudaMalloc(&dq, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&dout, q_elems * 4));
  CHECK_CUDA(cudaMalloc(&dtab, ids.size() * 4));
  CHECK_CUDA(cudaMalloc(&dlens, kv_lens.size() * 4));
  CHECK_CUDA(cudaMalloc(&dqs, qs.size() * 4));
  CHECK_CUDA(cudaMalloc(&dprec, ids.size()));
  CHECK_CUDA(cudaMalloc(&flags, sh.num_seqs));
  CHECK_CUDA(cudaMalloc(&slots, ids.size() * 4));
  CHECK_CUDA(cudaMalloc(&rel, tokens * 4));
  CHECK_CUDA(cudaMalloc(&bound, ids.size() * 4));
  CHECK_CUDA(cudaMalloc(&score_max, size_t(sh.num_seqs) * kHeads * 4));
  CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  CHECK_CUDA(cudaMemcpy(dq, q.data(), q_elems * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dtab, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dlens, kv_lens.data(), kv_lens.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dqs, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(flags, 1, sh.num_seqs));
  CHECK_CUDA(cudaMemset(slots, 0xff, ids.size() * 4));  // -1: no summaries (no bound work)
  CHECK_CUDA(cudaMemset(rel, 0, tokens * 4));
  CHECK_CUDA(cudaMemset(bound, 0, ids.size() * 4));

  kvsplit::Status st;
  const size_t stream_bytes = full_bytes * num_pages;
  const float stream_ms = time_ms(
      stream, warmup, iters,
      [&] { return kvsplit::kernels::launch_stream_read(pages, stream_bytes, sink, sms, stream); },
      &st);
  if (!st.ok()) {  // no reference bandwidth: the shape's rows would mean nothing
    std::printf("%-12s stream read FAILED: %s\n", sh.name, st.to_string().c_str());
    std::fflush(stdout);
    ++*failed;
  }
  const double stream_gbs = double(stream_bytes) / (stream_ms * 1e-3) / 1e9;
  const KvPrecision F = KvPrecision::kFull, I8 = KvPrecision::kInt8, I4 = KvPrecision::kInt4,
                    E = KvPrecision::kEvicted;
  const Mix mixes[] = {{"all-full", {F}, false},  {"all-int8", {I8}, false},
                       {"all-int4", {I4}, false}, {"f/8/4/evict", {F, I8, I4, E}, false},
                       {"all-int8", {I8}, true},  {"f/8/4/evict", {F, I8, I4, E}, true}};
  const kvsplit::backend::SplitPlan plan =
      kvsplit::backend::plan_decode_splits(kv_lens.data(), sh.num_seqs, kKvHeads, kBlockSize, sms);
  int32_t* dplan = nullptr;
  float* part = nullptr;
  if (plan.has_splits()) {
    CHECK_CUDA(cudaMalloc(&dplan, 2 * sh.num_seqs * 4));
    CHECK_CUDA(cudaMemcpy(dplan, plan.num_splits.data(), sh.num_seqs * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dplan + sh.num_seqs, plan.split_offset.data(), sh.num_seqs * 4,
                          cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&part, size_t(plan.total_splits) * kHeads * (kHeadDim + 2) * 4));
  }
  // A probe leaves stages of the kernel out (bits), or forces its pipeline depth (stages; 0: the
  // launcher's choice by occupancy).
  struct Probe {
    const char* name;
    int bits;
    int stages = 0;
  };
  namespace k = kvsplit::kernels;
  const Probe all_stages[] = {{"-", 0}};
  // Unscored all-full and all-int8 pages also with the pipeline depth forced, as plain mode does.
  const Probe depths[] = {{"-", 0}, {"(2 stages)", 0, 2}, {"(1 stage)", 0, 1}};
  const Probe probes[] = {
      {"-", 0},
      {"no-pageinfo", k::kMixedProbeNoPageInfo},
      {"no-rows", k::kMixedProbeNoRows},
      {"no-scores", k::kMixedProbeNoScores},
      {"no-pv", k::kMixedProbeNoPv},
      {"no-rows+scores+pv", k::kMixedProbeNoRows | k::kMixedProbeNoScores | k::kMixedProbeNoPv},
      {"none", k::kMixedProbeNoRows | k::kMixedProbeNoScores | k::kMixedProbeNoPv |
                   k::kMixedProbeNoPageInfo}};
  for (const Mix& mix : mixes) {
    if (!st.ok()) break;
    if (probe && (mix.scored || mix.pattern.size() != 1 || mix.pattern[0] == I4)) continue;
    std::vector<uint8_t> prec(ids.size());
    double read = 2.0 * q_elems * 4 + ids.size() * 5.0;  // q, out, tables, precisions
    for (int s = 0; s < sh.num_seqs; ++s) {
      for (int i = 0; i < blocks_per_seq; ++i) {
        const KvPrecision p = mix.pattern[i % mix.pattern.size()];
        prec[size_t(s) * blocks_per_seq + i] = static_cast<uint8_t>(p);
        const double page = p == F ? full_bytes : (p == I8 ? b8 : (p == I4 ? b4 : 0));
        read += page;
        // Scoring re-reads the K half of each resident page (about half its bytes).
        if (mix.scored) read += page / 2;
      }
    }
    if (mix.scored) read += tokens * 8.0;  // relevance read-modify-write
    CHECK_CUDA(cudaMemcpy(dprec, prec.data(), prec.size(), cudaMemcpyHostToDevice));
    kvsplit::kernels::MixedAttentionParams mp;
    kvsplit::kernels::PagedAttentionParams& p = mp.base;
    p.q = dq;
    p.out = dout;
    p.kv = pages;
    p.kv_dtype = kvsplit::kernels::ElemType::kBF16;
    p.num_seqs = sh.num_seqs;
    p.num_tokens = sh.num_seqs;
    p.num_heads = kHeads;
    p.num_kv_heads = kKvHeads;
    p.head_dim = kHeadDim;
    p.block_size = kBlockSize;
    p.num_blocks = num_pages;
    p.scale = 0.088f;
    p.query_start = dqs;
    p.kv_lens = dlens;
    p.block_tables = dtab;
    p.max_blocks_per_seq = blocks_per_seq;
    p.max_query_len = 1;
    p.max_splits = std::max(plan.max_splits, 1);
    if (plan.has_splits()) {
      const size_t heads = size_t(plan.total_splits) * kHeads;
      p.chunk_tokens = plan.chunk_tokens;
      p.num_splits = dplan;
      p.split_offset = dplan + sh.num_seqs;
      p.part_o = part;
      p.part_m = part + heads * kHeadDim;
      p.part_l = p.part_m + heads;
    }
    mp.page_precision = dprec;
    mp.int8_pages = arena8;
    mp.num_int8_blocks = num_pages;
    mp.int4_pages = arena4;
    mp.num_int4_blocks = num_pages;
    if (mix.scored) {
      mp.score_seqs = flags;
      mp.token_relevance = rel;
      mp.summary_slots = slots;
      mp.page_bound = bound;
      mp.score_max = score_max;
    }
    const bool single = !mix.scored && mix.pattern.size() == 1 && mix.pattern[0] != I4;
    for (const Probe& pr : probe    ? std::span<const Probe>(probes)
                           : single ? std::span<const Probe>(depths)
                                    : std::span<const Probe>(all_stages)) {
      mp.probe = pr.bits;
      p.pipeline_stages = pr.stages;
      kvsplit::Status row;
      const float ms = time_ms(
          stream, warmup, iters, [&] { return kvsplit::kernels::launch_mixed_decode(mp, stream); },
          &row);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (!row.ok()) {
        std::printf("%-12s %-12s %-6s %-18s %7d FAILED: %s\n", sh.name, mix.name,
                    mix.scored ? "scored" : "-", pr.name, plan.max_splits, row.to_string().c_str());
        ++*failed;
      } else {
        const double gbs = read / (ms * 1e-3) / 1e9;
        // No row here reads under 2 x L2 (the plain rows rotate copies; these would be marked).
        std::printf("%-12s %-12s %-6s %-18s %7d %10.1f %10.1f %10.1f %10.1f %8.1f%%%s\n", sh.name,
                    mix.name, mix.scored ? "scored" : "-", pr.name, plan.max_splits, read / 1e6,
                    ms * 1e3, gbs, stream_gbs, 100.0 * gbs / stream_gbs,
                    read < 2 * l2_bytes ? " L2-resident" : "");
      }
      std::fflush(stdout);
    }
  }
  for (void* ptr :
       {pages, arena8, arena4, static_cast<void*>(dq), static_cast<void*>(dout),
        static_cast<void*>(dtab), static_cast<void*>(dlens), static_cast<void*>(dqs),
        static_cast<void*>(dprec), static_cast<void*>(flags), static_cast<void*>(slots),
        static_cast<void*>(rel), static_cast<void*>(bound), static_cast<void*>(score_max),
        static_cast<void*>(sink), static_cast<void*>(dplan), static_cast<void*>(part)})
    if (ptr) cudaFree(ptr);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("paged decode attention bandwidth");
  int iters = 20, warmup = 3;
  app.add_option("--iters", iters, "timed iterations per case")->check(kvsplit::kPositive);
  app.add_option("--warmup", warmup, "untimed iterations per case")->check(kvsplit::kNonNegative);
  std::string mode = "plain";
  app.add_option("--mode", mode, "plain: the all-full kernels; mixed: mixed-precision pages")
      ->check(CLI::IsMember({"plain", "mixed"}));
  bool probe = false;
  app.add_flag("--probe", probe,
               "--mode mixed: all-full and all-int8 pages with each kernel stage left out in turn "
               "(the stage's cost is the difference; outputs meaningless)");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_attention: skipped (no CUDA device)\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const double l2_bytes = prop.l2CacheSize;
  std::printf("device: %s, %d SMs, L2 %.1f MiB; heads %d/%d, head_dim %d, bf16 KV, block %d\n",
              prop.name, sms, l2_bytes / (1 << 20), kHeads, kKvHeads, kHeadDim, kBlockSize);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  const Shape shapes[] = {
      {"B=64 x 8K", 64, 8192}, {"B=1 x 128K", 1, 131072}, {"B=128 x 2K", 128, 2048}};
  // Sliding-window decode (Mistral-7B-v0.1's window) at a long context: against B=1 x 128K's
  // full attention in the same run, the time it saves; its GB/s counts the window's pages only.
  const Shape windowed[] = {{"B=1 x 128K w4K", 1, 131072, 4096}, {"B=64 x 8K w4K", 64, 8192, 4096}};
  if (mode == "mixed") {
    std::printf("mixed-precision decode (split-K by the planner); MB = bytes actually read\n");
    std::printf("%-12s %-12s %-6s %-18s %7s %10s %10s %10s %10s %9s\n", "shape", "pages", "score",
                "left out/depth", "splits", "MB", "time_us", "GB/s", "stream", "of_stream");
    int failed = 0;
    for (const Shape& sh : shapes) {
      // A CUDA error (not a refused launch) ends the run: run_mixed returns without freeing that
      // shape's buffers, and the context may be unusable. Refused launches go on to the next.
      if (run_mixed(sh, sms, l2_bytes, stream, warmup, iters, probe, &failed) != 0) {
        ++failed;
        break;
      }
    }
    cudaStreamDestroy(stream);
    if (failed > 0) std::fprintf(stderr, "bench_attention: %d case(s) failed\n", failed);
    return failed > 0 ? 1 : 0;
  }
  std::printf("%-14s %-9s %6s %7s %10s %10s %10s %9s %6s %s\n", "shape", "split", "stages",
              "splits", "time_us", "GB/s", "stream", "of_stream", "copies", "output");
  std::vector<Shape> plain(std::begin(shapes), std::end(shapes));
  plain.insert(plain.end(), std::begin(windowed), std::end(windowed));
  int failed = 0;  // rows refused (FAILED) or with a wrong output (WRONG); the others still run
  for (const Shape& sh : plain) {
    const int blocks_per_seq = (sh.kv_len + kBlockSize - 1) / kBlockSize;
    const int num_blocks = blocks_per_seq * sh.num_seqs;
    const size_t half_elems = size_t{kKvHeads} * kBlockSize * kHeadDim;  // K or V of one page
    const size_t block_bytes = 2 * half_elems * 2;
    const size_t kv_bytes = block_bytes * num_blocks;
    // With a window only its pages are read (the splits start at the first key's page).
    const int read_len = kvsplit::backend::split_span(sh.kv_len, sh.window, kBlockSize);
    const double read_bytes =
        double(block_bytes) * sh.num_seqs * ((read_len + kBlockSize - 1) / kBlockSize);
    // A row that reads under 2 x L2 rotates its launches over copies of its read pages (see
    // bench_attention_check.h); if they do not fit in free memory it runs on one copy, marked.
    int copies = kvsplit::bench::rotation_copies(read_bytes, l2_bytes);
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(42));
    int64_t total_pages = 0;
    std::vector<int32_t> tabs =
        kvsplit::bench::rotation_tables(ids, sh.num_seqs, blocks_per_seq, sh.kv_len, sh.window,
                                        kBlockSize, copies, num_blocks, &total_pages);
    size_t free_mem = 0, total_mem = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_mem, &total_mem));
    if (copies > 1 && block_bytes * size_t(total_pages) + (size_t{256} << 20) > free_mem) {
      copies = 1;
      tabs = ids;
      total_pages = num_blocks;
    }
    const size_t pool_bytes = block_bytes * size_t(total_pages);
    void* pages = nullptr;
    CHECK_CUDA(cudaMalloc(&pages, pool_bytes));
    // K: bf16 0x3c3c ~ 0.0115 everywhere, so every key scores the same and the output is the
    // mean of V over the attended keys. V of KV head h of page p: page_v_value(head_v_index(p, h))
    // (one of 127 values), copied page by page from a device template of the 127 V halves
    // (template j: the V half of a page with p % 127 == j).
    CHECK_CUDA(cudaMemset(pages, 0x3c, pool_bytes));
    {
      const size_t head_elems = half_elems / kKvHeads;  // [kv_head, block_size, head_dim]
      std::vector<uint16_t> tmpl(half_elems * kvsplit::bench::kPageValueCount);
      for (int j = 0; j < kvsplit::bench::kPageValueCount; ++j)
        for (int h = 0; h < kKvHeads; ++h)
          std::fill_n(tmpl.begin() + half_elems * j + head_elems * h, head_elems,
                      kvsplit::bench::page_v_bits(kvsplit::bench::head_v_index(j, h)));
      void* dtmpl = nullptr;
      CHECK_CUDA(cudaMalloc(&dtmpl, tmpl.size() * 2));
      CHECK_CUDA(cudaMemcpy(dtmpl, tmpl.data(), tmpl.size() * 2, cudaMemcpyHostToDevice));
      for (int64_t pg = 0; pg < total_pages; ++pg)
        CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(pages) + block_bytes * pg + half_elems * 2,
                                   static_cast<const char*>(dtmpl) +
                                       half_elems * 2 * (pg % kvsplit::bench::kPageValueCount),
                                   half_elems * 2, cudaMemcpyDeviceToDevice, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaFree(dtmpl));
    }
    // Expected output of each (copy, sequence, KV head): the same for every query head of the KV
    // head (query head q reads KV head q / (kHeads / kKvHeads)) and every dim.
    std::vector<double> expect(size_t(copies) * sh.num_seqs * kKvHeads);
    for (size_t i = 0; i < expect.size(); ++i)
      expect[i] = kvsplit::bench::expected_decode_mean(tabs.data() + i / kKvHeads * blocks_per_seq,
                                                       sh.kv_len, sh.window, kBlockSize,
                                                       static_cast<int>(i % kKvHeads));
    // The expected value of output element i (q: [seq, head, dim]) after a launch over `copy`.
    const auto want_of = [&](int copy, size_t i) {
      const size_t seq = i / (size_t{kHeads} * kHeadDim);
      const size_t kv_head = i / kHeadDim % kHeads / (kHeads / kKvHeads);
      return expect[(size_t(copy) * sh.num_seqs + seq) * kKvHeads + kv_head];
    };
    std::vector<int32_t> kv_lens(sh.num_seqs, sh.kv_len), qs(sh.num_seqs + 1);
    for (int s = 0; s <= sh.num_seqs; ++s) qs[s] = s;
    const size_t q_elems = size_t(sh.num_seqs) * kHeads * kHeadDim;
    std::vector<float> q(q_elems, 0.01f), out(q_elems);
    float *dq, *dout;
    int32_t *dtab, *dlens, *dqs;
    int* derr;
    CHECK_CUDA(cudaMalloc(&dq, q_elems * 4));
    CHECK_CUDA(cudaMalloc(&dout, q_elems * 4));
    CHECK_CUDA(cudaMalloc(&dtab, tabs.size() * 4));
    CHECK_CUDA(cudaMalloc(&dlens, kv_lens.size() * 4));
    CHECK_CUDA(cudaMalloc(&dqs, qs.size() * 4));
    CHECK_CUDA(cudaMalloc(&derr, sizeof(int)));
    CHECK_CUDA(cudaMemcpy(dq, q.data(), q_elems * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dtab, tabs.data(), tabs.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dlens, kv_lens.data(), kv_lens.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dqs, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice));
    unsigned* sink;
    CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));

    kvsplit::Status st;
    // The reference streams the first kv_bytes of the pool (copy 0's pages: 512 MiB or more here).
    const float stream_ms = time_ms(
        stream, warmup, iters,
        [&] { return kvsplit::kernels::launch_stream_read(pages, kv_bytes, sink, sms, stream); },
        &st);
    if (!st.ok()) {  // no reference bandwidth: the shape's rows would mean nothing
      std::printf("%-14s stream read FAILED: %s\n", sh.name, st.to_string().c_str());
      std::fflush(stdout);
      ++failed;
    }
    const double mandatory = read_bytes + 2.0 * q_elems * 4;
    const double stream_gbs = double(kv_bytes) / (stream_ms * 1e-3) / 1e9;
    // Under 2 x L2 still (rotation did not fit): the row's time is L2's, not HBM's.
    const bool l2_resident = read_bytes * copies < 2 * l2_bytes;

    for (bool split : {false, true}) {
      if (!st.ok()) break;
      const kvsplit::backend::SplitPlan plan =
          split ? kvsplit::backend::plan_decode_splits(kv_lens.data(), sh.num_seqs, kKvHeads,
                                                       kBlockSize, sms, {}, sh.window)
                : kvsplit::backend::make_split_plan(kv_lens.data(), sh.num_seqs, kBlockSize, 0,
                                                    sh.window);
      kvsplit::kernels::PagedAttentionParams p;
      p.q = dq;
      p.out = dout;
      p.kv = pages;
      p.kv_dtype = kvsplit::kernels::ElemType::kBF16;
      p.num_seqs = sh.num_seqs;
      p.num_tokens = sh.num_seqs;
      p.num_heads = kHeads;
      p.num_kv_heads = kKvHeads;
      p.head_dim = kHeadDim;
      p.block_size = kBlockSize;
      p.num_blocks = static_cast<int>(total_pages);
      p.scale = 0.088f;
      p.query_start = dqs;
      p.kv_lens = dlens;
      p.block_tables = dtab;
      p.max_blocks_per_seq = blocks_per_seq;
      p.max_query_len = 1;
      p.window = sh.window;
      p.error_flag = derr;
      p.max_splits = std::max(plan.max_splits, 1);
      int32_t* dplan = nullptr;
      float* part = nullptr;
      if (plan.has_splits()) {
        CHECK_CUDA(cudaMalloc(&dplan, 2 * sh.num_seqs * 4));
        CHECK_CUDA(
            cudaMemcpy(dplan, plan.num_splits.data(), sh.num_seqs * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(dplan + sh.num_seqs, plan.split_offset.data(), sh.num_seqs * 4,
                              cudaMemcpyHostToDevice));
        const size_t heads = size_t(plan.total_splits) * kHeads;
        CHECK_CUDA(cudaMalloc(&part, heads * (kHeadDim + 2) * 4));
        p.chunk_tokens = plan.chunk_tokens;
        p.num_splits = dplan;
        p.split_offset = dplan + sh.num_seqs;
        p.part_o = part;
        p.part_m = part + heads * kHeadDim;
        p.part_l = p.part_m + heads;
      }
      // The launcher's choice (auto: by occupancy), then two K/V pipeline stages and one.
      for (int stages : {0, 2, 1}) {
        p.pipeline_stages = stages;
        CHECK_CUDA(cudaMemset(dout, 0xff, q_elems * 4));  // NaN: a row that writes nothing fails
        CHECK_CUDA(cudaMemset(derr, 0, sizeof(int)));
        kvsplit::Status row;
        long launches = 0;  // launch i reads copy i % copies of the pages
        const float ms = time_ms(
            stream, warmup, iters,
            [&] {
              p.block_tables = dtab + size_t(launches++ % copies) * num_blocks;
              kvsplit::Status r = kvsplit::kernels::launch_paged_decode(p, stream);
              if (r.ok() && plan.has_splits()) r = kvsplit::kernels::launch_merge_states(p, stream);
              return r;
            },
            &row);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        const char* split_name = split ? "split-K" : "none";
        const char* stages_name = stages == 0 ? "auto" : (stages == 2 ? "2" : "1");
        if (!row.ok()) {
          std::printf("%-14s %-9s %6s %7d FAILED: %s\n", sh.name, split_name, stages_name,
                      plan.max_splits, row.to_string().c_str());
          ++failed;
          std::fflush(stdout);
          continue;
        }
        // The output of the last launch (copy (launches - 1) % copies) against the host's mean.
        const int last = static_cast<int>((launches - 1) % copies);
        int flag = 0;
        CHECK_CUDA(cudaMemcpy(out.data(), dout, q_elems * 4, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(&flag, derr, sizeof(int), cudaMemcpyDeviceToHost));
        size_t bad = 0, first_bad = 0;
        for (size_t i = 0; i < q_elems; ++i) {
          const double want = want_of(last, i);
          if (std::fabs(out[i] - want) <= kvsplit::bench::kOutputRelTol * std::fabs(want)) continue;
          if (bad++ == 0) first_bad = i;  // NaN lands here too
        }
        const double gbs = mandatory / (ms * 1e-3) / 1e9;
        std::printf("%-14s %-9s %6s %7d %10.1f %10.1f %10.1f %8.1f%% %6d %-5s%s\n", sh.name,
                    split_name, stages_name, plan.max_splits, ms * 1e3, gbs, stream_gbs,
                    100.0 * gbs / stream_gbs, copies, bad == 0 && flag == 0 ? "ok" : "WRONG",
                    l2_resident ? " L2-resident" : "");
        if (bad > 0 || flag != 0) {
          const size_t s = first_bad / (kHeads * kHeadDim);
          std::fprintf(stderr,
                       "bench_attention: %s %s %s: WRONG OUTPUT: %zu of %zu values off (first: "
                       "out[seq %zu, head %zu, dim %zu] = %.9g, want %.9g), error_flag %d\n",
                       sh.name, split_name, stages_name, bad, q_elems, s,
                       first_bad / kHeadDim % kHeads, first_bad % kHeadDim, double(out[first_bad]),
                       want_of(last, first_bad), flag);
          ++failed;
        }
        std::fflush(stdout);
      }
      if (dplan) cudaFree(dplan);
      if (part) cudaFree(part);
    }
    for (void* ptr : {pages, static_cast<void*>(dq), static_cast<void*>(dout),
                      static_cast<void*>(dtab), static_cast<void*>(dlens), static_cast<void*>(dqs),
                      static_cast<void*>(sink), static_cast<void*>(derr)})
      cudaFree(ptr);
  }
  cudaStreamDestroy(stream);
  if (failed > 0) std::fprintf(stderr, "bench_attention: %d case(s) failed\n", failed);
  return failed > 0 ? 1 : 0;
}
#endif
