// BlockIo: both backends pass the same tests (io_uring ones skip where it cannot run).
#include "kv/block_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kv/checksum.h"
#include "test_util.h"

namespace kvsplit::kv {
namespace {

std::unique_ptr<BlockIo> make_or_skip(IoBackend b) {
  StatusOr<std::unique_ptr<BlockIo>> io = BlockIo::create(IoOptions{b, 8, 2});
  if (!io.ok()) return nullptr;
  EXPECT_EQ(io.value()->backend(), b);
  return std::move(io).value();
}

class BlockIoTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    io_ = make_or_skip(GetParam());
    if (!io_) GTEST_SKIP() << "io_uring unavailable here";
    fd_ = ::open(dir_.file("f").c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    io_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  testing::TempDir dir_;
  std::unique_ptr<BlockIo> io_;
  int fd_ = -1;
};

TEST_P(BlockIoTest, VectoredWriteThenReadBack) {
  std::vector<char> a(5000), b(70000);
  std::iota(a.begin(), a.end(), 1);
  std::iota(b.begin(), b.end(), 7);
  IoRequest w{IoOp::kWrite, fd_, 4096, {{a.data(), a.size()}, {b.data(), b.size()}}};
  auto cw = io_->submit(w);
  const IoResult rw = cw->wait();
  EXPECT_TRUE(cw->done());
  EXPECT_EQ(rw.error, 0);
  EXPECT_EQ(rw.bytes, 75000);
  EXPECT_EQ(cw->requested(), 75000);

  std::vector<char> back(75000, 0);  // one buffer for both halves
  auto cr = io_->submit(IoRequest{IoOp::kRead, fd_, 4096, {{back.data(), back.size()}}});
  const IoResult rr = cr->wait();
  EXPECT_EQ(rr.error, 0);
  EXPECT_EQ(rr.bytes, 75000);
  EXPECT_EQ(std::memcmp(back.data(), a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(back.data() + a.size(), b.data(), b.size()), 0);
}

TEST_P(BlockIoTest, ReadPastTheEndIsShort) {
  std::vector<char> a(1000, 'x');
  ASSERT_EQ(io_->submit(IoRequest{IoOp::kWrite, fd_, 0, {{a.data(), a.size()}}})->wait().bytes,
            1000);
  std::vector<char> back(3000);
  const IoResult r =
      io_->submit(IoRequest{IoOp::kRead, fd_, 500, {{back.data(), back.size()}}})->wait();
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.bytes, 500);
}

// A read the kernel serves in part (procfs' seq_files give about a page per call) goes on with the
// rest instead of ending short: a short read is a fault to the disk tier (recompute), which a
// partial transfer of a record that is all there is not.
TEST_P(BlockIoTest, APartialReadGoesOnWithTheRest) {
  const int fd = ::open("/proc/self/smaps", O_RDONLY);
  if (fd < 0) GTEST_SKIP() << "no /proc/self/smaps";
  std::vector<char> probe(1 << 20);
  const ssize_t first = ::pread(fd, probe.data(), probe.size(), 0);
  if (first <= 0 || first >= 16384) {
    ::close(fd);
    GTEST_SKIP() << "/proc/self/smaps served " << first << " bytes at once: nothing partial";
  }
  int64_t size = 0;  // the whole file, read piece by piece
  for (ssize_t n; (n = ::pread(fd, probe.data(), probe.size(), size)) > 0;) size += n;
  if (size < 2 * 16384) {
    ::close(fd);
    GTEST_SKIP() << "/proc/self/smaps holds " << size << " bytes, too few to read in parts";
  }
  std::vector<char> back(16384, 0);  // well inside the file, several of its pieces
  const IoResult r =
      io_->submit(IoRequest{IoOp::kRead, fd, 0, {{back.data(), 5000}, {back.data() + 5000, 11384}}})
          ->wait();
  ::close(fd);
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.bytes, 16384);
}

TEST_P(BlockIoTest, BadDescriptorReportsErrno) {
  char c = 0;
  const IoResult r = io_->submit(IoRequest{IoOp::kRead, -1, 0, {{&c, 1}}})->wait();
  EXPECT_EQ(r.error, EBADF);
  EXPECT_EQ(r.bytes, 0);
}

TEST_P(BlockIoTest, ManyRequestsInFlightAllComplete) {
  // More requests than the io_uring queue (8) and its in-flight cap (16) hold at once.
  constexpr int kN = 100;
  std::vector<std::vector<uint32_t>> bufs(kN, std::vector<uint32_t>(1024));
  std::vector<std::shared_ptr<IoCompletion>> cs;
  for (int i = 0; i < kN; ++i) {
    std::fill(bufs[i].begin(), bufs[i].end(), static_cast<uint32_t>(i * 31 + 5));
    cs.push_back(
        io_->submit(IoRequest{IoOp::kWrite, fd_, int64_t{i} * 4096, {{bufs[i].data(), 4096}}}));
  }
  for (auto& c : cs) EXPECT_EQ(c->wait().bytes, 4096);
  std::vector<uint32_t> back(1024);
  for (int i = 0; i < kN; i += 17) {
    ASSERT_EQ(io_->submit(IoRequest{IoOp::kRead, fd_, int64_t{i} * 4096, {{back.data(), 4096}}})
                  ->wait()
                  .bytes,
              4096);
    EXPECT_EQ(back, bufs[i]);
  }
}

// A submission the kernel refuses as transient (io_uring_enter: EAGAIN) leaves the request in the
// ring, where the kernel still reads its iovecs later: the backend retries the submit, and the
// requests complete normally with their data. (Failing them instead freed their buffers under
// the kernel, and the next submit's completion of the stale request aborted the reaper.)
TEST_P(BlockIoTest, TransientSubmitRefusalsAreRetriedNotFailed) {
  if (!io_->refuse_submits_for_testing(3)) GTEST_SKIP() << "no submit step to refuse (threads)";
  std::vector<uint32_t> a(1024, 0xabcdu), b(1024, 0x1234u);
  const IoResult ra = io_->submit(IoRequest{IoOp::kWrite, fd_, 0, {{a.data(), 4096}}})->wait();
  EXPECT_EQ(ra.error, 0);
  EXPECT_EQ(ra.bytes, 4096);
  ASSERT_TRUE(io_->refuse_submits_for_testing(1));
  const IoResult rb = io_->submit(IoRequest{IoOp::kWrite, fd_, 4096, {{b.data(), 4096}}})->wait();
  EXPECT_EQ(rb.error, 0);
  EXPECT_EQ(rb.bytes, 4096);
  std::vector<uint32_t> back(2048, 0);
  const IoResult rr = io_->submit(IoRequest{IoOp::kRead, fd_, 0, {{back.data(), 8192}}})->wait();
  ASSERT_EQ(rr.bytes, 8192);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), back.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), back.begin() + 1024));
}

