#include "runtime/model_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/local_group.h"
#include "core/log.h"

namespace kiln::runtime {

// Ranks 1..n-1's threads: each waits for a job, runs it with its rank, reports done.
// The state lives in a shared block the threads hold too, so that a rank stuck in its
// job (the watchdog gave up on it) can be left behind without touching freed memory.
//
// Handing a step to a sleeping thread and back costs two wake-ups (tens of microseconds
// each on a server's idle cores), on every step's critical path: a rank that starts late
// holds up the others at their first collective. So with `spin` > 0 (device backends,
// whose host threads are otherwise idle during a step) a rank thread polls for the next
// job for up to `spin` after each one before it sleeps, and the caller polls for the
// ranks' ends for as long before it blocks; decode steps come back within that. With
// host backends (the CPU reference) the cores do the work: no polling.
struct ModelRunner::Threads {
  struct Shared {
    std::mutex m;
    std::condition_variable job_ready, job_done;
    std::atomic<uint64_t> generation{0};  // written under m; polled without it
    std::atomic<int> pending{0};          // likewise
    bool stop = false;
    std::shared_ptr<const std::function<void(int)>> job;
  };
  std::shared_ptr<Shared> s = std::make_shared<Shared>();
  std::vector<std::thread> threads;
  std::chrono::microseconds spin;

  Threads(int world, std::chrono::microseconds spin_for) : spin(spin_for) {
    for (int r = 1; r < world; ++r) threads.emplace_back([s = s, r, spin_for] { loop(*s, r, spin_for); });
  }
  ~Threads() {
    {
      std::lock_guard<std::mutex> lock(s->m);
      s->stop = true;
      s->generation.fetch_add(1);  // ends a poll
    }
    s->job_ready.notify_all();
    // A rank still in a job the watchdog gave up on is left to the process's exit.
    const bool stuck = !wait_idle(std::chrono::seconds(5));
    for (std::thread& t : threads) stuck ? t.detach() : t.join();
  }
  // Polls `done` for up to `limit`; whether it held.
  template <typename F>
  static bool poll(std::chrono::microseconds limit, F&& done) {
    if (limit.count() <= 0) return done();
    const auto until = std::chrono::steady_clock::now() + limit;
    for (int i = 0;; ++i) {
      if (done()) return true;
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return false;
    }
  }
  static void loop(Shared& s, int rank, std::chrono::microseconds spin) {
    uint64_t seen = 0;
    for (;;) {
      poll(spin, [&] { return s.generation.load(std::memory_order_acquire) != seen; });
      std::shared_ptr<const std::function<void(int)>> j;
      {
        std::unique_lock<std::mutex> lock(s.m);
        s.job_ready.wait(lock, [&] { return s.stop || s.generation.load() != seen; });
        if (s.stop) return;
        seen = s.generation.load();
        j = s.job;
      }
      (*j)(rank);
      std::lock_guard<std::mutex> lock(s.m);
      if (s.pending.fetch_sub(1) == 1) s.job_done.notify_all();
    }
  }
  // Waits up to `limit` for every rank's job to end; false if some rank is still in it.
  bool wait_idle(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(s->m);
    return s->job_done.wait_for(lock, limit, [&] { return s->pending.load() == 0; });
  }
  // fn(0) here, fn(r) on thread r, all at once; returns when every rank has finished, or
  // false when `give_up()` has held for `grace` and some rank is still in its job.
  bool run_all(std::shared_ptr<const std::function<void(int)>> fn, const std::function<bool()>& give_up,
               std::chrono::milliseconds grace) {
    {
      std::lock_guard<std::mutex> lock(s->m);
      s->job = fn;
      s->pending.store(int(threads.size()));
      s->generation.fetch_add(1, std::memory_order_release);
    }
    s->job_ready.notify_all();
    (*fn)(0);
    if (poll(spin, [&] { return s->pending.load(std::memory_order_acquire) == 0; })) return true;
    std::unique_lock<std::mutex> lock(s->m);
    auto since = std::chrono::steady_clock::time_point::max();
    while (!s->job_done.wait_for(lock, std::chrono::milliseconds(100), [&] { return s->pending.load() == 0; })) {
      if (since == std::chrono::steady_clock::time_point::max() && give_up()) since = std::chrono::steady_clock::now();
      if (std::chrono::steady_clock::now() - since > grace) return false;
    }
    return true;
  }
};

// The watchdog: a thread that, while a step is in flight, aborts the world when no rank
// has moved for the timeout (comm/progress.h), naming the rank that holds the others up.
struct ModelRunner::Watchdog {
  std::mutex m;
  std::condition_variable wake;
  bool stop = false;
  std::atomic<bool> fired{false};
  std::string reason;  // the abort's, under m
  std::thread thread;

