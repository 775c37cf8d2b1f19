#include "common/config_rules.h"

#include <cmath>
#include <set>
#include <sstream>
#include <string>

#include "common/escape.h"

namespace kvsplit {
namespace {

std::string real(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

Status check_positive(const std::string& field, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    return invalid_argument(field + ": must be > 0, got " + real(v));
  }
  return ok_status();
}

Status check_range(const std::string& field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return invalid_argument(field + ": must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got " + std::to_string(v));
  }
  return ok_status();
}

bool valid_class_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Status validate_sla_classes(const std::vector<SlaClass>& classes) {
  if (classes.empty()) return invalid_argument("sla_classes: at least one class is required");
  std::set<std::string> names;
  for (const SlaClass& c : classes) {
    if (!valid_class_name(c.name)) {
      return invalid_argument("sla_classes." + escape_for_message(c.name, 64) +
                              ": class names are 1..64 characters of [A-Za-z0-9_.-]");
    }
    if (!names.insert(c.name).second) {
      return invalid_argument("sla_classes." + c.name + ": duplicate class name");
    }
    const std::string p = "sla_classes." + c.name + ".";
    KVSPLIT_RETURN_IF_ERROR(check_positive(p + "max_ttft_ms", c.max_ttft_ms));
    KVSPLIT_RETURN_IF_ERROR(check_positive(p + "max_itl_ms", c.max_itl_ms));
    KVSPLIT_RETURN_IF_ERROR(check_range(p + "priority", c.priority, -1000, 1000));
    KVSPLIT_RETURN_IF_ERROR(check_range(p + "max_queue", c.max_queue, 1, 1000000));
    KVSPLIT_RETURN_IF_ERROR(check_positive(p + "queue_timeout_ms", c.queue_timeout_ms));
  }
  return ok_status();
}

Status validate_block_size(int32_t block_size, std::string_view field) {
  if (block_size != 8 && block_size != 16 && block_size != 32 && block_size != 64) {
    return invalid_argument(std::string(field) + ": must be one of 8, 16, 32, 64, got " +
                            std::to_string(block_size));
  }
  return ok_status();
}

}  // namespace kvsplit
