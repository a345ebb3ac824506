// Per-kernel GPU time of any CUDA process, without a profiler (the GPU machines have no
// nsys): a library to preload, which turns on CUPTI's activity records of every kernel
// (CUDA-graph replays included) and, when the process exits, prints the time per kernel
// name, largest first:
//   LD_PRELOAD=build-gpu/tests/libkiln_kernel_trace.so build-gpu/bin/kiln generate
//     --model configs/Qwen3-30B-A3B.json --load-format dummy --backend cuda --max-tokens 256
//     --ignore-eos
// (one command line; tests/CMakeLists.txt builds it with the GPU tests when CUPTI is found)
// KILN_KERNEL_TRACE_OUT=FILE writes the table there instead of stderr. Times are each
// kernel's own (start to end on the GPU), summed over devices; gaps between kernels (launch
// latency, host work) are the difference between "kernels" and the wall time of a step.
// With programmatic dependent launches (kiln's decode kernels on SM 9.0+) a kernel starts
// while the one before it ends and its time includes that wait, so the sum exceeds the
// wall time: run with KILN_PDL=0 for each kernel's own cost. A process that ran no kernel
// writes nothing, so it may be preloaded into a wrapper script (scripts/gpu-serve-sweep:
// the server's table, not its client's); two processes that run kernels would write over
// each other's file.
// KILN_KERNEL_TRACE_START_FILE=FILE records nothing until FILE exists (polled every 50 ms):
// a server's start-up and warm-up (thousands of launches, graph recordings) run untraced,
// and a script creates the file before the requests it wants measured.
// KILN_KERNEL_TRACE_TIMELINE=FILE also writes every kernel (up to 4 M) as a line "device
// stream start_ns end_ns name", in the order CUPTI delivered them: where a step's time goes
// between kernels, which the table cannot say (with dependent launches, a kernel's cost in
// the step is its end minus the end of the kernel before it on its stream);
// scripts/kernel-timeline reads it. CUPTI lengthens host work (the gap between one-stream
// steps was ~0.3 ms traced, where the engine's untraced launch phase is ~0.03 ms): time the
// host's gaps without it.
#include <cupti.h>

#include <cxxabi.h>
#include <pthread.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Stat {
  uint64_t count = 0, ns = 0;
};

std::mutex mu;
std::map<std::string, Stat>* stats = nullptr;  // leaked on purpose: read at exit
struct Event {
  uint32_t device, stream;
  uint64_t start, end;
  const std::string* name;  // a key of *stats
};
std::vector<Event>* timeline = nullptr;  // KILN_KERNEL_TRACE_TIMELINE only
constexpr size_t kMaxEvents = size_t(4) << 20;
uint64_t first_start = UINT64_MAX, last_end = 0;

constexpr size_t kBufferBytes = size_t(8) << 20;

std::string readable(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  // "(anonymous namespace)::" would end the name at its parenthesis below.
  for (const std::string anon = "(anonymous namespace)::"; s.find(anon) != std::string::npos;)
    s.erase(s.find(anon), anon.size());
  // The kernel and its template arguments, not the parameter list.
  if (const size_t paren = s.find('('); paren != std::string::npos && paren > 0) s.resize(paren);
  return s.size() > 110 ? s.substr(0, 107) + "..." : s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    const auto it = stats->try_emplace(readable(k->name)).first;
    Stat& s = it->second;
    if (timeline && timeline->size() < kMaxEvents)
      timeline->push_back({k->deviceId, k->streamId, k->start, k->end, &it->first});
    ++s.count;
    s.ns += k->end - k->start;
    first_start = std::min<uint64_t>(first_start, k->start);
    last_end = std::max<uint64_t>(last_end, k->end);
  }
  std::free(buffer);
}

void report() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(mu);
  if (stats->empty()) return;  // a process that ran no kernel (a wrapper shell, a client) writes nothing
  const char* path = std::getenv("KILN_KERNEL_TRACE_OUT");
  FILE* f = path && *path ? std::fopen(path, "w") : nullptr;
  FILE* out = f ? f : stderr;
  std::vector<std::pair<std::string, Stat>> rows(stats->begin(), stats->end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  uint64_t total = 0, launches = 0;
  for (const auto& [name, s] : rows) {
    total += s.ns;
    launches += s.count;
  }
  std::fprintf(out, "kernel_trace: %llu kernels, %.3f ms of kernel time, %.3f ms from the first start to the last end\n",
               (unsigned long long)launches, double(total) / 1e6,
               last_end > first_start ? double(last_end - first_start) / 1e6 : 0.0);
  std::fprintf(out, "%12s %10s %10s %7s  %s\n", "total ms", "count", "mean us", "share", "kernel");
  for (const auto& [name, s] : rows)
    std::fprintf(out, "%12.3f %10llu %10.2f %6.1f%%  %s\n", double(s.ns) / 1e6, (unsigned long long)s.count,
                 double(s.ns) / 1e3 / double(std::max<uint64_t>(s.count, 1)),
                 total ? 100.0 * double(s.ns) / double(total) : 0.0, name.c_str());
  if (f) std::fclose(f);
  const char* tpath = std::getenv("KILN_KERNEL_TRACE_TIMELINE");
  if (timeline && tpath && *tpath) {
    if (FILE* t = std::fopen(tpath, "w")) {
      for (const Event& e : *timeline)
        std::fprintf(t, "%u %u %llu %llu %s\n", e.device, e.stream, (unsigned long long)e.start,
                     (unsigned long long)e.end, e.name->c_str());
      std::fclose(t);
    }
  }
}

// Runs when the library is loaded (LD_PRELOAD), before main.
struct Start {
  Start() {
    stats = new std::map<std::string, Stat>();
    if (const char* t = std::getenv("KILN_KERNEL_TRACE_TIMELINE"); t && *t) timeline = new std::vector<Event>();
    // CUPTI's threads, started here before main, must not take the signals the program
    // waits for on a thread of its own (kiln serve's SIGINT / SIGTERM): they inherit a
    // mask that blocks them.
    sigset_t stop, before;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, &before);
    struct Restore {
      sigset_t* mask;
      ~Restore() { pthread_sigmask(SIG_SETMASK, mask, nullptr); }
    } restore{&before};
    const char* start_file = std::getenv("KILN_KERNEL_TRACE_START_FILE");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        (!start_file && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)) {
      std::fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity records; nothing will be traced\n");
      return;
    }
    if (start_file) {  // (the thread inherits the blocked signals above)
      std::thread([path = std::string(start_file)] {
        while (access(path.c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
          std::fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity records; nothing will be traced\n");
      }).detach();
    }
    cuptiActivityFlushPeriod(250);  // ms: records reach us while the process runs, not only at exit
    std::atexit(report);
  }
} start;

}  // namespace
