#include "model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "common/check.h"
#include "kernels/common/float_bits.h"
#include "kernels/common/paged_kv.h"
#include "model/sharded_attention.h"
#include "sampling/sampler.h"

namespace kvsplit::model {

using backend::Backend;
using backend::DeviceBuffer;
using backend::DType;
using backend::MatrixView;

namespace {

// f32 copy of a small weight vector (norms, biases), whatever its stored dtype.
std::vector<float> to_f32(const WeightTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const auto* bytes = static_cast<const uint8_t*>(t.data);
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case DType::kF32:
        std::memcpy(&out[i], bytes + 4 * i, 4);
        break;
      case DType::kBF16:
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[i] = t.dtype == DType::kBF16 ? kernels::bf16_bits_to_float(h)
                                         : kernels::half_bits_to_float(h);
        break;
      }
    }
  }
  return out;
}

}  // namespace

struct LlamaModel::Impl {
  struct Layer {
    MatrixView wq, wk, wv, wo, w_gate, w_up, w_down;
    DeviceBuffer attn_norm, ffn_norm;  // f32 [dim]
    DeviceBuffer bq, bk, bv;           // f32, only with qkv_bias
  };
  MatrixView embedding;
  MatrixView lm_head;
  DeviceBuffer final_norm;             // f32 [dim]
  DeviceBuffer inv_freq;               // f32 [head_dim / 2]
  float rope_attention_factor = 1.0f;  // multiplies RoPE's cos and sin (YaRN)
  std::vector<Layer> layers;

  // Step scratch, grown on demand (device).
  DeviceBuffer act;  // all activations of one step, carved below
  size_t act_tokens = 0;
  size_t act_rows = 0;
  DeviceBuffer meta;  // int32 metadata of one step
  size_t meta_ints = 0;
  DeviceBuffer ids;  // int32 greedy ids of one step (backends with sample_tokens)
  size_t ids_cap = 0;
  DeviceBuffer pages;  // page precisions, summary slots and scoring outputs of one step
  size_t pages_bytes = 0;
  // The spatial cut: sequences spread over the pool's shard group.
  ShardedAttention sharded;
  // The exchange goes through the pool's communicator (KvPool::communicator: the shard group's),
  // else through this in-process one. `exchange` is what this model's steps moved, whichever it
  // was; `comm_name` the name of the last one used.
  std::unique_ptr<backend::Communicator> comm;
  backend::ExchangeStats exchange;
  std::string comm_name;
};

namespace {

// Adds what `comm` counted during its lifetime to *into: the model's own share of a communicator
// that belongs to the pool (it is never read after the pool is gone).
class ExchangeTally {
 public:
  ExchangeTally(const backend::Communicator& comm, backend::ExchangeStats* into)
      : comm_(comm), before_(comm.stats()), into_(into) {}
  ~ExchangeTally() {
    const backend::ExchangeStats& now = comm_.stats();
    into_->transfers += now.transfers - before_.transfers;
    into_->bytes += now.bytes - before_.bytes;
    into_->host_bytes += now.host_bytes - before_.host_bytes;
    into_->seconds += now.seconds - before_.seconds;
  }
  ExchangeTally(const ExchangeTally&) = delete;
  ExchangeTally& operator=(const ExchangeTally&) = delete;

 private:
  const backend::Communicator& comm_;
  backend::ExchangeStats before_;
  backend::ExchangeStats* into_;
};

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, Backend& backend)
    : config_(config), backend_(backend), impl_(std::make_unique<Impl>()) {}

LlamaModel::~LlamaModel() = default;

