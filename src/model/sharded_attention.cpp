#include "model/sharded_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "common/log.h"
#include "kernels/common/kv_quant.h"

namespace kvsplit::model {
namespace {

// Workspace slots of a shard's pool (KvPool::workspace); the home pool also holds the received
// partials of every peer, at kRecv + 2 * shard (+ 1 for lse), and the K/V rows each peer owns when
// they are not one run of rows, at kStage + 2 * shard (+ 1 for V).
enum Slot : int {
  kQ,
  kK,
  kV,
  kO,
  kLse,
  kMeta,
  kPrecision,
  kDecPrecision,
  kScore,
  kAllMax,
  kSeqMax,
  kRecv,
  // Home: per peer, its owned rows' K and V gathered into one run (kStage + 2 * shard, + 1 for V).
  kStage = kRecv + 2 * backend::Backend::kMaxMergeParts
};

// 16-byte aligned parts of one buffer.
struct Parts {
  size_t size = 0;
  size_t take(size_t bytes) {
    const size_t o = size;
    size += (bytes + 15) & ~size_t{15};
    return o;
  }
};

template <typename T>
Status take(kv::KvPool& pool, int slot, size_t bytes, T** out) {
  KVSPLIT_ASSIGN_OR_RETURN(void* p, pool.workspace(slot, bytes));
  *out = static_cast<T*>(p);
  return ok_status();
}

}  // namespace

Status ShardedAttention::prepare(std::span<const ShardedSeq> seqs, kv::KvPool& pool,
                                 const ShardedAttentionShape& shape,
                                 const backend::SplitPlanConfig& split, backend::Communicator& comm,
                                 int force_chunk_tokens) {
  const int S = pool.num_shards();
  if (S < 2) return invalid_argument("sharded attention needs a shard group of 2 or more");
  if (S > backend::Backend::kMaxMergeParts)
    return invalid_argument("sharded attention merges at most " +
                            std::to_string(backend::Backend::kMaxMergeParts) + " shards, got " +
                            std::to_string(S));
  pool_ = &pool;
  home_ = &pool.backend();
  phase_ = 0;
  merge_spans_.clear();
  comm_ = &comm;
  shape_ = shape;
  const int bs = pool.block_size();
  rows_ = decode_rows_ = prefill_seqs_ = pre_max_q_ = pre_max_kv_ = dec_max_kv_ = 0;
  scoring_ = false;
  rel_out_.clear();
  bound_out_.clear();
  rel_pages_.clear();
  bool seen_prefill = false;
  int max_blocks = 1;
  // Per shard: whether it holds a page some row reads (a decode row's resident or summarised
  // page, a prefill row's resident page; the pages written this step are among them), and a
  // resident page of a prefill row's sequence. The home always takes part: it merges.
  std::vector<char> holds(S, 0), holds_prefill(S, 0);
  holds[0] = 1;
  for (const ShardedSeq& s : seqs) {
    if (s.table == nullptr || s.tokens <= 0) return invalid_argument("bad sharded sequence");
    const int kv_len = s.start_pos + s.tokens;
    const int nb = kv::BlockTable::blocks_for(kv_len, bs);
    if (static_cast<int>(s.table->blocks.size()) < nb ||
        (!s.table->pages.empty() && s.table->pages.size() != s.table->blocks.size()))
      return invalid_argument("sharded sequence's block table is too short");
    for (int b = 0; b < nb; ++b) {
      const kv::PageEntry pe = s.table->page(b);
      if (pe.shard >= S)
        return invalid_argument("page " + std::to_string(b) + " names shard " +
                                std::to_string(pe.shard) + " of a group of " + std::to_string(S));
      if (pe.location != kv::PageLocation::kDevice && pe.location != kv::PageLocation::kEvicted)
        return invalid_argument("page " + std::to_string(b) +
                                " of a sharded sequence is not on a device");
      if (b >= s.start_pos / bs && (!pe.resident() || pe.precision != kernels::KvPrecision::kFull))
        return invalid_argument("page " + std::to_string(b) +
                                " is written this step but is not full precision on a device");
      if (pe.resident() || (s.decode && pe.summary >= 0)) holds[pe.shard] = 1;
      if (pe.resident() && !s.decode) holds_prefill[pe.shard] = 1;
    }
    if ((s.token_relevance == nullptr) != (s.page_bound == nullptr))
      return invalid_argument("token_relevance and page_bound go together");
    if (s.token_relevance != nullptr && !s.decode)
      return invalid_argument("scoring outputs are for decode rows only");
    if (s.decode) {
      if (seen_prefill) return invalid_argument("sharded decode rows must come first");
      ++decode_rows_;
      rel_out_.push_back(s.token_relevance);
      bound_out_.push_back(s.page_bound);
      rel_pages_.push_back(nb);
      scoring_ = scoring_ || s.token_relevance != nullptr;
      dec_max_kv_ = std::max(dec_max_kv_, kv_len);
    } else {
      seen_prefill = true;
      ++prefill_seqs_;
      pre_max_q_ = std::max(pre_max_q_, s.tokens);
      pre_max_kv_ = std::max(pre_max_kv_, kv_len);
    }
    rows_ += s.tokens;
    max_blocks = std::max(max_blocks, nb);
  }
  const int H = shape.num_heads, Hkv = shape.num_kv_heads, d = shape.head_dim;
  const size_t q_bytes = size_t(rows_) * H * d * sizeof(float);
  const size_t kv_bytes = size_t(rows_) * Hkv * d * sizeof(float);
  const size_t lse_bytes = size_t(rows_) * H * sizeof(float);

  const std::vector<float> neg_inf(size_t(rows_) * H, -std::numeric_limits<float>::infinity());
  const size_t dr = static_cast<size_t>(decode_rows_), mb = static_cast<size_t>(max_blocks);
  if (scoring_) {
    KVSPLIT_RETURN_IF_ERROR(take(pool, kAllMax, size_t(S) * dr * H * sizeof(float), &all_max_));
    KVSPLIT_RETURN_IF_ERROR(take(pool, kSeqMax, dr * H * sizeof(float), &seq_max_));
  }
  shards_.resize(S);
  active_.clear();
  for (int sh = 0; sh < S; ++sh) {
    Shard& z = shards_[sh];
    z.pool = &pool.shard(sh);
    z.be = &z.pool->backend();
    z.runs.clear();
    z.spans.clear();
    z.kv_runs.clear();
    z.kv_rows = 0;
    z.prefill = holds_prefill[sh] != 0;
    z.max_blocks = max_blocks;
    if (!holds[sh]) continue;  // inactive: sent nothing, computes nothing, not merged
    active_.push_back(sh);
    if (sh > 0) {
      KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kQ, q_bytes, &z.q));
      KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kK, kv_bytes, &z.k));
      KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kV, kv_bytes, &z.v));
      KVSPLIT_RETURN_IF_ERROR(take(pool, kRecv + 2 * sh, q_bytes, &z.recv_o));
      KVSPLIT_RETURN_IF_ERROR(take(pool, kRecv + 2 * sh + 1, lse_bytes, &z.recv_lse));
    }
    KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kO, q_bytes, &z.o));
    KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kLse, lse_bytes, &z.lse));
    // Rows a shard never computes this step stay an empty partial (o 0, lse -inf).
    KVSPLIT_RETURN_IF_ERROR(z.be->memset_zero(z.o, q_bytes));
    KVSPLIT_RETURN_IF_ERROR(z.be->copy_h2d(z.lse, neg_inf.data(), lse_bytes));

    // Metadata (host image, then one upload): slots, then the decode runs, then prefill. The home
    // appends from the step's K/V rows as computed (slots [rows], -1 for rows it does not own); a
    // peer receives only the rows of the positions it owns, packed in row order (kv_runs), so its
    // slots are [kv_rows].
    std::vector<int32_t> ints(static_cast<size_t>(rows_), -1);
    z.slots = 0;
    z.stage_k = z.stage_v = nullptr;
    {
      int row = 0;
      for (const ShardedSeq& s : seqs) {
        for (int i = 0; i < s.tokens; ++i, ++row) {
          const int pos = s.start_pos + i;
          const int b = pos / bs;
          if (s.table->page(b).shard != sh) continue;
          ints[row] = s.table->blocks[b] * bs + pos % bs;
        }
      }
    }
    if (sh > 0) {
      std::vector<int32_t> packed;
      for (int row = 0; row < rows_; ++row) {
        if (ints[row] < 0) continue;
        if (!z.kv_runs.empty() && z.kv_runs.back().first + z.kv_runs.back().second == row)
          ++z.kv_runs.back().second;
        else
          z.kv_runs.emplace_back(row, 1);
        packed.push_back(ints[row]);
      }
      z.kv_rows = static_cast<int>(packed.size());
      ints = std::move(packed);
      if (z.kv_runs.size() > 1) {
        const size_t bytes = size_t(z.kv_rows) * Hkv * d * sizeof(float);
        KVSPLIT_RETURN_IF_ERROR(take(pool, kStage + 2 * sh, bytes, &z.stage_k));
        KVSPLIT_RETURN_IF_ERROR(take(pool, kStage + 2 * sh + 1, bytes, &z.stage_v));
      }
    }
    // Decode: the compact table of the pages this shard holds (its local kv_len). Consecutive
    // rows with at least one local token form one call.
    // Pages at any precision are listed (page_precision when some are not full); evicted pages
    // too (attention skips them) when they have a key summary here, for the page bounds.
    std::vector<uint8_t> dec_prec(dr * mb, static_cast<uint8_t>(kernels::KvPrecision::kFull));
    std::vector<uint8_t> flags(dr, 0);
    std::vector<int32_t> summary_slots(dr * mb, -1);
    bool dec_mixed = false;
    for (int r = 0; r < decode_rows_;) {
      std::vector<int32_t> lens, tables, pages;
      const int first = r;
      for (; r < decode_rows_; ++r) {
        const ShardedSeq& s = seqs[r];
        const int kv_len = s.start_pos + 1;
        const int nb = kv::BlockTable::blocks_for(kv_len, bs);
        int local = 0;
        std::vector<int32_t> row_table(mb, 0), row_pages(mb, -1);
        int n = 0;
        for (int b = 0; b < nb; ++b) {
          const kv::PageEntry pe = s.table->page(b);
          if (pe.shard != sh) continue;
          if (!pe.resident() && pe.summary < 0) continue;
          const size_t at = size_t(r) * mb + n;
          dec_prec[at] = static_cast<uint8_t>(pe.precision);
          dec_mixed = dec_mixed || pe.precision != kernels::KvPrecision::kFull;
          summary_slots[at] = pe.summary;
          row_pages[n] = b;
          row_table[n++] = pe.resident() ? s.table->blocks[b] : 0;
          local += std::min(bs, kv_len - b * bs);
        }
        if (local == 0) break;
        flags[r] = s.token_relevance != nullptr;
        lens.push_back(local);
        tables.insert(tables.end(), row_table.begin(), row_table.end());
        pages.insert(pages.end(), row_pages.begin(), row_pages.end());
      }
      const int n = r - first;
      if (n == 0) {
        ++r;  // this row has nothing here: skip it
        continue;
      }
      DecodeRun run;
      run.first_row = first;
      run.rows = n;
      run.meta = ints.size();
      for (int i = 0; i <= n; ++i) ints.push_back(i);
      ints.insert(ints.end(), lens.begin(), lens.end());
      ints.insert(ints.end(), tables.begin(), tables.end());
      // Sized on the pages attended (SplitPlanConfig::attended): the compact table lists evicted
      // pages that have a summary here (for their bounds), which attention skips.
      const bool on_attended =
          backend::plan_on_attended(split, z.be->kind() == backend::DeviceKind::kCpu);
      const backend::PlanPages attended{
          on_attended ? dec_prec.data() + size_t(first) * mb : nullptr, max_blocks};
      run.plan = force_chunk_tokens >= 0
                     ? backend::make_split_plan(lens.data(), n, bs, force_chunk_tokens)
                     : backend::plan_decode_splits(lens.data(), n, Hkv, bs, z.be->parallelism(),
                                                   split, 0, attended);
      run.pages = std::move(pages);
      z.runs.push_back(std::move(run));
    }
    z.dec_precision = nullptr;
    if (dec_mixed) {
      KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kDecPrecision, dec_prec.size(), &z.dec_precision));
      KVSPLIT_RETURN_IF_ERROR(z.be->copy_h2d(z.dec_precision, dec_prec.data(), dec_prec.size()));
    }
    z.score_flags = nullptr;
    if (scoring_) {
      Parts parts;
      const size_t o_flags = parts.take(dr);
      const size_t o_slots = parts.take(dr * mb * sizeof(int32_t));
      const size_t o_rel = parts.take(dr * mb * bs * sizeof(float));
      const size_t o_bound = parts.take(dr * mb * sizeof(float));
      const size_t o_hmax = parts.take(dr * H * sizeof(float));
      const size_t o_smax = parts.take(dr * H * sizeof(float));
      std::vector<std::byte> img(parts.size, std::byte{0});  // relevance and bounds zeroed
      std::copy(flags.begin(), flags.end(), reinterpret_cast<uint8_t*>(img.data() + o_flags));
      std::copy(summary_slots.begin(), summary_slots.end(),
                reinterpret_cast<int32_t*>(img.data() + o_slots));
      std::copy_n(neg_inf.begin(), dr * H, reinterpret_cast<float*>(img.data() + o_hmax));
      std::byte* buf = nullptr;
      KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kScore, parts.size, &buf));
      KVSPLIT_RETURN_IF_ERROR(z.be->copy_h2d(buf, img.data(), img.size()));
      z.score_flags = reinterpret_cast<uint8_t*>(buf + o_flags);
      z.summary_slots = reinterpret_cast<int32_t*>(buf + o_slots);
      z.relevance = reinterpret_cast<float*>(buf + o_rel);
      z.bound = reinterpret_cast<float*>(buf + o_bound);
      z.head_max = reinterpret_cast<float*>(buf + o_hmax);
      z.seq_max = reinterpret_cast<float*>(buf + o_smax);
    }
    // Prefill (on a shard holding some of its pages): every prefill sequence, over its whole table
    // with other shards' pages evicted.
    z.pre_meta = ints.size();
    if (prefill_seqs_ > 0 && z.prefill) {
      std::vector<uint8_t> prec(size_t(prefill_seqs_) * max_blocks,
                                static_cast<uint8_t>(kernels::KvPrecision::kEvicted));
      std::vector<int32_t> qstart{0}, lens, tables(size_t(prefill_seqs_) * max_blocks, 0);
      int j = 0;
      for (int i = decode_rows_; i < static_cast<int>(seqs.size()); ++i, ++j) {
        const ShardedSeq& s = seqs[i];
        const int kv_len = s.start_pos + s.tokens;
        qstart.push_back(qstart.back() + s.tokens);
        lens.push_back(kv_len);
        for (int b = 0; b < kv::BlockTable::blocks_for(kv_len, bs); ++b) {
          const kv::PageEntry pe = s.table->page(b);
          if (pe.shard != sh || !pe.resident()) continue;
          prec[size_t(j) * max_blocks + b] = static_cast<uint8_t>(pe.precision);
          tables[size_t(j) * max_blocks + b] = s.table->blocks[b];
        }
      }
      ints.insert(ints.end(), qstart.begin(), qstart.end());
      ints.insert(ints.end(), lens.begin(), lens.end());
      ints.insert(ints.end(), tables.begin(), tables.end());
      KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kPrecision, prec.size(), &z.precision));
      KVSPLIT_RETURN_IF_ERROR(z.be->copy_h2d(z.precision, prec.data(), prec.size()));
    }
    KVSPLIT_RETURN_IF_ERROR(take(*z.pool, kMeta, ints.size() * sizeof(int32_t), &z.meta));
    KVSPLIT_RETURN_IF_ERROR(z.be->copy_h2d(z.meta, ints.data(), ints.size() * sizeof(int32_t)));
  }
  return ok_status();
}

