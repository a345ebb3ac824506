#include "core/thread_pool.h"

#include <algorithm>

namespace kiln {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int chunks = int(std::min<int64_t>(max_chunks, int64_t(size()) * 4));
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  auto run_chunk = [&](int c) {
    const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    if (b < e) fn(b, e);
  };
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  next_chunk_ = 0;
  done_chunks_ = 0;
  ++generation_;
  cv_work_.notify_all();
  while (next_chunk_ < job_chunks_) {
    const int c = next_chunk_++;
    lock.unlock();
    run_chunk(c);
    lock.lock();
    ++done_chunks_;
  }
  cv_done_.wait(lock, [&] { return done_chunks_ == job_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_work_.wait(lock, [&] { return stop_ || (job_ != nullptr && generation_ != seen); });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_chunk_ < job_chunks_) {
      const int c = next_chunk_++;
      const auto* fn = job_;
      const int64_t n = job_n_;
      const int chunks = job_chunks_;
      lock.unlock();
      const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
      if (b < e) (*fn)(b, e);
      lock.lock();
      if (++done_chunks_ == job_chunks_) cv_done_.notify_all();
    }
  }
}

}  // namespace kiln
