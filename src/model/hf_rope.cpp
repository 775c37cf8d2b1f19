// The RoPE fields of a HF config.json in both forms (see hf_config.h, docs/models.md).
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "common/log.h"
#include "model/hf_config.h"

namespace kvsplit::model {

namespace {

using common::Json;

constexpr const char* kSupportedRopeTypes = "default, linear, dynamic, llama3, yarn";

// One RoPE value and the config.json path it was read from, e.g. "rope_scaling.factor".
struct Field {
  std::string path;
  Json value;
};

// Canonical key -> value, merged over both forms ("type" is the older spelling of "rope_type").
// A null value counts as absent, as in HF, except yarn's `truncate`: HF reads it with
// `get("truncate", True)` and tests it for truth, so an explicit null means false.
using Fields = std::map<std::string, Field>;

bool same_value(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// Adds `path` = `v` under `key`; a value already there from another field must be the same.
Status add_field(const std::string& what, const std::string& key, const std::string& path,
                 const Json& v, Fields* fields) {
  if (v.is_null() && key != "truncate") return ok_status();
  const Json value = v.is_null() ? Json(false) : v;
  auto [it, inserted] = fields->emplace(key, Field{path, value});
  if (!inserted && !same_value(it->second.value, value)) {
    return invalid_argument(what + ": " + it->second.path + " = " + it->second.value.dump() +
                            " disagrees with " + path + " = " + v.dump());
  }
  return ok_status();
}

Status add_dict(const std::string& what, const Json& dict, const std::string& prefix,
                Fields* fields) {
  for (auto it = dict.begin(); it != dict.end(); ++it) {
    const std::string key = it.key() == "type" ? "rope_type" : it.key();
    KVSPLIT_RETURN_IF_ERROR(add_field(what, key, prefix + "." + it.key(), it.value(), fields));
  }
  return ok_status();
}

// `rope_parameters` (or the legacy `rope_scaling`, `name`) keyed by layer type ({"full_attention":
// {...}, ...}): every layer type the model uses needs an entry, and they must all be the same (one
// RoPE for all layers runs here). Entries for layer types the model does not use are ignored. Adds
// the chosen entry's fields.
Status add_per_layer_type(const std::string& what, const std::string& name, const Json& rp,
                          const std::vector<std::string>& layer_types, Fields* fields) {
  for (auto it = rp.begin(); it != rp.end(); ++it) {
    if (!it->is_object() && !it->is_null()) {
      return invalid_argument(what + ": " + name + " mixes per-layer-type entries with the " +
                              "plain field '" + it.key() + "'");
    }
  }
  const Json* chosen = nullptr;
  std::string chosen_type;
  for (const std::string& t : std::set<std::string>(layer_types.begin(), layer_types.end())) {
    auto e = rp.find(t);
    if (e == rp.end()) {
      return invalid_argument(what + ": " + name + " is keyed by layer type but has no entry " +
                              "for '" + t + "', which this model's layers use");
    }
    if (e->is_null()) {
      return unimplemented(what + ": " + name + "." + t +
                           " = null (layers without RoPE) is not supported");
    }
    if (chosen == nullptr) {
      chosen = &*e;
      chosen_type = t;
    } else if (*chosen != *e) {
      return unimplemented(what + ": " + name + "." + chosen_type + " = " + chosen->dump() +
                           " and " + name + "." + t + " = " + e->dump() +
                           " differ: one RoPE for all layers is supported");
    }
  }
  if (chosen == nullptr) return ok_status();
  return add_dict(what, *chosen, name + "." + chosen_type, fields);
}

// A RoPE dict: plain fields, or entries keyed by layer type (any value an object).
Status add_rope_dict(const std::string& what, const std::string& name, const Json& dict,
                     const std::vector<std::string>& layer_types, Fields* fields) {
  bool per_layer_type = false;
  for (const auto& v : dict) per_layer_type = per_layer_type || v.is_object();
  return per_layer_type ? add_per_layer_type(what, name, dict, layer_types, fields)
                        : add_dict(what, dict, name, fields);
}

// Typed reads from the merged fields; errors name the config.json path.
class RopeFields {
 public:
  RopeFields(const std::string& what, Fields fields, std::string prefix)
      : what_(what), fields_(std::move(fields)), prefix_(std::move(prefix)) {}

  const Field* find(const std::string& key) const {
    auto it = fields_.find(key);
    return it == fields_.end() ? nullptr : &it->second;
  }

  // Absent: `fallback`, or "missing field <prefix>.<key>" when there is none.
  StatusOr<double> number(const std::string& key, std::optional<double> fallback) const {
    const Field* f = find(key);
    if (f == nullptr) {
      if (fallback) return *fallback;
      return invalid_argument(what_ + ": missing field " + prefix_ + "." + key);
    }
    if (!f->value.is_number()) {
      return invalid_argument(what_ + ": " + f->path + " must be a number, got " + f->value.dump());
    }
    return f->value.get<double>();
  }

  // A positive integer (an integral float such as 8192.0 is accepted).
  StatusOr<int> positive_int(const std::string& key, int fallback) const {
    const Field* f = find(key);
    if (f == nullptr) return fallback;
    const double v = f->value.is_number() ? f->value.get<double>() : NAN;
    if (!(v >= 1 && v <= INT32_MAX && v == std::floor(v))) {
      return invalid_argument(what_ + ": " + f->path + " must be a positive integer, got " +
                              f->value.dump());
    }
    return static_cast<int>(v);
  }

  StatusOr<bool> boolean(const std::string& key, bool fallback) const {
    const Field* f = find(key);
    if (f == nullptr) return fallback;
    if (!f->value.is_boolean()) {
      return invalid_argument(what_ + ": " + f->path + " must be true or false, got " +
                              f->value.dump());
    }
    return f->value.get<bool>();
  }

 private:
  std::string what_;
  Fields fields_;
  std::string prefix_;
};

Status parse_scaling(const RopeFields& f, RopeType type, int max_position_embeddings,
                     RopeScaling* s) {
  s->type = type;
  if (type == RopeType::kYarn) {
    // HF: a missing factor is the ratio of the context lengths (DeepSeek-V3 configs).
    KVSPLIT_ASSIGN_OR_RETURN(
        s->original_max_position_embeddings,
        f.positive_int("original_max_position_embeddings", max_position_embeddings));
    KVSPLIT_ASSIGN_OR_RETURN(s->factor,
                             f.number("factor", static_cast<double>(max_position_embeddings) /
                                                    s->original_max_position_embeddings));
    KVSPLIT_ASSIGN_OR_RETURN(s->beta_fast, f.number("beta_fast", 32.0));
    KVSPLIT_ASSIGN_OR_RETURN(s->beta_slow, f.number("beta_slow", 1.0));
    KVSPLIT_ASSIGN_OR_RETURN(s->mscale, f.number("mscale", 0.0));
    KVSPLIT_ASSIGN_OR_RETURN(s->mscale_all_dim, f.number("mscale_all_dim", 0.0));
    if (f.find("attention_factor") != nullptr) {
      KVSPLIT_ASSIGN_OR_RETURN(s->attention_factor, f.number("attention_factor", std::nullopt));
    }
    KVSPLIT_ASSIGN_OR_RETURN(s->truncate, f.boolean("truncate", true));
    return ok_status();
  }
  KVSPLIT_ASSIGN_OR_RETURN(s->factor, f.number("factor", std::nullopt));
  if (type == RopeType::kDynamic) {
    // HF grows the base past config.max_position_embeddings (there is no separate field).
    s->original_max_position_embeddings = max_position_embeddings;
  } else if (type == RopeType::kLlama3) {
    KVSPLIT_ASSIGN_OR_RETURN(s->low_freq_factor, f.number("low_freq_factor", std::nullopt));
    KVSPLIT_ASSIGN_OR_RETURN(s->high_freq_factor, f.number("high_freq_factor", std::nullopt));
    KVSPLIT_ASSIGN_OR_RETURN(
        s->original_max_position_embeddings,
        f.positive_int("original_max_position_embeddings", max_position_embeddings));
  }
  return ok_status();
}

// The context length a scaled RoPE runs at (docs/models.md, "Context length"): linear extends
// max_position_embeddings by the factor, YaRN extends its original length by the factor (at least
// max_position_embeddings); llama3 and dynamic keep max_position_embeddings.
double scaled_context(const RopeScaling& s, int max_position_embeddings) {
  switch (s.type) {
    case RopeType::kLinear:
      return std::floor(max_position_embeddings * s.factor);
    case RopeType::kYarn:
      return std::max<double>(max_position_embeddings,
                              std::floor(s.original_max_position_embeddings * s.factor));
    case RopeType::kDynamic:
    case RopeType::kLlama3:
      break;
  }
  return max_position_embeddings;
}

}  // namespace

Status parse_hf_rope(const Json& j, const std::string& what,
                     const std::vector<std::string>& layer_types, ModelConfig* c) {
  Fields fields;
  auto rp = j.find("rope_parameters");
  if (rp != j.end() && !rp->is_null()) {
    if (!rp->is_object()) {
      return invalid_argument(what + ": 'rope_parameters' must be an object or null, got " +
                              rp->dump());
    }
    KVSPLIT_RETURN_IF_ERROR(add_rope_dict(what, "rope_parameters", *rp, layer_types, &fields));
  }
  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) {
      return invalid_argument(what + ": 'rope_scaling' must be an object or null, got " +
                              rs->dump());
    }
    // transformers reads a legacy rope_scaling as rope_parameters, per layer type included.
    KVSPLIT_RETURN_IF_ERROR(add_rope_dict(what, "rope_scaling", *rs, layer_types, &fields));
  }
  for (const char* key :
       {"rope_theta", "partial_rotary_factor", "original_max_position_embeddings"}) {
    auto it = j.find(key);
    if (it != j.end()) KVSPLIT_RETURN_IF_ERROR(add_field(what, key, key, *it, &fields));
  }