Status ShardedAttention::timed(int sh, int phase, const std::function<Status(int)>& fn) {
  backend::Backend& be = *shards_[sh].be;
  KVSPLIT_ASSIGN_OR_RETURN(const int from, be.mark_time());
  KVSPLIT_RETURN_IF_ERROR(fn(sh));
  KVSPLIT_ASSIGN_OR_RETURN(const int to, be.mark_time());
  shards_[sh].spans.push_back(Span{phase, from, to});
  return ok_status();
}

Status ShardedAttention::on_shards(const std::function<Status(int)>& body) {
  const int S = static_cast<int>(shards_.size());
  const int phase = phase_++;
  const auto fn = [&](int sh) { return timed(sh, phase, body); };
  // The peers' job threads, started on first use. A refused thread is not the step's failure:
  // the shards take turns from then on (the same output).
  while (concurrent_ && !no_threads_ && static_cast<int>(runners_.size()) < S - 1) {
    StatusOr<std::unique_ptr<JobThread>> r = JobThread::create();
    if (!r.ok()) {
      KVSPLIT_LOG_WARN("spatial cut: {}; the {} shards compute in turns from now on",
                       r.status().message(), S);
      no_threads_ = true;
      runners_.clear();
      break;
    }
    runners_.push_back(std::move(r).value());
  }
  if (!concurrent_ || no_threads_) {
    for (int sh : active_) KVSPLIT_RETURN_IF_ERROR(fn(sh));
    return ok_status();
  }
  for (int sh : active_) {
    if (sh == 0) continue;
    runners_[sh - 1]->post([this, &fn, sh]() -> Status {
      KVSPLIT_RETURN_IF_ERROR(shards_[sh].be->bind_thread());
      return fn(sh);
    });
  }
  // Every peer is waited for, whatever the home's outcome: no job outlives this call.
  Status first = fn(0);
  for (int sh : active_) {
    if (sh == 0) continue;
    Status st = runners_[sh - 1]->wait();
    if (first.ok() && !st.ok()) first = std::move(st);
  }
  return first;
}

