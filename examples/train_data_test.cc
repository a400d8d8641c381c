#include "examples/train_data.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ze {
namespace examples {
namespace {

TEST(AdditionTaskTest, WritesReversedPaddedSums) {
  auto task = AdditionTask::Create(3, 16, 0);
  ASSERT_TRUE(task.ok()) << task.status();
  const AdditionTask::Problem problem{123, 45};
  const std::vector<int32_t> prompt = task->PromptTokens(problem);
  EXPECT_EQ(std::string(prompt.begin(), prompt.end()), "123+045=");
  EXPECT_EQ(task->AnswerText(problem), "8610\n");
  EXPECT_EQ(task->AnswerText({999, 999}), "8991\n");
  EXPECT_EQ(task->ParseAnswer("8610\n"), 168);
  EXPECT_EQ(task->ParseAnswer("8991\n"), 1998);
  EXPECT_FALSE(task->ParseAnswer("861\n").has_value());
  EXPECT_FALSE(task->ParseAnswer("86100").has_value());
  EXPECT_FALSE(task->ParseAnswer("8a10\n").has_value());
  EXPECT_EQ(task->problem_length(), 13);
  EXPECT_EQ(AdditionTask::Describe(problem), "123+45");
}

TEST(AdditionTaskTest, RejectsBadSizesNamingTheFlag) {
  auto digits = AdditionTask::Create(0, 16, 0);
  ASSERT_FALSE(digits.ok());
  EXPECT_NE(digits.status().message().find("--digits=0"), std::string::npos);
  auto held_out = AdditionTask::Create(1, 51, 0);
  ASSERT_FALSE(held_out.ok());
  EXPECT_NE(held_out.status().message().find("--eval_problems=51"),
            std::string::npos);
}

// Decodes a row back into problems; checks the targets and returns the
// problems whose answer was wholly inside the row.
std::vector<AdditionTask::Problem> CheckRow(
    const AdditionTask& task, const std::vector<int32_t>& tokens,
    const std::vector<int32_t>& targets) {
  std::string text(tokens.begin(), tokens.end());
  std::vector<AdditionTask::Problem> problems;
  const int digits = task.digits();
  for (size_t start = 0; start + task.problem_length() <= text.size();
       start += task.problem_length()) {
    AdditionTask::Problem problem{
        std::stoll(text.substr(start, digits)),
        std::stoll(text.substr(start + digits + 1, digits))};
    EXPECT_EQ(text[start + digits], '+');
    EXPECT_EQ(text[start + 2 * digits + 1], '=');
    EXPECT_EQ(text.substr(start + 2 * digits + 2, digits + 2),
              task.AnswerText(problem));
    for (int i = 0; i < task.problem_length(); ++i) {
      // Targets predict the answer characters (and the newline) only: the
      // position before each of them, that is from '=' on.
      const int32_t target = targets[start + i];
      if (i >= 2 * digits + 1 && i < task.problem_length() - 1) {
        EXPECT_EQ(target, text[start + i + 1]) << text << " at " << start + i;
      } else {
        EXPECT_EQ(target, kIgnoredTarget) << text << " at " << start + i;
      }
    }
    problems.push_back(problem);
  }
  return problems;
}

TEST(AdditionTaskTest, RowsAreDeterministicMaskedAndNeverHeldOut) {
  // One digit: 100 problems, 40 held out, so training rows meet held-out
  // candidates constantly and must skip every one.
  auto task = AdditionTask::Create(1, 40, 7);
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_EQ(task->held_out().size(), 40u);
  std::set<std::pair<int64_t, int64_t>> held_out;
  for (const auto& problem : task->held_out()) {
    EXPECT_TRUE(task->IsHeldOut(problem));
    held_out.insert({problem.a, problem.b});
  }
  EXPECT_EQ(held_out.size(), 40u);  // distinct
  const int64_t seq = 40;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int64_t sample = 0; sample < 200; ++sample) {
    std::vector<int32_t> tokens(seq), targets(seq), again(seq), again_t(seq);
    task->FillSample(sample, seq, tokens.data(), targets.data());
    task->FillSample(sample, seq, again.data(), again_t.data());
    EXPECT_EQ(tokens, again);
    EXPECT_EQ(targets, again_t);
    for (const auto& problem : CheckRow(*task, tokens, targets)) {
      EXPECT_EQ(held_out.count({problem.a, problem.b}), 0u)
          << problem.a << "+" << problem.b << " is held out";
      seen.insert({problem.a, problem.b});
    }
  }
  // Training covers the other 60 problems.
  EXPECT_EQ(seen.size(), 60u);
}

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                             : "/tmp") +
      "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(TokenCorpusTest, TextFileIsBytesWithAValidationTail) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + i % 26);
  const std::string path = WriteFile("corpus.txt", text);
  auto corpus = TokenCorpus::FromTextFile(path, 8);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_TRUE((*corpus)->is_text());
  EXPECT_EQ((*corpus)->vocab_size(), 256);
  EXPECT_EQ((*corpus)->training_tokens(), 900);
  std::vector<int32_t> tokens(8), targets(8);
  for (int64_t sample = 0; sample < 50; ++sample) {
    (*corpus)->FillSample(sample, 8, tokens.data(), targets.data());
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(targets[t], 'a' + (tokens[t] - 'a' + 1) % 26);
    }
  }
  (*corpus)->FillValidation(0, 4, 8, tokens.data(), targets.data());
  EXPECT_EQ(tokens[0], 'a' + 900 % 26);
  EXPECT_EQ(
      (*corpus)->ValidationTokens(0, 3),
      (std::vector<int32_t>{'a' + 900 % 26, 'a' + 901 % 26, 'a' + 902 % 26}));
}

