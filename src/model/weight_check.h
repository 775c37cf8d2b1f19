// Load-time check that every weight is finite: a checkpoint with NaN or Inf weights loads and
// produces garbage (or empty text) otherwise. One pass over the weight bytes, memory-bandwidth
// bound (docs/models.md gives the measured rate).
#pragma once

#include <cstdint>
#include <string>

#include "kvsplit/status.h"
#include "model/weights.h"

namespace kvsplit::model {

struct WeightCheckStats {
  int64_t tensors = 0;  // distinct tensors scanned (an alias such as a tied LM head counts once)
  uint64_t bytes = 0;   // bytes scanned
};

// Number of NaN or +-Inf elements among `numel` elements of `dtype` at `data`.
int64_t count_non_finite(const void* data, backend::DType dtype, int64_t numel);

// kInvalidArgument "<source>: tensor <name> has <n> non-finite values (first at element <i>:
// <value>)" for the first tensor holding any; `stats` (optional) gets what was scanned.
Status check_weights_finite(const ModelWeights& weights, const std::string& source,
                            WeightCheckStats* stats = nullptr);

}  // namespace kvsplit::model
