// Self-tests of the CUDA emulation harness: execution model, warp operations, barriers, shared
// memory, asynchronous copies (cp.async), atomics, and bit-exact half / bfloat16 conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/common/async_copy.cuh"
#include "kernels/common/cuda_compat.h"

namespace {

using kvsplit::kernels::launch;

__global__ void block_sum_kernel(const float* in, float* out, int n) {
  __shared__ float partial[1024];
  const int tid = threadIdx.x;
  float acc = 0.f;
  for (int i = blockIdx.x * blockDim.x + tid; i < n; i += blockDim.x * gridDim.x) acc += in[i];
  partial[tid] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (tid < stride) partial[tid] += partial[tid + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = partial[0];
}

TEST(Emulation, BlockReductionWithSharedMemoryAndBarriers) {
  std::vector<float> in(10000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7);
  std::vector<float> out(4, -1.f);
  ASSERT_EQ(launch(block_sum_kernel, dim3(4), dim3(256), 0, nullptr, in.data(), out.data(),
                   static_cast<int>(in.size())),
            cudaSuccess);
  double total = 0;
  for (float v : out) total += v;
  double expect = 0;
  for (float v : in) expect += v;
  EXPECT_EQ(total, expect);
}

__global__ void warp_ops_kernel(int* out) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  int* o = out + threadIdx.x * 8;
  int v = lane + 100 * warp;
  int sum = v;
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  o[0] = sum;
  o[1] = __shfl_sync(0xffffffffu, v, 5);
  o[2] = __shfl_down_sync(0xffffffffu, v, 3);
  o[3] = __shfl_up_sync(0xffffffffu, v, 2);
  o[4] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  o[5] = __any_sync(0xffffffffu, lane == 31 && warp == 1);
  o[6] = __all_sync(0xffffffffu, lane < 32);
  o[7] = __shfl_xor_sync(0xffffffffu, v, 1, 16);  // width 16 segments
}

TEST(Emulation, WarpShufflesAndVotes) {
  std::vector<int> out(64 * 8, -7);
  ASSERT_EQ(launch(warp_ops_kernel, dim3(1), dim3(64), 0, nullptr, out.data()), cudaSuccess);
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32, warp = t / 32;
    const int v = lane + 100 * warp;
    const int* o = out.data() + t * 8;
    EXPECT_EQ(o[0], 496 + 3200 * warp) << t;
    EXPECT_EQ(o[1], 5 + 100 * warp) << t;
    EXPECT_EQ(o[2], lane + 3 < 32 ? v + 3 : v) << t;
    EXPECT_EQ(o[3], lane >= 2 ? v - 2 : v) << t;
    EXPECT_EQ(static_cast<unsigned>(o[4]), ballot) << t;
    EXPECT_EQ(o[5], warp == 1 ? 1 : 0) << t;
    EXPECT_EQ(o[6], 1) << t;
    EXPECT_EQ(o[7], v ^ 1) << t;
  }
}

__global__ void partial_barrier_kernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1;
}

TEST(Emulation, PartialSyncthreadsIsAnError) {
  std::vector<int> out(64, 0);
  EXPECT_EQ(launch(partial_barrier_kernel, dim3(2), dim3(64), 0, nullptr, out.data()),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvsplit::emu::last_error_message().find("__syncthreads() reached by only 16 of 64"),
            std::string::npos)
      << kvsplit::emu::last_error_message();
  // The harness recovers: a good launch afterwards works.
  std::vector<float> in(256, 1.f), sum(1, 0.f);
  ASSERT_EQ(launch(block_sum_kernel, dim3(1), dim3(128), 0, nullptr, in.data(), sum.data(), 256),
            cudaSuccess);
  EXPECT_EQ(sum[0], 256.f);
}

// Two block sums through one shared scratch array; `guarded` puts the barrier before the second
// sum's writes that orders them after the first sum's reads. Without it a warp that runs ahead
// overwrites scratch while others still read the first sum: a race a GPU shows.
__device__ float scratch_block_sum(float v, float* scratch, bool guarded) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (guarded) __syncthreads();  // the previous sum's readers are done
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

__global__ void two_sums_kernel(float* out, bool guarded) {
  __shared__ float scratch[32];
  const float first = scratch_block_sum(1.f, scratch, guarded);
  (void)scratch_block_sum(2.f * static_cast<float>(threadIdx.x), scratch, guarded);
  out[threadIdx.x] = first;
}

