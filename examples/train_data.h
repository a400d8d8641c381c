// train_gpt's data: the built-in addition task (the default, judged by
// exact-match accuracy on held-out problems) and token corpora read from a
// file (any text file as bytes, a nanoGPT uint16 token file, or a uint32
// token file for vocabularies above 65,535, as tools/write_tokens.py writes).
//
// Every source fills the rows of the global sample sequence: row `sample`
// depends only on that number, so rank r of a W-rank run that reads samples
// ((step * A + m) * W + r) * B + i trains exactly as one rank reading all of
// them would, at any world size.
#ifndef ZE_EXAMPLES_TRAIN_DATA_H_
#define ZE_EXAMPLES_TRAIN_DATA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ze {
namespace examples {

// A target that the loss does not count (GptModel::ForwardLoss ignores
// targets < 0).
inline constexpr int32_t kIgnoredTarget = -1;

// Multi-digit addition as text, one problem per line, operands zero-padded
// and the sum written least significant digit first, zero-padded to
// digits + 1 (so every problem has the same length):
//   123+045=8610\n       (123 + 45 = 168; "8610" is 0168 reversed)
// Reversed, each answer digit depends only on the operands' digits at its
// place and the carry from the digit just produced, which a small
// transformer learns far faster than sums written most significant digit
// first (there the first digit already needs every carry).
//
// A training row packs consecutive problems (the row starts at a problem's
// start); only the answer digits and the newline are targets, since the
// operands are random and cannot be predicted. A fixed set of held-out
// problems, drawn with their own seed, is never used for training.
class AdditionTask {
 public:
  struct Problem {
    int64_t a = 0;
    int64_t b = 0;
  };

  // digits in [1, 9]; held_out in [1, 10^(2 digits) / 2]. InvalidArgument
  // naming --digits or --eval_problems otherwise.
  static absl::StatusOr<AdditionTask> Create(int digits, int held_out,
                                             uint64_t seed);

  int digits() const { return digits_; }
  // Characters of one problem: 2 digits + 1 ('+') + 1 ('=') + digits + 1
  // (the sum) + 1 ('\n').
  int64_t problem_length() const { return 3 * digits_ + 4; }
  // "123+045=" as byte tokens.
  std::vector<int32_t> PromptTokens(const Problem& problem) const;
  // "8610\n": the reversed sum and the newline, what the model must write.
  std::string AnswerText(const Problem& problem) const;
  // The sum that generated answer text stands for ("8610\n" -> 168), or
  // nullopt when it is not digits + 1 digits followed by a newline.
  std::optional<int64_t> ParseAnswer(const std::string& generated) const;
  // "123+45" for people.
  static std::string Describe(const Problem& problem);

  const std::vector<Problem>& held_out() const { return held_out_; }
  bool IsHeldOut(const Problem& problem) const;

  // Row `sample` of the training data: seq byte tokens and their next-token
  // targets (kIgnoredTarget except where the next character is part of an
  // answer). Never contains a held-out problem.
  void FillSample(int64_t sample, int64_t seq, int32_t* tokens,
                  int32_t* targets) const;

 private:
  AdditionTask(int digits, uint64_t seed) : digits_(digits), seed_(seed) {}
  // A problem drawn from (stream, counter): uniform over all pairs.
  Problem Draw(uint64_t stream, uint64_t counter) const;

  int digits_;
  uint64_t seed_;
  int64_t limit_ = 0;  // 10^digits
  std::vector<Problem> held_out_;
  std::vector<uint64_t> held_out_keys_;  // a * limit + b, sorted
};

// A sequence of tokens from a file, read through a read-only memory map
// (only the pages a row touches are read): the first 90% for training, the
// last 10% (at least seq + 1 tokens) for validation.
class TokenCorpus {
 public:
  // Any file as bytes: vocabulary 256.
  static absl::StatusOr<std::unique_ptr<TokenCorpus>> FromTextFile(
      const std::string& path, int64_t seq);
  // Bytes per token id in a token file, little-endian, no header.
  enum class TokenWidth {
    kUint16 = 2,  // nanoGPT's format (--data=tokens:PATH)
    kUint32 = 4,  // vocabularies above 65,535 (--data=tokens32:PATH)
  };
  // A token file: little-endian ids of `width`, no header. Its vocabulary
  // is one more than its largest token. InvalidArgument naming the file for
  // a size that is not a multiple of the width, or (uint32) an id above
  // 2^31 - 1, which no int32 token tensor holds.
  static absl::StatusOr<std::unique_ptr<TokenCorpus>> FromTokenFile(
      const std::string& path, int64_t seq,
      TokenWidth width = TokenWidth::kUint16);
  ~TokenCorpus();
  TokenCorpus(const TokenCorpus&) = delete;
  TokenCorpus& operator=(const TokenCorpus&) = delete;

  const std::string& path() const { return path_; }
  bool is_text() const { return bytes_per_token_ == 1; }
  // 1 (text), 2 (uint16) or 4 (uint32).
  int bytes_per_token() const { return bytes_per_token_; }
  int64_t size() const { return size_; }  // tokens
  int64_t vocab_size() const { return vocab_size_; }
  int64_t training_tokens() const { return validation_begin_; }

  // Row `sample`: a window at a position drawn from the sample number in the
  // training part; targets are the next tokens.
  void FillSample(int64_t sample, int64_t seq, int32_t* tokens,
                  int32_t* targets) const;
  // Validation window `index` of `count`, spread evenly over the
  // validation part.
  void FillValidation(int64_t index, int64_t count, int64_t seq,
                      int32_t* tokens, int32_t* targets) const;
  // Tokens [begin, begin + length) of the validation part (for a prompt).
  std::vector<int32_t> ValidationTokens(int64_t begin, int64_t length) const;

 private:
  TokenCorpus() = default;
  static absl::StatusOr<std::unique_ptr<TokenCorpus>> Open(
      const std::string& path, int bytes_per_token, int64_t seq);
  // Token `index` as stored (any width), and as the int32 the model takes.
  uint32_t RawAt(int64_t index) const;
  int32_t At(int64_t index) const;
  void FillWindow(int64_t begin, int64_t seq, int32_t* tokens,
                  int32_t* targets) const;

  std::string path_;
  int bytes_per_token_ = 1;              // 1, 2 or 4
  const unsigned char* data_ = nullptr;  // the mapping
  size_t mapped_bytes_ = 0;
  int64_t size_ = 0;
  int64_t validation_begin_ = 0;
  int64_t vocab_size_ = 256;
};

// A 64-bit mixer (splitmix64's finaliser): the counter-based source of
// every random choice here.
uint64_t Mix(uint64_t x);

}  // namespace examples
}  // namespace ze

#endif  // ZE_EXAMPLES_TRAIN_DATA_H_
