#include "common/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <random>

namespace kvsplit {
namespace {

void fill_random(unsigned char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      break;  // ENOSYS (very old kernel) or a seccomp filter: fall back below
    }
  }
  if (got == n) return;
  thread_local std::random_device device;  // /dev/urandom on Linux
  for (; got < n; ++got) out[got] = static_cast<unsigned char>(device());
}

}  // namespace

void random_bytes(void* out, size_t n) { fill_random(static_cast<unsigned char*>(out), n); }

std::string random_id(std::string_view prefix) {
  unsigned char bytes[16];
  fill_random(bytes, sizeof(bytes));
  constexpr char kHex[] = "0123456789abcdef";
  std::string out(prefix);
  out.reserve(prefix.size() + 2 * sizeof(bytes));
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xF]);
  }
  return out;
}

}  // namespace kvsplit
