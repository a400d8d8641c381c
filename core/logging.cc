#include "core/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace ze {
namespace {

std::atomic<int> g_rank{-1};
std::atomic<int> g_world_size{0};
std::atomic<int> g_min_level{-1};

LogLevel ParseLevel(const char* text) {
  if (text == nullptr) return LogLevel::kInfo;
  std::string value(text);
  for (char& c : value) c = static_cast<char>(std::toupper(c));
  if (value == "DEBUG") return LogLevel::kDebug;
  if (value == "WARNING" || value == "WARN") return LogLevel::kWarning;
  if (value == "ERROR") return LogLevel::kError;
  return LogLevel::kInfo;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
  }
  return '?';
}

std::mutex& OutputMutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace

void SetLogRank(int rank, int world_size) {
  g_rank.store(rank);
  g_world_size.store(world_size);
}

int LogRank() { return g_rank.load(); }

LogLevel MinLogLevel() {
  int level = g_min_level.load();
  if (level < 0) {
    level = static_cast<int>(ParseLevel(std::getenv("ZE_LOG_LEVEL")));
    g_min_level.store(level);
  }
  return static_cast<LogLevel>(level);
}

void SetMinLogLevel(LogLevel level) {
  g_min_level.store(static_cast<int>(level));
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line,
                       bool rank0_only)
    : level_(level) {
  enabled_ = static_cast<int>(level) >= static_cast<int>(MinLogLevel());
  if (rank0_only && g_rank.load() > 0) enabled_ = false;
  if (!enabled_) return;
  const char* base = std::strrchr(file, '/');
  base = base == nullptr ? file : base + 1;
  const int rank = g_rank.load();
  if (rank >= 0) stream_ << "[rank " << rank << "] ";
  stream_ << LevelLetter(level) << " " << base << ":" << line << "] ";
}

void LogMessage::Flush() {
  if (!enabled_) return;
  enabled_ = false;
  std::string text = stream_.str();
  text.push_back('\n');
  std::lock_guard<std::mutex> lock(OutputMutex());
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace internal
}  // namespace ze
