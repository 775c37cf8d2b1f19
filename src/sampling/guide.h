// Guided decoding (docs/sampling.md, "Guided decoding"): which tokens keep the generated text a
// prefix of a string of the request's language.
//
//   TokenVocabulary  the bytes each token adds to the text, as a trie (one per model, shared);
//   GuideGrammar     a compiled language: NFA, a lazily built DFA over it and, per DFA state, the
//                    mask of tokens whose bytes stay inside the language (shared by every request
//                    with the same constraint; thread-safe: sampling threads share it);
//   GuideState       one sequence's position in the DFA (owned by its Sampler).
//
// A token is allowed when walking its bytes from the current DFA state never reaches the dead
// state. A token that adds no bytes (special tokens) is never allowed as text; the end ids (the
// model's EOS ids and stop_token_ids) are allowed exactly when the text so far is a whole string
// of the language. Every DFA state reached is live (the Thompson NFA of a regex without empty
// classes can reach its match from every node; every rule of a grammar derives a finite string),
// so an allowed token never leads to a dead end. A grammar's rule calls run on a stack: a DFA
// state is then a set of stacks, built as lazily as the rest.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvsplit/sampling_params.h"
#include "kvsplit/status.h"
#include "sampling/guide_regex.h"

namespace kvsplit::sampling {

// The bytes of every token, in the two contexts a tokenizer distinguishes: mid-text, and at the
// start of the text (the first token after BOS, where SentencePiece drops the leading space).
class TokenVocabulary {
 public:
  // bytes[id]: what token id adds mid-text; start_bytes[id]: at the start (empty vector: the same
  // as mid-text). Ids with no bytes (special tokens) are in neither trie.
  TokenVocabulary(std::vector<std::string> bytes, std::vector<std::string> start_bytes);

  int size() const { return size_; }
  std::string_view bytes(int32_t id, bool at_start) const;

  // A trie of token byte strings, nodes in preorder, children in byte order.
  struct Trie {
    struct Node {
      int32_t first_child = -1;
      int32_t next_sibling = -1;
      int32_t tokens_begin = 0;  // ids ending here: ids[tokens_begin, tokens_end)
      int32_t tokens_end = 0;
      uint8_t byte = 0;
    };
    std::vector<Node> nodes;  // nodes[0]: the root (the empty string)
    std::vector<int32_t> ids;
  };
  const Trie& trie(bool at_start) const { return at_start && has_start_ ? start_trie_ : trie_; }

 private:
  static Trie build(const std::vector<std::string>& bytes);

