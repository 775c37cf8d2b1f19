// llama2.c tokenizer.bin: score-ordered BPE with byte fallback, encoding exactly as run.c's
// `encode` (merge loop in O(n log n), see bpe.h).
//
// File format (little-endian): uint32 max_token_length, then for each id 0..vocab-1: float32
// score, int32 byte length, the piece bytes (no terminator). The file does not store the vocab
// size; run.c takes it from the model, so `expected_vocab` (when > 0) says how many entries to
// read, and leftover bytes are an error.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/bpe.h"
#include "model/tokenizer.h"
#include "model/utf8.h"

namespace kvsplit::model::internal {
namespace {

constexpr int32_t kUnkId = 0;
constexpr int32_t kBosId = 1;
constexpr int32_t kEosId = 2;
constexpr int kByteIdOffset = 3;  // <0xNN> has id NN + 3
// run.c starts its best-score search at -1e10 with a strict '>': pairs scoring at or below it
// (or NaN) never merge.
constexpr float kRunCMinScore = -1e10f;

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    piece_ids_.reserve(pieces_.size());
    // On duplicate pieces the lowest id wins (run.c's bsearch would pick one arbitrarily).
    for (size_t i = 0; i < pieces_.size(); ++i) piece_ids_.emplace(pieces_[i], int32_t(i));
    space_id_ = find(" ");
    // Safe to cut before a space that follows a non-space: no piece has a space right after
    // another byte, so no merge can produce one across the cut.
    split_at_space_ = space_id_ >= 0;
    for (const std::string& p : pieces_) {
      for (size_t k = 1; k < p.size() && split_at_space_; ++k) {
        if (p[k] == ' ' && p[k - 1] != ' ') split_at_space_ = false;
      }
    }
  }

  using Tokenizer::encode;
  // parse_special is ignored: this format has no special-token text (plain text, as run.c).
  StatusOr<std::vector<int32_t>> encode(std::string_view text,
                                        const EncodeOptions& options) const override {
    const bool add_bos = options.add_special;
    std::vector<int32_t> out;
    if (add_bos) out.push_back(kBosId);
    // run.c takes a C string: the text ends at its first NUL byte (then no dummy prefix either
    // when nothing is before it). The llama2.c format follows run.c here as everywhere.
    text = text.substr(0, text.find('\0'));
    if (text.empty()) return out;

    std::vector<int32_t> ids;
    ids.reserve(text.size() + 1);
    if (space_id_ >= 0) ids.push_back(space_id_);  // dummy prefix, as SentencePiece
    // run.c's grouping: a byte plus up to 3 following continuation bytes (10xxxxxx) form one
    // lookup unit, whether or not they are well-formed UTF-8.
    for (size_t i = 0; i < text.size();) {
      size_t len = 1;
      while (i + len < text.size() && len < 4 &&
             (static_cast<uint8_t>(text[i + len]) & 0xC0) == 0x80) {
        ++len;
      }
      const std::string_view unit = text.substr(i, len);
      const int32_t id = unit[0] == '\0' ? -1 : find(unit);
      if (id >= 0) {
        ids.push_back(id);
      } else {
        for (char c : unit) {
          const int32_t byte_id = static_cast<uint8_t>(c) + kByteIdOffset;
          if (byte_id >= vocab_size()) {
            return invalid_argument("llama2.c tokenizer: byte " + std::to_string(byte_id - 3) +
                                    " has no byte token in a vocab of " +
                                    std::to_string(vocab_size()));
          }
          ids.push_back(byte_id);
        }
      }
      i += len;
    }

    std::string buf;
    const bpe::PairLookup lookup = [&](int32_t l, int32_t r) -> std::optional<bpe::Merge> {
      buf.assign(pieces_[l]).append(pieces_[r]);
      const int32_t id = find(buf);
      if (id < 0 || !(scores_[id] > kRunCMinScore)) return std::nullopt;
      return bpe::Merge{id, static_cast<double>(scores_[id])};
    };
    if (!split_at_space_) {
      bpe::merge_greedy(ids, lookup);
      out.insert(out.end(), ids.begin(), ids.end());
      return out;
    }
    // Words start at a space unit that follows another unit; no piece joins across that point
    // (see split_at_space_), so merging each word alone gives the same ids.
    std::vector<int32_t> word;
    for (size_t i = 0; i <= ids.size(); ++i) {
      if (i == ids.size() || (i > 0 && ids[i] == space_id_ && ids[i - 1] != space_id_)) {
        bpe::merge_greedy(word, lookup);
        out.insert(out.end(), word.begin(), word.end());
        word.clear();
      }
      if (i < ids.size()) word.push_back(ids[i]);
    }
    return out;
  }

