// A burst of long greedy requests submitted at once, and the engine's occupancy while they run:
// the capacity benchmarks (bench_serving_offline --capacity / --swap-compare, bench_window).
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "kvsplit/engine.h"

namespace kvsplit::bench {

// Submits `seqs` greedy requests at once: prompts of `prompt` token ids drawn from `seed`
// (3 .. vocab - 1), `output` tokens each with EOS ignored. Appends their handles to *handles.
inline Status submit_burst(Engine& engine, int seqs, int prompt, int output, uint64_t seed,
                           std::vector<RequestHandle>* handles) {
  std::mt19937_64 rng(seed);
  const int vocab = engine.model_info().vocab_size;
  for (int i = 0; i < seqs; ++i) {
    Request r;
    r.prompt_token_ids.resize(prompt);
    for (int32_t& id : r.prompt_token_ids) id = 3 + static_cast<int32_t>(rng() % (vocab - 3));
    r.sampling.max_tokens = output;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = 0;
    auto h = engine.submit(r);
    if (!h.ok()) return h.status();
    handles->push_back(*h);
  }
  return ok_status();
}

// Polls the engine until `seqs` requests have finished or failed. Returns the mean number of
// sequences running, sampled every 2 ms until the first finish (the steady state).
inline double mean_running_until_done(const Engine& engine, int seqs) {
  double sum = 0;
  int64_t samples = 0;
  for (;;) {
    const EngineStats st = engine.stats();
    if (st.requests_finished + st.requests_failed >= seqs) break;
    if (st.requests_finished == 0) {
      sum += st.num_running;
      ++samples;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return samples > 0 ? sum / static_cast<double>(samples) : 0;
}

}  // namespace kvsplit::bench