Status ShardedAttention::partial(int sh, int layer, const float* q, const float* k,
                                 const float* v) {
  Shard& z = shards_[sh];
  backend::Backend& be = *z.be;
  const int H = shape_.num_heads, d = shape_.head_dim;
  const float *zq = q, *zk = k, *zv = v;
  int append_rows = rows_;
  if (sh > 0) {  // the copies run_layer sent, the K/V rows packed
    zq = z.q;
    zk = z.k;
    zv = z.v;
    append_rows = z.kv_rows;
  }
  const int32_t* meta = z.meta;
  if (append_rows > 0)
    KVSPLIT_RETURN_IF_ERROR(
        be.kv_append(z.pool->layer(layer), zk, zv, meta + z.slots, append_rows));
  for (const DecodeRun& run : z.runs) {
    backend::AttentionArgs a = decode_args(z, layer, run, zq);
    a.lse = z.lse + size_t(run.first_row) * H;
    if (scoring_) a.head_max = z.head_max + size_t(run.first_row) * H;
    KVSPLIT_RETURN_IF_ERROR(be.attention_decode(a, run.plan));
  }
  if (prefill_seqs_ > 0 && z.prefill) {  // else its prefill rows stay an empty partial
    backend::AttentionArgs a = base_args(z, layer);
    a.q = zq + size_t(decode_rows_) * H * d;
    a.out = z.o + size_t(decode_rows_) * H * d;
    a.lse = z.lse + size_t(decode_rows_) * H;
    a.num_seqs = prefill_seqs_;
    a.num_tokens = rows_ - decode_rows_;
    a.query_start = meta + z.pre_meta;
    a.kv_lens = meta + z.pre_meta + prefill_seqs_ + 1;
    a.block_tables = meta + z.pre_meta + 2 * prefill_seqs_ + 1;
    a.max_query_len = pre_max_q_;
    a.max_kv_len = pre_max_kv_;
    a.page_precision = z.precision;
    set_arenas(z, layer, a);
    KVSPLIT_RETURN_IF_ERROR(be.attention_prefill(a));
  }
  // No wait here: the partial's sends back to the home are ordered after it (the communicator's
  // contract), and its time is taken by device marks (timed).
  return ok_status();
}

