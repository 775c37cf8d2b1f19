// Guided decoding: the token trie, the lazy DFA and its token masks, the grammar cache.
#include "sampling/guide.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "sampling/guide_grammar.h"
#include "sampling/json_schema.h"

namespace kvsplit::sampling {
namespace {

constexpr int32_t kNotComputed = -3;
constexpr int32_t kOverflow = -2;

}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes,
                                 std::vector<std::string> start_bytes)
    : size_(static_cast<int>(bytes.size())),
      bytes_(std::move(bytes)),
      start_bytes_(std::move(start_bytes)) {
  has_start_ = !start_bytes_.empty() && start_bytes_ != bytes_;
  if (!has_start_) start_bytes_.clear();
  trie_ = build(bytes_);
  if (has_start_) start_trie_ = build(start_bytes_);
}

std::string_view TokenVocabulary::bytes(int32_t id, bool at_start) const {
  if (id < 0 || id >= size_) return {};
  return at_start && has_start_ ? start_bytes_[static_cast<size_t>(id)]
                                : bytes_[static_cast<size_t>(id)];
}

// Inserts the byte strings in sorted order, so each node's children come in byte order and the
// ids of equal strings are adjacent (one [begin, end) range per node).
TokenVocabulary::Trie TokenVocabulary::build(const std::vector<std::string>& bytes) {
  std::vector<int32_t> order;
  for (size_t id = 0; id < bytes.size(); ++id)
    if (!bytes[id].empty()) order.push_back(static_cast<int32_t>(id));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes[static_cast<size_t>(a)] < bytes[static_cast<size_t>(b)];
  });
  Trie t;
  t.nodes.emplace_back();
  std::vector<int32_t> last_child(1, -1);
  std::vector<int32_t> path{0};  // path[d]: the node of the previous string's first d bytes
  std::string_view prev;
  for (const int32_t id : order) {
    const std::string_view s = bytes[static_cast<size_t>(id)];
    size_t lcp = 0;
    while (lcp < s.size() && lcp < prev.size() && s[lcp] == prev[lcp]) ++lcp;
    path.resize(lcp + 1);
    for (size_t d = lcp; d < s.size(); ++d) {
      const auto node = static_cast<int32_t>(t.nodes.size());
      t.nodes.push_back({.byte = static_cast<uint8_t>(s[d])});
      last_child.push_back(-1);
      const int32_t parent = path[d];
      const int32_t sibling = last_child[static_cast<size_t>(parent)];
      if (sibling < 0) {
        t.nodes[static_cast<size_t>(parent)].first_child = node;
      } else {
        t.nodes[static_cast<size_t>(sibling)].next_sibling = node;
      }
      last_child[static_cast<size_t>(parent)] = node;
      path.push_back(node);
    }
    Trie::Node& end = t.nodes[static_cast<size_t>(path.back())];
    if (end.tokens_begin == end.tokens_end) end.tokens_begin = static_cast<int32_t>(t.ids.size());
    t.ids.push_back(id);
    end.tokens_end = static_cast<int32_t>(t.ids.size());
    prev = s;
  }
  return t;
}

