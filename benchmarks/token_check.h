// The output check of benchmarks that time two or more configurations on the same requests
// (bench_handoff, bench_temporal --prefix, bench_serving_offline --swap-compare): a mode that
// changed the tokens did different work, so its speed-up is not one. Their requests are greedy
// (temperature 0) with EOS ignored, so every configuration must give every request the same
// tokens; a difference fails the benchmark, naming the first differing request.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kvsplit/engine.h"

namespace kvsplit::bench {

// Per request (by index, in submission order): the token ids it generated.
using Outputs = std::vector<std::vector<int32_t>>;

// Reads `h` to its final event (into *last), appending every event's tokens to *tokens.
// False when no final event came within `timeout` per event.
inline bool drain_tokens(RequestHandle& h, TokenEvent* last, std::vector<int32_t>* tokens,
                         std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
  TokenEvent ev;
  while (h.next(&ev, timeout)) {
    tokens->insert(tokens->end(), ev.token_ids.begin(), ev.token_ids.end());
    if (ev.final) break;
  }
  *last = ev;
  return ev.final;
}

// "yes" when `got` equals `want` request by request, else "NO".
inline const char* same_tokens(const Outputs& want, const Outputs& got) {
  return want == got ? "yes" : "NO";
}

// 0 when `got` (configuration `got_name`) equals `want` (`want_name`) request by request; else
// prints to stderr which request differs first, and where, and returns 1.
inline int check_same_tokens(const char* what, const Outputs& want, const std::string& want_name,
                             const Outputs& got, const std::string& got_name) {
  if (want == got) return 0;
  if (want.size() != got.size()) {
    std::fprintf(stderr, "%s: %zu requests with %s, %zu with %s\n", what, want.size(),
                 want_name.c_str(), got.size(), got_name.c_str());
    return 1;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const std::vector<int32_t>& a = want[i];
    const std::vector<int32_t>& b = got[i];
    if (a == b) continue;
    const size_t k = static_cast<size_t>(
        std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
    std::fprintf(stderr,
                 "%s: the tokens differ: request %zu's token %zu is %s with %s, %s with %s (%zu "
                 "and %zu tokens); the configurations did different work, their timings do not "
                 "compare\n",
                 what, i, k, k < a.size() ? std::to_string(a[k]).c_str() : "(none)",
                 want_name.c_str(), k < b.size() ? std::to_string(b[k]).c_str() : "(none)",
                 got_name.c_str(), a.size(), b.size());
    return 1;
  }
  return 1;
}

}  // namespace kvsplit::bench
