// The spatial cut's sharded attention (model/sharded_attention.h) equals unsharded attention:
// random shapes (MHA / GQA / MQA, head_dim 8..128), 2..4 shards, random chunk sizes and lengths
// (partial last pages), a prefill chunk spanning shards (causal mask at true positions) and then
// decode steps, against the CPU backend's attention over one pool holding the same K/V.
#include "model/sharded_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/split_plan.h"
#include "kv/kv_pool.h"
#include "kv/page_ops.h"
#include "model/shard_test_util.h"

namespace kvsplit::testing {
namespace {

struct Shape {
  int heads, kv_heads, head_dim, block_size;
};

// Exchange bytes of one step of sharded attention over one layer (sharded_attention.h): each of
// the `active` peers (those holding a page of the step's sequences) gets every query row and sends
// back its partial (o and lse), and gets the K/V rows of the positions it owns only. `old` is the
// earlier scheme, every K/V row to every peer; `every_peer` the scheme before 2026-12-06, every
// one of the S - 1 peers taking part.
struct Exchange {
  int64_t bytes = 0, old = 0, every_peer = 0;
};
Exchange exchange_formula(int S, int active, int H, int Hkv, int d, int rows, int peer_rows) {
  const int64_t f = sizeof(float);
  const int64_t q_partial = int64_t{rows} * (int64_t{H} * d + int64_t{H} * (d + 1)) * f;
  const int64_t kv = int64_t{peer_rows} * 2 * Hkv * d * f;
  return {active * q_partial + kv, (S - 1) * q_partial + int64_t{S - 1} * rows * 2 * Hkv * d * f,
          (S - 1) * q_partial + kv};
}

// Per step: the exchange measured, and the formulas (steps with a prefill row or not).
struct StepExchange {
  bool prefill = false;
  int rows = 0, peer_rows = 0, active = 0;  // active: peers taking part
  int64_t measured = 0;
  Exchange formula;
};

// One test case: `num_shards` shards of `blocks` blocks each, chunk `chunk` tokens; sequences
// with `prompt` lengths get a prefill of their whole prompt (in one chunk, from `start` already
// computed), then `decode_steps` decode steps. Compares every output row, and every step's
// exchange bytes with exchange_formula (steps appended to `exchanges` when given).
void run_case(const Shape& sh, int num_shards, int chunk, const std::vector<int>& prompts,
              int decode_steps, uint32_t seed, std::vector<StepExchange>* exchanges = nullptr) {
  SCOPED_TRACE("heads " + std::to_string(sh.heads) + "/" + std::to_string(sh.kv_heads) + " d " +
               std::to_string(sh.head_dim) + " bs " + std::to_string(sh.block_size) + " shards " +
               std::to_string(num_shards) + " chunk " + std::to_string(chunk) + " seed " +
               std::to_string(seed));
  std::mt19937 rng(seed);
  auto home = shard_cpu(0);
  auto ref_be = shard_cpu(0);
  kv::KvPoolConfig pc;
  pc.num_blocks = 256;
  pc.block_size = sh.block_size;
  const kv::KvShape shape{1, sh.kv_heads, sh.head_dim};
  auto pool = kv::KvPool::create(*home, pc, shape);
  ASSERT_TRUE(pool.ok());
  std::vector<std::unique_ptr<backend::Backend>> peers;
  for (int s = 1; s < num_shards; ++s) peers.push_back(shard_cpu(s));
  ASSERT_TRUE((*pool)->add_shards(std::move(peers), chunk).ok());
  pc.num_blocks = 256 * num_shards;
  auto ref = kv::KvPool::create(*ref_be, pc, shape);
  ASSERT_TRUE(ref.ok());
  auto comm = backend::make_in_process_communicator();

  const int n = static_cast<int>(prompts.size());
  std::vector<kv::BlockTable> tables(n), ref_tables(n);
  for (auto& t : tables) t.spread = true;
  std::vector<int> len(n, 0);
  const int H = sh.heads, Hkv = sh.kv_heads, d = sh.head_dim;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  model::ShardedAttention sa;

  // One step: seqs in order (decode rows first), each feeding `feed[i]` tokens.
  auto step = [&](const std::vector<int>& feed) {
    std::vector<int> order;
    for (int i = 0; i < n; ++i)
      if (feed[i] == 1 && len[i] > 0) order.push_back(i);
    const int num_dec = static_cast<int>(order.size());
    for (int i = 0; i < n; ++i)
      if (!(feed[i] == 1 && len[i] > 0)) order.push_back(i);
    int rows = 0;
    std::vector<model::ShardedSeq> seqs;
    for (int i : order) {
      ASSERT_TRUE((*pool)->reserve(tables[i], len[i] + feed[i]));
      ASSERT_TRUE((*ref)->reserve(ref_tables[i], len[i] + feed[i]));
      seqs.push_back({&tables[i], len[i], feed[i], feed[i] == 1 && len[i] > 0});
      rows += feed[i];
    }
    const std::vector<float> q = randn(rng, size_t(rows) * H * d);
    const std::vector<float> k = randn(rng, size_t(rows) * Hkv * d);
    const std::vector<float> v = randn(rng, size_t(rows) * Hkv * d);
    std::vector<float> out(q.size(), NAN), want(q.size(), NAN);
    // Rows whose position is on a peer shard (by the page placement): only they go to a peer.
    // Peers holding a page of the step's sequences up to their new positions: only they take part.
    int peer_rows = 0;
    std::vector<char> holds(num_shards, 0);
    for (int i : order) {
      for (int t = 0; t < feed[i]; ++t)
        peer_rows += tables[i].page((len[i] + t) / sh.block_size).shard != 0;
      for (int b = 0; b < kv::BlockTable::blocks_for(len[i] + feed[i], sh.block_size); ++b)
        holds[tables[i].page(b).shard] = 1;
    }
    const int active = static_cast<int>(std::count(holds.begin() + 1, holds.end(), 1));
    const int64_t before = comm->stats().bytes;
    const double attn0 = sa.attention_seconds(), merge0 = sa.merge_seconds();
    ASSERT_TRUE(sa.prepare(seqs, **pool, {H, Hkv, d, scale}, {}, *comm).ok());
    auto st = sa.run_layer(0, q.data(), k.data(), v.data(), out.data());
    ASSERT_TRUE(st.ok()) << st.to_string();
    // The step's times (the CPU backend's marks: host clock) are added at its end.
    EXPECT_EQ(sa.attention_seconds(), attn0);
    ASSERT_TRUE(sa.finish_step().ok());
    EXPECT_GT(sa.attention_seconds(), attn0);
    EXPECT_GT(sa.merge_seconds(), merge0);
    StepExchange ex;
    ex.prefill = static_cast<int>(order.size()) > num_dec;
    ex.rows = rows;
    ex.peer_rows = peer_rows;
    ex.active = active;
    ex.measured = comm->stats().bytes - before;
    ex.formula = exchange_formula(num_shards, active, H, Hkv, d, rows, peer_rows);
    ASSERT_EQ(ex.measured, ex.formula.bytes)
        << "rows " << rows << ", on peers " << peer_rows << ", active peers " << active;
    std::vector<int> want_active{0};  // the home, then the peers holding a page
    for (int s = 1; s < num_shards; ++s)
      if (holds[s]) want_active.push_back(s);
    EXPECT_EQ(std::vector<int>(sa.active_shards().begin(), sa.active_shards().end()), want_active);
    if (exchanges != nullptr) exchanges->push_back(ex);

    // Reference: the same K/V in one pool, then decode rows and prefill rows as two calls.
    std::vector<int32_t> slots, qs_dec{0}, qs_pre{0}, lens_dec, lens_pre, tab_dec, tab_pre;
    int mb = 1;
    for (int i : order) mb = std::max<int>(mb, static_cast<int>(ref_tables[i].blocks.size()));
    for (int j = 0; j < static_cast<int>(order.size()); ++j) {
      const int i = order[j];
      for (int t = 0; t < feed[i]; ++t) {
        const int pos = len[i] + t;
        slots.push_back(ref_tables[i].blocks[pos / sh.block_size] * sh.block_size +
                        pos % sh.block_size);
      }
      auto& qs = j < num_dec ? qs_dec : qs_pre;
      qs.push_back(qs.back() + feed[i]);
      (j < num_dec ? lens_dec : lens_pre).push_back(len[i] + feed[i]);
      auto& tab = j < num_dec ? tab_dec : tab_pre;
      std::vector<int32_t> row(mb, 0);
      std::copy(ref_tables[i].blocks.begin(), ref_tables[i].blocks.end(), row.begin());
      tab.insert(tab.end(), row.begin(), row.end());
    }
    ASSERT_TRUE(ref_be->kv_append((*ref)->layer(0), k.data(), v.data(), slots.data(), rows).ok());
    auto args = [&](bool dec) {
      backend::AttentionArgs a;
      a.kv = (*ref)->layer(0);
      a.num_heads = H;
      a.num_kv_heads = Hkv;
      a.head_dim = d;
      a.scale = scale;
      a.max_blocks_per_seq = mb;
      const int row0 = dec ? 0 : num_dec;
      a.q = q.data() + size_t(row0) * H * d;
      a.out = want.data() + size_t(row0) * H * d;
      a.num_seqs = dec ? num_dec : static_cast<int>(order.size()) - num_dec;
      a.num_tokens = dec ? num_dec : rows - num_dec;
      a.query_start = dec ? qs_dec.data() : qs_pre.data();
      a.kv_lens = dec ? lens_dec.data() : lens_pre.data();
      a.block_tables = dec ? tab_dec.data() : tab_pre.data();
      a.max_query_len = 0;
      for (int j = 0; j < a.num_seqs; ++j)
        a.max_query_len = std::max(a.max_query_len, a.query_start[j + 1] - a.query_start[j]);
      a.max_kv_len = 0;
      for (int j = 0; j < a.num_seqs; ++j) a.max_kv_len = std::max(a.max_kv_len, a.kv_lens[j]);
      return a;
    };
    if (num_dec > 0) {
      const backend::AttentionArgs a = args(true);
      const auto plan =
          backend::make_split_plan(a.kv_lens, a.num_seqs, sh.block_size, 4 * sh.block_size);
      ASSERT_TRUE(ref_be->attention_decode(a, plan).ok());
    }
    if (static_cast<int>(order.size()) > num_dec) {
      ASSERT_TRUE(ref_be->attention_prefill(args(false)).ok());
    }
    for (size_t r = 0; r < out.size(); ++r)
      ASSERT_NEAR(out[r], want[r], 2e-5f + 2e-4f * std::fabs(want[r])) << "element " << r;
    for (int i : order) len[i] += feed[i];
  };

  std::vector<int> feed(prompts);
  step(feed);
  for (int s = 0; s < decode_steps; ++s) {
    std::fill(feed.begin(), feed.end(), 1);
    step(feed);
  }
  int used = 0;
  for (const auto& t : tables) used = std::max(used, t.shards_used());
  const int total = *std::max_element(len.begin(), len.end());
  EXPECT_EQ(used, std::min(num_shards, (total + chunk - 1) / chunk));
  for (auto& t : tables) (*pool)->release(t);
  for (auto& t : ref_tables) (*ref)->release(t);
  EXPECT_EQ((*pool)->used_blocks(), 0);
}

TEST(ShardedAttention, EqualsUnshardedOverRandomShapes) {
  const Shape shapes[] = {{8, 8, 8, 16},  {8, 4, 8, 16},   {8, 1, 16, 16},
                          {4, 2, 64, 16}, {4, 4, 128, 16}, {6, 2, 32, 8}};
  std::mt19937 rng(2026);
  uint32_t seed = 1;
  for (const Shape& sh : shapes) {
    for (int shards = 2; shards <= 4; ++shards) {
      const int chunk = sh.block_size * (1 + static_cast<int>(rng() % 4));
      std::vector<int> prompts;
      const int n = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < n; ++i) prompts.push_back(1 + static_cast<int>(rng() % (4 * chunk)));
      run_case(sh, shards, chunk, prompts, 3, seed++);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The exchange per step (one layer) equals the formula: every peer gets all query rows and sends
// its partial, but only the owner of a position gets its K/V row. For a prefill chunk spanning
// every shard and for decode steps on home and on peers it is below the earlier scheme's (every
// K/V row to every peer) by (S - 1) x rows - peer_rows rows of K/V, and the outputs still equal
// the unsharded attention (run_case).
TEST(ShardedAttention, KvRowsGoOnlyToTheShardOwningThePosition) {
  const Shape sh{8, 2, 16, 16};
  for (int shards = 2; shards <= 4; ++shards) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    const int chunk = 32;
    // A prompt of 2 * shards + 1 chunks minus 5 tokens: the prefill chunk spans every shard (and
    // wraps around the group); then one decode step per position up to past the next chunk,
    // so decode steps land on the home and on peers.
    const int prompt = (2 * shards + 1) * chunk - 5;
    std::vector<StepExchange> ex;
    run_case(sh, shards, chunk, {prompt}, 2 * chunk, 500 + shards, &ex);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(ex.size(), size_t{1 + 2 * chunk});
    ASSERT_TRUE(ex[0].prefill);
    EXPECT_EQ(ex[0].rows, prompt);
    // Positions [0, prompt): the home owns chunks 0, S, 2S (the last one partly).
    EXPECT_EQ(ex[0].peer_rows, prompt - (2 * chunk + chunk - 5));
    bool decode_on_home = false, decode_on_peer = false;
    for (const StepExchange& e : ex) {
      EXPECT_EQ(e.measured, e.formula.bytes);
      // Lower with several peers or a row on the home; one row on the only peer is sent as before.
      if (shards > 2 || e.peer_rows < e.rows)
        EXPECT_LT(e.measured, e.formula.old);
      else
        EXPECT_EQ(e.measured, e.formula.old);
      if (!e.prefill) (e.peer_rows == 0 ? decode_on_home : decode_on_peer) = true;
      // What is saved: the K/V rows of the positions each peer does not own.
      const int64_t kv_row = int64_t{2} * sh.kv_heads * sh.head_dim * sizeof(float);
      EXPECT_EQ(e.formula.old - e.measured, (int64_t{shards - 1} * e.rows - e.peer_rows) * kv_row);
    }
    EXPECT_TRUE(decode_on_home);
    EXPECT_TRUE(decode_on_peer);
  }
}

// Decode steps of several sequences whose new positions sit on different shards: a peer's rows
// are not one run, so the home gathers them before the send; the exchange is still the formula.
TEST(ShardedAttention, KvRowsOfSeveralSequencesGatheredPerPeer) {
  std::vector<StepExchange> ex;
  // Sequences of 20, 40, 60, 80 and 100 tokens, chunk 16 over 3 shards: at each decode step the
  // new positions fall on different shards.
  run_case({4, 2, 16, 16}, 3, 16, {20, 40, 60, 80, 100}, 5, 77, &ex);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(ex.size(), size_t{6});
  for (const StepExchange& e : ex) {
    EXPECT_EQ(e.measured, e.formula.bytes);
    EXPECT_LT(e.measured, e.formula.old);
  }
}

// Decode of sequences some shards hold nothing of (short sequences, large chunks): their rows
// merge an empty partial from those shards.
TEST(ShardedAttention, ShardsHoldingNothingOfASequence) {
  run_case({8, 4, 8, 16}, 4, 64, {5, 70, 130}, 4, 99);
}

// The semantic cut on sharded sequences: the same page transitions (int8, int4, evicted with a
// summary) applied on a shard group and on one pool, then a scored decode step: the output,
// every token's relevance (normalized to the most attended token of the whole sequence, not of
// one shard) and every page bound equal the unsharded ones; a restore brings a page back onto a
// shard; release frees every shard's arenas and summaries and the home host tier.
void run_scored_case(const Shape& sh, int num_shards, int chunk, const std::vector<int>& prompts,
                     uint32_t seed) {
  SCOPED_TRACE("shards " + std::to_string(num_shards) + " chunk " + std::to_string(chunk) +
               " seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto home = shard_cpu(0);
  auto ref_be = shard_cpu(0);
  const int bs = sh.block_size;
  kv::KvPoolConfig pc;
  pc.num_blocks = 64;
  pc.block_size = bs;
  pc.int8_blocks = 16;
  pc.int4_blocks = 16;
  pc.summary_slots = 32;
  const kv::KvShape shape{1, sh.kv_heads, sh.head_dim};
  pc.host_bytes = 64 * kv::KvPool::block_bytes(pc, shape);
  auto pool = kv::KvPool::create(*home, pc, shape);
  ASSERT_TRUE(pool.ok());
  std::vector<std::unique_ptr<backend::Backend>> peers;
  for (int s = 1; s < num_shards; ++s) peers.push_back(shard_cpu(s));
  ASSERT_TRUE((*pool)->add_shards(std::move(peers), chunk).ok());
  pc.num_blocks = 64 * num_shards;
  pc.int8_blocks = pc.int4_blocks = 16 * num_shards;
  pc.summary_slots = 32 * num_shards;
  auto ref = kv::KvPool::create(*ref_be, pc, shape);
  ASSERT_TRUE(ref.ok());
  auto comm = backend::make_in_process_communicator();
  const int H = sh.heads, Hkv = sh.kv_heads, d = sh.head_dim;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const int n = static_cast<int>(prompts.size());
  std::vector<kv::BlockTable> tables(n), ref_tables(n);
  for (auto& t : tables) t.spread = true;
  model::ShardedAttention sa;

  // Prefill every prompt (same K/V in both pools).
  {
    std::vector<model::ShardedSeq> seqs;
    std::vector<int32_t> slots;
    int rows = 0;
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE((*pool)->reserve(tables[i], prompts[i]));
      ASSERT_TRUE((*ref)->reserve(ref_tables[i], prompts[i]));
      seqs.push_back({&tables[i], 0, prompts[i], false});
      for (int p = 0; p < prompts[i]; ++p)
        slots.push_back(ref_tables[i].blocks[p / bs] * bs + p % bs);
      rows += prompts[i];
    }
    const std::vector<float> q = randn(rng, size_t(rows) * H * d);
    const std::vector<float> k = randn(rng, size_t(rows) * Hkv * d);
    const std::vector<float> v = randn(rng, size_t(rows) * Hkv * d);
    std::vector<float> out(q.size());
    ASSERT_TRUE(sa.prepare(seqs, **pool, {H, Hkv, d, scale}, {}, *comm).ok());
    ASSERT_TRUE(sa.run_layer(0, q.data(), k.data(), v.data(), out.data()).ok());
    ASSERT_TRUE(ref_be->kv_append((*ref)->layer(0), k.data(), v.data(), slots.data(), rows).ok());
  }
  std::vector<int> len(prompts);
  int remote = 0;
  for (const auto& t : tables)
    for (const auto& pe : t.pages) remote += pe.shard != 0;
  EXPECT_GT(remote, 0);

  // The same ladder on both: per sequence, full pages cycle int8, int4, evicted, full.
  auto apply = [&](std::vector<kv::PageTransition> plan, int i) {
    kv::PageOpStats a, b;
    auto st = kv::apply_page_transitions(**pool, tables[i], len[i], plan, &a);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(kv::apply_page_transitions(**ref, ref_tables[i], len[i], plan, &b).ok());
    EXPECT_EQ(a.refused(), 0);
    EXPECT_EQ(b.refused(), 0);
    EXPECT_EQ(a.demoted_to_int8 + a.demoted_to_int4 + a.evicted + a.restored,
              b.demoted_to_int8 + b.demoted_to_int4 + b.evicted + b.restored);
  };
  for (int i = 0; i < n; ++i) {
    std::vector<kv::PageTransition> plan;
    for (int p = 0; p < len[i] / bs; ++p) {
      if (p % 4 == 1) plan.push_back({p, kv::PageOp::kDemote, kernels::KvPrecision::kInt8});
      if (p % 4 == 2) plan.push_back({p, kv::PageOp::kDemote, kernels::KvPrecision::kInt4});
      if (p % 4 == 3) plan.push_back({p, kv::PageOp::kEvict});
    }
    apply(plan, i);
    if (::testing::Test::HasFatalFailure()) return;
  }

  // Scored decode steps; after the first, restore one evicted and one int4 page of each.
  for (int step = 0; step < 2; ++step) {
    std::vector<model::ShardedSeq> seqs;
    std::vector<int> nbs(n);
    size_t mb = 1;
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE((*pool)->reserve(tables[i], len[i] + 1));
      ASSERT_TRUE((*ref)->reserve(ref_tables[i], len[i] + 1));
      nbs[i] = kv::BlockTable::blocks_for(len[i] + 1, bs);
      mb = std::max(mb, size_t(nbs[i]));
    }
    std::vector<std::vector<float>> rel(n), bound(n);
    for (int i = 0; i < n; ++i) {
      rel[i].assign(size_t(nbs[i]) * bs, -1.f);  // overwritten
      bound[i].assign(size_t(nbs[i]), -1.f);
      seqs.push_back({&tables[i], len[i], 1, true, rel[i].data(), bound[i].data()});
    }
    const std::vector<float> q = randn(rng, size_t(n) * H * d);
    const std::vector<float> k = randn(rng, size_t(n) * Hkv * d);
    const std::vector<float> v = randn(rng, size_t(n) * Hkv * d);
    std::vector<float> out(q.size(), NAN), want(q.size(), NAN);
    auto st = sa.prepare(seqs, **pool, {H, Hkv, d, scale}, {}, *comm);
    ASSERT_TRUE(st.ok()) << st.to_string();
    st = sa.run_layer(0, q.data(), k.data(), v.data(), out.data());
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(sa.finish_step().ok());

    // Reference: one mixed-precision scored decode call over the single pool.
    std::vector<int32_t> slots, qs{0}, lens, tab(size_t(n) * mb, 0), sum(size_t(n) * mb, -1);
    std::vector<uint8_t> prec(size_t(n) * mb, 0), flags(n, 1);
    for (int i = 0; i < n; ++i) {
      slots.push_back(ref_tables[i].blocks[len[i] / bs] * bs + len[i] % bs);
      qs.push_back(i + 1);
      lens.push_back(len[i] + 1);
      for (int b = 0; b < nbs[i]; ++b) {
        const kv::PageEntry pe = ref_tables[i].page(b);
        tab[i * mb + b] = pe.resident() ? ref_tables[i].blocks[b] : 0;
        prec[i * mb + b] = static_cast<uint8_t>(pe.precision);
        sum[i * mb + b] = pe.summary;
      }
    }
    ASSERT_TRUE(ref_be->kv_append((*ref)->layer(0), k.data(), v.data(), slots.data(), n).ok());
    std::vector<float> want_rel(size_t(n) * mb * bs, 0.f), want_bound(size_t(n) * mb, 0.f);
    backend::AttentionArgs a;
    a.kv = (*ref)->layer(0);
    a.num_heads = H;
    a.num_kv_heads = Hkv;
    a.head_dim = d;
    a.scale = scale;
    a.max_blocks_per_seq = static_cast<int>(mb);
    a.q = q.data();
    a.out = want.data();
    a.num_seqs = n;
    a.num_tokens = n;
    a.query_start = qs.data();
    a.kv_lens = lens.data();
    a.block_tables = tab.data();
    a.max_query_len = 1;
    a.max_kv_len = *std::max_element(lens.begin(), lens.end());
    a.page_precision = prec.data();
    a.int8_pages = (*ref)->arena(kernels::KvPrecision::kInt8, 0);
    a.num_int8_blocks = pc.int8_blocks;
    a.int4_pages = (*ref)->arena(kernels::KvPrecision::kInt4, 0);
    a.num_int4_blocks = pc.int4_blocks;
    a.score_seqs = flags.data();
    a.token_relevance = want_rel.data();
    a.summary_slots = sum.data();
    a.summaries = (*ref)->summaries(0);
    a.num_summary_slots = pc.summary_slots;
    a.page_bound = want_bound.data();
    const auto plan = backend::make_split_plan(a.kv_lens, n, bs, 4 * bs);
    st = ref_be->attention_decode(a, plan);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (size_t r = 0; r < out.size(); ++r)
      ASSERT_NEAR(out[r], want[r], 2e-5f + 2e-4f * std::fabs(want[r])) << "element " << r;
    int scored = 0, ones = 0;
    for (int i = 0; i < n; ++i) {
      for (int t = 0; t < nbs[i] * bs; ++t) {
        const float w = want_rel[i * mb * bs + t];
        ASSERT_NEAR(rel[i][t], w, 1e-5f + 1e-4f * w) << "seq " << i << " token " << t;
        scored += w > 0.f;
        ones += w > 0.999f;
      }
      for (int b = 0; b < nbs[i]; ++b) {
        const float w = want_bound[i * mb + b];
        ASSERT_NEAR(bound[i][b], w, 1e-5f + 1e-4f * w) << "seq " << i << " page " << b;
      }
    }
    EXPECT_GT(scored, 0);
    EXPECT_GE(ones, n);  // each sequence's most attended token scores 1 (whole-sequence max)
    for (int i = 0; i < n; ++i) ++len[i];
    if (step == 0) {
      for (int i = 0; i < n; ++i) {
        std::vector<kv::PageTransition> plan;
        for (int p = 0; p < len[i] / bs; ++p)
          if (p % 4 == 2 || p % 4 == 3) plan.push_back({p, kv::PageOp::kRestore});
        apply(plan, i);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  for (auto& t : tables) (*pool)->release(t);
  for (auto& t : ref_tables) (*ref)->release(t);
  for (int s = 0; s < num_shards; ++s) {
    const kv::KvPool& z = (*pool)->shard(s);
    EXPECT_EQ(z.allocator().num_used(), 0) << "shard " << s;
    EXPECT_EQ(z.arena_allocator(kernels::KvPrecision::kInt8).num_used(), 0) << "shard " << s;
    EXPECT_EQ(z.arena_allocator(kernels::KvPrecision::kInt4).num_used(), 0) << "shard " << s;
    EXPECT_EQ(z.summary_allocator().num_used(), 0) << "shard " << s;
  }
  EXPECT_EQ((*pool)->host_allocator().num_used(), 0);
}

TEST(ShardedAttention, ScoringOverMixedPrecisionShardsEqualsUnsharded) {
  run_scored_case({8, 4, 16, 16}, 2, 16, {100, 37}, 5);
  run_scored_case({8, 2, 8, 16}, 3, 32, {150}, 6);
  run_scored_case({4, 4, 32, 8}, 4, 8, {61, 90, 17}, 7);
  // One shard holds nothing of the short sequence.
  run_scored_case({8, 8, 8, 16}, 4, 64, {20, 200}, 8);
}

// A step's time marks are released by finish_step, and by abandon_step when a step fails after
// prepare (LlamaModel::forward's guard): none is left held on any shard's backend.
TEST(ShardedAttention, FinishedAndAbandonedStepsHoldNoTimeMark) {
  auto home = shard_cpu(0);
  kv::KvPoolConfig pc;
  pc.num_blocks = 16;
  pc.block_size = 8;
  auto pool = kv::KvPool::create(*home, pc, kv::KvShape{1, 2, 8});
  ASSERT_TRUE(pool.ok());
  std::vector<std::unique_ptr<backend::Backend>> peers;
  for (int s = 1; s < 3; ++s) peers.push_back(shard_cpu(s));
  ASSERT_TRUE((*pool)->add_shards(std::move(peers), 8).ok());
  auto comm = backend::make_in_process_communicator();
  kv::BlockTable t;
  t.spread = true;
  ASSERT_TRUE((*pool)->reserve(t, 40));  // 5 pages over the 3 shards
  std::mt19937 rng(3);
  const std::vector<float> q = randn(rng, size_t(40) * 4 * 8);
  const std::vector<float> k = randn(rng, size_t(40) * 2 * 8);
  const std::vector<float> v = randn(rng, size_t(40) * 2 * 8);
  std::vector<float> out(q.size());
  model::ShardedAttention sa;
  const std::vector<model::ShardedSeq> seqs{{&t, 0, 40, false}};
  auto next_mark_is_first = [&] {
    for (int s = 0; s < 3; ++s) {
      backend::Backend& be = (*pool)->shard(s).backend();
      auto m = be.mark_time();
      ASSERT_TRUE(m.ok());
      EXPECT_EQ(*m, 0) << "shard " << s << " still holds marks";
      be.release_time_marks();
    }
  };
  for (const bool abandon : {false, true}) {
    SCOPED_TRACE(abandon ? "abandoned" : "finished");
    ASSERT_TRUE(sa.prepare(seqs, **pool, {4, 2, 8, 0.35f}, {}, *comm).ok());
    ASSERT_TRUE(sa.run_layer(0, q.data(), k.data(), v.data(), out.data()).ok());
    if (abandon)
      sa.abandon_step();
    else
      ASSERT_TRUE(sa.finish_step().ok());
    next_mark_is_first();
  }
  (*pool)->release(t);
  EXPECT_EQ((*pool)->used_blocks(), 0);
}

TEST(ShardedAttention, RefusesAPoolWithoutShards) {
  auto be = shard_cpu(0);
  kv::KvPoolConfig pc;
  pc.num_blocks = 8;
  auto pool = kv::KvPool::create(*be, pc, kv::KvShape{1, 1, 8});
  ASSERT_TRUE(pool.ok());
  model::ShardedAttention sa;
  auto comm = backend::make_in_process_communicator();
  const auto st = sa.prepare({}, **pool, {1, 1, 8, 1.f}, {}, *comm);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
}

}  // namespace
}  // namespace kvsplit::testing