  int size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<std::string> start_bytes_;
  bool has_start_ = false;
  Trie trie_;
  Trie start_trie_;
};

// The tokens allowed as text in one DFA state: a bit per token id.
struct TokenMask {
  std::vector<uint64_t> bits;
  int32_t count = 0;  // bits set
  bool test(int32_t id) const { return (bits[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u; }
};

class GuideGrammar {
 public:
  static constexpr int32_t kDead = -1;
  // Bounds on building the DFA, which a client's constraint drives: states, NFA nodes stored
  // over all states (memory), and NFA nodes visited (CPU: about a second at most).
  static constexpr size_t kMaxDfaStates = 1 << 16;
  static constexpr size_t kMaxDfaSetEntries = size_t{1} << 22;
  static constexpr size_t kMaxDfaTableEntries = size_t{1} << 22;  // states x byte classes
  static constexpr size_t kMaxDfaWork = size_t{1} << 29;
  // Stack frames (a grammar's rule calls) interned over all states.
  static constexpr size_t kMaxFrames = size_t{1} << 20;
  // Distinct masks cached per grammar; past this many bytes the cache starts over (masks in use
  // stay alive with their users).
  static constexpr size_t kMaxMaskBytes = size_t{16} << 20;

  // kInvalidArgument for a constraint that does not compile (its message names the field).
  static StatusOr<std::shared_ptr<GuideGrammar>> compile(
      const GuidedDecoding& guided, std::shared_ptr<const TokenVocabulary> vocab);

  GuideGrammar(regex::Nfa nfa, std::shared_ptr<const TokenVocabulary> vocab);

  int32_t start_state() const { return 0; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  // False once the grammar failed.
  bool accepting(int32_t state) const;
  // The state after `bytes` from `state` (kDead when the text leaves the language).
  // kInvalidArgument once the DFA passed its bounds: the grammar has then failed for good (its
  // tables are freed; every call fails at once).
  StatusOr<int32_t> walk(int32_t state, std::string_view bytes);
  // Tokens allowed as text in `state` (at_start: the first token after BOS).
  StatusOr<std::shared_ptr<const TokenMask>> mask(int32_t state, bool at_start);

  size_t num_states() const;
  size_t num_distinct_masks() const;
  bool failed() const;
  // What a call on a failed grammar returns.
  Status overflow_error() const;
  // Bytes its DFA tables and masks take (what a GuideCache budgets).
  size_t memory_bytes() const;

 private:
  // A DFA state is a set of frames. A frame is an NFA node and the frame to continue at when the
  // node's rule ends (-1: the text's own rule); frames are interned, so equal stacks have one id.
  // Frames [0, nfa nodes) are (node, -1): a regex, which makes no calls, has only those.
  struct Frame {
    int32_t node;
    int32_t parent;
  };
  int32_t frame_locked(int32_t node, int32_t parent);  // -1 past kMaxFrames
  int32_t step_locked(int32_t state, uint8_t byte);    // kDead, or -2 past kMaxDfaStates
  int32_t state_of_locked(std::vector<int32_t>& set);  // closure of `set`, then its id
  void closure_locked(std::vector<int32_t>& set);
  std::shared_ptr<const TokenMask> build_mask_locked(int32_t state, bool at_start);
  void fail_locked();  // past the bounds: frees the tables, every call fails from now on

  const regex::Nfa nfa_;
  const std::shared_ptr<const TokenVocabulary> vocab_;
  uint8_t byte_class_[256] = {};
  int num_classes_ = 0;

  mutable std::mutex mu_;
  std::vector<std::vector<int32_t>> sets_;  // per DFA state: its NFA byte and match nodes
  std::vector<uint8_t> accepting_;
  std::vector<int32_t> next_;  // [state * num_classes_ + class]: -3 not yet computed
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<int64_t, std::shared_ptr<const TokenMask>> masks_;  // key: state * 2 + start
  std::unordered_map<size_t, std::vector<std::shared_ptr<const TokenMask>>> unique_;  // by hash
  size_t mask_bytes_ = 0;  // of the distinct masks
  bool overflowed_ = false;
  size_t set_entries_ = 0;  // NFA nodes stored in sets_
  size_t work_ = 0;         // NFA nodes visited by closures and steps
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> frame_ids_;  // of the frames with a parent
  bool frames_full_ = false;
  std::vector<uint32_t> seen_;  // closure scratch: generation stamps per frame
  uint32_t generation_ = 0;
};

// One sequence's position in its grammar.
class GuideState {
 public:
  // at_start: the first token follows BOS (or nothing), as the tokenizer's start context.
  GuideState(std::shared_ptr<GuideGrammar> grammar, bool at_start)
      : grammar_(std::move(grammar)), at_start_(at_start) {}

  bool accepting() const { return grammar_->accepting(state_); }
  StatusOr<std::shared_ptr<const TokenMask>> mask() { return grammar_->mask(state_, at_start_); }
  // The text grew by token `id` (an allowed one). End ids add no bytes and change nothing.
  Status advance(int32_t id);

 private:
  std::shared_ptr<GuideGrammar> grammar_;
  int32_t state_ = 0;
  bool at_start_;
};

// A small thread-safe LRU of compiled grammars keyed by the constraint, over one vocabulary.
class GuideCache {
 public:
  // At most `capacity` grammars and about `max_bytes` of their tables: past either, the least
  // recently used go (a request still using one keeps it alive). Failed grammars are dropped.
  explicit GuideCache(std::shared_ptr<const TokenVocabulary> vocab, size_t capacity = 32,
                      size_t max_bytes = size_t{256} << 20)
      : vocab_(std::move(vocab)), capacity_(capacity), max_bytes_(max_bytes) {}
  StatusOr<std::shared_ptr<GuideGrammar>> get(const GuidedDecoding& guided);

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t capacity_;
  size_t max_bytes_;
  std::mutex mu_;
  std::vector<std::pair<std::string, std::shared_ptr<GuideGrammar>>> entries_;  // most recent last
};

// The regex a constraint compiles to: the pattern itself, the choices' alternation, or the JSON
// schema's / any JSON object's regex. kInvalidArgument naming the field.
StatusOr<std::string> guide_regex(const GuidedDecoding& guided);

}  // namespace kvsplit::sampling
