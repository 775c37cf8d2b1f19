// An engine cost profile for the policy simulator (docs/kvm.md, "Policy simulator"): what one
// engine step costs on this machine, fitted by `bench_engine --write-profile FILE` from short
// runs of the real forward pass, and the KV bytes per token at each precision. JSON on disk.
#pragma once

#include <string>
#include <string_view>

#include "kvsplit/status.h"

namespace kvsplit::kvm {

struct EngineProfile {
  std::string model = "synthetic:stories260k";  // what it was measured on (informational)
  std::string backend = "cpu";
  int threads = 1;  // CPU threads per worker during the measurement
  // The model's context in tokens: the simulator fits a trace's lengths to it as
  // bench_serving_offline does (prompt <= context - 1, prompt + output <= context). 0: unknown
  // (profiles written before the field existed), lengths kept.
  int max_context = 0;
  // A step with p prompt (prefill) tokens attending a KV tokens in all (a chunk of n tokens after
  // k cached ones attends n * (k + n / 2)), and d decoding sequences attending k KV tokens in all:
  //   step_ms = step_base_ms + step_overhead_ms + p * prefill_ms_per_token
  //             + a * prefill_ms_per_kv_token + d * decode_ms_per_seq + k * decode_ms_per_kv_token
  double step_base_ms = 0.015;
  double prefill_ms_per_token = 0.008;
  double prefill_ms_per_kv_token = 0.0005;
  double decode_ms_per_seq = 0.012;
  double decode_ms_per_kv_token = 0.0006;
  // The engine's fixed cost per step beyond its forward pass: sampling, token events, scheduling,
  // the worker loop's wake-ups. bench_engine measures it on a short run of the real engine (its
  // wall time less the time the simulator predicts for the same run, per step). Profiles written
  // before it existed lack the field (0) and hold their per-step overhead in step_base_ms.
  double step_overhead_ms = 0;
  // KV bytes per token (all layers, K and V) at each rung of the semantic cut's ladder.
  double kv_bytes_per_token_full = 1280;
  double kv_bytes_per_token_int8 = 400;
  double kv_bytes_per_token_int4 = 280;
  // Host <-> device copies (swap out / in, KV handoff): bytes per millisecond.
  double copy_bytes_per_ms = 4e6;

  double step_ms(double prefill_tokens, double prefill_attended, double decode_seqs,
                 double kv_tokens) const {
    return step_base_ms + step_overhead_ms + prefill_tokens * prefill_ms_per_token +
           prefill_attended * prefill_ms_per_kv_token + decode_seqs * decode_ms_per_seq +
           kv_tokens * decode_ms_per_kv_token;
  }
};

// The built-in profile (stories260K on one CPU thread of the development machine); the simulator
// says on stderr when it falls back to it.
EngineProfile default_profile();

// Every cost >= 0, bytes per token > 0 with int4 <= int8 <= full, copy bandwidth > 0; errors
// name the field.
Status validate(const EngineProfile& p);
std::string profile_to_json(const EngineProfile& p);  // one JSON object, indented
// Errors (kInvalidArgument) name the source and the field; unknown fields are errors; absent ones
// keep the defaults.
StatusOr<EngineProfile> parse_profile(std::string_view text, const std::string& what = "profile");
StatusOr<EngineProfile> read_profile_file(const std::string& path);
Status write_profile_file(const std::string& path, const EngineProfile& p);

}  // namespace kvsplit::kvm