// A write the kernel takes only in part (here: the file size limit, as a device that fills up
// mid-request) goes on with the rest, on the helper threads or by a second SQE, so the caller
// gets the error of the next part (EFBIG here, ENOSPC on a full device) with the bytes written,
// not a bare short count.
TEST_P(BlockIoTest, WriteOnAfterAPartialWriteAndReportTheError) {
  std::vector<char> a(3000, 'a'), b(5192, 'b'), c(100, 'c');
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit limit = old_limit;
  limit.rlim_cur = 6000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  const IoResult r =
      io_->submit(IoRequest{IoOp::kWrite, fd_, 0, {{a.data(), a.size()}, {b.data(), b.size()}}})
          ->wait();
  // At the limit already: nothing written, the error at once.
  const IoResult at_limit =
      io_->submit(IoRequest{IoOp::kWrite, fd_, 6000, {{c.data(), c.size()}}})->wait();
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  EXPECT_EQ(r.bytes, 6000);
  EXPECT_EQ(r.error, EFBIG);
  EXPECT_EQ(at_limit.bytes, 0);
  EXPECT_EQ(at_limit.error, EFBIG);
  std::vector<char> back(6000, 0);
  ASSERT_EQ(::pread(fd_, back.data(), back.size(), 0), 6000);
  EXPECT_EQ(std::string(back.begin(), back.begin() + 3000), std::string(3000, 'a'));
  EXPECT_EQ(std::string(back.begin() + 3000, back.end()), std::string(3000, 'b'));
  // Below the limit again, a write whose parts end mid-iovec goes on from there and completes.
  std::vector<char> d(9000);
  std::iota(d.begin(), d.end(), 1);
  ASSERT_EQ(::ftruncate(fd_, 0), 0);
  limit.rlim_cur = 4000;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  const IoResult part =
      io_->submit(IoRequest{IoOp::kWrite, fd_, 0, {{d.data(), 2500}, {d.data() + 2500, 6500}}})
          ->wait();
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  EXPECT_EQ(part.bytes, 4000);
  EXPECT_EQ(part.error, EFBIG);
  const IoResult rest =
      io_->submit(IoRequest{IoOp::kWrite, fd_, 4000, {{d.data() + 4000, 5000}}})->wait();
  EXPECT_EQ(rest.bytes, 5000);
  EXPECT_EQ(rest.error, 0);
  std::vector<char> all(9000, 0);
  ASSERT_EQ(::pread(fd_, all.data(), all.size(), 0), 9000);
  EXPECT_EQ(all, d);
}

