// The exit-code rule of every `kvsplit` subcommand (README "Exit codes"): 0 success; 2 bad input,
// i.e. the fault is in what the user gave (flags, files, prompts, texts) or the input asks for
// something unsupported; 1 an internal failure (a bug, the machine or the device).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

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

// Flushes stdout (std::cout and <cstdio> write through the one stdio stream) and says whether
// every write to it arrived: kInternal (exit 1) naming the error when one failed (a full disk, a
// closed descriptor), else OK. A subcommand whose output was lost never exits 0.
inline Status flush_stdout() {
  errno = 0;
  std::cout.flush();
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (std::cout && flushed && !std::ferror(stdout)) return ok_status();
  return internal_error(std::string("writing the output to stdout failed") +
                        (err != 0 ? std::string(": ") + std::strerror(err) : std::string()));
}

}  // namespace kvsplit::cli