// The harness's schedules: in order (the default) warps wait for the whole block at every warp
// operation, which hides the race above; reverse and random orders release a warp as soon as its
// lanes arrive and show it. The guarded kernel is right in every order.
TEST(Emulation, OutOfOrderSchedulesShowARaceInOrderHides) {
  using kvsplit::emu::ScheduleOrder;
  const ScheduleOrder saved = kvsplit::emu::schedule_order();
  auto wrong_outputs = [](ScheduleOrder order, uint64_t seed, bool guarded) {
    kvsplit::emu::set_schedule_order(order, seed);
    std::vector<float> out(256, -1.f);
    EXPECT_EQ(launch(two_sums_kernel, dim3(1), dim3(256), 0, nullptr, out.data(), guarded),
              cudaSuccess);
    int wrong = 0;
    for (float v : out) wrong += v != 256.f;
    return wrong;
  };
  EXPECT_EQ(wrong_outputs(ScheduleOrder::kInOrder, 1, false), 0);  // the blind spot
  EXPECT_GT(wrong_outputs(ScheduleOrder::kReverse, 1, false), 0);
  int random_wrong = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed)
    random_wrong += wrong_outputs(ScheduleOrder::kRandom, seed, false);
  EXPECT_GT(random_wrong, 0);
  for (const ScheduleOrder order :
       {ScheduleOrder::kInOrder, ScheduleOrder::kReverse, ScheduleOrder::kRandom}) {
    for (uint64_t seed = 1; seed <= 4; ++seed)
      EXPECT_EQ(wrong_outputs(order, seed, true), 0) << static_cast<int>(order) << " " << seed;
  }
  kvsplit::emu::set_schedule_order(saved);
}

__global__ void bad_mask_kernel(int* out) {
  // Lanes 0..15 name the full warp but lanes 16..31 never arrive.
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
}

__global__ void excluded_lane_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 0);  // lanes 16..31 are not in the mask
}

__global__ void partial_mask_kernel(int* out) {
  const int lane = threadIdx.x;
  int v = lane;
  if (lane < 16)
    v = __shfl_xor_sync(0x0000ffffu, v, 1);
  else
    v = __shfl_down_sync(0xffff0000u, v, 1, 16);
  out[lane] = v;
}

TEST(Emulation, WarpMaskErrorsAndPartialMasks) {
  std::vector<int> out(32, -1);
  EXPECT_EQ(launch(bad_mask_kernel, dim3(1), dim3(32), 0, nullptr, out.data()),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvsplit::emu::last_error_message().find("deadlock"), std::string::npos);
  EXPECT_EQ(launch(excluded_lane_kernel, dim3(1), dim3(32), 0, nullptr, out.data()),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvsplit::emu::last_error_message().find("excludes"), std::string::npos);
  ASSERT_EQ(launch(partial_mask_kernel, dim3(1), dim3(32), 0, nullptr, out.data()), cudaSuccess);
  for (int l = 0; l < 16; ++l) EXPECT_EQ(out[l], l ^ 1);
  for (int l = 16; l < 32; ++l) EXPECT_EQ(out[l], l == 31 ? 31 : l + 1);
}

__global__ void dynamic_smem_kernel(float* out, int* nan_seen) {
  KVSPLIT_DYNAMIC_SMEM(float, buf);
  const int t = threadIdx.x;
  if (std::isnan(buf[t])) atomicAdd(nan_seen, 1);  // unwritten shared memory reads as NaN
  __syncthreads();
  buf[t] = static_cast<float>(t + blockIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = buf[blockDim.x - 1 - t];
}

TEST(Emulation, DynamicSharedMemoryIsPoisonedPerBlock) {
  std::vector<float> out(3 * 32);
  int nan_seen = 0;
  ASSERT_EQ(launch(dynamic_smem_kernel, dim3(3), dim3(32), 32 * sizeof(float), nullptr, out.data(),
                   &nan_seen),
            cudaSuccess);
  EXPECT_EQ(nan_seen, 3 * 32);
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 32; ++t) EXPECT_EQ(out[b * 32 + t], static_cast<float>(31 - t + b));
}

