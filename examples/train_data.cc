#include "examples/train_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ze {
namespace examples {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

// Streams of draws, so that training and held-out problems never share
// a counter.
constexpr uint64_t kHeldOutStream = 1;
constexpr uint64_t kTrainingStream = 2;

int64_t Power10(int digits) {
  int64_t value = 1;
  for (int i = 0; i < digits; ++i) value *= 10;
  return value;
}

}  // namespace

absl::StatusOr<AdditionTask> AdditionTask::Create(int digits, int held_out,
                                                  uint64_t seed) {
  if (digits < 1 || digits > 9) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--digits=", digits, ": the addition task takes 1 to 9 digits"));
  }
  AdditionTask task(digits, seed);
  task.limit_ = Power10(digits);
  const int64_t pairs = task.limit_ * task.limit_;
  if (held_out < 1 || held_out > pairs / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--eval_problems=", held_out, ": must be in [1, ", pairs / 2, "] for ",
        digits, "-digit addition (half of its ", pairs, " problems)"));
  }
  // Distinct problems, drawn in order until there are enough.
  for (uint64_t counter = 0; static_cast<int>(task.held_out_.size()) < held_out;
       ++counter) {
    const Problem problem = task.Draw(kHeldOutStream, counter);
    const uint64_t key = problem.a * task.limit_ + problem.b;
    auto it = std::lower_bound(task.held_out_keys_.begin(),
                               task.held_out_keys_.end(), key);
    if (it != task.held_out_keys_.end() && *it == key) continue;
    task.held_out_keys_.insert(it, key);
    task.held_out_.push_back(problem);
  }
  return task;
}

AdditionTask::Problem AdditionTask::Draw(uint64_t stream,
                                         uint64_t counter) const {
  const uint64_t bits = Mix(Mix(seed_ ^ (stream << 56)) + counter);
  // Each operand from its own 32 bits; reducing 2^32 values modulo
  // 10^digits favours the smaller remainders by at most 10^digits / 2^32
  // (0.2% at 7 digits), immaterial to the task.
  return Problem{static_cast<int64_t>((bits >> 32) % limit_),
                 static_cast<int64_t>((bits & 0xffffffffu) % limit_)};
}

bool AdditionTask::IsHeldOut(const Problem& problem) const {
  return std::binary_search(
      held_out_keys_.begin(), held_out_keys_.end(),
      static_cast<uint64_t>(problem.a * limit_ + problem.b));
}

std::vector<int32_t> AdditionTask::PromptTokens(const Problem& problem) const {
  const std::string text =
      absl::StrFormat("%0*d+%0*d=", digits_, problem.a, digits_, problem.b);
  return std::vector<int32_t>(text.begin(), text.end());
}

std::string AdditionTask::AnswerText(const Problem& problem) const {
  std::string sum = absl::StrFormat("%0*d", digits_ + 1, problem.a + problem.b);
  std::reverse(sum.begin(), sum.end());
  return sum + "\n";
}

std::optional<int64_t> AdditionTask::ParseAnswer(
    const std::string& generated) const {
  if (static_cast<int>(generated.size()) != digits_ + 2 ||
      generated.back() != '\n') {
    return std::nullopt;
  }
  int64_t value = 0;
  for (int i = digits_; i >= 0; --i) {
    if (generated[i] < '0' || generated[i] > '9') return std::nullopt;
    value = value * 10 + (generated[i] - '0');
  }
  return value;
}

std::string AdditionTask::Describe(const Problem& problem) {
  return absl::StrCat(problem.a, "+", problem.b);
}

void AdditionTask::FillSample(int64_t sample, int64_t seq, int32_t* tokens,
                              int32_t* targets) const {
  // seq + 1 characters of consecutive problems: tokens are [0, seq), targets
  // [1, seq]. `counted` marks the characters the loss may predict.
  std::string text;
  std::vector<bool> counted;
  const int prompt_length = 2 * digits_ + 2;
  // Each row draws from its own range of counters, 2^20 wide: far more
  // problems than any row holds.
  uint64_t counter = static_cast<uint64_t>(sample) << 20;
  while (static_cast<int64_t>(text.size()) < seq + 1) {
    Problem problem = Draw(kTrainingStream, counter++);
    while (IsHeldOut(problem)) problem = Draw(kTrainingStream, counter++);
    const std::vector<int32_t> prompt = PromptTokens(problem);
    text.append(prompt.begin(), prompt.end());
    counted.insert(counted.end(), prompt_length, false);
    const std::string answer = AnswerText(problem);
    text += answer;
    counted.insert(counted.end(), answer.size(), true);
  }
  for (int64_t t = 0; t < seq; ++t) {
    tokens[t] = static_cast<unsigned char>(text[t]);
    targets[t] = counted[t + 1] ? static_cast<unsigned char>(text[t + 1])
                                : kIgnoredTarget;
  }
}

