// llama2.c v0 checkpoints built in a TempDir: layout of the views, and every malformed case.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "model/loader.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

using kvsplit::testing::TempDir;

struct Header {
  int32_t dim = 8, hidden = 12, layers = 2, heads = 2, kv_heads = 1, vocab = 16, seq_len = 4;
};

// Float count of the body for `h` (|vocab|, wcls when vocab < 0).
int64_t body_floats(const Header& h) {
  const int64_t d = h.dim, hd = h.hidden, L = h.layers, kv = int64_t{h.dim} / h.heads * h.kv_heads;
  const int64_t v = h.vocab < 0 ? -int64_t{h.vocab} : h.vocab;
  int64_t n = v * d + L * d + L * d * d + 2 * L * kv * d + L * d * d + L * d + 3 * L * hd * d + d +
              int64_t{h.seq_len} * (d / h.heads);
  if (h.vocab < 0) n += v * d;
  return n;
}

// Writes header + body where body[i] = i (so every view can be located by its first value).
std::string write_checkpoint(const TempDir& dir, const Header& h, int64_t extra_bytes = 0,
                             const std::string& name = "model.bin") {
  std::vector<int32_t> hdr = {h.dim, h.hidden, h.layers, h.heads, h.kv_heads, h.vocab, h.seq_len};
  std::vector<float> body(body_floats(h));
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<float>(i);
  std::string path = dir.file(name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(hdr.data()), 28);
  int64_t nbytes = static_cast<int64_t>(body.size()) * 4 + extra_bytes;
  std::vector<char> bytes(std::max<int64_t>(nbytes, 0), 0);
  std::memcpy(bytes.data(), body.data(), std::min<int64_t>(nbytes, body.size() * 4));
  out.write(bytes.data(), bytes.size());
  return path;
}

LoadOptions no_tokenizer() {
  LoadOptions o;
  o.load_tokenizer = false;
  return o;
}

float first(const WeightTensor& t) { return static_cast<const float*>(t.data)[0]; }

TEST(LoaderLlama2c, ViewsPointAtTheRightArrays) {
  TempDir dir;
  Header h;
  auto m = load_llama2c(write_checkpoint(dir, h), no_tokenizer());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.architecture, "llama2c");
  EXPECT_EQ(c.dim, 8);
  EXPECT_EQ(c.hidden_dim, 12);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 2);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.vocab_size, 16);
  EXPECT_EQ(c.max_seq_len, 4);
  EXPECT_EQ(c.rope_style, backend::RopeStyle::kInterleaved);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1}));  // run.c stops on BOS only
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(m->tokenizer, nullptr);
  // Offsets in floats: emb 128, rms_att 16, wq 128, wk 64, wv 64, wo 128, rms_ffn 16,
  // w1 192, w2 192, w3 192, rms_final 8, freq 16.
  const ModelWeights& w = m->weights;
  EXPECT_EQ(first(w.embedding), 0.0f);
  EXPECT_EQ(w.embedding.shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(first(w.layers[0].attn_norm), 128.0f);
  EXPECT_EQ(first(w.layers[1].attn_norm), 136.0f);
  EXPECT_EQ(first(w.layers[0].wq), 144.0f);
  EXPECT_EQ(first(w.layers[1].wq), 208.0f);
  EXPECT_EQ(first(w.layers[0].wk), 272.0f);
  EXPECT_EQ(w.layers[0].wk.shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(first(w.layers[1].wk), 304.0f);
  EXPECT_EQ(first(w.layers[0].wv), 336.0f);
  EXPECT_EQ(first(w.layers[0].wo), 400.0f);
  EXPECT_EQ(first(w.layers[1].ffn_norm), 536.0f);
  EXPECT_EQ(first(w.layers[0].w_gate), 544.0f);
  EXPECT_EQ(first(w.layers[1].w_gate), 640.0f);
  EXPECT_EQ(first(w.layers[0].w_down), 736.0f);
  EXPECT_EQ(w.layers[0].w_down.shape, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(first(w.layers[0].w_up), 928.0f);
  EXPECT_EQ(first(w.final_norm), 1120.0f);
  EXPECT_EQ(w.lm_head.data, w.embedding.data);
  EXPECT_FALSE(w.layers[0].bq.present());
  EXPECT_FALSE(w.storage.empty());
}

TEST(LoaderLlama2c, UnsharedClassifierFollowsFreqCis) {
  TempDir dir;
  Header h;
  h.vocab = -16;
  auto m = load_llama2c(write_checkpoint(dir, h), no_tokenizer());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->config.vocab_size, 16);
  EXPECT_FALSE(m->config.tie_word_embeddings);
  EXPECT_NE(m->weights.lm_head.data, m->weights.embedding.data);
  EXPECT_EQ(first(m->weights.lm_head), 1128.0f + 16.0f);  // after rms_final (8) and freq_cis (16)
  EXPECT_EQ(m->weights.lm_head.shape, (std::vector<int64_t>{16, 8}));
}

void expect_error(const StatusOr<LoadedModel>& m, StatusCode code,
                  const std::vector<std::string>& needles) {
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), code) << m.status().to_string();
  for (const auto& n : needles) {
    EXPECT_NE(m.status().message().find(n), std::string::npos)
        << "'" << n << "' not in: " << m.status().message();
  }
}

