#include "comm/local_group.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

namespace kiln::comm {

struct FailState {
  std::atomic<bool> failed{false};
  std::mutex m;
  std::string reason;

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(m);
    if (failed.load()) return;
    reason = why;
    failed.store(true);
  }
  [[noreturn]] void raise() {
    std::lock_guard<std::mutex> lock(m);
    throw CommAborted("communicator group aborted: " + reason);
  }
};

struct LocalGroup::State {
  int size = 0;
  std::shared_ptr<FailState> fail;
  std::mutex m;
  std::condition_variable cv;
  // The rendezvous: ranks arrive; the last one advances the generation.
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<const void*> published;  // per rank, this collective's buffer
  // Point to point: (from, to) -> messages in order.
  std::map<std::pair<int, int>, std::deque<std::vector<uint8_t>>> mail;

  // Waits, polling the failure state, until `done` (called under the lock) holds.
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred done) {
    while (!done()) {
      if (fail->failed.load()) {
        lock.unlock();
        fail->raise();
      }
      cv.wait_for(lock, kPollInterval);
    }
    if (fail->failed.load()) {
      lock.unlock();
      fail->raise();
    }
  }

  void barrier() {
    std::unique_lock<std::mutex> lock(m);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    }
    wait(lock, [&] { return generation != gen; });
  }
};

namespace {

bool summable(DType d) { return d == DType::kF32 || d == DType::kBF16; }

float load(DType d, const void* p, int64_t i) {
  return d == DType::kF32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

void store(DType d, void* p, int64_t i, float v) {
  if (d == DType::kF32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
  }
}

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalGroup::State> s, int rank) : s_(std::move(s)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  std::string name() const override { return "local"; }

  void all_reduce(Tensor& t) override {
    check(t, "all_reduce");
    KILN_CHECK(summable(t.dtype)) << "all_reduce: dtype " << dtype_name(t.dtype);
    const int64_t n = t.numel();
    std::vector<float> sum(size_t(n), 0.0f);
    publish(t.data);
    for (int r = 0; r < size(); ++r)
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += load(t.dtype, s_->published[size_t(r)], i);
    s_->barrier();  // everyone has read every buffer
    for (int64_t i = 0; i < n; ++i) store(t.dtype, t.data, i, sum[size_t(i)]);
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check(in, "all_gather in");
    check(out, "all_gather out");
    KILN_CHECK(in.dtype == out.dtype && out.numel() == in.numel() * size())
        << "all_gather: out " << out.shape << " vs " << size() << " x in " << in.shape;
    const size_t bytes = in.nbytes();
    publish(in.data);
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<uint8_t*>(out.data) + size_t(r) * bytes, s_->published[size_t(r)], bytes);
    s_->barrier();
  }

  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check(in, "reduce_scatter in");
    check(out, "reduce_scatter out");
    KILN_CHECK(summable(in.dtype) && in.dtype == out.dtype && in.numel() == out.numel() * size())
        << "reduce_scatter: in " << in.shape << " vs " << size() << " x out " << out.shape;
    const int64_t n = out.numel();
    std::vector<float> sum(size_t(n), 0.0f);
    publish(in.data);
    for (int r = 0; r < size(); ++r)
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += load(in.dtype, s_->published[size_t(r)], rank_ * n + i);
    s_->barrier();
    for (int64_t i = 0; i < n; ++i) store(out.dtype, out.data, i, sum[size_t(i)]);
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    check(in, "all_to_all in");
    check(out, "all_to_all out");
    KILN_CHECK(in.dtype == out.dtype && in.numel() == out.numel() && in.numel() % size() == 0)
        << "all_to_all: in " << in.shape << " out " << out.shape << " over " << size() << " ranks";
    const size_t chunk = in.nbytes() / size_t(size());
    publish(in.data);
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<uint8_t*>(out.data) + size_t(r) * chunk,
                  static_cast<const uint8_t*>(s_->published[size_t(r)]) + size_t(rank_) * chunk, chunk);
    s_->barrier();
  }

  void broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    KILN_CHECK(root >= 0 && root < size()) << "broadcast: root " << root;
    publish(t.data);
    if (rank_ != root) std::memcpy(t.data, s_->published[size_t(root)], t.nbytes());
    s_->barrier();
  }

  void send(const Tensor& t, int peer) override {
    check(t, "send");
    KILN_CHECK(peer >= 0 && peer < size() && peer != rank_) << "send: peer " << peer;
    const auto* p = static_cast<const uint8_t*>(t.data);
    std::vector<uint8_t> msg(p, p + t.nbytes());
    std::lock_guard<std::mutex> lock(s_->m);
    s_->mail[{rank_, peer}].push_back(std::move(msg));
    s_->cv.notify_all();
  }

  void recv(Tensor& t, int peer) override {
    check(t, "recv");
    KILN_CHECK(peer >= 0 && peer < size() && peer != rank_) << "recv: peer " << peer;
    std::unique_lock<std::mutex> lock(s_->m);
    auto& box = s_->mail[{peer, rank_}];
    s_->wait(lock, [&] { return !box.empty(); });
    std::vector<uint8_t> msg = std::move(box.front());
    box.pop_front();
    lock.unlock();
    if (msg.size() != t.nbytes()) {
      const std::string why = "rank " + std::to_string(rank_) + " expected " + std::to_string(t.nbytes()) +
                              " bytes from rank " + std::to_string(peer) + ", got " + std::to_string(msg.size());
      abort(why);
      s_->fail->raise();
    }
    std::memcpy(t.data, msg.data(), msg.size());
  }

  void abort(const std::string& reason) override {
    s_->fail->fail(reason);
    std::lock_guard<std::mutex> lock(s_->m);
    s_->cv.notify_all();
  }

 private:
  void check(const Tensor& t, const char* what) const {
    KILN_CHECK(t.defined() && t.device == Device::kHost) << what << ": the local group takes host tensors";
  }
  // Publishes this rank's buffer and waits until every rank has published its own.
  void publish(const void* p) {
    if (s_->fail->failed.load()) s_->fail->raise();
    s_->published[size_t(rank_)] = p;
    s_->barrier();
  }

  std::shared_ptr<LocalGroup::State> s_;
  int rank_;
};

}  // namespace

LocalGroup::LocalGroup(int size, std::shared_ptr<FailState> fail) : state_(std::make_shared<State>()) {
  KILN_CHECK_GT(size, 0) << "LocalGroup size";
  state_->size = size;
  state_->fail = fail ? std::move(fail) : std::make_shared<FailState>();
  state_->published.assign(size_t(size), nullptr);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<LocalComm>(state_, r));
}

LocalGroup::~LocalGroup() = default;

int LocalGroup::size() const { return state_->size; }

Communicator& LocalGroup::rank(int rank) {
  KILN_CHECK(rank >= 0 && rank < size()) << "LocalGroup rank " << rank;
  return *ranks_[size_t(rank)];
}

std::shared_ptr<FailState> LocalGroup::fail_state() const { return state_->fail; }

}  // namespace kiln::comm