  Watchdog(std::shared_ptr<comm::ProgressBoard> board, double timeout_s, std::function<void(const std::string&)> abort) {
    thread = std::thread([this, board = std::move(board), timeout_s, abort = std::move(abort)] {
      std::unique_lock<std::mutex> lock(m);
      while (!stop) {
        wake.wait_for(lock, std::chrono::milliseconds(100));
        if (stop || fired.load() || board->idle_seconds() < timeout_s) continue;
        reason = board->describe_stall();
        fired.store(true);
        lock.unlock();
        KILN_LOG(kError, reason << "; aborting every rank");
        abort(reason);
        lock.lock();
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }
};

Result<CommWorld> local_comm_world(const std::vector<ops::Backend*>& backends, const ParallelConfig& parallel) {
  const int world = parallel.world(), tp = parallel.tensor_parallel;
  for (ops::Backend* b : backends) {
    if (b->alloc(DType::kF32, {1}).device != Device::kHost) {
      return unsupported("the " + b->name() + " backend's tensors are not in host memory: several ranks on it "
                         "need NCCL (the in-process communicator moves host memory only)");
    }
  }
  struct Groups {
    std::unique_ptr<comm::LocalGroup> world;
    std::vector<std::unique_ptr<comm::LocalGroup>> tp;
  };
  auto g = std::make_shared<Groups>();
  g->world = std::make_unique<comm::LocalGroup>(world);
  for (int s = 0; s < parallel.pipeline_parallel; ++s)
    g->tp.push_back(std::make_unique<comm::LocalGroup>(tp, g->world->fail_state()));
  CommWorld c;
  for (int r = 0; r < world; ++r) {
    c.world.push_back(&g->world->rank(r));
    c.tp.push_back(&g->tp[size_t(r / tp)]->rank(r % tp));
  }
  comm::Communicator* any = c.world[0];
  c.abort = [any](const std::string& reason) { any->abort(reason); };  // the groups share one failure state
  c.owner = g;
  return c;
}

namespace {

// How long rank threads poll for the next job, and the caller for their ends, before
// sleeping (ModelRunner::Threads): 1 ms with device backends, none with host ones;
// KILN_RANK_SPIN_US overrides (0: never poll).
std::chrono::microseconds rank_spin(ops::Backend& b) {
  if (const char* v = std::getenv("KILN_RANK_SPIN_US"); v != nullptr && *v != '\0')
    return std::chrono::microseconds(std::max(0LL, std::atoll(v)));
  return std::chrono::microseconds(b.memory_info() ? 1000 : 0);
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(std::vector<std::unique_ptr<ops::Backend>> backends,
                                                         const ParallelConfig& parallel, const CommFactory& comms) {
  if (parallel.tensor_parallel < 1 || parallel.pipeline_parallel < 1) {
    return invalid_argument("tensor- and pipeline-parallel sizes must be at least 1");
  }
  if (int(backends.size()) != parallel.world()) {
    return invalid_argument(std::to_string(backends.size()) + " backends for " + std::to_string(parallel.world()) +
                            " ranks (tensor-parallel " + std::to_string(parallel.tensor_parallel) + " x pipeline " +
                            std::to_string(parallel.pipeline_parallel) + ")");
  }
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  r->parallel_ = parallel;
  std::vector<ops::Backend*> raw;
  for (auto& b : backends) {
    raw.push_back(b.get());
    r->ranks_.push_back({.backend = std::move(b), .model = {}});
  }
  if (parallel.world() > 1) {
    KILN_ASSIGN_OR_RETURN(r->comms_, comms ? comms(raw, parallel) : local_comm_world(raw, parallel));
    // Every collective reports to the board the watchdog reads.
    r->board_ = std::make_shared<comm::ProgressBoard>(parallel.world());
    for (int w = 0; w < parallel.world(); ++w) {
      for (auto* list : {&r->comms_.world, &r->comms_.tp}) {
        comm::Communicator*& c = (*list)[size_t(w)];
        if (c == nullptr) continue;
        r->watched_.push_back(std::make_unique<comm::WatchedCommunicator>(c, r->board_, w));
        c = r->watched_.back().get();
      }
    }
    if (parallel.watchdog_seconds > 0) {
      r->watchdog_ = std::make_unique<Watchdog>(r->board_, parallel.watchdog_seconds, r->comms_.abort);
    }
  }
  r->threads_ = std::make_unique<Threads>(parallel.world(), rank_spin(*raw[0]));
  return r;
}

ModelRunner::~ModelRunner() {
  // The recorded steps go first: NCCL's abort (the communicators' release, below as
  // comms_, or a watchdog's abort still in progress) waits until every CUDA graph that
  // captured one of the communicator's collectives is destroyed, so releasing them
  // after the communicators hung the process at exit once a decode step had been
  // recorded (seen on 2 H100s: `kiln serve --tensor-parallel-size 2` after serving).
  // A rank left stuck by an abort may still be using its backend: not touched.
  if (!stuck_) {
    for (Rank& r : ranks_) r.backend->release_step_memory();
  }
  watchdog_.reset();
  threads_.reset();
}

model::Shard ModelRunner::shard(int rank, int64_t n_layers) const { return shard_of(parallel_, rank, n_layers); }

model::Shard shard_of(const ParallelConfig& parallel, int rank, int64_t n_layers) {
  const int tp = parallel.tensor_parallel, pp = parallel.pipeline_parallel, stage = rank / tp;
  return {.tp_rank = rank % tp,
          .tp_size = tp,
          .expert_parallel = parallel.expert_parallel && tp > 1,
          .layer_begin = n_layers * stage / pp,
          .layer_end = n_layers * (stage + 1) / pp,
          .first_stage = stage == 0,
          .last_stage = stage == pp - 1};
}

Status ModelRunner::run(const std::function<void(int rank)>& fn, bool watched_step) {
  if (stuck_) return internal_error(*stuck_);
  // Per-call state, shared with the rank threads: a rank the watchdog gives up on may
  // still be inside its job when this returns.
  struct Outcome {
    std::vector<std::string> failed;
    std::vector<char> aborted;
  };
  auto out = std::make_shared<Outcome>();
  out->failed.resize(ranks_.size());
  out->aborted.assign(ranks_.size(), 0);
  if (board_ && watched_step) board_->step_begin();
  auto guarded = std::make_shared<const std::function<void(int)>>([this, out, &fn](int r) {
    try {
      backend(r).bind_thread();
      fn(r);
    } catch (const comm::CommAborted& e) {
      out->failed[size_t(r)] = e.what();
      out->aborted[size_t(r)] = 1;
    } catch (const std::exception& e) {
      out->failed[size_t(r)] = "rank " + std::to_string(r) + " failed: " + e.what();
      if (comms_.abort) comms_.abort(out->failed[size_t(r)]);
    }
    if (board_) board_->rank_done(r);
  });
  const auto gave_up = [this] { return watchdog_ && watchdog_->fired.load(); };
  if (!threads_->run_all(guarded, gave_up, kStuckGrace)) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(watchdog_->m);
      reason = watchdog_->reason;
    }
    stuck_ = reason + "; a rank did not return within " + std::to_string(kStuckGrace.count() / 1000) +
             " s of the abort: the runner cannot go on";
    return internal_error(*stuck_);
  }
  for (int pass = 0; pass < 2; ++pass)  // a rank's own failure before the aborts it caused
    for (size_t r = 0; r < out->failed.size(); ++r)
      if (!out->failed[r].empty() && out->aborted[r] == pass) return internal_error(out->failed[r]);
  return Status::Ok();
}

int64_t resolve_micro_batch_rows(const ParallelConfig& p, bool overlap_pays) {
  if (p.micro_batch_rows >= 0) return p.micro_batch_rows;
  if (const char* v = std::getenv("KILN_MICRO_BATCH_ROWS"); v != nullptr && *v != '\0') {
    return std::max(0LL, std::atoll(v));
  }
  return overlap_pays ? 1024 : 0;
}

Status ModelRunner::build(int64_t n_layers,
                          const std::function<Result<model::CausalLM>(int rank, const model::Shard&)>& build) {
  const int tp = parallel_.tensor_parallel, pp = parallel_.pipeline_parallel;
  if (pp > n_layers) {
    return invalid_argument("pipeline-parallel size " + std::to_string(pp) + " exceeds the " +
                            std::to_string(n_layers) + " layers");
  }
  std::vector<Status> status(ranks_.size());
  KILN_RETURN_IF_ERROR(run([&](int r) {
    auto m = build(r, shard(r, n_layers));
    if (!m.ok()) {
      status[size_t(r)] = world() > 1 ? m.status().with_context("rank " + std::to_string(r)) : m.status();
      return;
    }
    model::CausalLM& lm = ranks_[size_t(r)].model = std::move(m).value();
    if (tp > 1) {
      lm.tp = comms_.tp[size_t(r)];
      lm.micro_batch_rows = resolve_micro_batch_rows(parallel_, lm.tp->overlap_pays());
    }
    if (pp > 1) {
      lm.pp = comms_.world[size_t(r)];
      lm.prev_stage = r - tp;
      lm.next_stage = r + tp;
    }
  }));
  for (const Status& s : status) KILN_RETURN_IF_ERROR(s);
  if (tp > 1 && ranks_[0].model.micro_batch_rows > 0) {
    KILN_LOG(kInfo, "tensor parallel: steps of " << ranks_[0].model.micro_batch_rows
                                                 << " rows or more run as two micro-batches, each one's sums "
                                                    "moving while the other computes (KILN_MICRO_BATCH_ROWS=0: off)");
  }
  return Status::Ok();
}

std::vector<KvCache> ModelRunner::make_kv(int32_t n_blocks, int32_t block_size, KvCacheDtype dtype,
                                          int32_t n_state_slots) {
  std::vector<KvCache> kv;
  for (Rank& r : ranks_)
    kv.push_back(KvCache::create(*r.backend, r.model.kv_layouts(), n_blocks, block_size, dtype, n_state_slots));
  return kv;
}

bool ModelRunner::recurrent() const {
  for (const Rank& r : ranks_)
    if (KvCache::has_recurrent(r.model.kv_layouts())) return true;
  return false;
}

int64_t ModelRunner::state_bytes_per_row() const {
  int64_t most = 0;
  for (const Rank& r : ranks_)
    most = std::max(most, KvCache::bytes_per_state_slot(r.model.kv_layouts(), r.backend->activation_dtype()));
  return most;
}

int64_t ModelRunner::kv_bytes_per_token(KvCacheDtype dtype) const {
  int64_t most = 0;
  for (const Rank& r : ranks_)
    most = std::max(most, KvCache::bytes_per_token(r.model.kv_layouts(), r.backend->activation_dtype(), dtype));
  return most;
}

ops::BatchMeta batch_slice(const ops::BatchMeta& b, int32_t begin, int32_t end) {
  KILN_CHECK(b.device_token_rows.empty()) << "batch_slice: token ids still on a device (one rank only)";
  ops::BatchMeta out;
  out.block_size = b.block_size;
  out.max_blocks_per_seq = b.max_blocks_per_seq;
  const int32_t t0 = b.q_start[size_t(begin)], t1 = b.q_start[size_t(end)];
  out.token_ids.assign(b.token_ids.begin() + t0, b.token_ids.begin() + t1);
  out.positions.assign(b.positions.begin() + t0, b.positions.begin() + t1);
  out.slot_mapping.assign(b.slot_mapping.begin() + t0, b.slot_mapping.begin() + t1);
  for (int32_t s = begin; s <= end; ++s) out.q_start.push_back(b.q_start[size_t(s)] - t0);
  out.context_len.assign(b.context_len.begin() + begin, b.context_len.begin() + end);
  if (!b.state_slots.empty()) out.state_slots.assign(b.state_slots.begin() + begin, b.state_slots.begin() + end);
  if (!b.state_snapshots.empty()) out.state_snapshots.assign(b.state_snapshots.begin() + t0, b.state_snapshots.begin() + t1);
  const size_t w = size_t(b.max_blocks_per_seq);
  out.block_table.assign(b.block_table.begin() + long(size_t(begin) * w), b.block_table.begin() + long(size_t(end) * w));
  for (int32_t row : b.logit_rows)
    if (row >= t0 && row < t1) out.logit_rows.push_back(row - t0);
  return out;
}

Result<Tensor> ModelRunner::forward(const ops::BatchMeta& batch, std::vector<KvCache>& kv) {
  KILN_CHECK_EQ(kv.size(), ranks_.size()) << "forward: KV caches per rank";
  const auto hidden = [&](int r) { return mtp_.empty() ? Tensor{} : mtp_[size_t(r)].step_hidden; };
  if (world() == 1) return ranks_[0].model.forward(backend(0), batch, kv[0].layers, hidden(0));
  const int tp = parallel_.tensor_parallel, pp = parallel_.pipeline_parallel;
  // A pipeline's micro-batches: the sequences in up to pp parts, their logit rows in
  // the batch's order (each sequence's rows after the previous sequence's); a step of few
  // tokens runs whole (ParallelConfig::pipeline_micro_min_tokens).
  std::vector<const ops::BatchMeta*> parts = {&batch};
  micro_.clear();
  const int32_t n_seqs = batch.n_seqs();
  const bool split = pp > 1 && batch.n_tokens() >= parallel_.pipeline_micro_min_tokens;
  const int32_t n_micro = split ? std::min(pp, n_seqs) : 1;
  if (n_micro > 1) {
    for (size_t i = 1; i < batch.logit_rows.size(); ++i)
      KILN_CHECK_LT(batch.logit_rows[i - 1], batch.logit_rows[i]) << "forward: logit rows out of order";
    parts.clear();
    for (int32_t m = 0; m < n_micro; ++m)
      micro_.push_back(batch_slice(batch, n_seqs * m / n_micro, n_seqs * (m + 1) / n_micro));
    for (const ops::BatchMeta& m : micro_) parts.push_back(&m);
  }
  const int64_t n_rows = int64_t(batch.logit_rows.size()), vocab = ranks_[0].model.vocab_size;
  const int last = (pp - 1) * tp;  // the last stage's first rank: it holds the whole logits
  const bool hand_over = pp > 1 && n_rows > 0;
  if (hand_over) logits_ = backend(0).alloc(backend(0).activation_dtype(), {n_rows, vocab});
  Tensor result;
  KILN_RETURN_IF_ERROR(run([&](int r) {
    ops::Backend& be = backend(r);
    Tensor gathered;  // the last stage's logits of every micro-batch
    if (hand_over && r == last) gathered = be.alloc(be.activation_dtype(), {n_rows, vocab});
    int64_t row = 0;
    for (const ops::BatchMeta* part : parts) {
      const Tensor out = ranks_[size_t(r)].model.forward(be, *part, kv[size_t(r)].layers, hidden(r));
      const int64_t n = int64_t(part->logit_rows.size());
      if (pp == 1 && r == 0) result = out;
      // Copied at once: the next micro-batch's step may reuse the memory.
      if (gathered.defined() && n > 0) be.slice_columns({.src = out, .dst = gathered.slice0(row, row + n)});
      row += n;
    }
    // Sent after the last micro-batch, so no stage waits on rank 0 mid-pipeline.
    if (gathered.defined()) comms_.world[size_t(r)]->send(gathered, 0);
    if (hand_over && r == 0) comms_.world[0]->recv(logits_, last);
    // Each rank waits for its device inside the watched step: a GPU stuck in a
    // collective is then a rank that does not finish (rank 0 samples next and would wait
    // for its stream anyway; the others have nothing to do until the next step).
    be.synchronize();
  }, /*watched_step=*/true));
  if (pp == 1) return result;
  return hand_over ? logits_ : backend(0).alloc(backend(0).activation_dtype(), {0, vocab});
}

void ModelRunner::enable_mtp(int32_t max_tokens, int32_t pending_rows, int32_t max_depth) {
  KILN_CHECK(parallel_.pipeline_parallel == 1) << "MTP with pipeline parallelism";
  mtp_.resize(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    KILN_CHECK(ranks_[r].model.mtp.has_value()) << "rank " << r << " has no MTP layer";
    ops::Backend& be = *ranks_[r].backend;
    const Shape shape{max_tokens, ranks_[r].model.d_model};
    mtp_[r].step_hidden = be.alloc(be.activation_dtype(), shape);
    // Zeros: padding rows of a chained pass may read rows no pass wrote yet.
    for (Tensor& t : mtp_[r].chain) {
      t = be.alloc(be.activation_dtype(), shape);
      be.fill_random({.out = t, .mean = 0.0f, .stddev = 0.0f});
    }
    if (pending_rows > 0) mtp_[r].pending = be.alloc(be.activation_dtype(), {pending_rows, ranks_[r].model.d_model});
    if (r == 0) {
      Tensor zeros = host_tensor(DType::kI32, {int64_t(std::max(max_depth, 1)) * max_tokens});
      std::fill_n(zeros.as<int32_t>(), zeros.numel(), 0);
      mtp_[r].draft_ids = be.upload(zeros);
    }
    be.synchronize();
  }
}

Status ModelRunner::mtp_keep(int32_t n, int32_t at) {
  KILN_CHECK(!mtp_.empty()) << "mtp_keep before enable_mtp";
  KILN_CHECK(n >= 0 && at >= 0 && at + n <= mtp_pending_rows()) << "mtp_keep: rows [" << at << ", " << at + n << ")";
  if (n == 0) return Status::Ok();
  const auto one = [&](int r) {
    const MtpBuffers& m = mtp_[size_t(r)];
    backend(r).slice_columns({.src = m.step_hidden.slice0(0, n), .dst = m.pending.slice0(at, at + n)});
  };
  if (world() == 1) {
    one(0);
    return Status::Ok();
  }
  return run(one);  // (a copy queued on each rank's stream, before its next step: no wait)
}

Result<Tensor> ModelRunner::mtp_forward(const ops::BatchMeta& batch, MtpInput from, std::vector<KvCache>& kv,
                                        int tokens_from_depth) {
  KILN_CHECK(!mtp_.empty()) << "mtp_forward before enable_mtp";
  KILN_CHECK_LE(batch.n_tokens(), mtp_[0].step_hidden.dim(0)) << "mtp_forward: rows";
  const int64_t n = batch.n_tokens();
  KILN_CHECK(tokens_from_depth < 0 || (world() == 1 && (tokens_from_depth + 1) * n <= mtp_[0].draft_ids.dim(0)))
      << "mtp_forward: token ids from draft row " << tokens_from_depth;
  Tensor result;
  const auto one = [&](int r) {
    MtpBuffers& m = mtp_[size_t(r)];
    const int next = from == MtpInput::kChain ? 1 - m.last : 0;
    const Tensor& h = from == MtpInput::kStep ? m.step_hidden : from == MtpInput::kKept ? m.pending : m.chain[m.last];
    const Tensor tokens = tokens_from_depth >= 0 ? m.draft_ids.slice0(tokens_from_depth * n, (tokens_from_depth + 1) * n)
                                                 : Tensor{};
    Tensor out = ranks_[size_t(r)].model.mtp_forward(backend(r), batch, h, kv[size_t(r)].layers, m.chain[next], tokens);
    m.last = next;
    if (r == 0) result = out;
  };
  if (world() == 1) {
    one(0);
    return result;
  }
  KILN_RETURN_IF_ERROR(run([&](int r) {
    one(r);
    backend(r).synchronize();
  }, /*watched_step=*/true));
  return result;
}

void ModelRunner::mtp_argmax(const Tensor& logits, int depth) {
  const int64_t n = logits.dim(0);
  KILN_CHECK(!mtp_.empty() && depth >= 0 && (depth + 1) * n <= mtp_[0].draft_ids.dim(0)) << "mtp_argmax: draft row " << depth;
  backend(0).argmax({.logits = logits, .out = mtp_[0].draft_ids.slice0(depth * n, (depth + 1) * n)});
}

std::vector<int32_t> ModelRunner::mtp_read_drafts(int depths, int n) {
  KILN_CHECK(depths >= 0 && n >= 0 && int64_t(depths) * n <= mtp_[0].draft_ids.dim(0)) << "mtp_read_drafts: " << depths << " x " << n;
  std::vector<int32_t> out(size_t(depths) * size_t(n));
  if (!out.empty()) backend(0).to_host_i32(mtp_[0].draft_ids.slice0(0, int64_t(depths) * n), out.data());
  return out;
}

}  // namespace kiln::runtime
