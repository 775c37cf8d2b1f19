#include "model/bpe.h"

#include <queue>

namespace kvsplit::model::bpe {
namespace {

// A symbol of the sequence being merged. Index = position of its first input symbol, so index
// order is left-to-right order. A merge keeps the left symbol and kills the right one.
struct Symbol {
  int32_t id;
  int32_t prev;      // index of the live symbol to the left, -1 at the start
  int32_t next;      // index of the live symbol to the right, -1 at the end
  uint32_t version;  // bumped whenever the symbol changes or dies
  bool alive;
};

struct Candidate {
  double priority;
  int32_t left;  // symbol index
  int32_t right;
  uint32_t left_version;
  uint32_t right_version;
  int32_t merged_id;
};

// std::priority_queue pops the "largest": highest priority, then smallest left index.
struct CandidateLess {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.left > b.left;
  }
};

}  // namespace

void merge_greedy(std::vector<int32_t>& ids, const PairLookup& lookup) {
  const auto n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, 0, true};

  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateLess> heap(CandidateLess{},
                                                                             std::move(storage));
  auto push_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    if (auto m = lookup(sym[l].id, sym[r].id)) {
      heap.push({m->priority, l, r, sym[l].version, sym[r].version, m->id});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, i + 1);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[c.left];
    Symbol& r = sym[c.right];
    // Stale: one side merged with something else since this candidate was queued.
    if (!l.alive || !r.alive || l.next != c.right || l.version != c.left_version ||
        r.version != c.right_version) {
      continue;
    }
    l.id = c.merged_id;
    ++l.version;
    r.alive = false;
    ++r.version;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    push_pair(l.prev, c.left);
    push_pair(c.left, l.next);
  }

  ids.clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
}

}  // namespace kvsplit::model::bpe
