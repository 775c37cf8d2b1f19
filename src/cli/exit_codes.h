// The exit-code rule of every `kvsplit` subcommand (README "Exit codes"): 0 success; 2 bad input,
// i.e. the fault is in what the user gave (flags, files, prompts, texts) or the input asks for
// something unsupported; 1 an internal failure (a bug, the machine or the device).
#pragma once

#include "kvsplit/status.h"

namespace kvsplit::cli {

inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInternal = 1;

inline int exit_code_for(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kPermissionDenied:
    case StatusCode::kUnimplemented:
    case StatusCode::kOutOfRange:
    case StatusCode::kDataLoss:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAlreadyExists:
      return kExitBadInput;
    default:
      return kExitInternal;
  }
}

}  // namespace kvsplit::cli