// Each thread copies 16 bytes per group, two groups. Records what it sees of its own destinations
// before any wait, after wait<1> (oldest group landed) and after wait<0>; then, after a barrier,
// reads the neighbour's data.
__global__ void async_copy_kernel(const int4* src, int* seen) {
  KVSPLIT_DYNAMIC_SMEM(int4, buf);
  const int t = threadIdx.x, n = blockDim.x;
  using kvsplit::kernels::cp_async16;
  cp_async16(&buf[t], &src[t]);
  kvsplit::kernels::cp_async_commit();
  cp_async16(&buf[n + t], &src[n + t]);
  kvsplit::kernels::cp_async_commit();
  int* o = seen + t * 4;
  o[0] = buf[t].x;  // not waited for: still the 0xFF fill
  kvsplit::kernels::cp_async_wait<1>();
  o[1] = buf[t].x * 1000 + (buf[n + t].x == -1 ? 1 : 0);  // first group only
  kvsplit::kernels::cp_async_wait<0>();
  __syncthreads();
  o[2] = buf[n + t].x;
  o[3] = buf[(t + 1) % n].x;  // another thread's copy, visible after wait + barrier
}

__global__ void misaligned_async_copy_kernel(const int* src) {
  KVSPLIT_DYNAMIC_SMEM(unsigned char, buf);
  kvsplit::kernels::cp_async16(buf + 4, src);
}

TEST(Emulation, AsyncCopiesLandOnlyAtTheirWait) {
  const int n = 32;
  std::vector<int4> src(2 * n);
  for (int i = 0; i < 2 * n; ++i) src[i] = int4{i + 1, 0, 0, 0};
  std::vector<int> seen(n * 4, 0);
  ASSERT_EQ(launch(async_copy_kernel, dim3(2), dim3(n), 2 * n * sizeof(int4), nullptr, src.data(),
                   seen.data()),
            cudaSuccess)
      << kvsplit::emu::last_error_message();
  for (int t = 0; t < n; ++t) {
    EXPECT_EQ(seen[t * 4 + 0], -1) << t;
    EXPECT_EQ(seen[t * 4 + 1], (t + 1) * 1000 + 1) << t;
    EXPECT_EQ(seen[t * 4 + 2], n + t + 1) << t;
    EXPECT_EQ(seen[t * 4 + 3], (t + 1) % n + 1) << t;
  }
  alignas(16) int words[8] = {};
  EXPECT_EQ(launch(misaligned_async_copy_kernel, dim3(1), dim3(1), 64, nullptr, words),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvsplit::emu::last_error_message().find("aligned"), std::string::npos)
      << kvsplit::emu::last_error_message();
}

__global__ void atomics_kernel(float* fsum, int* imax, int* count) {
  atomicAdd(fsum, 0.5f);
  atomicMax(imax, static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x));
  atomicAdd(count, 1);
}

TEST(Emulation, AtomicsAcrossBlocksAnd2DIndexing) {
  float fsum = 0.f;
  int imax = -1, count = 0;
  ASSERT_EQ(launch(atomics_kernel, dim3(5), dim3(64), 0, nullptr, &fsum, &imax, &count),
            cudaSuccess);
  EXPECT_EQ(fsum, 160.f);
  EXPECT_EQ(imax, 319);
  EXPECT_EQ(count, 320);
}

