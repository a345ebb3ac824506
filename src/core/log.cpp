#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("KILN_LOG");
  if (v == nullptr) return LogLevel::kWarn;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  if (!std::strcmp(v, "info")) return LogLevel::kInfo;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  return LogLevel::kWarn;
}

std::atomic<int> g_level{int(level_from_env())};

}  // namespace

LogLevel log_level() { return LogLevel(g_level.load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { g_level.store(int(level)); }

void log_line(LogLevel level, const std::string& message) {
  static const char* kNames[] = {"error", "warn", "info", "debug"};
  std::fprintf(stderr, "kiln %s: %s\n", kNames[int(level)], message.c_str());
}

}  // namespace kiln
