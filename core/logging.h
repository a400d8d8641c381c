// A small rank-aware logger.
//
//   ZE_LOG(INFO) << "loss " << loss;        // every rank, "[rank 2] I ..."
//   prefix ZE_LOG_RANK0(INFO) << "step " << step;  // only rank 0 prints
//
// The level comes from the environment variable ZE_LOG_LEVEL (DEBUG, INFO,
// WARNING, ERROR; default INFO). The rank prefix is set once the communicator
// is bootstrapped (SetLogRank); before that, lines carry no rank.
// Lines go to stderr, written whole under a lock, so ranks' lines interleave
// by line, not by character.
#ifndef ZE_CORE_LOGGING_H_
#define ZE_CORE_LOGGING_H_

#include <sstream>

namespace ze {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Sets the rank and world size shown in every line's prefix.
void SetLogRank(int rank, int world_size);
// Rank set by SetLogRank, or -1 if it was never called.
int LogRank();
// The minimum level printed; read from ZE_LOG_LEVEL on first use.
LogLevel MinLogLevel();
void SetMinLogLevel(LogLevel level);

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line, bool rank0_only);
  ~LogMessage() = default;
  // Writes the line (once) and disables the message, ending the loop in
  // ZE_LOG_IMPL_.
  void Flush();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace internal
}  // namespace ze

#define ZE_LOG_LEVEL_DEBUG ::ze::LogLevel::kDebug
#define ZE_LOG_LEVEL_INFO ::ze::LogLevel::kInfo
#define ZE_LOG_LEVEL_WARNING ::ze::LogLevel::kWarning
#define ZE_LOG_LEVEL_ERROR ::ze::LogLevel::kError

#define ZE_LOG_IMPL_(level, rank0_only)                                      \
  for (::ze::internal::LogMessage ze_log_message_(level, __FILE__, __LINE__, \
                                                  rank0_only);               \
       ze_log_message_.enabled(); ze_log_message_.Flush())                   \
  ze_log_message_.stream()

#define ZE_LOG(severity) ZE_LOG_IMPL_(ZE_LOG_LEVEL_##severity, false)
#define ZE_LOG_RANK0(severity) ZE_LOG_IMPL_(ZE_LOG_LEVEL_##severity, true)

#endif  // ZE_CORE_LOGGING_H_