TEST(TokenCorpusTest, TokenFileIsLittleEndianUint16) {
  std::string bytes;
  for (int i = 0; i < 400; ++i) {
    const int token = (i * 37) % 1000;
    bytes += static_cast<char>(token & 0xff);
    bytes += static_cast<char>(token >> 8);
  }
  const std::string path = WriteFile("tokens.bin", bytes);
  auto corpus = TokenCorpus::FromTokenFile(path, 8);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_FALSE((*corpus)->is_text());
  EXPECT_EQ((*corpus)->size(), 400);
  EXPECT_EQ((*corpus)->vocab_size(), 999 + 1);
  EXPECT_EQ((*corpus)->ValidationTokens(0, 1)[0], (360 * 37) % 1000);
}

TEST(TokenCorpusTest, Token32FileIsLittleEndianUint32) {
  // Ids above 65,535 (a 128k or 152k vocabulary) in every byte position.
  std::string bytes;
  auto token_at = [](int i) { return (i * 40503) % 151936; };
  for (int i = 0; i < 400; ++i) {
    const uint32_t token = token_at(i);
    for (int b = 0; b < 4; ++b) bytes += static_cast<char>(token >> (8 * b));
  }
  const std::string path = WriteFile("tokens32.bin", bytes);
  auto corpus =
      TokenCorpus::FromTokenFile(path, 8, TokenCorpus::TokenWidth::kUint32);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_FALSE((*corpus)->is_text());
  EXPECT_EQ((*corpus)->bytes_per_token(), 4);
  EXPECT_EQ((*corpus)->size(), 400);
  int largest = 0;
  for (int i = 0; i < 400; ++i) largest = std::max(largest, token_at(i));
  EXPECT_GT(largest, 65535);
  EXPECT_EQ((*corpus)->vocab_size(), largest + 1);
  EXPECT_EQ((*corpus)->ValidationTokens(0, 2),
            (std::vector<int32_t>{token_at(360), token_at(361)}));
  // Every training window is a run of consecutive file tokens.
  std::vector<int32_t> tokens(8), targets(8);
  for (int64_t sample = 0; sample < 20; ++sample) {
    (*corpus)->FillSample(sample, 8, tokens.data(), targets.data());
    int start = -1;
    for (int i = 0; i < 400 && start < 0; ++i) {
      if (token_at(i) == tokens[0] && token_at(i + 1) == tokens[1]) start = i;
    }
    ASSERT_GE(start, 0);
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(tokens[t], token_at(start + t));
      EXPECT_EQ(targets[t], token_at(start + t + 1));
    }
  }
}

TEST(TokenCorpusTest, BadToken32FilesAreNamed) {
  const std::string ragged = WriteFile("ragged32.bin", std::string(402, 'x'));
  auto ragged_size =
      TokenCorpus::FromTokenFile(ragged, 8, TokenCorpus::TokenWidth::kUint32);
  ASSERT_FALSE(ragged_size.ok());
  EXPECT_NE(ragged_size.status().message().find("not a multiple of 4"),
            std::string::npos)
      << ragged_size.status();
  EXPECT_NE(ragged_size.status().message().find(ragged), std::string::npos);
  // 100 tokens, the 50th 2^31: no int32 holds it.
  std::string bytes(400, '\0');
  bytes[4 * 50 + 3] = static_cast<char>(0x80);
  const std::string huge = WriteFile("huge32.bin", bytes);
  auto too_large =
      TokenCorpus::FromTokenFile(huge, 8, TokenCorpus::TokenWidth::kUint32);
  ASSERT_FALSE(too_large.ok());
  EXPECT_NE(too_large.status().message().find("token 50 is 2147483648"),
            std::string::npos)
      << too_large.status();
  EXPECT_NE(too_large.status().message().find(huge), std::string::npos);
}

TEST(TokenCorpusTest, BadFilesAreNamed) {
  auto missing = TokenCorpus::FromTextFile("/nonexistent/x.txt", 8);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/x.txt"),
            std::string::npos);
  const std::string odd = WriteFile("odd.bin", std::string(201, 'x'));
  auto odd_size = TokenCorpus::FromTokenFile(odd, 8);
  ASSERT_FALSE(odd_size.ok());
  EXPECT_NE(odd_size.status().message().find("not a multiple of 2"),
            std::string::npos);
  EXPECT_NE(odd_size.status().message().find(odd), std::string::npos);
  const std::string short_file = WriteFile("short.txt", std::string(89, 'x'));
  auto too_short = TokenCorpus::FromTextFile(short_file, 8);
  ASSERT_FALSE(too_short.ok());
  EXPECT_NE(too_short.status().message().find("needs at least 90"),
            std::string::npos)
      << too_short.status();
}

}  // namespace
}  // namespace examples
}  // namespace ze