double LlamaModel::matmul_weight_bytes() const {
  auto bytes = [](const MatrixView& m) {
    return static_cast<double>(m.rows) * static_cast<double>(m.cols) *
           static_cast<double>(backend::dtype_size(m.dtype));
  };
  double total = bytes(impl_->lm_head);
  for (const Impl::Layer& l : impl_->layers) {
    for (const MatrixView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      total += bytes(*m);
  }
  return total;
}

LlamaModel::ShardingStats LlamaModel::sharding_stats() const {
  ShardingStats st;
  st.exchange = impl_->exchange;
  st.communicator = impl_->comm_name;
  st.merge_seconds = impl_->sharded.merge_seconds();
  st.attention_seconds = impl_->sharded.attention_seconds();
  return st;
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::create(const LoadedModel& model,
                                                         Backend& backend) {
  const ModelConfig& c = model.config;
  if (c.dim <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 ||
      c.head_dim <= 0 || c.vocab_size <= 0 || c.hidden_dim <= 0 || c.max_seq_len <= 0) {
    return invalid_argument("model config has non-positive dimensions");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return invalid_argument("num_heads must be a multiple of num_kv_heads");
  }
  if (c.head_dim % 2 != 0) return invalid_argument("head_dim must be even for RoPE");
  // What the backend's attention is built for (the CUDA kernels: head_dim 8, 64, 128): refused
  // here rather than at every request's first attention launch.
  if (Status st = backend.check_model_attention(c.head_dim, c.num_heads / c.num_kv_heads); !st.ok())
    return Status(st.code(), "backend " + backend.name() + ": " + st.message());
  if (static_cast<int>(model.weights.layers.size()) != c.num_layers) {
    return invalid_argument("weights hold " + std::to_string(model.weights.layers.size()) +
                            " layers, config says " + std::to_string(c.num_layers));
  }
  std::unique_ptr<LlamaModel> m(new LlamaModel(c, backend));
  Impl& im = *m->impl_;

  auto upload_mat = [&](const WeightTensor& t, int64_t rows, int64_t cols,
                        const char* name) -> StatusOr<MatrixView> {
    if (!t.present()) return invalid_argument(std::string("missing weight ") + name);
    if (t.numel() != rows * cols) {
      return invalid_argument(std::string("weight ") + name + " has " + std::to_string(t.numel()) +
                              " elements, expected " + std::to_string(rows * cols));
    }
    return backend.upload_matrix(t.data, t.dtype, rows, cols);
  };
  auto upload_vec = [&](const WeightTensor& t, int64_t n,
                        const char* name) -> StatusOr<DeviceBuffer> {
    if (!t.present()) return invalid_argument(std::string("missing weight ") + name);
    if (t.numel() != n) {
      return invalid_argument(std::string("weight ") + name + " has " + std::to_string(t.numel()) +
                              " elements, expected " + std::to_string(n));
    }
    std::vector<float> host = to_f32(t);
    KVSPLIT_ASSIGN_OR_RETURN(DeviceBuffer buf,
                             DeviceBuffer::make(backend, host.size() * sizeof(float)));
    KVSPLIT_RETURN_IF_ERROR(backend.copy_h2d(buf.get(), host.data(), host.size() * sizeof(float)));
    return buf;
  };

  const int64_t dim = c.dim, hidden = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  KVSPLIT_ASSIGN_OR_RETURN(im.embedding,
                           upload_mat(model.weights.embedding, c.vocab_size, dim, "embedding"));
  if (model.weights.lm_head.present() &&
      model.weights.lm_head.data != model.weights.embedding.data) {
    KVSPLIT_ASSIGN_OR_RETURN(im.lm_head,
                             upload_mat(model.weights.lm_head, c.vocab_size, dim, "lm_head"));
  } else {
    im.lm_head = im.embedding;  // tied
  }
  KVSPLIT_ASSIGN_OR_RETURN(im.final_norm, upload_vec(model.weights.final_norm, dim, "final_norm"));
  im.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model.weights.layers[l];
    Impl::Layer& L = im.layers[l];
    KVSPLIT_ASSIGN_OR_RETURN(L.wq, upload_mat(w.wq, qd, dim, "wq"));
    KVSPLIT_ASSIGN_OR_RETURN(L.wk, upload_mat(w.wk, kvd, dim, "wk"));
    KVSPLIT_ASSIGN_OR_RETURN(L.wv, upload_mat(w.wv, kvd, dim, "wv"));
    KVSPLIT_ASSIGN_OR_RETURN(L.wo, upload_mat(w.wo, dim, qd, "wo"));
    KVSPLIT_ASSIGN_OR_RETURN(L.w_gate, upload_mat(w.w_gate, hidden, dim, "w_gate"));
    KVSPLIT_ASSIGN_OR_RETURN(L.w_up, upload_mat(w.w_up, hidden, dim, "w_up"));
    KVSPLIT_ASSIGN_OR_RETURN(L.w_down, upload_mat(w.w_down, dim, hidden, "w_down"));
    KVSPLIT_ASSIGN_OR_RETURN(L.attn_norm, upload_vec(w.attn_norm, dim, "attn_norm"));
    KVSPLIT_ASSIGN_OR_RETURN(L.ffn_norm, upload_vec(w.ffn_norm, dim, "ffn_norm"));
    if (c.qkv_bias) {
      KVSPLIT_ASSIGN_OR_RETURN(L.bq, upload_vec(w.bq, qd, "bq"));
      KVSPLIT_ASSIGN_OR_RETURN(L.bk, upload_vec(w.bk, kvd, "bk"));
      KVSPLIT_ASSIGN_OR_RETURN(L.bv, upload_vec(w.bv, kvd, "bv"));
    }
  }
  const std::vector<float> inv_freq = rope_inv_freq(c);
  KVSPLIT_ASSIGN_OR_RETURN(im.inv_freq,
                           DeviceBuffer::make(backend, inv_freq.size() * sizeof(float)));
  KVSPLIT_RETURN_IF_ERROR(
      backend.copy_h2d(im.inv_freq.get(), inv_freq.data(), inv_freq.size() * sizeof(float)));
  im.rope_attention_factor = rope_attention_factor(c);
  return m;
}

namespace {

// Host-side layout of one step's int32 metadata; uploaded as one buffer.
struct StepMeta {
  std::vector<int32_t> ints;
  size_t token_ids = 0, positions = 0, slots = 0;
  size_t dec_qstart = 0, dec_kvlens = 0, dec_tables = 0;
  size_t pre_qstart = 0, pre_kvlens = 0, pre_tables = 0;
  size_t logit_rows = 0;
};

}  // namespace

Status LlamaModel::forward(std::span<const SeqStep> seqs, kv::KvPool& pool,
                           std::vector<float>* logits, const ForwardOptions& options,
                           std::vector<int32_t>* ids) {
  const ModelConfig& c = config_;
  Impl& im = *impl_;
  Backend& be = backend_;
  if (seqs.empty()) return ok_status();
  if (pool.shape().num_layers != c.num_layers || pool.shape().num_kv_heads != c.num_kv_heads ||
      pool.shape().head_dim != c.head_dim) {
    return invalid_argument("KV pool shape does not match the model");
  }
  const int block_size = pool.block_size();

  // Decode sequences first (one query row each), then prefill sequences, then the sequences
  // whose pages are spread over the pool's shard group (the spatial cut: their decode rows, then
  // their prefill rows); order[] maps back.
  std::vector<int> order;
  order.reserve(seqs.size());
  auto is_decode = [](const SeqStep& s) { return s.tokens.size() == 1 && s.start_pos > 0; };
  auto is_sharded = [](const SeqStep& s) { return s.table != nullptr && s.table->sharded(); };
  for (int pass = 0; pass < 4; ++pass) {
    for (size_t i = 0; i < seqs.size(); ++i)
      if (is_sharded(seqs[i]) == (pass >= 2) && is_decode(seqs[i]) == (pass % 2 == 0))
        order.push_back(static_cast<int>(i));
  }
  int num_decode = 0, num_prefill = 0;
  for (int i : order) {
    if (is_sharded(seqs[i])) break;
    (is_decode(seqs[i]) ? num_decode : num_prefill)++;
  }
  const int num_local = num_decode + num_prefill;  // rows of the home-pool attention calls

  int num_tokens = 0, max_blocks = 1, dec_max_kv = 0, pre_max_kv = 0, pre_max_q = 0;
  for (const SeqStep& s : seqs) {
    const int n = static_cast<int>(s.tokens.size());
    if (n == 0) return invalid_argument("a sequence step has no tokens");
    if (s.start_pos < 0) return invalid_argument("negative start_pos");
    if (s.table == nullptr) return invalid_argument("a sequence step has no block table");
    const int kv_len = s.start_pos + n;
    if (kv_len > c.max_seq_len) {
      return invalid_argument("sequence of " + std::to_string(kv_len) +
                              " positions exceeds the context length " +
                              std::to_string(c.max_seq_len));
    }
    if (static_cast<int64_t>(s.table->blocks.size()) * block_size < kv_len) {
      return invalid_argument("block table holds " + std::to_string(s.table->blocks.size()) +
                              " blocks, too few for " + std::to_string(kv_len) + " positions");
    }
    if (!s.table->pages.empty()) {
      if (s.table->pages.size() != s.table->blocks.size())
        return invalid_argument("block table pages and blocks differ in length");
      for (int b = 0; b < kv::BlockTable::blocks_for(kv_len, block_size); ++b) {
        const kv::PageLocation loc = s.table->pages[b].location;
        if (loc == kv::PageLocation::kHost || loc == kv::PageLocation::kDisk)
          return invalid_argument("page " + std::to_string(b) +
                                  " is swapped out of the device (swap it in first)");
      }
      for (int b = s.start_pos / block_size; b < kv::BlockTable::blocks_for(kv_len, block_size);
           ++b) {
        const kv::PageEntry& pe = s.table->pages[b];
        if (!pe.resident() || pe.precision != kernels::KvPrecision::kFull)
          return invalid_argument("page " + std::to_string(b) +
                                  " is written this step but is not full precision on the device");
      }
    }
    if (s.table->window_dropped > 0) {
      // Pages dropped behind the window must lie before every layer's window of this step's
      // first query.
      // The first key any layer reads for the first query (0 when a layer reads everything).
      const int needed = kernels::window_first_key(s.start_pos, c.kv_window());
      if (int64_t{s.table->window_dropped} * block_size > needed ||
          s.table->window_dropped >= kv::BlockTable::blocks_for(kv_len, block_size)) {
        return invalid_argument("page " + std::to_string(s.table->window_dropped - 1) +
                                " was dropped behind the sliding window, and position " +
                                std::to_string(s.start_pos) + " still reads it");
      }
    }
    if (s.table->sharded()) {
      if (pool.num_shards() < 2)
        return invalid_argument("a block table names shards but the pool has no shard group");
    }
    if ((s.token_relevance == nullptr) != (s.page_bound == nullptr))
      return invalid_argument("token_relevance and page_bound go together");
    if (s.token_relevance != nullptr && !is_decode(s))
      return invalid_argument("scoring outputs are for decode steps only");
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return invalid_argument("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                std::to_string(c.vocab_size) + ")");
      }
    }
    num_tokens += n;
    max_blocks = std::max(max_blocks, kv::BlockTable::blocks_for(kv_len, block_size));
  }

  int local_tokens = 0;  // token rows of the home-pool sequences (the sharded ones follow)
  for (int k = 0; k < num_local; ++k)
    local_tokens += static_cast<int>(seqs[order[k]].tokens.size());
  const int num_sharded_rows = num_tokens - local_tokens;

  // ---- metadata ----
  StepMeta meta;
  auto reserve_ints = [&](size_t n) {
    size_t off = meta.ints.size();
    meta.ints.resize(off + n, 0);
    return off;
  };
  meta.token_ids = reserve_ints(num_tokens);
  meta.positions = reserve_ints(num_tokens);
  meta.slots = reserve_ints(num_tokens);
  meta.dec_qstart = reserve_ints(num_decode + 1);
  meta.dec_kvlens = reserve_ints(std::max(num_decode, 1));
  meta.dec_tables = reserve_ints(static_cast<size_t>(std::max(num_decode, 1)) * max_blocks);
  meta.pre_qstart = reserve_ints(num_prefill + 1);
  meta.pre_kvlens = reserve_ints(std::max(num_prefill, 1));
  meta.pre_tables = reserve_ints(static_cast<size_t>(std::max(num_prefill, 1)) * max_blocks);
  // Token rows that get the final norm and the LM head: first the kArgmax rows, then the rows whose
  // logits are returned, each part in seqs order (so the greedy rows are one contiguous block).
  std::vector<int32_t> logit_rows;
  std::vector<int32_t> other_rows;
  std::vector<int> first_row(seqs.size());
  {
    int t = 0;
    for (int k = 0; k < static_cast<int>(order.size()); ++k) {
      const SeqStep& s = seqs[order[k]];
      const int n = static_cast<int>(s.tokens.size());
      const int kv_len = s.start_pos + n;
      first_row[order[k]] = t;
      if (k >= num_local) {  // sharded: its own metadata (ShardedAttention), no home slot
        for (int i = 0; i < n; ++i, ++t) {
          meta.ints[meta.token_ids + t] = s.tokens[i];
          meta.ints[meta.positions + t] = s.start_pos + i;
          meta.ints[meta.slots + t] = -1;
        }
        continue;
      }
      const bool dec = k < num_decode;
      const int j = dec ? k : k - num_decode;
      int32_t* qstart = &meta.ints[dec ? meta.dec_qstart : meta.pre_qstart];
      int32_t* kvlens = &meta.ints[dec ? meta.dec_kvlens : meta.pre_kvlens];
      int32_t* tables = &meta.ints[dec ? meta.dec_tables : meta.pre_tables];
      const int row0 = dec ? 0 : num_decode;
      qstart[j] = t - row0;
      qstart[j + 1] = t - row0 + n;
      kvlens[j] = kv_len;
      const int nb = kv::BlockTable::blocks_for(kv_len, block_size);
      // Pages dropped behind the window are never read (every layer's window starts after
      // them, checked above); the all-full kernels still want valid ids there.
      const int dropped = s.table->window_dropped;
      for (int b = 0; b < nb; ++b)
        tables[static_cast<size_t>(j) * max_blocks + b] =
            s.table->blocks[b < dropped ? dropped : b];
      for (int i = 0; i < n; ++i, ++t) {
        const int pos = s.start_pos + i;
        meta.ints[meta.token_ids + t] = s.tokens[i];
        meta.ints[meta.positions + t] = pos;
        meta.ints[meta.slots + t] =
            static_cast<int32_t>(kernels::slot_of(s.table->blocks.data(), block_size, pos));
      }
      if (dec)
        dec_max_kv = std::max(dec_max_kv, kv_len);
      else {
        pre_max_kv = std::max(pre_max_kv, kv_len);
        pre_max_q = std::max(pre_max_q, n);
      }
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SeqStep& s = seqs[i];
      const int n = static_cast<int>(s.tokens.size());
      if (s.logits == SeqStep::Logits::kArgmax) logit_rows.push_back(first_row[i] + n - 1);
      if (s.logits == SeqStep::Logits::kLast) other_rows.push_back(first_row[i] + n - 1);
      if (s.logits == SeqStep::Logits::kAll) {
        for (int r = 0; r < n; ++r) other_rows.push_back(first_row[i] + r);
      }
    }
  }
  const int num_argmax = static_cast<int>(logit_rows.size());
  logit_rows.insert(logit_rows.end(), other_rows.begin(), other_rows.end());
  const int num_rows = static_cast<int>(logit_rows.size());
  if (num_argmax > 0 && ids == nullptr) return invalid_argument("kArgmax steps need an ids output");
  if (num_rows > num_argmax && logits == nullptr)
    return invalid_argument("logits rows need a logits output");
  meta.logit_rows = reserve_ints(std::max(num_rows, 1));
  std::copy(logit_rows.begin(), logit_rows.end(), meta.ints.begin() + meta.logit_rows);

  if (meta.ints.size() > im.meta_ints) {
    im.meta.reset();
    const size_t cap = std::max<size_t>(meta.ints.size(), im.meta_ints * 2);
    im.meta_ints = 0;  // until the new buffer exists
    KVSPLIT_ASSIGN_OR_RETURN(im.meta, DeviceBuffer::make(be, cap * sizeof(int32_t)));
    im.meta_ints = cap;
  }
  KVSPLIT_RETURN_IF_ERROR(
      be.copy_h2d(im.meta.get(), meta.ints.data(), meta.ints.size() * sizeof(int32_t)));
  const int32_t* dmeta = im.meta.get<int32_t>();

  // ---- page precisions and scoring outputs (semantic cut) ----
  // Only when some page is not full precision on the device, or a decode step is scored; else
  // attention takes its all-full path. Host image of im.pages, 16-byte aligned parts: precisions
  // u8 [num_decode | num_prefill, max_blocks]; scoring: flags u8 [num_decode], summary slots i32
  // [num_decode, max_blocks], relevance f32 [num_decode, max_blocks * block_size] and bounds f32
  // [num_decode, max_blocks] (zeroed: the kernels accumulate a max).
  bool dec_mixed = false, pre_mixed = false, scoring = false;
  for (int k = 0; k < num_local; ++k) {
    const SeqStep& s = seqs[order[k]];
    if (!s.table->all_full()) (k < num_decode ? dec_mixed : pre_mixed) = true;
    if (s.token_relevance != nullptr) scoring = true;
  }
  const size_t mb = static_cast<size_t>(max_blocks), nd = static_cast<size_t>(num_decode);
  size_t pages_size = 0;
  auto take = [&](size_t bytes) {
    const size_t o = pages_size;
    pages_size += (bytes + 15) & ~size_t{15};
    return o;
  };
  const size_t o_dec_prec = dec_mixed ? take(nd * mb) : 0;
  const size_t o_pre_prec = pre_mixed ? take(static_cast<size_t>(num_prefill) * mb) : 0;
  const size_t o_flags = scoring ? take(nd) : 0;
  const size_t o_slots = scoring ? take(nd * mb * sizeof(int32_t)) : 0;
  const size_t o_rel = scoring ? take(nd * mb * block_size * sizeof(float)) : 0;
  const size_t o_bound = scoring ? take(nd * mb * sizeof(float)) : 0;
  std::byte* dpages = nullptr;
  std::vector<uint8_t> dec_precision;  // [num_decode, max_blocks] when dec_mixed: for the planner
  if (pages_size > 0) {
    std::vector<std::byte> host(pages_size, std::byte{0});
    for (int k = 0; k < num_local; ++k) {
      const SeqStep& s = seqs[order[k]];
      const bool dec = k < num_decode;
      const size_t j = static_cast<size_t>(dec ? k : k - num_decode);
      const size_t nb = s.table->blocks.size();
      if (dec ? dec_mixed : pre_mixed) {
        auto* prec = reinterpret_cast<uint8_t*>(host.data() + (dec ? o_dec_prec : o_pre_prec));
        for (size_t b = 0; b < nb && b < mb; ++b)
          prec[j * mb + b] = static_cast<uint8_t>(
              s.table->pages.empty() ? kernels::KvPrecision::kFull : s.table->pages[b].precision);
      }
      if (dec && scoring) {
        reinterpret_cast<uint8_t*>(host.data() + o_flags)[j] = s.token_relevance != nullptr;
        auto* slots = reinterpret_cast<int32_t*>(host.data() + o_slots) + j * mb;
        for (size_t b = 0; b < mb; ++b)
          slots[b] = b < nb && !s.table->pages.empty() ? s.table->pages[b].summary : -1;
      }
    }
    if (dec_mixed) {
      const auto* prec = reinterpret_cast<const uint8_t*>(host.data() + o_dec_prec);
      dec_precision.assign(prec, prec + nd * mb);
    }
    if (pages_size > im.pages_bytes) {
      im.pages.reset();
      const size_t cap = std::max(pages_size, im.pages_bytes * 2);
      im.pages_bytes = 0;  // until the new buffer exists
      KVSPLIT_ASSIGN_OR_RETURN(im.pages, DeviceBuffer::make(be, cap));
      im.pages_bytes = cap;
    }
    KVSPLIT_RETURN_IF_ERROR(be.copy_h2d(im.pages.get(), host.data(), pages_size));
    dpages = im.pages.get<std::byte>();
  }

  // ---- activations ----
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hidden = c.hidden_dim;
  const int64_t T = num_tokens;
  const int64_t R = std::max(num_rows, 1);
  // Floats of step scratch for `tokens` token rows and `rows` logit rows (carved below).
  auto act_floats = [&](size_t tokens, size_t rows) {
    return tokens * (2 * dim + qd * 2 + kvd * 2 + hidden * 2) + rows * (dim * 2 + c.vocab_size);
  };
  if (static_cast<size_t>(T) > im.act_tokens || static_cast<size_t>(R) > im.act_rows) {
    im.act.reset();
    const size_t tokens = std::max<size_t>(T, im.act_tokens);
    const size_t rows = std::max<size_t>(R, im.act_rows);
    im.act_tokens = im.act_rows = 0;  // until the new buffer exists
    KVSPLIT_ASSIGN_OR_RETURN(im.act,
                             DeviceBuffer::make(be, act_floats(tokens, rows) * sizeof(float)));
    im.act_tokens = tokens;
    im.act_rows = rows;
  }
  float* p = im.act.get<float>();
  auto carve = [&](int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  float* x = carve(T * dim);            // residual stream [T, dim]
  float* xb = carve(T * dim);           // normed input [T, dim]
  float* q = carve(T * qd);             // [T, num_heads, head_dim]
  float* att = carve(T * qd);           // attention output [T, num_heads, head_dim]
  float* k = carve(T * kvd);            // [T, num_kv_heads, head_dim]
  float* v = carve(T * kvd);            // [T, num_kv_heads, head_dim]
  float* hb = carve(T * hidden);        // gate [T, hidden]
  float* hb2 = carve(T * hidden);       // up [T, hidden]
  float* xr = carve(R * dim);           // rows that need logits [R, dim]
  float* xrn = carve(R * dim);          // their final norm [R, dim]
  float* lg = carve(R * c.vocab_size);  // logits [R, vocab]

  // ---- split-K plans for the decode part: one per distinct sliding window of the layers ----
  std::vector<backend::SplitPlan> plans;  // plans[i].window is its window
  if (num_decode > 0) {
    const int32_t* kvl = &meta.ints[meta.dec_kvlens];
    // Sized on the attended pages where evicted ones cost nothing (SplitPlanConfig::attended).
    const bool attended = dec_mixed && backend::plan_on_attended(
                                           options.split, be.kind() == backend::DeviceKind::kCpu);
    for (int l = 0; l < c.num_layers; ++l) {
      const int w = c.window_of(l);
      if (std::ranges::any_of(plans, [&](const backend::SplitPlan& p) { return p.window == w; }))
        continue;
      plans.push_back(
          options.force_chunk_tokens >= 0
              ? backend::make_split_plan(kvl, num_decode, block_size, options.force_chunk_tokens, w)
              : backend::plan_decode_splits(
                    kvl, num_decode, c.num_kv_heads, block_size, be.parallelism(), options.split, w,
                    {attended ? dec_precision.data() : nullptr, max_blocks}));
    }
  }
  auto plan_of = [&](int layer) -> const backend::SplitPlan& {
    return *std::ranges::find(plans, c.window_of(layer), &backend::SplitPlan::window);
  };

  backend::RopeArgs rope;
  rope.style = c.rope_style;
  rope.head_dim = c.head_dim;
  rope.rotary_dim = c.head_dim;
  rope.inv_freq = im.inv_freq.get<float>();
  rope.attention_factor = im.rope_attention_factor;

  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  auto attn_args = [&](const kv::KvPool& kvp, int layer, bool dec) {
    backend::AttentionArgs a;
    const int row0 = dec ? 0 : num_decode;
    a.q = q + row0 * qd;
    a.out = att + row0 * qd;
    a.kv = kvp.layer(layer);
    a.num_seqs = dec ? num_decode : num_prefill;
    a.num_tokens = dec ? num_decode : local_tokens - num_decode;
    a.num_heads = c.num_heads;
    a.num_kv_heads = c.num_kv_heads;
    a.head_dim = c.head_dim;
    a.scale = scale;
    a.query_start = dmeta + (dec ? meta.dec_qstart : meta.pre_qstart);
    a.kv_lens = dmeta + (dec ? meta.dec_kvlens : meta.pre_kvlens);
    a.block_tables = dmeta + (dec ? meta.dec_tables : meta.pre_tables);
    a.max_blocks_per_seq = max_blocks;
    a.max_query_len = dec ? 1 : pre_max_q;
    a.max_kv_len = dec ? dec_max_kv : pre_max_kv;
    a.window = c.window_of(layer);
    if (dec ? dec_mixed : pre_mixed) {
      a.page_precision = reinterpret_cast<const uint8_t*>(dpages + (dec ? o_dec_prec : o_pre_prec));
      a.int8_pages =
          kvp.config().int8_blocks > 0 ? kvp.arena(kernels::KvPrecision::kInt8, layer) : nullptr;
      a.num_int8_blocks = kvp.config().int8_blocks;
      a.int4_pages =
          kvp.config().int4_blocks > 0 ? kvp.arena(kernels::KvPrecision::kInt4, layer) : nullptr;
      a.num_int4_blocks = kvp.config().int4_blocks;
    }
    if (dec && scoring) {
      a.score_seqs = reinterpret_cast<const uint8_t*>(dpages + o_flags);
      a.token_relevance = reinterpret_cast<float*>(dpages + o_rel);
      a.summary_slots = reinterpret_cast<const int32_t*>(dpages + o_slots);
      a.summaries = kvp.config().summary_slots > 0 ? kvp.summaries(layer) : nullptr;
      a.num_summary_slots = kvp.config().summary_slots;
      a.summary_parts = kvp.config().summary_parts;
      a.page_bound = reinterpret_cast<float*>(dpages + o_bound);
    }
    return a;
  };

  // ---- the sharded sequences' attention plan (spatial cut) ----
  std::optional<ExchangeTally> tally;  // counts this step's exchange, whatever path returns
  // A step that fails once its sharded attention is prepared leaves no peer shard running on the
  // home's buffers and no time mark held (ShardedAttention::abandon_step).
  struct AbandonGuard {
    ShardedAttention* sa = nullptr;
    ~AbandonGuard() {
      if (sa != nullptr) sa->abandon_step();
    }
  } sharded_guard;
  if (num_sharded_rows > 0) {
    if (c.has_sliding_window())
      return unimplemented(
          "the spatial cut does not support sliding-window attention (the model has windowed "
          "layers): run without spatial shards");
    std::vector<ShardedSeq> sh;
    for (int k = num_local; k < static_cast<int>(order.size()); ++k) {
      const SeqStep& s = seqs[order[k]];
      sh.push_back(ShardedSeq{s.table, s.start_pos, static_cast<int>(s.tokens.size()), is_decode(s),
                              s.token_relevance, s.page_bound});
    }
    backend::Communicator* comm = pool.communicator();
    if (comm == nullptr) {
      if (!im.comm) im.comm = backend::make_in_process_communicator();
      comm = im.comm.get();
    }
    im.comm_name = comm->name();
    tally.emplace(*comm, &im.exchange);
    ShardedAttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, scale};
    im.sharded.set_concurrent(options.concurrent_shards);
    KVSPLIT_RETURN_IF_ERROR(
        im.sharded.prepare(sh, pool, shape, options.split, *comm, options.force_chunk_tokens));
    sharded_guard.sa = &im.sharded;
  }

  const int nt = static_cast<int>(T);
  KVSPLIT_RETURN_IF_ERROR(be.embedding(dmeta + meta.token_ids, nt, im.embedding, x));
  for (int l = 0; l < c.num_layers; ++l) {
    const Impl::Layer& L = im.layers[l];
    // Attention block.
    KVSPLIT_RETURN_IF_ERROR(be.rmsnorm(x, L.attn_norm.get<float>(), nt, c.dim, c.norm_eps, xb));
    KVSPLIT_RETURN_IF_ERROR(be.gemm(xb, nt, L.wq, L.bq.get<float>(), q, false));
    KVSPLIT_RETURN_IF_ERROR(be.gemm(xb, nt, L.wk, L.bk.get<float>(), k, false));
    KVSPLIT_RETURN_IF_ERROR(be.gemm(xb, nt, L.wv, L.bv.get<float>(), v, false));
    KVSPLIT_RETURN_IF_ERROR(
        be.rope(q, k, dmeta + meta.positions, nt, c.num_heads, c.num_kv_heads, rope));
    KVSPLIT_RETURN_IF_ERROR(be.kv_append(pool.layer(l), k, v, dmeta + meta.slots, nt));
    if (num_decode > 0)
      KVSPLIT_RETURN_IF_ERROR(be.attention_decode(attn_args(pool, l, true), plan_of(l)));
    if (num_prefill > 0) KVSPLIT_RETURN_IF_ERROR(be.attention_prefill(attn_args(pool, l, false)));
    if (num_sharded_rows > 0) {
      KVSPLIT_RETURN_IF_ERROR(im.sharded.run_layer(l, q + local_tokens * qd, k + local_tokens * kvd,
                                                   v + local_tokens * kvd,
                                                   att + local_tokens * qd));
    }
    KVSPLIT_RETURN_IF_ERROR(be.gemm(att, nt, L.wo, nullptr, x, /*accumulate=*/true));
    // Feed-forward block (SwiGLU).
    KVSPLIT_RETURN_IF_ERROR(be.rmsnorm(x, L.ffn_norm.get<float>(), nt, c.dim, c.norm_eps, xb));
    KVSPLIT_RETURN_IF_ERROR(be.gemm(xb, nt, L.w_gate, nullptr, hb, false));
    KVSPLIT_RETURN_IF_ERROR(be.gemm(xb, nt, L.w_up, nullptr, hb2, false));
    KVSPLIT_RETURN_IF_ERROR(be.swiglu(hb, hb2, T * hidden, hb));
    KVSPLIT_RETURN_IF_ERROR(be.gemm(hb, nt, L.w_down, nullptr, x, /*accumulate=*/true));
  }
  if (num_sharded_rows > 0) {
    sharded_guard.sa = nullptr;  // finish_step cleans up after itself, error or not
    KVSPLIT_RETURN_IF_ERROR(im.sharded.finish_step());
  }
  if (scoring) {
    std::vector<float> rel(nd * mb * block_size), bound(nd * mb);
    KVSPLIT_RETURN_IF_ERROR(be.copy_d2h(rel.data(), dpages + o_rel, rel.size() * sizeof(float)));
    KVSPLIT_RETURN_IF_ERROR(
        be.copy_d2h(bound.data(), dpages + o_bound, bound.size() * sizeof(float)));
    KVSPLIT_RETURN_IF_ERROR(be.synchronize());
    for (int k = 0; k < num_decode; ++k) {
      const SeqStep& s = seqs[order[k]];
      if (s.token_relevance == nullptr) continue;
      const int nb = kv::BlockTable::blocks_for(s.start_pos + 1, block_size);
      std::copy_n(rel.begin() + static_cast<size_t>(k) * mb * block_size,
                  static_cast<size_t>(nb) * block_size, s.token_relevance);
      std::copy_n(bound.begin() + static_cast<size_t>(k) * mb, nb, s.page_bound);
    }
  }
  if (num_rows == 0) return be.synchronize();

  // Final norm and LM head only for the rows that need logits.
  for (int r = 0; r < num_rows; ++r) {
    KVSPLIT_RETURN_IF_ERROR(be.copy_d2d(xr + r * dim, x + static_cast<int64_t>(logit_rows[r]) * dim,
                                        dim * sizeof(float)));
  }
  KVSPLIT_RETURN_IF_ERROR(
      be.rmsnorm(xr, im.final_norm.get<float>(), num_rows, c.dim, c.norm_eps, xrn));
  KVSPLIT_RETURN_IF_ERROR(be.gemm(xrn, num_rows, im.lm_head, nullptr, lg, false));
  const int64_t vocab = c.vocab_size;
  const size_t row_bytes = static_cast<size_t>(vocab) * sizeof(float);
  // Rows [num_argmax, num_rows) are returned as logits, in one copy.
  if (num_rows > num_argmax) {
    const size_t old = logits->size();
    logits->resize(old + static_cast<size_t>(num_rows - num_argmax) * vocab);
    KVSPLIT_RETURN_IF_ERROR(be.copy_d2h(logits->data() + old, lg + num_argmax * vocab,
                                        (num_rows - num_argmax) * row_bytes));
  }
  if (num_argmax == 0) return be.synchronize();
  // Rows [0, num_argmax): greedy. On the device when the backend samples, so only their ids
  // come back; otherwise each row comes over and the host picks by the same rule.
  std::vector<int32_t> row_ids(num_argmax, -1);
  if (be.has_sample_tokens()) {
    if (static_cast<size_t>(num_argmax) > im.ids_cap) {
      im.ids.reset();
      const size_t cap = std::max<size_t>(num_argmax, im.ids_cap * 2);
      im.ids_cap = 0;  // until the new buffer exists
      KVSPLIT_ASSIGN_OR_RETURN(im.ids, DeviceBuffer::make(be, cap * sizeof(int32_t)));
      im.ids_cap = cap;
    }
    std::vector<backend::SamplingRow> greedy(num_argmax);
    for (backend::SamplingRow& g : greedy) g.temperature = 0.f;
    KVSPLIT_RETURN_IF_ERROR(
        be.sample_tokens(lg, num_argmax, c.vocab_size, greedy.data(), im.ids.get<int32_t>()));
    KVSPLIT_RETURN_IF_ERROR(
        be.copy_d2h(row_ids.data(), im.ids.get<int32_t>(), num_argmax * sizeof(int32_t)));
  } else {
    std::vector<float> row(static_cast<size_t>(vocab));
    for (int r = 0; r < num_argmax; ++r) {
      KVSPLIT_RETURN_IF_ERROR(be.copy_d2h(row.data(), lg + r * vocab, row_bytes));
      // -1 when the row has no usable logit (sampling::logits_usable, from the same argmax).
      const int32_t id = sampling::argmax_lowest(row.data(), c.vocab_size);
      row_ids[r] = std::isfinite(row[id]) ? id : -1;
    }
  }
  KVSPLIT_RETURN_IF_ERROR(be.synchronize());
  for (int32_t id : row_ids) {
    if (id < -1 || id >= c.vocab_size) {
      return internal_error("greedy id " + std::to_string(id) + " outside the vocabulary");
    }
  }
  ids->insert(ids->end(), row_ids.begin(), row_ids.end());
  return ok_status();
}

}  // namespace kvsplit::model
