// Bounded reads of whole input files (tokenizers, configs, JSON side files, TLS material).
// Every file is checked to be a regular file before a byte is read, is opened non-blocking (so a
// FIFO or a device can never block the caller), and is refused past a per-kind size cap.
#pragma once

#include <cstddef>
#include <string>

#include "kvsplit/status.h"

namespace kvsplit::common {

// Size caps per kind of input. Each is far above what real files of that kind hold (a Llama-3
// tokenizer.json is ~9 MB, a 405B model's safetensors index ~1 MB) and far below memory.
inline constexpr size_t kMaxTokenizerFileBytes = size_t{256} << 20;  // tokenizer.json / .bin
inline constexpr size_t kMaxJsonSideFileBytes = size_t{64} << 20;    // config.json, index, ...
inline constexpr size_t kMaxConfigFileBytes = size_t{4} << 20;       // server YAML config
inline constexpr size_t kMaxPemFileBytes = size_t{1} << 20;          // TLS cert / key / CA
// The safetensors format caps its JSON header at 100 MB (the reference implementation's limit).
inline constexpr size_t kMaxSafetensorsHeaderBytes = size_t{100} << 20;

// Reads all of `path`, a regular file of at most `max_bytes` bytes. `kind` names the file in
// errors ("tokenizer", "config", ...). Errors, each starting with "<kind> <path>: ":
//   kNotFound (missing), kPermissionDenied, kInvalidArgument (a directory, a FIFO, a device or
//   anything else that is not a regular file; over the cap, naming the cap), kDataLoss (read
//   error or the file shrank while being read).
StatusOr<std::string> read_regular_file(const std::string& path, size_t max_bytes,
                                        const std::string& kind);

// Opens `path` read-only and non-blocking and checks that it is a regular file; returns the fd
// (the caller closes it) and its size in *size. Same errors as read_regular_file, without the cap.
StatusOr<int> open_regular_file(const std::string& path, const std::string& kind, size_t* size);

// "1.5 GiB", "256 MiB", "12 KiB", "17 bytes": a byte count for messages.
std::string format_bytes(size_t bytes);

}  // namespace kvsplit::common