  // run.c `decode`: a piece following BOS loses one leading space; "<0xNN>" is the raw byte.
  // Unlike run.c, the start of text (prev -1) also drops the space, and <unk>/BOS/EOS give "".
  std::string decode_token(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= vocab_size() || id == kUnkId || id == kBosId || id == kEosId) return {};
    std::string_view piece = pieces_[id];
    if ((prev == kBosId || prev == -1) && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    if (const int b = utf8::parse_byte_piece(piece); b >= 0) return std::string(1, char(b));
    return std::string(piece);
  }

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int32_t bos_id() const override { return kBosId; }
  int32_t eos_id() const override { return kEosId; }
  std::string_view kind() const override { return "llama2c"; }
  bool text_ends_at_nul() const override { return true; }

 private:
  int32_t find(std::string_view piece) const {
    auto it = piece_ids_.find(piece);
    return it == piece_ids_.end() ? -1 : it->second;
  }

  std::vector<std::string> pieces_;  // [vocab] piece bytes
  std::vector<float> scores_;        // [vocab]
  bool split_at_space_ = false;
  bpe::PieceMap piece_ids_;  // piece -> id
  int32_t space_id_ = -1;    // piece " " (the dummy prefix), -1 when absent
};

template <typename T>
T read_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // the build targets little-endian hosts only
  return v;
}

}  // namespace

// `data` is the whole file. Errors name `path` and the fault.
StatusOr<std::unique_ptr<Tokenizer>> load_llama2c_tokenizer(const std::string& path,
                                                            std::string_view data,
                                                            int expected_vocab) {
  auto fail = [&](const std::string& what) {
    return invalid_argument("llama2.c tokenizer " + path + ": " + what);
  };
  if (data.size() < 4)
    return fail("truncated: no max_token_length header (file has " + std::to_string(data.size()) +
                " bytes)");
  const uint32_t max_len = read_le<uint32_t>(data.data());
  if (max_len == 0 || max_len > (1u << 20)) {
    return fail("bad max_token_length " + std::to_string(max_len));
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  size_t off = 4;
  const size_t want = expected_vocab > 0 ? size_t(expected_vocab) : SIZE_MAX;
  while (pieces.size() < want && off < data.size()) {
    const std::string id = std::to_string(pieces.size());
    if (data.size() - off < 8) return fail("truncated in the header of entry " + id);
    const float score = read_le<float>(data.data() + off);
    const int32_t len = read_le<int32_t>(data.data() + off + 4);
    off += 8;
    if (!std::isfinite(score)) {
      return fail("entry " + id + " has a non-finite score (" + std::to_string(score) +
                  "): BPE merges are ranked by score");
    }
    if (len < 0) return fail("entry " + id + " has negative length " + std::to_string(len));
    if (uint32_t(len) > max_len) {
      return fail("entry " + id + " has length " + std::to_string(len) + " > max_token_length " +
                  std::to_string(max_len));
    }
    if (data.size() - off < size_t(len)) {
      return fail("truncated in the bytes of entry " + id + " (length " + std::to_string(len) +
                  ", " + std::to_string(data.size() - off) + " bytes left)");
    }
    pieces.emplace_back(data.substr(off, len));
    scores.push_back(score);
    off += len;
  }
  if (expected_vocab > 0 && pieces.size() < want) {
    return fail("vocab mismatch: the file holds " + std::to_string(pieces.size()) +
                " entries, the model expects " + std::to_string(expected_vocab));
  }
  if (off != data.size()) {
    return fail("vocab mismatch: " + std::to_string(data.size() - off) + " bytes left after the " +
                std::to_string(pieces.size()) + " entries the model expects");
  }
  if (pieces.size() < 3) {
    return fail("needs at least 3 entries (<unk>, BOS, EOS), has " + std::to_string(pieces.size()));
  }
  return std::unique_ptr<Tokenizer>(
      std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores)));
}

}  // namespace kvsplit::model::internal