Status ShardedAttention::run_layer(int layer, const float* q, const float* k, const float* v,
                                   float* out) {
  if (rows_ == 0) return ok_status();
  const int H = shape_.num_heads, Hkv = shape_.num_kv_heads, d = shape_.head_dim;
  const size_t q_bytes = size_t(rows_) * H * d * sizeof(float);
  const size_t row_kv = size_t(Hkv) * d;  // floats of one row's K (or V)
  const size_t lse_bytes = size_t(rows_) * H * sizeof(float);
  // 1. To every active peer (on this thread, so the communicator is used by one thread): every
  // query row (the peer's partial covers every row), but only the K/V rows of the positions it
  // owns: one run is sent in place, several are gathered first.
  for (int sh : active_) {
    if (sh == 0) continue;
    Shard& z = shards_[sh];
    backend::Backend& be = *z.be;
    KVSPLIT_RETURN_IF_ERROR(comm_->send(be, z.q, *home_, q, q_bytes));
    if (z.kv_rows == 0) continue;
    const float *sk = k + size_t(z.kv_runs[0].first) * row_kv,
                *sv = v + size_t(z.kv_runs[0].first) * row_kv;
    if (z.kv_runs.size() > 1) {
      size_t at = 0;
      for (const auto& [first, n] : z.kv_runs) {
        const size_t off = size_t(first) * row_kv, bytes = size_t(n) * row_kv * sizeof(float);
        KVSPLIT_RETURN_IF_ERROR(home_->copy_d2d(z.stage_k + at, k + off, bytes));
        KVSPLIT_RETURN_IF_ERROR(home_->copy_d2d(z.stage_v + at, v + off, bytes));
        at += size_t(n) * row_kv;
      }
      sk = z.stage_k;
      sv = z.stage_v;
    }
    const size_t bytes = size_t(z.kv_rows) * row_kv * sizeof(float);
    KVSPLIT_RETURN_IF_ERROR(comm_->send(be, z.k, *home_, sk, bytes));
    KVSPLIT_RETURN_IF_ERROR(comm_->send(be, z.v, *home_, sv, bytes));
  }
  // 2. Every active shard's partial: at once (peers on their job threads) or one after another.
  KVSPLIT_RETURN_IF_ERROR(on_shards([&](int sh) { return partial(sh, layer, q, k, v); }));
  // 3. The active peers' partials back to the home, merged in shard order (the same sums whatever
  // ran first; an inactive shard's partial would be empty, weight 0, so leaving it out changes no
  // bit).
  const float* parts_o[backend::Backend::kMaxMergeParts];
  const float* parts_lse[backend::Backend::kMaxMergeParts];
  int parts = 0;
  for (int sh : active_) {
    Shard& z = shards_[sh];
    if (sh > 0) {
      KVSPLIT_RETURN_IF_ERROR(comm_->send(*home_, z.recv_o, *z.be, z.o, q_bytes));
      KVSPLIT_RETURN_IF_ERROR(comm_->send(*home_, z.recv_lse, *z.be, z.lse, lse_bytes));
    }
    parts_o[parts] = sh > 0 ? z.recv_o : z.o;
    parts_lse[parts++] = sh > 0 ? z.recv_lse : z.lse;
  }
  // The merge is timed on the home's stream (after the partials arrived, before the work that
  // reads `out`) and not waited for: the layer's next op is queued behind it.
  KVSPLIT_ASSIGN_OR_RETURN(const int m0, home_->mark_time());
  KVSPLIT_RETURN_IF_ERROR(home_->merge_attention_states(parts_o, parts_lse, parts,
                                                        int64_t{rows_} * H, d, out, nullptr));
  KVSPLIT_ASSIGN_OR_RETURN(const int m1, home_->mark_time());
  merge_spans_.emplace_back(m0, m1);
  if (scoring_) KVSPLIT_RETURN_IF_ERROR(score_layer(layer, q));
  return ok_status();
}