StatusOr<std::shared_ptr<GuideGrammar>> GuideGrammar::compile(
    const GuidedDecoding& guided, std::shared_ptr<const TokenVocabulary> vocab) {
  if (guided.kind == GuidedDecoding::Kind::kGrammar) {
    StatusOr<regex::Nfa> nfa = grammar::compile_grammar(guided.spec);
    if (!nfa.ok()) return nfa.status().with_prefix("guided.grammar");
    auto g = std::make_shared<GuideGrammar>(std::move(*nfa), std::move(vocab));
    if (g->failed()) return g->overflow_error().with_prefix("guided.grammar");
    return g;
  }
  if (guided.kind == GuidedDecoding::Kind::kJsonSchema) {  // a recursive $ref: rules
    StatusOr<SchemaRegexes> rx = json_schema_to_rules(guided.spec);
    if (!rx.ok()) return Status(rx.status().code(), "guided." + rx.status().message());
    StatusOr<regex::Nfa> nfa =
        rx->rules.size() == 1 ? regex::compile_regex(rx->rules[0])
                              : regex::compile_regex_rules(rx->rules, rx->names, "json_schema");
    if (!nfa.ok()) return nfa.status().with_prefix("guided.json_schema");
    auto g = std::make_shared<GuideGrammar>(std::move(*nfa), std::move(vocab));
    if (g->failed()) return g->overflow_error().with_prefix("guided.json_schema");
    return g;
  }
  KVSPLIT_ASSIGN_OR_RETURN(std::string rx, guide_regex(guided));
  StatusOr<regex::Nfa> nfa = regex::compile_regex(rx);
  if (!nfa.ok()) {
    const char* field = guided.kind == GuidedDecoding::Kind::kRegex        ? "guided.regex"
                        : guided.kind == GuidedDecoding::Kind::kJsonSchema ? "guided.json_schema"
                                                                           : "guided";
    return nfa.status().with_prefix(field);
  }
  return std::make_shared<GuideGrammar>(std::move(*nfa), std::move(vocab));
}

GuideGrammar::GuideGrammar(regex::Nfa nfa, std::shared_ptr<const TokenVocabulary> vocab)
    : nfa_(std::move(nfa)), vocab_(std::move(vocab)), seen_(nfa_.nodes.size(), 0) {
  frames_.reserve(nfa_.nodes.size());
  for (size_t i = 0; i < nfa_.nodes.size(); ++i) frames_.push_back({static_cast<int32_t>(i), -1});
  // Bytes no range tells apart share a class: the transition table is per class, not per byte.
  bool edge[257] = {};
  for (const regex::NfaNode& n : nfa_.nodes) {
    if (n.kind != regex::NfaNode::kByte) continue;
    edge[n.lo] = true;
    edge[n.hi + 1] = true;
  }
  int cls = -1;
  for (int b = 0; b < 256; ++b) {
    if (b == 0 || edge[b]) ++cls;
    byte_class_[b] = static_cast<uint8_t>(cls);
  }
  num_classes_ = cls + 1;
  std::vector<int32_t> start{nfa_.start};
  const std::lock_guard lock(mu_);
  // State 0. A grammar whose calls before the first byte pass the bounds has failed at once.
  if (state_of_locked(start) == kOverflow) fail_locked();
}

int32_t GuideGrammar::frame_locked(int32_t node, int32_t parent) {
  if (parent < 0) return node;
  const uint64_t key =
      (uint64_t{static_cast<uint32_t>(node)} << 32) | static_cast<uint32_t>(parent);
  if (auto it = frame_ids_.find(key); it != frame_ids_.end()) return it->second;
  if (frames_.size() >= kMaxFrames) {
    frames_full_ = true;
    return -1;
  }
  const auto id = static_cast<int32_t>(frames_.size());
  frames_.push_back({node, parent});
  seen_.push_back(0);
  frame_ids_.emplace(key, id);
  return id;
}