// IoRequest::digest: the backend hashes what it read (inline or on its helper thread), the
// first digest_bytes of it, with the request's seed; a short read gets no digest.
TEST_P(BlockIoTest, ReadsCarryTheDigestOfWhatTheyRead) {
  std::vector<char> data(300000);
  std::iota(data.begin(), data.end(), 3);
  ASSERT_EQ(
      io_->submit(IoRequest{IoOp::kWrite, fd_, 0, {{data.data(), data.size()}}})->wait().bytes,
      300000);
  const auto bytes = [&](size_t n) { return std::as_bytes(std::span(data.data(), n)); };
  for (const bool inline_read : {false, true}) {
    SCOPED_TRACE(inline_read ? "inline if cached" : "through the backend");
    std::vector<char> a(1000), b(299000);
    IoRequest r{IoOp::kRead, fd_, 0, {{a.data(), a.size()}, {b.data(), b.size()}}};
    r.inline_if_cached = inline_read;
    r.digest = true;
    r.digest_seed = 77;
    const IoResult whole = io_->submit(r)->wait();
    ASSERT_EQ(whole.bytes, 300000);
    EXPECT_TRUE(whole.digested);
    EXPECT_EQ(whole.digest, xxh3_64(bytes(300000), 77));
    EXPECT_NE(whole.digest, xxh3_64(bytes(300000), 78));
    r.digest_bytes = 250000;  // a prefix (the disk tier's O_DIRECT padding is left out)
    const IoResult prefix = io_->submit(r)->wait();
    EXPECT_TRUE(prefix.digested);
    EXPECT_EQ(prefix.digest, xxh3_64(bytes(250000), 77));
    r.offset = 1000;  // 1000 bytes past the end: short, so no digest
    const IoResult shorter = io_->submit(r)->wait();
    EXPECT_EQ(shorter.bytes, 299000);
    EXPECT_FALSE(shorter.digested);
    r.offset = 0;
    r.digest = false;
    EXPECT_FALSE(io_->submit(r)->wait().digested);
  }
}

// Whether preadv2(RWF_NOWAIT) works on `fd` (a file system without it answers EOPNOTSUPP).
bool nowait_reads_work(int fd) {
  char c;
  iovec v{&c, 1};
  return ::preadv2(fd, &v, 1, 0, RWF_NOWAIT) >= 0 || errno != EOPNOTSUPP;
}

