// Bounded, non-blocking reads of every input file, safetensors tiling, and the NaN/Inf weight
// check. Each case here was accepted (or hung, or grew without bound) before the hardening issue.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file_read.h"
#include "common/json_util.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/weight_check.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

namespace fs = std::filesystem;
using kvsplit::testing::model_path;
using kvsplit::testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void expect_error(const Status& st, StatusCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const std::string& p : parts)
    EXPECT_NE(st.message().find(p), std::string::npos) << "want '" << p << "' in " << st.message();
}

TEST(InputFiles, NonRegularFilesAreRefusedBeforeAnyRead) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A FIFO with no writer: a blocking open would hang here forever.
  expect_error(load_tokenizer(fifo).status(), StatusCode::kInvalidArgument, {fifo, "a FIFO"});
  expect_error(load_model(fifo).status(), StatusCode::kInvalidArgument, {fifo, "a FIFO"});
  // /dev/zero reads forever: refused as a device before a byte is read.
  expect_error(load_tokenizer("/dev/zero").status(), StatusCode::kInvalidArgument,
               {"/dev/zero", "a character device"});
  expect_error(load_model("/dev/zero").status(), StatusCode::kInvalidArgument,
               {"/dev/zero", "a character device"});
  expect_error(load_tokenizer(dir.path().string()).status(), StatusCode::kInvalidArgument,
               {dir.path().string(), "is a directory"});
  expect_error(common::read_json_file(fifo).status(), StatusCode::kInvalidArgument, {"a FIFO"});
}

TEST(InputFiles, SizeCapsNameTheCap) {
  TempDir dir;
  // A sparse file: the size check runs before any read, so nothing is allocated.
  const std::string big = dir.file("tokenizer.json");
  {
    const int fd = ::open(big.c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(common::kMaxTokenizerFileBytes) + 1), 0);
    ::close(fd);
  }
  expect_error(load_tokenizer(big).status(), StatusCode::kInvalidArgument,
               {big, "over the 256 MiB cap for tokenizer files"});
  auto small = common::read_regular_file(big, 1000, "config");
  expect_error(small.status(), StatusCode::kInvalidArgument,
               {"config " + big, "over the 1000 bytes cap for config files"});
  write_bytes(dir.file("ok.txt"), "hello");
  auto ok = common::read_regular_file(dir.file("ok.txt"), 5, "config");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(*ok, "hello");
  expect_error(common::read_regular_file(dir.file("missing"), 5, "config").status(),
               StatusCode::kNotFound, {"no such file"});
}

// A copy of stories260K-hf whose safetensors header is rewritten by `edit`; returns the dir.
std::string hf_copy_with_header(
    const TempDir& dir, const std::function<void(nlohmann::json&)>& edit,
    const std::function<void(std::string&, const nlohmann::json&)>& patch_data = nullptr,
    bool misalign = false) {
  const fs::path src = model_path("stories260K-hf");
  const fs::path dst = dir.path() / "model";
  fs::create_directory(dst);
  for (const auto& e : fs::directory_iterator(src))
    fs::copy_file(e.path(), dst / e.path().filename());
  const std::string st_path = (dst / "model.safetensors").string();
  fs::permissions(st_path, fs::perms::owner_write, fs::perm_options::add);
  std::string bytes = read_bytes(st_path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  std::string data = bytes.substr(8 + n);
  edit(h);
  if (patch_data) patch_data(data, h);
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  if (misalign) header.append(1, ' ');  // the data section then starts at 1 mod 8
  uint64_t len = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  write_bytes(st_path, out + header + data);
  return dst.string();
}

TEST(Safetensors, OverlappingTensorsAreRefused) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  // The final norm weight pointed into the embedding's bytes (the probe's case: it loaded with
  // exit 0 and generated garbage).
  const std::string m = hf_copy_with_header(dir, [](nlohmann::json& h) {
    const auto emb = h["model.embed_tokens.weight"]["data_offsets"];
    const uint64_t begin = emb[0].get<uint64_t>();
    auto& norm = h["model.norm.weight"]["data_offsets"];
    const uint64_t len = norm[1].get<uint64_t>() - norm[0].get<uint64_t>();
    norm = {begin, begin + len};
  });
  auto r = load_model(m);
  expect_error(r.status(), StatusCode::kInvalidArgument, {"model.safetensors", "overlaps"});
}