__global__ void index_kernel(int* out) {
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

TEST(Emulation, MultiDimensionalGridAndBlock) {
  const dim3 grid(2, 3, 2), block(4, 2, 3);
  std::vector<int> out(12 * 24, -1);
  ASSERT_EQ(launch(index_kernel, grid, block, 0, nullptr, out.data()), cudaSuccess);
  for (int b = 0; b < 12; ++b)
    for (int t = 0; t < 24; ++t) EXPECT_EQ(out[b * 24 + t], b * 1000 + t);
}

TEST(Emulation, LaunchConfigurationErrors) {
  std::vector<int> out(4096);
  EXPECT_EQ(launch(index_kernel, dim3(1), dim3(2048), 0, nullptr, out.data()),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch(index_kernel, dim3(0), dim3(32), 0, nullptr, out.data()),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch(index_kernel, dim3(1), dim3(32), size_t{300} * 1024, nullptr, out.data()),
            cudaErrorInvalidValue);
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(EmulationTypes, HalfKnownValues) {
  EXPECT_EQ(__float2half(1.f).bits, 0x3c00);
  EXPECT_EQ(__float2half(-2.f).bits, 0xc000);
  EXPECT_EQ(__float2half(0.1f).bits, 0x2e66);
  EXPECT_EQ(__float2half(65504.f).bits, 0x7bff);
  EXPECT_EQ(__float2half(65519.f).bits, 0x7bff);
  EXPECT_EQ(__float2half(65520.f).bits, 0x7c00);  // tie rounds up to inf
  EXPECT_EQ(__float2half(std::ldexp(1.f, -24)).bits, 0x0001);
  EXPECT_EQ(__float2half(std::ldexp(1.f, -25)).bits, 0x0000);  // tie to even (0)
  EXPECT_EQ(__float2half(std::ldexp(3.f, -25)).bits, 0x0002);  // 1.5 ulp -> even 2
  EXPECT_EQ(__float2half(std::ldexp(1.f, -14)).bits, 0x0400);  // smallest normal
  EXPECT_EQ(__float2half(-0.f).bits, 0x8000);
  EXPECT_EQ(__float2half(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_EQ(__float2half(std::nanf("")).bits, 0x7fff);
  EXPECT_EQ(__float2half(from_bits(0x3f801000)).bits, 0x3c00);  // 1 + 2^-11: tie -> even
  EXPECT_EQ(__float2half(from_bits(0x3f803000)).bits, 0x3c02);  // 1 + 3*2^-11: tie -> even
  EXPECT_EQ(__half2float(__half{0x0001}), std::ldexp(1.f, -24));
  EXPECT_EQ(__half2float(__half{0x7bff}), 65504.f);
}

TEST(EmulationTypes, BFloat16KnownValues) {
  EXPECT_EQ(__float2bfloat16(1.f).bits, 0x3f80);
  EXPECT_EQ(__float2bfloat16(3.f).bits, 0x4040);
  EXPECT_EQ(__float2bfloat16(0.1f).bits, 0x3dcd);
  EXPECT_EQ(__float2bfloat16(from_bits(0x3f808000)).bits, 0x3f80);  // tie -> even
  EXPECT_EQ(__float2bfloat16(from_bits(0x3f818000)).bits, 0x3f82);  // tie -> even
  EXPECT_EQ(__float2bfloat16(from_bits(0x7f7fffff)).bits, 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(__float2bfloat16(std::nanf("")).bits, 0x7fff);
  EXPECT_EQ(__bfloat162float(__nv_bfloat16{0x4049}), 3.140625f);
}

// Round-to-nearest-even against an fp64 reference: the chosen value is the nearest one, and on a
// tie it has an even significand. Exhaustive for half -> float -> half.
TEST(EmulationTypes, HalfRoundingIsNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = __half2float(__half{static_cast<uint16_t>(h)});
    if (std::isnan(f)) continue;
    ASSERT_EQ(__float2half(f).bits, h) << std::hex << h;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exp_dist(-26.f, 16.5f);
  for (int i = 0; i < 200000; ++i) {
    const float f = std::exp2(exp_dist(rng)) * ((i & 1) ? -1.f : 1.f);
    const uint16_t h = __float2half(f).bits;
    const double v = __half2float(__half{h});
    if (std::isinf(v)) {
      ASSERT_GE(std::fabs(f), 65520.f);
      continue;
    }
    const uint16_t up = static_cast<uint16_t>(h + 1), down = static_cast<uint16_t>(h - 1);
    for (uint16_t n : {up, down}) {
      if ((n & 0x7fff) > 0x7bff || ((h & 0x7fff) == 0 && n == down)) continue;
      const double dn = std::fabs(static_cast<double>(__half2float(__half{n})) - f);
      const double dv = std::fabs(v - f);
      ASSERT_TRUE(dv < dn || (dv == dn && (h & 1) == 0)) << f;
    }
  }
}

TEST(EmulationTypes, BFloat16RoundingIsNearestEven) {
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = rng() & 0xff7fffffu;  // finite
    const float f = from_bits(u);
    const uint16_t b = __float2bfloat16(f).bits;
    const double v = __bfloat162float(__nv_bfloat16{b});
    if (std::isinf(v)) continue;
    const double lo = from_bits(u & 0xffff0000u), hi = from_bits((u & 0xffff0000u) + 0x10000u);
    const double dv = std::fabs(v - f);
    ASSERT_LE(dv, std::min(std::fabs(lo - f), std::fabs(hi - f))) << std::hex << u;
    if (std::fabs(lo - f) == std::fabs(hi - f)) {
      ASSERT_EQ(b & 1, 0) << std::hex << u;
    }
  }
}

}  // namespace
