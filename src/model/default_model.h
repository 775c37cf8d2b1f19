// The default model of the command-line tools: the first of $KVSPLIT_MODELS, ./models and
// ../shared/models that holds stories260K, else the synthetic stand-in (said plainly).
#pragma once

#include <string>

namespace kvsplit::model {

struct DefaultModel {
  std::string model;      // path to stories260K.bin, or "synthetic:stories260k"
  std::string tokenizer;  // tok512.bin beside it, or empty
  std::string note;       // one line for the user saying what was chosen and why
  bool synthetic = false;
};

DefaultModel resolve_default_model();

}  // namespace kvsplit::model