backend::AttentionArgs ShardedAttention::base_args(const Shard& z, int layer) const {
  backend::AttentionArgs a;
  a.kv = z.pool->layer(layer);
  a.num_heads = shape_.num_heads;
  a.num_kv_heads = shape_.num_kv_heads;
  a.head_dim = shape_.head_dim;
  a.scale = shape_.scale;
  a.max_blocks_per_seq = z.max_blocks;
  return a;
}

void ShardedAttention::set_arenas(const Shard& z, int layer, backend::AttentionArgs& a) const {
  const kv::KvPoolConfig& c = z.pool->config();
  a.int8_pages = c.int8_blocks > 0 ? z.pool->arena(kernels::KvPrecision::kInt8, layer) : nullptr;
  a.num_int8_blocks = c.int8_blocks;
  a.int4_pages = c.int4_blocks > 0 ? z.pool->arena(kernels::KvPrecision::kInt4, layer) : nullptr;
  a.num_int4_blocks = c.int4_blocks;
}

backend::AttentionArgs ShardedAttention::decode_args(const Shard& z, int layer,
                                                     const DecodeRun& run, const float* zq) const {
  const int H = shape_.num_heads, d = shape_.head_dim;
  backend::AttentionArgs a = base_args(z, layer);
  a.q = zq + size_t(run.first_row) * H * d;
  a.out = z.o + size_t(run.first_row) * H * d;
  a.num_seqs = run.rows;
  a.num_tokens = run.rows;
  a.query_start = z.meta + run.meta;
  a.kv_lens = z.meta + run.meta + run.rows + 1;
  a.block_tables = z.meta + run.meta + 2 * run.rows + 1;
  a.max_query_len = 1;
  a.max_kv_len = dec_max_kv_;
  if (z.dec_precision != nullptr) {
    a.page_precision = z.dec_precision + size_t(run.first_row) * z.max_blocks;
    set_arenas(z, layer, a);
  }
  return a;
}

