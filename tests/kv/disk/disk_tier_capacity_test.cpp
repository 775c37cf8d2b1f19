// DiskTier's capacity bound: the extents' bookkeeping is built at open (~9 bytes an extent), so a
// capacity of more than DiskTier::kMaxExtents extents is refused with the largest one that works,
// and a bookkeeping allocation that fails leaves nothing open.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kv/disk_tier.h"
#include "test_util.h"

namespace kvsplit::kv {
namespace {

// --disk-capacity-mb 8388608 with stories260K's extents (24 KiB) made 357M extents: 3.3 GB of
// bookkeeping before the first token, or std::bad_alloc. From 67108864 MiB on, the refusal said
// "holds no whole extent (or too many)".
TEST(DiskTierCapacity, MoreExtentsThanTheCapAreRefusedWithTheLargestCapacityThatWorks) {
  testing::TempDir dir;
  DiskTierConfig c;
  c.path = (dir.path() / "tier").string();
  c.extent_bytes = 4096;
  c.capacity_bytes = (DiskTier::kMaxExtents + 1) * c.extent_bytes;
  auto t = DiskTier::open(c);
  ASSERT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().to_string();
  const std::string& m = t.status().message();
  EXPECT_NE(m.find("kv.disk.capacity_mb"), std::string::npos) << m;
  EXPECT_NE(m.find("--disk-capacity-mb"), std::string::npos) << m;
  EXPECT_NE(m.find("at most 262144 MiB"), std::string::npos) << m;  // 2^26 extents of 4 KiB
  EXPECT_FALSE(std::filesystem::exists(c.path));                    // refused before any file

  c.extent_bytes = 24576;
  for (const int64_t mb : {int64_t{8388608}, int64_t{67108864}, int64_t{1} << 30}) {
    SCOPED_TRACE(mb);
    c.capacity_bytes = mb << 20;
    t = DiskTier::open(c);
    ASSERT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().to_string();
    EXPECT_NE(t.status().message().find("at most 1572864 MiB"), std::string::npos)
        << t.status().message();
  }
  c.capacity_bytes = 100;  // below one extent: its own message
  t = DiskTier::open(c);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("holds no whole extent"), std::string::npos);
  c.capacity_bytes = 16 * c.extent_bytes;
  EXPECT_TRUE(DiskTier::open(c).ok());
}

int open_fds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += !e.path().empty();
  return n;
}

// The process's address space now (VmSize, bytes).
int64_t address_space_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) << 10;
  return -1;
}

// Opens a tier of kMaxExtents extents (~600 MB of bookkeeping) under `path` with the address
// space limited to 128 MiB more than now. 0: kResourceExhausted, no descriptor left open and no
// lock left on the directory (a small tier opens there next).
int open_at_the_cap_without_the_memory(const std::string& path) {
  DiskTierConfig c;
  c.path = path;
  c.extent_bytes = 4096;
  c.capacity_bytes = DiskTier::kMaxExtents * c.extent_bytes;
  const int fds = open_fds();
  const int64_t vm = address_space_bytes();
  const rlimit lim{static_cast<rlim_t>(vm + (int64_t{128} << 20)), RLIM_INFINITY};
  if (vm < 0 || ::setrlimit(RLIMIT_AS, &lim) != 0) return 2;
  auto t = DiskTier::open(c);
  const rlimit none{RLIM_INFINITY, RLIM_INFINITY};
  ::setrlimit(RLIMIT_AS, &none);
  if (t.status().code() != StatusCode::kResourceExhausted) return 3;
  if (open_fds() != fds) return 4;
  c.capacity_bytes = 16 * c.extent_bytes;
  return DiskTier::open(c).ok() ? 0 : 5;
}

// Before, the allocator was built in the constructor, after the files were opened and locked,
// and its std::bad_alloc ended the process.
TEST(DiskTierCapacityDeathTest, NoMemoryForTheBookkeepingLeavesNothingOpen) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "an address-space limit breaks the sanitizers' own allocations";
#endif
  testing::TempDir dir;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = (dir.path() / "tier").string();
  EXPECT_EXIT(std::_Exit(open_at_the_cap_without_the_memory(path)), ::testing::ExitedWithCode(0),
              "");
}

}  // namespace
}  // namespace kvsplit::kv
