// synthetic:<preset>[@seed=N][,ctx=N][,window=N]: Llama-shaped models with seeded random weights,
// for benchmarks (options after "@", comma-separated, each at most once; ctx overrides the
// preset's context length, e.g. for long-context benchmarks; window makes every layer slide over
// N keys, as Mistral's sliding_window; the weights depend on neither).
// Values are a counter-based hash of (seed, tensor, index), so generation is parallel and the
// result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <thread>

#include "common/log.h"
#include "common/splitmix.h"
#include "common/thread_pool.h"
#include "model/loader.h"
#include "model/tokenizer.h"

namespace kvsplit::model {

namespace {

constexpr int64_t kFourGiB = int64_t{4} << 30;
constexpr size_t kAlign = 64;  // every tensor starts on a cache line

struct Preset {
  const char* name;
  int dim, hidden_dim, num_layers, num_heads, num_kv_heads, vocab_size, max_seq_len;
  bool tied;
  float rope_theta;
  bool llama3_scaling;
};

constexpr Preset kPresets[] = {
    {"stories260k", 64, 172, 5, 8, 4, 512, 512, true, 10000.0f, false},
    {"llama-110m", 768, 2048, 12, 12, 12, 32000, 1024, true, 10000.0f, false},
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, false, 10000.0f, false},
    {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, false, 500000.0f, true},
};

std::string preset_names() {
  std::string s;
  for (const auto& p : kPresets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

// Uniform in [-1, 1) from the top 24 bits.
float uniform_pm1(uint64_t h) { return static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f; }

uint16_t to_bf16(float f) {  // round to nearest even (values here are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// dst[i] = bias + scale * uniform(-1, 1) for i in [b, e). Branch-free so it vectorizes.
template <typename T>
void fill(T* dst, int64_t b, int64_t e, uint64_t key, float bias, float scale) {
  for (int64_t i = b; i < e; ++i) {
    const float v = bias + scale * uniform_pm1(splitmix64(key + static_cast<uint64_t>(i)));
    if constexpr (sizeof(T) == 2) {
      dst[i] = to_bf16(v);
    } else {
      dst[i] = v;
    }
  }
}

struct Parsed {
  const Preset* preset = nullptr;
  uint64_t seed = 0;
  int ctx = 0;     // > 0: overrides the preset's max_seq_len
  int window = 0;  // > 0: every layer slides over this many keys (Mistral's sliding_window)
};

// A decimal integer of at most 19 digits: true and *out, or false.
bool parse_decimal(const std::string& digits, uint64_t* out) {
  if (digits.empty() || digits.size() > 19 ||
      !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return false;
  *out = std::stoull(digits);
  return true;
}

StatusOr<Parsed> parse_spec(const std::string& spec) {
  std::string s = spec;
  if (s.rfind("synthetic:", 0) == 0) s = s.substr(10);
  std::string opts;
  const size_t at = s.find('@');
  const bool has_opts = at != std::string::npos;
  if (has_opts) {
    opts = s.substr(at + 1);
    s = s.substr(0, at);
  }
  Parsed p;
  for (const auto& pr : kPresets) {
    if (s == pr.name) p.preset = &pr;
  }
  if (p.preset == nullptr) {
    return invalid_argument(spec + ": unknown synthetic preset '" + s +
                            "' (presets: " + preset_names() + ")");
  }
  if (!has_opts) return p;
  // Options: comma-separated key=value, each key at most once.
  bool seen_seed = false, seen_ctx = false, seen_window = false;
  size_t b = 0;
  while (true) {
    const size_t e = std::min(opts.find(',', b), opts.size());
    const std::string opt = opts.substr(b, e - b);
    const size_t eq = opt.find('=');
    const std::string key = opt.substr(0, eq);
    uint64_t value = 0;
    const bool number = eq != std::string::npos && parse_decimal(opt.substr(eq + 1), &value);
    if (key == "seed" && !seen_seed && number) {
      seen_seed = true;
      p.seed = value;
    } else if (key == "window" && !seen_window && number && value >= 1 &&
               value <= static_cast<uint64_t>(kMaxContextLength)) {
      seen_window = true;
      p.window = static_cast<int>(value);
    } else if (key == "ctx" && !seen_ctx && number && value >= 1 &&
               value <= static_cast<uint64_t>(kMaxContextLength)) {
      seen_ctx = true;
      p.ctx = static_cast<int>(value);
    } else {
      return invalid_argument(spec + ": bad option '" + opt +
                              "' (expected comma-separated seed=N, ctx=N, window=N after @: N a "
                              "decimal integer, ctx and window in [1, " +
                              std::to_string(kMaxContextLength) + "], each at most once)");
    }
    if (e == opts.size()) break;
    b = e + 1;
  }
  return p;
}

ModelConfig make_config(const Preset& p, int ctx, int window) {
  ModelConfig c;
  c.architecture = "synthetic";
  c.dim = p.dim;
  c.hidden_dim = p.hidden_dim;
  c.num_layers = p.num_layers;
  c.num_heads = p.num_heads;
  c.num_kv_heads = p.num_kv_heads;
  c.head_dim = p.dim / p.num_heads;
  c.vocab_size = p.vocab_size;
  c.max_seq_len = ctx > 0 ? ctx : p.max_seq_len;
  c.norm_eps = 1e-5f;
  c.rope_theta = p.rope_theta;
  c.rope_style = backend::RopeStyle::kHalf;
  if (p.llama3_scaling) c.rope_scaling = RopeScaling::llama3(8.0, 1.0, 4.0, 8192);
  c.tie_word_embeddings = p.tied;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  // A window of at least the context masks nothing (as for HF configs, docs/models.md).
  if (window > 0 && window < c.max_seq_len) c.layer_window.assign(c.num_layers, window);
  return c;
}

// One tensor to generate: where it goes and how it is filled.
struct Job {
  WeightTensor* dst;
  size_t offset;  // bytes into the buffer
  int64_t numel;
  uint64_t key;  // hash key: seed and tensor index
  float scale;   // matrices: 1/sqrt(in_features); norms: spread around 1
  bool norm;
};

}  // namespace

StatusOr<ModelConfig> synthetic_config(const std::string& spec) {
  KVSPLIT_ASSIGN_OR_RETURN(Parsed p, parse_spec(spec));
  return make_config(*p.preset, p.ctx, p.window);
}

StatusOr<LoadedModel> load_synthetic(const std::string& spec, const LoadOptions& options) {
  KVSPLIT_ASSIGN_OR_RETURN(Parsed parsed, parse_spec(spec));
  LoadedModel m;
  m.config = make_config(*parsed.preset, parsed.ctx, parsed.window);
  const ModelConfig& c = m.config;
  KVSPLIT_RETURN_IF_ERROR(validate_model_config(c, spec));
  const int64_t dim = c.dim, hid = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim(), V = c.vocab_size;

  const int64_t layer_params = 2 * dim + q * dim + 2 * kv * dim + dim * q + 3 * hid * dim;
  const int64_t other_params = V * dim * (c.tie_word_embeddings ? 1 : 2) + dim;
  const int64_t total = other_params + layer_params * c.num_layers;
  const bool bf16 = total * 4 > kFourGiB;
  const size_t esize = bf16 ? 2 : 4;
  const bool shared_layers = total * static_cast<int64_t>(esize) > kFourGiB;
  if (bf16) {
    KVSPLIT_LOG_INFO(
        "{}: {} parameters would exceed 4 GiB in f32; generating bf16{}", spec, total,
        shared_layers ? ", all layers sharing layer 0's buffers (outputs meaningless)" : "");
  }

  ModelWeights& w = m.weights;
  w.layers.resize(c.num_layers);
  std::vector<Job> jobs;
  size_t bytes = 0;
  auto add = [&](WeightTensor* t, std::vector<int64_t> shape, bool norm) {
    t->dtype = bf16 ? backend::DType::kBF16 : backend::DType::kF32;
    t->shape = std::move(shape);
    const int64_t in = t->shape.back();
    Job j{t,
          bytes,
          t->numel(),
          splitmix64(parsed.seed ^ (0xA5A5ull << 32)) + jobs.size(),
          norm ? 0.1f : 1.0f / std::sqrt(static_cast<float>(in)),
          norm};
    bytes += (static_cast<size_t>(j.numel) * esize + kAlign - 1) / kAlign * kAlign;
    jobs.push_back(j);
  };
  add(&w.embedding, {V, dim}, false);
  for (int l = 0; l < (shared_layers ? 1 : c.num_layers); ++l) {
    LayerWeights& lw = w.layers[l];
    add(&lw.attn_norm, {dim}, true);
    add(&lw.wq, {q, dim}, false);
    add(&lw.wk, {kv, dim}, false);
    add(&lw.wv, {kv, dim}, false);
    add(&lw.wo, {dim, q}, false);
    add(&lw.ffn_norm, {dim}, true);
    add(&lw.w_gate, {hid, dim}, false);
    add(&lw.w_up, {hid, dim}, false);
    add(&lw.w_down, {dim, hid}, false);
  }
  add(&w.final_norm, {dim}, true);
  if (!c.tie_word_embeddings) add(&w.lm_head, {V, dim}, false);

  void* raw = ::operator new(bytes, std::align_val_t(kAlign), std::nothrow);
  if (raw == nullptr) {
    return resource_exhausted(spec + ": cannot allocate " + std::to_string(bytes) + " bytes");
  }
  std::shared_ptr<void> buffer(raw,
                               [](void* p) { ::operator delete(p, std::align_val_t(kAlign)); });
  auto* base = static_cast<uint8_t*>(raw);
  for (Job& j : jobs) j.dst->data = base + j.offset;

  // Fill in chunks of 1M elements across all cores (first touch happens in the workers).
  constexpr int64_t kChunk = 1 << 20;
  std::vector<std::pair<size_t, int64_t>> chunks;  // (job, first element)
  for (size_t i = 0; i < jobs.size(); ++i) {
    for (int64_t b = 0; b < jobs[i].numel; b += kChunk) chunks.emplace_back(i, b);
  }
  ThreadPool pool(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  pool.parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t ci) {
    const Job& j = jobs[chunks[ci].first];
    const int64_t b = chunks[ci].second, e = std::min(j.numel, b + kChunk);
    const uint64_t key = splitmix64(j.key);
    const float bias = j.norm ? 1.0f : 0.0f;
    if (bf16) {
      fill(reinterpret_cast<uint16_t*>(base + j.offset), b, e, key, bias, j.scale);
    } else {
      fill(reinterpret_cast<float*>(base + j.offset), b, e, key, bias, j.scale);
    }
  });
  if (shared_layers) {
    for (int l = 1; l < c.num_layers; ++l) w.layers[l] = w.layers[0];
  }
  if (c.tie_word_embeddings) w.lm_head = w.embedding;
  w.storage.push_back(std::move(buffer));

  // The tokenizer file given (--tokenizer, engine.tokenizer), checked against the preset's
  // vocabulary; else the byte-level stand-in.
  if (options.load_tokenizer && !options.tokenizer_path.empty()) {
    KVSPLIT_ASSIGN_OR_RETURN(m.tokenizer, load_tokenizer(options.tokenizer_path, c.vocab_size));
  } else if (options.load_tokenizer) {
    m.tokenizer = make_byte_tokenizer(c.vocab_size);
  }
  m.source = "synthetic:" + std::string(parsed.preset->name) +
             "@seed=" + std::to_string(parsed.seed) +
             (parsed.ctx > 0 ? ",ctx=" + std::to_string(parsed.ctx) : "") +
             (parsed.window > 0 ? ",window=" + std::to_string(parsed.window) : "");
  KVSPLIT_LOG_INFO("generated {}: {} parameters, {} MiB of {}{}", m.source, total, bytes >> 20,
                   bf16 ? "bf16" : "f32", shared_layers ? " (layers share one buffer set)" : "");
  return m;
}

}  // namespace kvsplit::model
