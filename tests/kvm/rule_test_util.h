// Builders of the rule-engine tests (rule_engine_test.cpp, rule_engine_retry_test.cpp).
#pragma once

#include "kvsplit/kvm.h"

namespace kvsplit::kvm {

// A snapshot at `t_ms` with the given device_kv_use.
inline KvmSnapshot use_at(double t_ms, double device_kv_use) {
  KvmSnapshot s;
  s.time_ms = t_ms;
  s.device_kv_use = device_kv_use;
  return s;
}

}  // namespace kvsplit::kvm
