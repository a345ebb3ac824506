// Minimal leveled logging to stderr. Level from KILN_LOG (error|warn|info|debug).
#pragma once

#include <sstream>
#include <string>

namespace kiln {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_line(LogLevel level, const std::string& message);

}  // namespace kiln

#define KILN_LOG(level, expr)                                                  \
  do {                                                                         \
    if (::kiln::LogLevel::level <= ::kiln::log_level()) {                      \
      std::ostringstream kiln_log_os_;                                         \
      kiln_log_os_ << expr;                                                    \
      ::kiln::log_line(::kiln::LogLevel::level, kiln_log_os_.str());           \
    }                                                                          \
  } while (0)