  // Missing fields are named after the dict that gives the type.
  std::string prefix = "rope_parameters";
  std::string type = "default";
  auto t = fields.find("rope_type");
  if (t != fields.end()) {
    if (!t->second.value.is_string()) {
      return invalid_argument(what + ": " + t->second.path + " must be a string, got " +
                              t->second.value.dump());
    }
    type = t->second.value.get<std::string>();
    prefix = t->second.path.substr(0, t->second.path.rfind('.'));
  }
  const RopeFields f(what, std::move(fields), prefix);

  KVSPLIT_ASSIGN_OR_RETURN(double theta, f.number("rope_theta", 10000.0));
  KVSPLIT_ASSIGN_OR_RETURN(
      c->rope_theta,
      common::to_float_field(
          theta, f.find("rope_theta") ? f.find("rope_theta")->path : "rope_theta", what));
  KVSPLIT_ASSIGN_OR_RETURN(double partial, f.number("partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    return unimplemented(what + ": " + f.find("partial_rotary_factor")->path + " = " +
                         f.find("partial_rotary_factor")->value.dump() +
                         ": partial rotary embedding is not supported (1.0 only)");
  }

  static const std::map<std::string, RopeType> kTypes = {{"linear", RopeType::kLinear},
                                                         {"dynamic", RopeType::kDynamic},
                                                         {"llama3", RopeType::kLlama3},
                                                         {"yarn", RopeType::kYarn}};
  c->rope_scaling.reset();
  if (type == "default") return ok_status();
  auto kt = kTypes.find(type);
  if (kt == kTypes.end()) {
    return unimplemented(what + ": " + f.find("rope_type")->path + " = '" + type +
                         "' is not supported (supported: " + kSupportedRopeTypes + ")");
  }
  RopeScaling s;
  const int max_position_embeddings = c->max_seq_len;
  KVSPLIT_RETURN_IF_ERROR(parse_scaling(f, kt->second, max_position_embeddings, &s));
  c->rope_scaling = s;
  KVSPLIT_RETURN_IF_ERROR(validate_rope_scaling(*c, what));
  const double ctx = scaled_context(s, max_position_embeddings);
  if (ctx > kMaxContextLength) {
    char factor[32];
    std::snprintf(factor, sizeof(factor), "%.10g", s.factor);
    return invalid_argument(what + ": rope " + type + " factor " + factor + " gives a context of " +
                            std::to_string(static_cast<int64_t>(ctx)) + " positions, more than " +
                            std::to_string(kMaxContextLength));
  }
  if (ctx != max_position_embeddings) {
    KVSPLIT_LOG_INFO("{}: rope {} factor {}: context {} (max_position_embeddings {})", what, type,
                     s.factor, static_cast<int64_t>(ctx), max_position_embeddings);
  }
  c->max_seq_len = static_cast<int>(ctx);
  return ok_status();
}

}  // namespace kvsplit::model
