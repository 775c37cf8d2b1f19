#include "kvm/profile.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/file_read.h"
#include "common/json_util.h"

namespace kvsplit::kvm {

namespace {

using Json = nlohmann::json;

struct NumField {
  const char* name;
  double EngineProfile::*member;
  bool positive;  // > 0 (else >= 0)
};

constexpr NumField kNumFields[] = {
    {"step_base_ms", &EngineProfile::step_base_ms, false},
    {"prefill_ms_per_token", &EngineProfile::prefill_ms_per_token, false},
    {"prefill_ms_per_kv_token", &EngineProfile::prefill_ms_per_kv_token, false},
    {"decode_ms_per_seq", &EngineProfile::decode_ms_per_seq, false},
    {"decode_ms_per_kv_token", &EngineProfile::decode_ms_per_kv_token, false},
    {"step_overhead_ms", &EngineProfile::step_overhead_ms, false},
    {"kv_bytes_per_token_full", &EngineProfile::kv_bytes_per_token_full, true},
    {"kv_bytes_per_token_int8", &EngineProfile::kv_bytes_per_token_int8, true},
    {"kv_bytes_per_token_int4", &EngineProfile::kv_bytes_per_token_int4, true},
    {"copy_bytes_per_ms", &EngineProfile::copy_bytes_per_ms, true},
};

}  // namespace

EngineProfile default_profile() {
  EngineProfile p;
  p.max_context = 512;  // stories260K
  return p;
}

Status validate(const EngineProfile& p) {
  for (const NumField& f : kNumFields) {
    const double v = p.*f.member;
    if (!std::isfinite(v) || v < 0 || (f.positive && v == 0))
      return invalid_argument(std::string(f.name) + ": must be " + (f.positive ? "> 0" : ">= 0") +
                              ", got " + std::to_string(v));
  }
  if (p.kv_bytes_per_token_int8 > p.kv_bytes_per_token_full)
    return invalid_argument("kv_bytes_per_token_int8: must be <= kv_bytes_per_token_full");
  if (p.kv_bytes_per_token_int4 > p.kv_bytes_per_token_int8)
    return invalid_argument("kv_bytes_per_token_int4: must be <= kv_bytes_per_token_int8");
  if (p.threads < 0) return invalid_argument("threads: must be >= 0");
  if (p.max_context < 0) return invalid_argument("max_context: must be >= 0");
  return ok_status();
}

std::string profile_to_json(const EngineProfile& p) {
  Json j;
  j["model"] = p.model;
  j["backend"] = p.backend;
  j["threads"] = p.threads;
  j["max_context"] = p.max_context;
  for (const NumField& f : kNumFields) j[f.name] = p.*f.member;
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

StatusOr<EngineProfile> parse_profile(std::string_view text, const std::string& what) {
  KVSPLIT_ASSIGN_OR_RETURN(Json j, common::parse_json(text, what));
  if (!j.is_object()) return invalid_argument(what + ": must be a JSON object");
  EngineProfile p;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const Json& v = it.value();
    if (k == "model" || k == "backend") {
      if (!v.is_string()) return invalid_argument(what + ": " + k + ": must be a string");
      (k == "model" ? p.model : p.backend) = v.get<std::string>();
      continue;
    }
    if (k == "threads" || k == "max_context") {
      // Read as 64 bits and range-checked: get<int>() wrapped 4294967306 to 10.
      const bool in_range = v.is_number_integer() && v.get<int64_t>() >= 0 &&
                            v.get<int64_t>() <= std::numeric_limits<int32_t>::max();
      if (!in_range) {
        return invalid_argument(what + ": " + k + ": must be an integer in [0, 2147483647], got " +
                                v.dump());
      }
      (k == "threads" ? p.threads : p.max_context) = static_cast<int>(v.get<int64_t>());
      continue;
    }
    const NumField* f = nullptr;
    for (const NumField& n : kNumFields) {
      if (k == n.name) f = &n;
    }
    if (!f) return invalid_argument(what + ": " + k + ": unknown field");
    if (!v.is_number()) return invalid_argument(what + ": " + k + ": must be a number");
    p.*f->member = v.get<double>();
  }
  if (Status st = validate(p); !st.ok()) return st.with_prefix(what);
  return p;
}

StatusOr<EngineProfile> read_profile_file(const std::string& path) {
  KVSPLIT_ASSIGN_OR_RETURN(std::string text,
                           common::read_regular_file(path, 1 << 20, "profile file"));
  return parse_profile(text, path);
}

Status write_profile_file(const std::string& path, const EngineProfile& p) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) return not_found(path + ": cannot open the profile file for writing");
  f << profile_to_json(p);
  f.close();
  if (!f) return internal_error(path + ": writing the profile file failed");
  return ok_status();
}

}  // namespace kvsplit::kvm