TEST_P(BlockIoTest, CachedReadIsServedOnTheSubmitterWhenAsked) {
  std::vector<char> a(12288);
  std::iota(a.begin(), a.end(), 3);
  ASSERT_EQ(io_->submit(IoRequest{IoOp::kWrite, fd_, 0, {{a.data(), a.size()}}})->wait().bytes,
            12288);
  if (!nowait_reads_work(fd_)) GTEST_SKIP() << "this file system has no RWF_NOWAIT reads";
  // Just written through the page cache, so cached: done before submit() returns.
  std::vector<char> back(a.size(), 0);
  IoRequest r{IoOp::kRead, fd_, 0, {{back.data(), 4096}, {back.data() + 4096, 8192}}};
  r.inline_if_cached = true;
  auto c = io_->submit(r);
  EXPECT_TRUE(c->done());
  EXPECT_TRUE(c->served_inline());
  EXPECT_EQ(c->wait().bytes, 12288);
  EXPECT_EQ(back, a);
  // Without the flag the same read goes to the backend's thread.
  std::fill(back.begin(), back.end(), 0);
  auto plain = io_->submit(IoRequest{IoOp::kRead, fd_, 0, {{back.data(), back.size()}}});
  EXPECT_EQ(plain->wait().bytes, 12288);
  EXPECT_FALSE(plain->served_inline());
  EXPECT_EQ(back, a);
  // Writes never take the inline path.
  IoRequest w{IoOp::kWrite, fd_, 0, {{a.data(), a.size()}}};
  w.inline_if_cached = true;
  auto cw = io_->submit(w);
  EXPECT_EQ(cw->wait().bytes, 12288);
  EXPECT_FALSE(cw->served_inline());
}

TEST_P(BlockIoTest, InlineReadPastTheEndFallsBackAndIsShort) {
  std::vector<char> a(1000, 'y');
  ASSERT_EQ(io_->submit(IoRequest{IoOp::kWrite, fd_, 0, {{a.data(), a.size()}}})->wait().bytes,
            1000);
  std::vector<char> back(3000);
  IoRequest r{IoOp::kRead, fd_, 500, {{back.data(), back.size()}}};
  r.inline_if_cached = true;
  auto c = io_->submit(r);
  const IoResult res = c->wait();
  EXPECT_FALSE(c->served_inline());  // a short inline copy is not a completion
  EXPECT_EQ(res.error, 0);
  EXPECT_EQ(res.bytes, 500);
  EXPECT_EQ(std::string(back.data(), 500), std::string(500, 'y'));
}

TEST_P(BlockIoTest, InlineReadOfABadDescriptorReportsErrnoFromTheBackend) {
  char c = 0;
  IoRequest r{IoOp::kRead, -1, 0, {{&c, 1}}};
  r.inline_if_cached = true;
  auto done = io_->submit(r);
  EXPECT_EQ(done->wait().error, EBADF);
  EXPECT_FALSE(done->served_inline());
}

INSTANTIATE_TEST_SUITE_P(Backends, BlockIoTest,
                         ::testing::Values(IoBackend::kThreads, IoBackend::kUring),
                         [](const auto& info) { return std::string(io_backend_name(info.param)); });

TEST(BlockIo, ParsesBackendNames) {
  EXPECT_EQ(parse_io_backend("uring").value(), IoBackend::kUring);
  EXPECT_EQ(parse_io_backend("threads").value(), IoBackend::kThreads);
  EXPECT_EQ(parse_io_backend("auto").value(), IoBackend::kAuto);
  EXPECT_EQ(parse_io_backend("aio").status().code(), StatusCode::kInvalidArgument);
}

TEST(BlockIo, AutoPicksUringWhenItRunsElseThreads) {
  auto io = BlockIo::create(IoOptions{});
  ASSERT_TRUE(io.ok());
  const bool ring_runs = BlockIo::create(IoOptions{IoBackend::kUring}).ok();
  EXPECT_EQ(io.value()->backend(), ring_runs ? IoBackend::kUring : IoBackend::kThreads);
  if (!have_io_uring_support()) {
    EXPECT_FALSE(ring_runs);
  }
}

TEST(BlockIo, RejectsBadOptions) {
  EXPECT_EQ(BlockIo::create(IoOptions{IoBackend::kThreads, 8, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockIo::create(IoOptions{IoBackend::kAuto, 0, 2}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvsplit::kv
