#include "model/weight_check.h"

#include <cstring>
#include <unordered_set>

#include "backend/dtype.h"

namespace kvsplit::model {
namespace {

// A value is non-finite when all its exponent bits are set (NaN or Inf), for every dtype here.
template <typename Bits>
int64_t count_exp_all_ones(const void* data, int64_t numel, Bits exp_mask) {
  const Bits* p = static_cast<const Bits*>(data);
  int64_t n = 0;
  for (int64_t i = 0; i < numel; ++i) n += (p[i] & exp_mask) == exp_mask;  // vectorizes
  return n;
}

template <typename Bits>
int64_t first_exp_all_ones(const void* data, int64_t numel, Bits exp_mask) {
  const Bits* p = static_cast<const Bits*>(data);
  for (int64_t i = 0; i < numel; ++i) {
    if ((p[i] & exp_mask) == exp_mask) return i;
  }
  return -1;
}

int64_t first_non_finite(const void* data, backend::DType dtype, int64_t numel) {
  switch (dtype) {
    case backend::DType::kF32:
      return first_exp_all_ones<uint32_t>(data, numel, 0x7f800000u);
    case backend::DType::kBF16:
      return first_exp_all_ones<uint16_t>(data, numel, 0x7f80u);
    case backend::DType::kF16:
      return first_exp_all_ones<uint16_t>(data, numel, 0x7c00u);
  }
  return -1;
}

// "nan", "inf" or "-inf" for a non-finite element, from its bits.
const char* non_finite_name(const void* data, backend::DType dtype, int64_t i) {
  uint32_t bits, mantissa_mask, sign_mask;
  if (dtype == backend::DType::kF32) {
    std::memcpy(&bits, static_cast<const uint32_t*>(data) + i, 4);
    mantissa_mask = 0x007fffffu;
    sign_mask = 0x80000000u;
  } else {
    bits = static_cast<const uint16_t*>(data)[i];
    mantissa_mask = dtype == backend::DType::kBF16 ? 0x007fu : 0x03ffu;
    sign_mask = 0x8000u;
  }
  if (bits & mantissa_mask) return "nan";
  return (bits & sign_mask) ? "-inf" : "inf";
}

}  // namespace

int64_t count_non_finite(const void* data, backend::DType dtype, int64_t numel) {
  switch (dtype) {
    case backend::DType::kF32:
      return count_exp_all_ones<uint32_t>(data, numel, 0x7f800000u);
    case backend::DType::kBF16:
      return count_exp_all_ones<uint16_t>(data, numel, 0x7f80u);
    case backend::DType::kF16:
      return count_exp_all_ones<uint16_t>(data, numel, 0x7c00u);
  }
  return 0;
}

Status check_weights_finite(const ModelWeights& weights, const std::string& source,
                            WeightCheckStats* stats) {
  WeightCheckStats s;
  std::unordered_set<const void*> seen;
  auto check = [&](const WeightTensor& t, const std::string& fallback_name) -> Status {
    if (!t.present() || !seen.insert(t.data).second) return ok_status();
    const int64_t numel = t.numel();
    ++s.tensors;
    s.bytes += static_cast<uint64_t>(numel) * backend::dtype_size(t.dtype);
    const int64_t bad = count_non_finite(t.data, t.dtype, numel);
    if (bad == 0) return ok_status();
    const int64_t first = first_non_finite(t.data, t.dtype, numel);
    return invalid_argument(source + ": tensor " + (t.name.empty() ? fallback_name : t.name) +
                            " has " + std::to_string(bad) + " non-finite value" +
                            (bad == 1 ? "" : "s") + " of " + std::to_string(numel) +
                            " (first at element " + std::to_string(first) + ": " +
                            non_finite_name(t.data, t.dtype, first) + ")");
  };
  KVSPLIT_RETURN_IF_ERROR(check(weights.embedding, "embedding"));
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& w = weights.layers[l];
    const std::string at = "layers[" + std::to_string(l) + "].";
    const std::pair<const WeightTensor*, const char*> all[] = {{&w.attn_norm, "attn_norm"},
                                                               {&w.wq, "wq"},
                                                               {&w.wk, "wk"},
                                                               {&w.wv, "wv"},
                                                               {&w.wo, "wo"},
                                                               {&w.bq, "bq"},
                                                               {&w.bk, "bk"},
                                                               {&w.bv, "bv"},
                                                               {&w.ffn_norm, "ffn_norm"},
                                                               {&w.w_gate, "w_gate"},
                                                               {&w.w_up, "w_up"},
                                                               {&w.w_down, "w_down"}};
    for (const auto& [t, name] : all) KVSPLIT_RETURN_IF_ERROR(check(*t, at + name));
  }
  KVSPLIT_RETURN_IF_ERROR(check(weights.final_norm, "final_norm"));
  KVSPLIT_RETURN_IF_ERROR(check(weights.lm_head, "lm_head"));
  if (stats != nullptr) *stats = s;
  return ok_status();
}

}  // namespace kvsplit::model