Status ShardedAttention::score_layer(int layer, const float* q) {
  const int H = shape_.num_heads;
  const size_t n = size_t(decode_rows_) * H;
  const size_t bytes = n * sizeof(float);
  const int bs = pool_->block_size();
  // The head maxima of every shard holding decode rows' pages to the home (the others' are -inf),
  // merged into the sequence's, and back to them.
  size_t parts = 0;
  for (int sh : active_) {
    Shard& z = shards_[sh];
    if (z.runs.empty()) continue;
    float* dst = all_max_ + parts++ * n;
    if (sh > 0)
      KVSPLIT_RETURN_IF_ERROR(comm_->send(*home_, dst, *z.be, z.head_max, bytes));
    else
      KVSPLIT_RETURN_IF_ERROR(home_->copy_d2d(dst, z.head_max, bytes));
  }
  std::vector<float> all(parts * n), seq(n, -std::numeric_limits<float>::infinity());
  KVSPLIT_RETURN_IF_ERROR(home_->copy_d2h(all.data(), all_max_, all.size() * sizeof(float)));
  KVSPLIT_RETURN_IF_ERROR(home_->synchronize());
  if (parts > 0) std::copy_n(all.begin(), n, seq.begin());  // a NaN there stays (std::max)
  for (size_t p = 1; p < parts; ++p)
    for (size_t i = 0; i < n; ++i) seq[i] = std::max(seq[i], all[p * n + i]);
  KVSPLIT_RETURN_IF_ERROR(home_->copy_h2d(seq_max_, seq.data(), bytes));
  for (int sh : active_) {
    Shard& z = shards_[sh];
    if (z.runs.empty()) continue;
    if (sh > 0)
      KVSPLIT_RETURN_IF_ERROR(comm_->send(*z.be, z.seq_max, *home_, seq_max_, bytes));
    else
      KVSPLIT_RETURN_IF_ERROR(home_->copy_d2d(z.seq_max, seq_max_, bytes));
  }
  // Each shard scores its pages (at once, or one after another, as the partials).
  KVSPLIT_RETURN_IF_ERROR(on_shards([&](int sh) -> Status {
    Shard& z = shards_[sh];
    if (z.runs.empty()) return ok_status();
    const float* zq = sh > 0 ? z.q : q;
    for (const DecodeRun& run : z.runs) {
      backend::AttentionArgs a = decode_args(z, layer, run, zq);
      const size_t r0 = size_t(run.first_row);
      a.score_seqs = z.score_flags + r0;
      a.token_relevance = z.relevance + r0 * z.max_blocks * bs;
      a.summary_slots = z.summary_slots + r0 * z.max_blocks;
      a.summaries = z.pool->config().summary_slots > 0 ? z.pool->summaries(layer) : nullptr;
      a.num_summary_slots = z.pool->config().summary_slots;
      a.summary_parts = z.pool->config().summary_parts;
      a.page_bound = z.bound + r0 * z.max_blocks;
      a.score_max = z.seq_max + r0 * H;
      KVSPLIT_RETURN_IF_ERROR(z.be->attention_decode(a, run.plan));
    }
    return ok_status();  // collect_scores reads the outputs after a wait
  }));
  return ok_status();
}

