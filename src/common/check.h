// KVSPLIT_CHECK: aborts on programmer errors (broken invariants). Never use it for input.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace kvsplit::detail {
[[noreturn]] inline void check_failed(const char* expr, const char* file, int line,
                                      const char* msg) {
  std::fprintf(stderr, "KVSPLIT_CHECK failed: %s at %s:%d %s\n", expr, file, line, msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}
}  // namespace kvsplit::detail

#define KVSPLIT_CHECK(cond)                                                           \
  do {                                                                                \
    if (!(cond)) ::kvsplit::detail::check_failed(#cond, __FILE__, __LINE__, nullptr); \
  } while (0)

#define KVSPLIT_CHECK_MSG(cond, msg)                                              \
  do {                                                                            \
    if (!(cond)) ::kvsplit::detail::check_failed(#cond, __FILE__, __LINE__, msg); \
  } while (0)