TEST(LoaderLlama2c, TruncatedFileSaysExpectedAndActualBytes) {
  TempDir dir;
  Header h;
  const int64_t expected = 28 + body_floats(h) * 4;
  std::string path = write_checkpoint(dir, h, -4);
  expect_error(load_llama2c(path, no_tokenizer()), StatusCode::kInvalidArgument,
               {path, std::to_string(expected - 4), std::to_string(expected), "truncated"});
}

TEST(LoaderLlama2c, TrailingBytesAreAnError) {
  TempDir dir;
  std::string path = write_checkpoint(dir, Header{}, 8);
  expect_error(load_llama2c(path, no_tokenizer()), StatusCode::kInvalidArgument,
               {path, "trailing data"});
}

TEST(LoaderLlama2c, ShorterThanHeader) {
  TempDir dir;
  std::string path = dir.file("short.bin");
  std::ofstream(path, std::ios::binary).write("\x08\0\0\0\x0c\0\0\0", 8);
  expect_error(load_llama2c(path, no_tokenizer()), StatusCode::kInvalidArgument,
               {path, "truncated", "28-byte"});
}

TEST(LoaderLlama2c, BadHeaderValues) {
  struct Case {
    Header h;
    std::string needle;
  };
  std::vector<Case> cases;
  {
    Header h;
    h.dim = 0;
    cases.push_back({h, "dim = 0"});
  }
  {
    Header h;
    h.heads = -2;
    cases.push_back({h, "n_heads = -2"});
  }
  {
    Header h;
    h.seq_len = -1;
    cases.push_back({h, "seq_len = -1"});
  }
  {
    Header h;
    h.dim = 9;
    h.heads = 2;
    cases.push_back({h, "not a multiple of n_heads"});
  }
  {
    Header h;
    h.heads = 2;
    h.kv_heads = 3;
    cases.push_back({h, "num_kv_heads"});
  }
  {
    Header h;
    h.layers = 1 << 20;
    cases.push_back({h, "num_layers = 1048576 out of range"});
  }
  {
    Header h;
    h.vocab = 1 << 30;
    cases.push_back({h, "vocab_size"});
  }
  {
    Header h;
    h.dim = 6;
    h.heads = 2;
    cases.push_back({h, "head_dim = 3 must be even"});
  }
  for (const auto& c : cases) {
    TempDir dir;
    // Write only the header plus a little data: validation must fail before any size arithmetic.
    std::string path = dir.file("bad.bin");
    std::vector<int32_t> hdr = {c.h.dim,   c.h.hidden,  c.h.layers, c.h.heads, c.h.kv_heads,
                                c.h.vocab, c.h.seq_len, 0,          0};
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(hdr.data()), 36);
    SCOPED_TRACE(c.needle);
    expect_error(load_llama2c(path, no_tokenizer()), StatusCode::kInvalidArgument,
                 {path, "bad llama2.c header", c.needle});
  }
}

TEST(LoaderLlama2c, VersionOneMagicIsUnimplemented) {
  TempDir dir;
  std::string path = dir.file("v1.bin");
  uint32_t magic = 0x616b3432, version = 1;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&magic), 4);
  out.write(reinterpret_cast<const char*>(&version), 4);
  out.write(std::string(256, '\0').data(), 256);
  out.close();
  expect_error(load_llama2c(path, no_tokenizer()), StatusCode::kUnimplemented,
               {path, "ak42", "version 0"});
}

TEST(LoaderLlama2c, MissingTokenizerNamesTheCandidates) {
  TempDir dir;
  std::string path = write_checkpoint(dir, Header{});
  expect_error(load_llama2c(path, LoadOptions{}), StatusCode::kNotFound,
               {path, "tokenizer.bin", "tok16.bin"});
}

TEST(LoaderLlama2c, EmptyFileAndDirectory) {
  TempDir dir;
  std::string empty = dir.file("empty.bin");
  std::ofstream(empty).close();
  expect_error(load_llama2c(empty, no_tokenizer()), StatusCode::kInvalidArgument,
               {empty, "empty file"});
  expect_error(load_llama2c(dir.path().string(), no_tokenizer()), StatusCode::kInvalidArgument,
               {"is a directory"});
  expect_error(load_llama2c(dir.file("nope.bin"), no_tokenizer()), StatusCode::kNotFound,
               {"nope.bin"});
}

TEST(LoaderDispatch, PathKinds) {
  TempDir dir;
  std::string path = write_checkpoint(dir, Header{});
  auto m = load_model(path, no_tokenizer());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->config.architecture, "llama2c");
  auto missing = load_model(dir.file("absent.bin"), no_tokenizer());
  expect_error(missing, StatusCode::kNotFound, {"absent.bin"});
  expect_error(load_model("", no_tokenizer()), StatusCode::kNotFound, {"empty path"});
  // A directory goes to the HF loader.
  expect_error(load_model(dir.path().string(), no_tokenizer()), StatusCode::kNotFound,
               {"config.json"});
  auto syn = load_model("synthetic:stories260k", no_tokenizer());
  ASSERT_TRUE(syn.ok()) << syn.status().to_string();
  EXPECT_EQ(syn->config.architecture, "synthetic");
}

}  // namespace
}  // namespace kvsplit::model
