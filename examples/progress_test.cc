#include "examples/progress.h"

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace ze {
namespace examples {
namespace {

TEST(ProgressTest, FlopsPerTokenIsSixNPlusAttention) {
  // GPT-2 124M at T = 1024: 6 * 124e6 + 12 * 12 * 768 * 1024.
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(124e6, 12, 768, 1024),
                   6 * 124e6 + 12.0 * 12 * 768 * 1024);
}

TEST(ProgressTest, MfuIsModelFlopsOverPeak) {
  // 1e9 FLOPs per token at 400k tokens/s over 2 devices of 1e15 FLOP/s: 20%.
  EXPECT_DOUBLE_EQ(ModelFlopsUtilization(1e9, 4e5, 2, 1e15), 0.2);
  EXPECT_EQ(ModelFlopsUtilization(1e9, 0, 2, 1e15), 0);
  EXPECT_EQ(ModelFlopsUtilization(1e9, 4e5, 0, 1e15), 0);
}

TEST(ProgressTest, EtaExtrapolatesTheMeanPace) {
  EXPECT_FALSE(EstimateRemainingSeconds(0, 100, 5).has_value());
  // 25 steps in 10 s: 75 left take 30 s.
  EXPECT_DOUBLE_EQ(*EstimateRemainingSeconds(25, 100, 10), 30);
  EXPECT_DOUBLE_EQ(*EstimateRemainingSeconds(100, 100, 10), 0);
  EXPECT_DOUBLE_EQ(*EstimateRemainingSeconds(120, 100, 10), 0);
}

TEST(ProgressTest, DurationsUseAtMostTwoUnits) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(-3), "0s");
  EXPECT_EQ(FormatDuration(42.9), "42s");
  EXPECT_EQ(FormatDuration(185), "3m05s");
  EXPECT_EQ(FormatDuration(2 * 3600 + 7 * 60 + 59), "2h07m");
}

TEST(ProgressTest, BytesKeepThreeSignificantFigures) {
  EXPECT_EQ(FormatBytes(812), "812 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(15 * 1024 * 1024 + 200 * 1024), "15.2 MiB");
  EXPECT_EQ(FormatBytes(int64_t{1} << 30), "1.00 GiB");
}

TEST(ProgressTest, LineShowsWhatIsKnown) {
  ProgressSnapshot snapshot;
  snapshot.step = 120;
  snapshot.total_steps = 600;
  snapshot.loss = 1.23456;
  snapshot.tokens_per_second = 15234;
  snapshot.memory_allocated_bytes = 3 << 20;
  snapshot.memory_peak_bytes = 5 << 20;
  EXPECT_EQ(FormatProgressLine(snapshot),
            "step 120/600 | loss 1.2346 | 15.2k tok/s | mem 3.00 MiB (peak "
            "5.00 MiB)");
  snapshot.mfu = 0.4134;
  snapshot.remaining_seconds = 185;
  EXPECT_EQ(FormatProgressLine(snapshot),
            "step 120/600 | loss 1.2346 | 15.2k tok/s | MFU 41.3% | ETA "
            "3m05s | mem 3.00 MiB (peak 5.00 MiB)");
}

std::string ReadBack(std::FILE* file) {
  std::rewind(file);
  std::string text;
  char buffer[256];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    text.append(buffer, n);
  }
  return text;
}

TEST(ProgressTest, InPlaceRedrawsOneLine) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressPrinter printer(file, /*in_place=*/true);
  ProgressSnapshot snapshot;
  snapshot.total_steps = 2;
  snapshot.step = 1;
  printer.Update(snapshot);
  snapshot.step = 2;
  printer.Update(snapshot);
  printer.Finish();
  printer.Finish();  // a second Finish adds nothing
  const std::string text = ReadBack(file);
  std::fclose(file);
  EXPECT_EQ(text,
            "\rstep 1/2 | loss 0.0000 | 0 tok/s | mem 0 B (peak 0 B)\x1b[K"
            "\rstep 2/2 | loss 0.0000 | 0 tok/s | mem 0 B (peak 0 B)\x1b[K\n");
}

TEST(ProgressTest, LogWritesOneLinePerUpdate) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressPrinter printer(file, /*in_place=*/false);
  ProgressSnapshot snapshot;
  snapshot.total_steps = 2;
  snapshot.step = 1;
  printer.Update(snapshot);
  snapshot.step = 2;
  printer.Update(snapshot);
  printer.Finish();
  const std::string text = ReadBack(file);
  std::fclose(file);
  EXPECT_EQ(text,
            "step 1/2 | loss 0.0000 | 0 tok/s | mem 0 B (peak 0 B)\n"
            "step 2/2 | loss 0.0000 | 0 tok/s | mem 0 B (peak 0 B)\n");
}

}  // namespace
}  // namespace examples
}  // namespace ze