// The frames a set reaches without reading a byte: splits and epsilons are followed, a call
// pushes its continuation (none for a call in tail position: the callee returns where the caller
// would) and enters the callee, a rule's end returns to its continuation. What is kept: byte
// nodes, and the end of the text's own rule. Without left recursion this ends: a frame's parent
// chain grows only through calls made before a byte, and those cannot cycle.
void GuideGrammar::closure_locked(std::vector<int32_t>& set) {
  if (++generation_ == 0) {  // the stamps wrapped: start them over
    std::fill(seen_.begin(), seen_.end(), 0);
    generation_ = 1;
  }
  std::vector<int32_t> stack(set.begin(), set.end());
  set.clear();
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    if (++work_ > kMaxDfaWork) return;  // state_of_locked sees it and fails the grammar
    if (id < 0 || seen_[static_cast<size_t>(id)] == generation_) continue;
    seen_[static_cast<size_t>(id)] = generation_;
    const Frame f = frames_[static_cast<size_t>(id)];
    const regex::NfaNode& n = nfa_.nodes[static_cast<size_t>(f.node)];
    switch (n.kind) {
      case regex::NfaNode::kByte:
        set.push_back(id);
        break;
      case regex::NfaNode::kMatch:
        if (f.parent < 0) {
          set.push_back(id);
        } else {
          stack.push_back(f.parent);
        }
        break;
      case regex::NfaNode::kSplit:
        stack.push_back(frame_locked(n.out2, f.parent));
        stack.push_back(frame_locked(n.out, f.parent));
        break;
      case regex::NfaNode::kEpsilon:
        stack.push_back(frame_locked(n.out, f.parent));
        break;
      case regex::NfaNode::kCall: {
        const bool tail = nfa_.nodes[static_cast<size_t>(n.out)].kind == regex::NfaNode::kMatch;
        const int32_t cont = tail ? f.parent : frame_locked(n.out, f.parent);
        if (cont >= 0 || tail) stack.push_back(frame_locked(n.out2, cont));
        break;
      }
    }
  }
  std::sort(set.begin(), set.end());
}

int32_t GuideGrammar::state_of_locked(std::vector<int32_t>& set) {
  closure_locked(set);
  // A closure cut short (a frame past kMaxFrames, or the work bound) is not the state: it must
  // not be looked up, or it could stand for another state and be cached as the transition.
  if (frames_full_ || work_ > kMaxDfaWork) return kOverflow;
  std::string key(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int32_t));
  if (auto it = ids_.find(key); it != ids_.end()) return it->second;
  if (frames_full_ || sets_.size() >= kMaxDfaStates ||
      set_entries_ + set.size() > kMaxDfaSetEntries ||
      (sets_.size() + 1) * static_cast<size_t>(num_classes_) > kMaxDfaTableEntries ||
      work_ > kMaxDfaWork) {
    return kOverflow;
  }
  const auto id = static_cast<int32_t>(sets_.size());
  bool accept = false;
  for (const int32_t n : set) {
    const int32_t node = frames_[static_cast<size_t>(n)].node;
    accept = accept || nfa_.nodes[static_cast<size_t>(node)].kind == regex::NfaNode::kMatch;
  }
  accepting_.push_back(accept ? 1 : 0);
  set_entries_ += set.size();
  sets_.push_back(set);
  next_.resize(sets_.size() * static_cast<size_t>(num_classes_), kNotComputed);
  ids_.emplace(std::move(key), id);
  return id;
}

int32_t GuideGrammar::step_locked(int32_t state, uint8_t byte) {
  const size_t slot = static_cast<size_t>(state) * num_classes_ + byte_class_[byte];
  if (next_[slot] != kNotComputed) return next_[slot];
  if (work_ > kMaxDfaWork) return kOverflow;
  work_ += sets_[static_cast<size_t>(state)].size();
  std::vector<int32_t> targets;
  for (const int32_t id : sets_[static_cast<size_t>(state)]) {
    const Frame f = frames_[static_cast<size_t>(id)];
    const regex::NfaNode& n = nfa_.nodes[static_cast<size_t>(f.node)];
    if (n.kind == regex::NfaNode::kByte && byte >= n.lo && byte <= n.hi)
      targets.push_back(frame_locked(n.out, f.parent));
  }
  if (frames_full_) return kOverflow;
  const int32_t next = targets.empty() ? kDead : state_of_locked(targets);
  if (next != kOverflow) next_[slot] = next;
  return next;
}

bool GuideGrammar::accepting(int32_t state) const {
  const std::lock_guard lock(mu_);
  return !overflowed_ && accepting_[static_cast<size_t>(state)] != 0;
}

bool GuideGrammar::failed() const {
  const std::lock_guard lock(mu_);
  return overflowed_;
}