Status ShardedAttention::finish_step() {
  if (rows_ == 0) return ok_status();
  // Each peer's kernels flag index errors on its own backend: wait for it and read its flag (the
  // in-process communicator's sends did; NCCL's do not). Its last work is done by now anyway:
  // the home merged its partials.
  Status st = ok_status();
  for (int sh : active_) {
    if (sh == 0) continue;
    Status peer = shards_[sh].be->synchronize();
    if (st.ok() && !peer.ok()) st = std::move(peer);
  }
  if (st.ok()) st = collect_scores();
  // Each phase's time is its longest shard's (they run at once, or that is the bound when they
  // run in turns on one device).
  std::vector<double> phase(static_cast<size_t>(phase_), 0.0);
  double merge = 0;
  for (Shard& z : shards_) {
    for (const Span& sp : z.spans) {
      if (!st.ok()) break;
      StatusOr<double> t = z.be->seconds_between(sp.from, sp.to);
      if (!t.ok())
        st = t.status();
      else
        phase[static_cast<size_t>(sp.phase)] = std::max(phase[size_t(sp.phase)], *t);
    }
  }
  for (const auto& [from, to] : merge_spans_) {
    if (!st.ok()) break;
    StatusOr<double> t = home_->seconds_between(from, to);
    if (!t.ok())
      st = t.status();
    else
      merge += *t;
  }
  release_marks();  // whatever happened
  KVSPLIT_RETURN_IF_ERROR(st);
  for (double t : phase) attention_seconds_ += t;
  merge_seconds_ += merge;
  return ok_status();
}

