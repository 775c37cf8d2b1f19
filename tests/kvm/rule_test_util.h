// Builders of the rule-engine tests (rule_engine_test.cpp, rule_engine_retry_test.cpp,
// validate_rules_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kvm/expr.h"
#include "kvsplit/kvm.h"

namespace kvsplit::kvm {

// A snapshot at `t_ms` with the given device_kv_use.
inline KvmSnapshot use_at(double t_ms, double device_kv_use) {
  KvmSnapshot s;
  s.time_ms = t_ms;
  s.device_kv_use = device_kv_use;
  return s;
}

// A rule from its texts (parse_condition / parse_action).
inline KvmRule rule(const std::string& name, const std::string& when, const std::string& exit,
                    const std::string& then, double cooldown_ms = 1000) {
  KvmRule r;
  r.name = name;
  auto w = parse_condition(when);
  auto e = parse_condition(exit);
  auto a = parse_action(then);
  EXPECT_TRUE(w.ok() && e.ok() && a.ok()) << when << " / " << exit << " / " << then;
  if (w.ok()) r.when = *w;
  if (e.ok()) r.exit = *e;
  if (a.ok()) r.then = *a;
  r.cooldown_ms = cooldown_ms;
  return r;
}

// The design's example rule.
inline KvmRule hot_rule() {
  KvmRule r = rule("hot", "device_kv_use > 0.90", "device_kv_use < 0.80",
                   "semantic_threshold += 0.05", 2000);
  r.max = 0.4;
  return r;
}

}  // namespace kvsplit::kvm
