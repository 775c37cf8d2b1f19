// llama2.c legacy (v0) checkpoints: 7 x int32 header, then layer-stacked float32 arrays (see
// docs/models.md). The weights are views into the memory mapping.
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "common/mmap_file.h"
#include "model/loader.h"

namespace kvsplit::model {

namespace {

constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42": llama2.c export.py version 1/2
constexpr int64_t kHeaderBytes = 7 * 4;

StatusOr<std::string> find_llama2c_tokenizer(const std::string& model_path, int vocab,
                                             const LoadOptions& options) {
  if (!options.tokenizer_path.empty()) return options.tokenizer_path;
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(model_path).parent_path();
  const fs::path candidates[] = {dir / "tokenizer.bin",
                                 dir / ("tok" + std::to_string(vocab) + ".bin")};
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c.string();
  }
  return not_found(model_path + ": no tokenizer beside the model (tried " + candidates[0].string() +
                   ", " + candidates[1].string() + "); pass a tokenizer path");
}

}  // namespace

StatusOr<LoadedModel> load_llama2c(const std::string& path, const LoadOptions& options) {
  KVSPLIT_ASSIGN_OR_RETURN(auto file, common::MmapFile::open(path));
  const uint8_t* base = file->data();
  const int64_t size = static_cast<int64_t>(file->size());
  if (size >= 4) {
    uint32_t magic = 0;
    std::memcpy(&magic, base, 4);
    if (magic == kLlama2cMagic) {
      return unimplemented(path +
                           ": llama2.c version 1/2 checkpoint (magic \"ak42\") is not "
                           "supported; export the legacy v0 format (export.py --version 0)");
    }
  }
  if (size < kHeaderBytes) {
    return invalid_argument(path + ": truncated: " + std::to_string(size) +
                            " bytes, shorter than the 28-byte llama2.c header");
  }
  int32_t h[7];
  std::memcpy(h, base, sizeof(h));
  const char* names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                          "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    if (h[i] == 0 || (h[i] < 0 && i != 5) || h[i] == INT32_MIN) {
      return invalid_argument(path + ": bad llama2.c header: " + names[i] + " = " +
                              std::to_string(h[i]) + " (must be positive)");
    }
  }
  const bool shared_classifier = h[5] > 0;

  ModelConfig c;
  c.architecture = "llama2c";
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.num_layers = h[2];
  c.num_heads = h[3];
  c.num_kv_heads = h[4];
  c.vocab_size = shared_classifier ? h[5] : -h[5];
  c.max_seq_len = h[6];
  if (c.dim % c.num_heads != 0) {
    return invalid_argument(path + ": bad llama2.c header: dim " + std::to_string(c.dim) +
                            " is not a multiple of n_heads " + std::to_string(c.num_heads));
  }
  c.head_dim = c.dim / c.num_heads;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_style = backend::RopeStyle::kInterleaved;
  c.tie_word_embeddings = shared_classifier;
  c.bos_token_id = 1;
  // run.c stops when the model samples BOS (1), and only then: these models end every story with
  // BOS; a sampled EOS (2) is fed on, as run.c does.
  c.eos_token_ids = {1};
  KVSPLIT_RETURN_IF_ERROR(validate_model_config(c, path + ": bad llama2.c header"));

  // Sizes in floats; validate_model_config's bounds keep all of this far from int64 overflow.
  const int64_t L = c.num_layers, dim = c.dim, hid = c.hidden_dim, kv = c.kv_dim();
  const int64_t vocab = c.vocab_size;
  int64_t off = 0;
  auto take = [&](int64_t n) {
    int64_t o = off;
    off += n;
    return o;
  };
  const int64_t o_emb = take(vocab * dim);
  const int64_t o_rms_att = take(L * dim);
  const int64_t o_wq = take(L * dim * dim);
  const int64_t o_wk = take(L * kv * dim);
  const int64_t o_wv = take(L * kv * dim);
  const int64_t o_wo = take(L * dim * dim);
  const int64_t o_rms_ffn = take(L * dim);
  const int64_t o_w1 = take(L * hid * dim);
  const int64_t o_w2 = take(L * dim * hid);
  const int64_t o_w3 = take(L * hid * dim);
  const int64_t o_rms_final = take(dim);
  take(int64_t{c.max_seq_len} * c.head_dim);  // freq_cis_real + freq_cis_imag, unused
  const int64_t o_wcls = shared_classifier ? o_emb : take(vocab * dim);
  const int64_t expected = kHeaderBytes + off * 4;
  if (size != expected) {
    return invalid_argument(
        path + ": file size " + std::to_string(size) + " bytes, but the header (dim " +
        std::to_string(dim) + ", hidden " + std::to_string(hid) + ", layers " + std::to_string(L) +
        ", heads " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) +
        ", vocab " + std::to_string(h[5]) + ", seq_len " + std::to_string(c.max_seq_len) +
        ") implies " + std::to_string(expected) + " bytes" +
        (size < expected ? " (truncated)" : " (trailing data)"));
  }

  const float* f = reinterpret_cast<const float*>(base + kHeaderBytes);
  // Names as llama2.c's TransformerWeights fields, with the layer: "wq[3]".
  auto view = [&](int64_t offset, std::vector<int64_t> shape, std::string name) {
    WeightTensor t;
    t.data = f + offset;
    t.dtype = backend::DType::kF32;
    t.shape = std::move(shape);
    t.name = std::move(name);
    return t;
  };
  LoadedModel m;
  ModelWeights& w = m.weights;
  w.embedding = view(o_emb, {vocab, dim}, "token_embedding_table");
  w.layers.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights& lw = w.layers[l];
    const std::string at = "[" + std::to_string(l) + "]";
    lw.attn_norm = view(o_rms_att + l * dim, {dim}, "rms_att_weight" + at);
    lw.wq = view(o_wq + l * dim * dim, {dim, dim}, "wq" + at);
    lw.wk = view(o_wk + l * kv * dim, {kv, dim}, "wk" + at);
    lw.wv = view(o_wv + l * kv * dim, {kv, dim}, "wv" + at);
    lw.wo = view(o_wo + l * dim * dim, {dim, dim}, "wo" + at);
    lw.ffn_norm = view(o_rms_ffn + l * dim, {dim}, "rms_ffn_weight" + at);
    lw.w_gate = view(o_w1 + l * hid * dim, {hid, dim}, "w1" + at);
    lw.w_down = view(o_w2 + l * dim * hid, {dim, hid}, "w2" + at);
    lw.w_up = view(o_w3 + l * hid * dim, {hid, dim}, "w3" + at);
  }
  w.final_norm = view(o_rms_final, {dim}, "rms_final_weight");
  w.lm_head = view(o_wcls, {vocab, dim}, shared_classifier ? "token_embedding_table" : "wcls");
  w.storage.push_back(file);

  if (options.load_tokenizer) {
    KVSPLIT_ASSIGN_OR_RETURN(std::string tok_path,
                             find_llama2c_tokenizer(path, c.vocab_size, options));
    KVSPLIT_ASSIGN_OR_RETURN(m.tokenizer, load_tokenizer(tok_path, c.vocab_size));
  }
  m.config = std::move(c);
  m.source = "llama2.c " + path;
  KVSPLIT_LOG_INFO("loaded {}: dim {}, {} layers, {} heads ({} kv), vocab {}, ctx {}", m.source,
                   m.config.dim, m.config.num_layers, m.config.num_heads, m.config.num_kv_heads,
                   m.config.vocab_size, m.config.max_seq_len);
  return m;
}

}  // namespace kvsplit::model