size_t GuideGrammar::memory_bytes() const {
  const std::lock_guard lock(mu_);
  // Sets, their copies as map keys, the transition table, the frames (a grammar's stacks; a
  // hash map entry is about 32 bytes), the distinct masks.
  return 2 * set_entries_ * sizeof(int32_t) + next_.size() * sizeof(int32_t) +
         (frames_.size() - nfa_.nodes.size()) * (sizeof(Frame) + 32) + mask_bytes_;
}

void GuideGrammar::fail_locked() {
  overflowed_ = true;
  sets_ = {};
  accepting_ = {};
  next_ = {};
  ids_ = {};
  masks_ = {};
  unique_ = {};
  mask_bytes_ = 0;
  set_entries_ = 0;
  frames_.resize(nfa_.nodes.size());
  frames_.shrink_to_fit();
  frame_ids_ = {};
  seen_.resize(nfa_.nodes.size());
  seen_.shrink_to_fit();
}

size_t GuideGrammar::num_states() const {
  const std::lock_guard lock(mu_);
  return sets_.size();
}

size_t GuideGrammar::num_distinct_masks() const {
  const std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [hash, masks] : unique_) n += masks.size();
  return n;
}

Status GuideGrammar::overflow_error() const {
  return invalid_argument(fmt::format(
      "guided decoding: the constraint's automaton grew past its bounds ({} states, {} stored "
      "NFA nodes, {} NFA node visits or {} grammar stack frames); simplify the constraint",
      kMaxDfaStates, kMaxDfaSetEntries, kMaxDfaWork, kMaxFrames));
}

StatusOr<int32_t> GuideGrammar::walk(int32_t state, std::string_view bytes) {
  const std::lock_guard lock(mu_);
  if (overflowed_) return overflow_error();
  for (const char c : bytes) {
    state = step_locked(state, static_cast<uint8_t>(c));
    if (state == kOverflow) {
      fail_locked();
      return overflow_error();
    }
    if (state == kDead) return kDead;
  }
  return state;
}

StatusOr<std::shared_ptr<const TokenMask>> GuideGrammar::mask(int32_t state, bool at_start) {
  const std::lock_guard lock(mu_);
  if (overflowed_) return overflow_error();
  const int64_t key = int64_t{state} * 2 + (at_start ? 1 : 0);
  if (auto it = masks_.find(key); it != masks_.end()) return it->second;
  std::shared_ptr<const TokenMask> m = build_mask_locked(state, at_start);
  if (m == nullptr) {
    fail_locked();
    return overflow_error();
  }
  // Many states share a mask (inside any JSON string nearly every token is allowed): one copy.
  const std::string_view raw(reinterpret_cast<const char*>(m->bits.data()),
                             m->bits.size() * sizeof(uint64_t));
  const size_t hash = std::hash<std::string_view>{}(raw);
  for (const std::shared_ptr<const TokenMask>& u : unique_[hash]) {
    if (u->bits == m->bits) {
      masks_.emplace(key, u);
      return u;
    }
  }
  if (mask_bytes_ + raw.size() > kMaxMaskBytes) {
    masks_.clear();
    unique_.clear();
    mask_bytes_ = 0;
  }
  unique_[hash].push_back(m);
  masks_.emplace(key, m);
  mask_bytes_ += raw.size();
  return m;
}

