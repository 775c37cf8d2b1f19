// The greedy merge loop shared by the SentencePiece-style tokenizers (llama2.c score order and HF
// merge-rank order), in O(n log n) with a priority queue and lazy invalidation.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvsplit::model::bpe {

// What merging two adjacent symbols gives: the merged id and how early it is applied (higher
// `priority` first). llama2.c: the merged piece's score. HF: minus the merge rank.
struct Merge {
  int32_t id;
  double priority;
};

// Returns the merge of the adjacent pair (left id, right id), or nullopt when they do not merge.
using PairLookup = std::function<std::optional<Merge>(int32_t left, int32_t right)>;

// Repeatedly merges the adjacent pair with the highest priority, the leftmost one on ties, until
// no pair merges; `ids` is replaced by the result. Gives exactly what the quadratic "scan all
// pairs, merge the best, repeat" loop of llama2.c run.c gives (and HF's BPE word merge).
// Cost: O(n log n) lookups and heap operations for n input symbols.
void merge_greedy(std::vector<int32_t>& ids, const PairLookup& lookup);

// Hash and equality for unordered maps keyed by std::string that accept string_view lookups.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StringEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
using PieceMap = std::unordered_map<std::string, int32_t, StringHash, StringEq>;

}  // namespace kvsplit::model::bpe