absl::StatusOr<std::unique_ptr<TokenCorpus>> TokenCorpus::FromTextFile(
    const std::string& path, int64_t seq) {
  return Open(path, 1, seq);
}

absl::StatusOr<std::unique_ptr<TokenCorpus>> TokenCorpus::FromTokenFile(
    const std::string& path, int64_t seq, TokenWidth width) {
  return Open(path, static_cast<int>(width), seq);
}

absl::StatusOr<std::unique_ptr<TokenCorpus>> TokenCorpus::Open(
    const std::string& path, int bytes_per_token, int64_t seq) {
  const char* kind = bytes_per_token == 1   ? "text file"
                     : bytes_per_token == 2 ? "uint16 token file"
                                            : "uint32 token file";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("--data: cannot open the ", kind, " ", path, ": ",
                     std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message)
                           : absl::PermissionDeniedError(message);
  }
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("--data: ", path, " is not a regular file"));
  }
  const int64_t bytes = info.st_size;
  if (bytes % bytes_per_token != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "--data: ", path, " has ", bytes, " bytes, not a multiple of ",
        bytes_per_token, ": not a ", kind,
        bytes_per_token == 2
            ? " (nanoGPT's format: 2 bytes per token, no header)"
            : " (4 bytes per token, little-endian, no header)"));
  }
  const int64_t size = bytes / bytes_per_token;
  // Training and validation each need at least one window of seq + 1.
  const int64_t needed = 10 * (seq + 1);
  if (size < needed) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrFormat(
        "--data: %s holds %d tokens; --seq=%d needs at least %d (a window of "
        "seq + 1 in its last tenth, kept for validation)",
        path, size, seq, needed));
  }
  void* mapping = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);
  if (mapping == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("--data: mmap of ", path, ": ", std::strerror(error)));
  }
  std::unique_ptr<TokenCorpus> corpus(new TokenCorpus());
  corpus->path_ = path;
  corpus->bytes_per_token_ = bytes_per_token;
  corpus->data_ = static_cast<const unsigned char*>(mapping);
  corpus->mapped_bytes_ = bytes;
  corpus->size_ = size;
  corpus->validation_begin_ = size - size / 10;
  if (bytes_per_token > 1) {
    // One pass over the file to know the vocabulary the model needs (and,
    // for uint32, that every id fits the int32 token tensors).
    uint32_t largest = 0;
    for (int64_t i = 0; i < size; ++i) {
      const uint32_t token = corpus->RawAt(i);
      if (token > static_cast<uint32_t>(INT32_MAX)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--data: ", path, ": token ", i, " is ", token,
            ", above 2^31 - 1 (no vocabulary is that large: is it a uint32 "
            "token file?)"));
      }
      largest = std::max(largest, token);
    }
    corpus->vocab_size_ = static_cast<int64_t>(largest) + 1;
  }
  return corpus;
}

TokenCorpus::~TokenCorpus() {
  if (data_ != nullptr) {
    ::munmap(const_cast<unsigned char*>(data_), mapped_bytes_);
  }
}

uint32_t TokenCorpus::RawAt(int64_t index) const {
  // Little-endian whatever the host, byte by byte.
  const unsigned char* bytes = data_ + index * bytes_per_token_;
  uint32_t value = 0;
  for (int b = bytes_per_token_ - 1; b >= 0; --b)
    value = (value << 8) | bytes[b];
  return value;
}

int32_t TokenCorpus::At(int64_t index) const {
  // Open checked every id fits an int32.
  return static_cast<int32_t>(RawAt(index));
}

void TokenCorpus::FillWindow(int64_t begin, int64_t seq, int32_t* tokens,
                             int32_t* targets) const {
  for (int64_t t = 0; t < seq; ++t) {
    tokens[t] = At(begin + t);
    targets[t] = At(begin + t + 1);
  }
}

void TokenCorpus::FillSample(int64_t sample, int64_t seq, int32_t* tokens,
                             int32_t* targets) const {
  // A window of seq + 1 tokens lying wholly in the training part.
  const uint64_t starts = static_cast<uint64_t>(validation_begin_ - seq);
  FillWindow(static_cast<int64_t>(Mix(static_cast<uint64_t>(sample)) % starts),
             seq, tokens, targets);
}

void TokenCorpus::FillValidation(int64_t index, int64_t count, int64_t seq,
                                 int32_t* tokens, int32_t* targets) const {
  const int64_t starts = size_ - validation_begin_ - seq;  // >= 1
  FillWindow(validation_begin_ + starts * index / std::max<int64_t>(count, 1),
             seq, tokens, targets);
}

std::vector<int32_t> TokenCorpus::ValidationTokens(int64_t begin,
                                                   int64_t length) const {
  std::vector<int32_t> tokens;
  for (int64_t i = validation_begin_ + begin;
       i < size_ && static_cast<int64_t>(tokens.size()) < length; ++i) {
    tokens.push_back(At(i));
  }
  return tokens;
}

}  // namespace examples
}  // namespace ze