// Walks the token trie and the DFA together, pruning at the first dead byte: the cost is the
// number of live (token prefix, state) pairs, not the vocabulary's total bytes.
std::shared_ptr<const TokenMask> GuideGrammar::build_mask_locked(int32_t state, bool at_start) {
  const TokenVocabulary::Trie& trie = vocab_->trie(at_start);
  auto m = std::make_shared<TokenMask>();
  m->bits.assign((static_cast<size_t>(vocab_->size()) + 63) / 64, 0);
  std::vector<std::pair<int32_t, int32_t>> stack{{0, state}};
  while (!stack.empty()) {
    const auto [node, s] = stack.back();
    stack.pop_back();
    for (int32_t c = trie.nodes[static_cast<size_t>(node)].first_child; c >= 0;
         c = trie.nodes[static_cast<size_t>(c)].next_sibling) {
      const TokenVocabulary::Trie::Node& child = trie.nodes[static_cast<size_t>(c)];
      const int32_t ns = step_locked(s, child.byte);
      if (ns == kOverflow) return nullptr;
      if (ns == kDead) continue;
      for (int32_t k = child.tokens_begin; k < child.tokens_end; ++k) {
        const int32_t id = trie.ids[static_cast<size_t>(k)];
        m->bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
        ++m->count;
      }
      if (child.first_child >= 0) stack.emplace_back(c, ns);
    }
  }
  return m;
}

Status GuideState::advance(int32_t id) {
  const std::string_view bytes = grammar_->vocab().bytes(id, at_start_);
  at_start_ = false;
  if (bytes.empty()) return ok_status();  // an end id
  KVSPLIT_ASSIGN_OR_RETURN(int32_t next, grammar_->walk(state_, bytes));
  if (next == GuideGrammar::kDead) {
    return invalid_argument(fmt::format("guided decoding: token {} leaves the language", id));
  }
  state_ = next;
  return ok_status();
}

StatusOr<std::string> guide_regex(const GuidedDecoding& guided) {
  switch (guided.kind) {
    case GuidedDecoding::Kind::kNone:
      return invalid_argument("guided: no constraint");
    case GuidedDecoding::Kind::kRegex:
      return guided.spec;
    case GuidedDecoding::Kind::kChoice:
      if (guided.choices.empty()) return invalid_argument("guided.choice: needs a choice");
      return choice_regex(guided.choices);
    case GuidedDecoding::Kind::kJsonSchema: {
      StatusOr<std::string> rx = json_schema_to_regex(guided.spec);
      if (!rx.ok()) return Status(rx.status().code(), "guided." + rx.status().message());
      return rx;
    }
    case GuidedDecoding::Kind::kJsonObject:
      return json_object_regex(kJsonObjectDepth);
    case GuidedDecoding::Kind::kGrammar:
      return invalid_argument("guided.grammar: a grammar is not a regular expression");
  }
  return invalid_argument("guided: unknown kind");
}

StatusOr<std::shared_ptr<GuideGrammar>> GuideCache::get(const GuidedDecoding& guided) {
  std::string key(1, static_cast<char>(guided.kind));
  key += guided.spec;
  for (const std::string& c : guided.choices) {  // length-prefixed: no two lists share a key
    key += fmt::format("\n{}:", c.size());
    key += c;
  }
  {
    const std::lock_guard lock(mu_);
    std::erase_if(entries_, [](const auto& e) { return e.second->failed(); });
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first != key) continue;
      std::rotate(entries_.begin() + static_cast<ptrdiff_t>(i),
                  entries_.begin() + static_cast<ptrdiff_t>(i) + 1, entries_.end());
      return entries_.back().second;
    }
  }
  // Compiled outside the lock: a large schema does not hold up other requests' look-ups.
  KVSPLIT_ASSIGN_OR_RETURN(std::shared_ptr<GuideGrammar> g, GuideGrammar::compile(guided, vocab_));
  const std::lock_guard lock(mu_);
  std::vector<size_t> sizes;
  size_t bytes = 0;
  for (const auto& e : entries_) bytes += sizes.emplace_back(e.second->memory_bytes());
  size_t drop = 0;
  while (drop < entries_.size() && (entries_.size() - drop >= capacity_ || bytes > max_bytes_))
    bytes -= sizes[drop++];
  entries_.erase(entries_.begin(), entries_.begin() + static_cast<ptrdiff_t>(drop));
  entries_.emplace_back(std::move(key), g);
  return g;
}

}  // namespace kvsplit::sampling