TEST(Safetensors, TensorsMustTileTheDataSection) {
  KVSPLIT_REQUIRE_MODELS();
  {
    TempDir dir;  // an extra unnamed byte range at the end of the data section
    const std::string m = hf_copy_with_header(
        dir, [](nlohmann::json&) {},
        [](std::string& data, const nlohmann::json&) { data += "junkjunk"; });
    expect_error(load_model(m).status(), StatusCode::kInvalidArgument,
                 {"model.safetensors", "must cover it exactly"});
  }
  {
    TempDir dir;  // a tensor removed from the header leaves a hole
    const std::string m = hf_copy_with_header(
        dir, [](nlohmann::json& h) { h.erase("model.layers.0.input_layernorm.weight"); });
    auto r = load_model(m);
    expect_error(r.status(), StatusCode::kInvalidArgument, {"belong to no tensor"});
  }
}

// The format does not require the header to be padded: with the data section at an odd offset
// every F32 tensor is misaligned. It loads (aligned copies) with the weights of the padded file.
TEST(Safetensors, AnUnpaddedHeaderLoadsTheSameWeights) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  const std::string m = hf_copy_with_header(
      dir, [](nlohmann::json&) {}, nullptr, /*misalign=*/true);
  auto odd = load_model(m);
  ASSERT_TRUE(odd.ok()) << odd.status().to_string();
  auto ref = load_model(model_path("stories260K-hf"));
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const WeightTensor& a = odd->weights.layers.at(0).wq;
  const WeightTensor& b = ref->weights.layers.at(0).wq;
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 4, 0u);
  EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.numel()) * 4), 0);
  EXPECT_EQ(odd->weights.embedding.numel(), ref->weights.embedding.numel());
  EXPECT_EQ(std::memcmp(odd->weights.embedding.data, ref->weights.embedding.data,
                        static_cast<size_t>(ref->weights.embedding.numel()) * 4),
            0);
}

TEST(WeightCheck, NonFiniteWeightsAreNamedAtLoad) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  const std::string m = hf_copy_with_header(
      dir, [](nlohmann::json&) {},
      [](std::string& data, const nlohmann::json& h) {
        const auto& t = h["model.norm.weight"];
        const uint64_t begin = t["data_offsets"][0].get<uint64_t>();
        const float nan = std::numeric_limits<float>::quiet_NaN();
        ASSERT_EQ(t["dtype"], "F32");
        for (int i = 3; i < 6; ++i) std::memcpy(&data[begin + 4 * i], &nan, 4);
      });
  auto r = load_model(m);
  expect_error(r.status(), StatusCode::kInvalidArgument,
               {"tensor model.norm.weight has 3 non-finite values", "first at element 3: nan"});
  LoadOptions skip;
  skip.check_weights = false;
  EXPECT_TRUE(load_model(m, skip).ok());

  // llama2.c format: +inf in the classifier-shared embedding, named as run.c names it.
  std::string bin = read_bytes(model_path("stories260K.bin"));
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(&bin[28 + 4 * 10], &inf, 4);  // token_embedding_table starts after the header
  write_bytes(dir.file("m.bin"), bin);
  LoadOptions lo;
  lo.tokenizer_path = model_path("tok512.bin");
  expect_error(load_model(dir.file("m.bin"), lo).status(), StatusCode::kInvalidArgument,
               {"tensor token_embedding_table has 1 non-finite value", "element 10: inf"});
}

TEST(WeightCheck, CountsEveryDtype) {
  const uint32_t f32[] = {0x3f800000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f7fffffu};
  EXPECT_EQ(count_non_finite(f32, backend::DType::kF32, 5), 3);
  const uint16_t bf16[] = {0x3f80, 0x7f80, 0xff81, 0x7f7f};
  EXPECT_EQ(count_non_finite(bf16, backend::DType::kBF16, 4), 2);
  const uint16_t f16[] = {0x3c00, 0x7c00, 0xfe00, 0x7bff};
  EXPECT_EQ(count_non_finite(f16, backend::DType::kF16, 4), 2);
}

}  // namespace
}  // namespace kvsplit::model
