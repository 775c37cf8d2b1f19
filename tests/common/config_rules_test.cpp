// The one set of SLA-class and block-size rules (the YAML loader and the Engine both use it).
#include "common/config_rules.h"

#include <gtest/gtest.h>

namespace kvsplit {
namespace {

TEST(ConfigRules, SlaClassesNameTheField) {
  std::vector<SlaClass> classes(2);
  classes[1].name = "x";
  classes[1].max_itl_ms = 0;
  Status st = validate_sla_classes(classes);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "sla_classes.x.max_itl_ms: must be > 0, got 0");
  classes[1].max_itl_ms = 10;
  classes[1].priority = 2147483647;
  EXPECT_EQ(validate_sla_classes(classes).message(),
            "sla_classes.x.priority: must be in [-1000, 1000], got 2147483647");
  classes[1].priority = 0;
  EXPECT_TRUE(validate_sla_classes(classes).ok());
  classes[1].name = "default";
  EXPECT_EQ(validate_sla_classes(classes).message(), "sla_classes.default: duplicate class name");
  classes[1].name = "bad\x1b[1m";
  EXPECT_EQ(validate_sla_classes(classes).message(),
            "sla_classes.bad\\x1b[1m: class names are 1..64 characters of [A-Za-z0-9_.-]");
  EXPECT_FALSE(validate_sla_classes({}).ok());
}

TEST(ConfigRules, BlockSizes) {
  for (int b : {8, 16, 32, 64}) EXPECT_TRUE(validate_block_size(b, "kv.block_size").ok());
  EXPECT_EQ(validate_block_size(12, "kv.block_size").message(),
            "kv.block_size: must be one of 8, 16, 32, 64, got 12");
}

}  // namespace
}  // namespace kvsplit
