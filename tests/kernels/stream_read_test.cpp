// The read-bandwidth probe of bench_attention (kernels/bench/stream_read.cu) under the emulation
// harness: its argument checks, and one read of an aligned buffer. Emulated only: gpu_tests does
// not link the benchmark kernels.
#include "kernels/bench/stream_read.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernel_test_util.h"

namespace kvsplit::testing {
namespace {

TEST(StreamRead, ReadsAnAlignedBufferAndRefusesAMisalignedOne) {
  constexpr size_t kBytes = 4096;
  DevArray<uint8_t> data(kBytes + 16);  // 64-byte aligned (dev_alloc); room for an offset read
  DevArray<unsigned> sink(1);
  ASSERT_TRUE(kernels::launch_stream_read(data.get(), kBytes, sink.get(), 1, nullptr).ok());
  EXPECT_EQ(device_sync(), "");
  // 16-byte loads: on a GPU a misaligned one is a sticky error, so the launcher refuses it.
  for (int off : {1, 4, 8}) {
    const Status st = kernels::launch_stream_read(data.get() + off, kBytes, sink.get(), 1, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << off << ": " << st.to_string();
    EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.to_string();
  }
  EXPECT_EQ(kernels::launch_stream_read(data.get(), 24, sink.get(), 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::launch_stream_read(data.get(), kBytes, nullptr, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvsplit::testing
