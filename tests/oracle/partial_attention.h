// Test helpers for partial attention (the spatial cut): the log-sum-exp output
// (AttentionArgs::lse) compared against the fp64 oracles (which give -inf for a row that attends
// no key), and the split of a sequence's pages into disjoint shards, each run as a mixed call whose
// other pages are evicted. Shared by the CPU suite (tests/backend/attention_lse_test.cpp) and the
// kernel parity suite (tests/kernels/attention_lse_parity_test.cpp). Host memory only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/common/kv_quant.h"
#include "oracle/attention_oracle.h"

namespace kvsplit::oracle {

// ok when every row the oracle says attends no key (-inf) is -inf in `got` too, and every other
// row is finite with |got - want| <= atol + rtol * |want|.
inline Comparison compare_lse(const float* got, const std::vector<double>& want, double atol,
                              double rtol) {
  Comparison c;
  for (size_t i = 0; i < want.size() && c.ok; ++i) {
    const bool want_empty = std::isinf(want[i]) && want[i] < 0;
    const bool got_empty = std::isinf(got[i]) && got[i] < 0;
    double err = 0.0;
    if (want_empty != got_empty || (!want_empty && !std::isfinite(got[i]))) {
      err = std::numeric_limits<double>::infinity();
    } else if (!want_empty) {
      err = std::abs(static_cast<double>(got[i]) - want[i]);
      c.max_abs_err = std::max(c.max_abs_err, err);
    }
    if (err > atol + rtol * (want_empty ? 0.0 : std::abs(want[i]))) {
      c.ok = false;
      c.worst = static_cast<int64_t>(i);
      c.message = "lse row " + std::to_string(i) + " got " + std::to_string(got[i]) + " want " +
                  std::to_string(want[i]);
    }
  }
  return c;
}

// Rows of `lse` (host) as doubles, for comparing two float results with compare / compare_lse.
inline std::vector<double> as_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Page precisions of num_parts shards of a call: every page that `base` keeps resident (base:
// [num_seqs, max_blocks_per_seq] KvPrecision values; empty means all kFull) goes to one shard
// drawn at random; in shard p every page of the other shards is kEvicted. The shards' key sets
// are disjoint and together are the call's resident keys. Returns [num_parts][rows].
inline std::vector<std::vector<uint8_t>> shard_precisions(const std::vector<uint8_t>& base,
                                                          size_t rows, int num_parts, Rng& rng) {
  const auto evicted = static_cast<uint8_t>(kernels::KvPrecision::kEvicted);
  std::vector<uint8_t> all = base.empty() ? std::vector<uint8_t>(rows, 0) : base;
  std::vector<std::vector<uint8_t>> parts(num_parts, std::vector<uint8_t>(rows, evicted));
  for (size_t r = 0; r < rows; ++r) {
    if (all[r] == evicted) continue;
    parts[rng.range(0, num_parts - 1)][r] = all[r];
  }
  return parts;
}

}  // namespace kvsplit::oracle