void ShardedAttention::abandon_step() {
  // Peer streams may still be reading the home's buffers (their copies of q, k, v): they finish
  // before the caller reuses or frees them. Their errors are the failed step's, already reported.
  for (size_t sh = 1; sh < shards_.size(); ++sh) (void)shards_[sh].be->synchronize();
  release_marks();
}

void ShardedAttention::release_marks() {
  for (Shard& z : shards_) {
    z.be->release_time_marks();
    z.spans.clear();
  }
  if (home_ != nullptr) home_->release_time_marks();
  merge_spans_.clear();
  phase_ = 0;
}

Status ShardedAttention::collect_scores() {
  if (!scoring_ || rows_ == 0) return ok_status();
  const int bs = pool_->block_size();
  for (int r = 0; r < decode_rows_; ++r) {
    if (rel_out_[r] == nullptr) continue;
    std::fill_n(rel_out_[r], size_t(rel_pages_[r]) * bs, 0.f);
    std::fill_n(bound_out_[r], size_t(rel_pages_[r]), 0.f);
  }
  std::vector<float> rel, bound;
  for (Shard& z : shards_) {
    if (z.runs.empty()) continue;
    const size_t mb = static_cast<size_t>(z.max_blocks);
    rel.resize(size_t(decode_rows_) * mb * bs);
    bound.resize(size_t(decode_rows_) * mb);
    KVSPLIT_RETURN_IF_ERROR(z.be->copy_d2h(rel.data(), z.relevance, rel.size() * sizeof(float)));
    KVSPLIT_RETURN_IF_ERROR(z.be->copy_d2h(bound.data(), z.bound, bound.size() * sizeof(float)));
    KVSPLIT_RETURN_IF_ERROR(z.be->synchronize());
    for (const DecodeRun& run : z.runs) {
      for (int i = 0; i < run.rows; ++i) {
        const int r = run.first_row + i;
        if (rel_out_[r] == nullptr) continue;
        for (size_t j = 0; j < mb; ++j) {
          const int b = run.pages[i * mb + j];
          if (b < 0) continue;
          const float* src = rel.data() + (size_t(r) * mb + j) * bs;
          float* dst = rel_out_[r] + size_t(b) * bs;
          for (int t = 0; t < bs; ++t) dst[t] = std::max(dst[t], src[t]);
          bound_out_[r][b] = std::max(bound_out_[r][b], bound[size_t(r) * mb + j]);
        }
      }
    }
  }
  return ok_status();
}

}  // namespace kvsplit::model
