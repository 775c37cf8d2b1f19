// A stop token's text is not emitted, and it never reaches the detokenizer: a byte-fallback stop
// token (tok512 ids 3..258 are the bytes 0..255) neither leaves a stray byte behind (a U+FFFD at
// the end of the text) nor completes a character and takes the earlier tokens' bytes with it.
#include <gtest/gtest.h>

#include "model/tokenizer.h"
#include "sampling/stop.h"
#include "sched/sequence.h"
#include "test_util.h"

namespace kvsplit::sched {
namespace {

constexpr int32_t kEos = 2;

class NullSink : public FinishSink {
 public:
  void on_final(const Sequence&, const TokenEvent&) override {}
};

// Greedy sequence with prompt [BOS], stop_token_ids {stop}, EOS kEos; appends `out` and returns the
// text its stream delivered and the finish reason.
std::pair<std::string, FinishReason> run(const model::Tokenizer& tok, int32_t stop,
                                         const std::vector<int32_t>& out) {
  Sequence seq;
  seq.ctl = std::make_shared<RequestControl>("r");
  seq.params.temperature = 0;
  seq.params.max_tokens = 16;
  seq.params.stop_token_ids = {stop};
  seq.tokens = {1};
  seq.num_prompt = 1;
  seq.eos_ids = {kEos};
  seq.stop = std::make_unique<sampling::StopChecker>(seq.params, seq.eos_ids, 16);
  seq.decoder = std::make_unique<model::StreamDecoder>(tok, 1);
  const auto now = Clock::now();
  FinishReason reason = FinishReason::kNone;
  for (int32_t t : out) {
    reason = append_token(seq, t, now);
    if (reason != FinishReason::kNone) break;
  }
  NullSink sink;
  finish_sequence(seq, reason, ok_status(), now, sink);
  std::string text;
  TokenEvent ev;
  while (seq.ctl->stream->try_next(&ev)) text += ev.text;
  return {text, reason};
}

TEST(SequenceStop, AByteFallbackStopTokenLeavesNoStrayByte) {
  KVSPLIT_REQUIRE_MODELS();
  auto tok = model::load_tokenizer(testing::model_path("tok512.bin"), 512);
  ASSERT_TRUE(tok.ok());
  // 0xE6, the first byte of a three-byte character, as the stop token after token 410.
  model::StreamDecoder ref(**tok, 1);
  const std::string before = ref.push(410) + ref.flush();
  auto [text, reason] = run(**tok, 3 + 0xE6, {410, 3 + 0xE6});
  EXPECT_EQ(reason, FinishReason::kStop);
  EXPECT_EQ(text, before);
  EXPECT_EQ(text.find("\xEF\xBF\xBD"), std::string::npos) << "a U+FFFD from the stop token";
}

TEST(SequenceStop, AStopTokenCompletingACharacterDoesNotTakeTheEarlierBytes) {
  KVSPLIT_REQUIRE_MODELS();
  auto tok = model::load_tokenizer(testing::model_path("tok512.bin"), 512);
  ASSERT_TRUE(tok.ok());
  // "日" is E6 97 A5: the first two bytes generated, the third is the stop token. The delivered
  // ids are the first two, whose text is what a detokenizer makes of them alone.
  model::StreamDecoder ref(**tok, 1);
  std::string two = ref.push(3 + 0xE6);
  two += ref.push(3 + 0x97);
  two += ref.flush();
  ASSERT_FALSE(two.empty());
  auto [text, reason] = run(**tok, 3 + 0xA5, {3 + 0xE6, 3 + 0x97, 3 + 0xA5});
  EXPECT_EQ(reason, FinishReason::kStop);
  EXPECT_EQ(text, two);
}

// Generation that ends on an EOS id is no stop string: the bytes the detokenizer still holds (an
// incomplete character before the EOS) are flushed, as after a stop_token_ids id. Treated as a
// stop string, they were dropped and the text no longer matched the delivered ids.
TEST(SequenceStop, AnEosAfterAnIncompleteCharacterFlushesItsBytes) {
  KVSPLIT_REQUIRE_MODELS();
  auto tok = model::load_tokenizer(testing::model_path("tok512.bin"), 512);
  ASSERT_TRUE(tok.ok());
  model::StreamDecoder ref(**tok, 1);
  std::string two = ref.push(3 + 0xE6);
  two += ref.push(3 + 0x97);
  two += ref.flush();
  ASSERT_FALSE(two.empty());
  auto [text, reason] = run(**tok, 3 + 0xA5, {3 + 0xE6, 3 + 0x97, kEos});
  EXPECT_EQ(reason, FinishReason::kStop);
  EXPECT_EQ(text, two);
}

}  // namespace
}  // namespace kvsplit::sched
