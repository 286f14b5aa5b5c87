#include "engine/tp_runner.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include <fmt/format.h>

#include "backend/comm.h"
#include "backend/common/rank_failure.h"
#include "backend/common/tcp_rendezvous.h"
#include "engine/sampler.h"
#include "engine/tp_shard.h"
#include "io/errors.h"

#if defined(FP8KV_HAVE_CUDA_BACKEND)
#include "backend/cuda/comm/nccl.h"
#endif

namespace fp8kv {

namespace {

// The control channel's messages (docs/design.md, "Multi-process tensor
// parallelism"): one op byte, then little-endian fields as written here.
// Both ends are this binary (the options check compares the version).
enum Op : char { kExecute = 'E', kLogits = 'L', kSample = 'S', kScales = 'K', kClips = 'C', kQuit = 'Q', kPing = 'P' };

// Marks a leader's call in flight (the keepalive stays off the channel).
struct InCall {
  explicit InCall(std::atomic<bool>& f) : flag(f) { flag = true; }
  ~InCall() { flag = false; }
  std::atomic<bool>& flag;
};

struct Writer {
  std::string s;
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    s.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    if (!v.empty()) s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  template <class T>
  void span(std::span<const T> v) {
    pod<uint64_t>(v.size());
    if (!v.empty()) s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void str(const std::string& v) { vec(std::vector<char>(v.begin(), v.end())); }
};

struct Reader {
  const std::string& s;
  size_t off = 0;
  int from = 0;  // the rank that wrote it (errors)
  void need(size_t n) const {
    if (off + n > s.size())
      throw std::runtime_error(fmt::format("tensor-parallel control channel: truncated message from rank {}", from));
  }
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, s.data() + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    const uint64_t n = pod<uint64_t>();
    if (n > s.size())
      throw std::runtime_error(fmt::format("tensor-parallel control channel: bad length from rank {}", from));
    need(n * sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), s.data() + off, n * sizeof(T));
    off += n * sizeof(T);
    return v;
  }
  std::string str() {
    const auto v = vec<char>();
    return std::string(v.begin(), v.end());
  }
};

void write_batch(Writer& w, const StepBatch& b) {
  for (int v : {b.num_tokens, b.num_seqs, b.num_decodes, b.max_query_len, b.max_context_len, b.num_groups,
                b.max_blocks_per_seq, b.decode_plan_context})
    w.pod<int32_t>(v);
  w.vec(b.token_ids);
  w.vec(b.positions);
  w.vec(b.query_start);
  w.vec(b.context_lens);
  w.vec(b.is_decode);
  w.pod<uint64_t>(b.slot_mapping.size());
  for (const auto& g : b.slot_mapping) w.vec(g);
  w.pod<uint64_t>(b.block_tables.size());
  for (const auto& g : b.block_tables) w.vec(g);
  w.vec(b.state_slots);  // linear-attention models: every rank holds its heads' states in the same slots
}

StepBatch read_batch(Reader& r) {
  StepBatch b;
  for (int* v : {&b.num_tokens, &b.num_seqs, &b.num_decodes, &b.max_query_len, &b.max_context_len, &b.num_groups,
                 &b.max_blocks_per_seq, &b.decode_plan_context})
    *v = r.pod<int32_t>();
  b.token_ids = r.vec<int32_t>();
  b.positions = r.vec<int32_t>();
  b.query_start = r.vec<int32_t>();
  b.context_lens = r.vec<int32_t>();
  b.is_decode = r.vec<uint8_t>();
  b.slot_mapping.resize(r.pod<uint64_t>() & 0xffff);
  for (auto& g : b.slot_mapping) g = r.vec<int64_t>();
  b.block_tables.resize(r.pod<uint64_t>() & 0xffff);
  for (auto& g : b.block_tables) g = r.vec<int32_t>();
  b.state_slots = r.vec<int32_t>();
  return b;
}

// Prefix-snapshot copies (src slot, dst slot), flattened.
void write_state_copies(Writer& w, const ModelRunner::StateCopies& c) {
  std::vector<int32_t> flat;
  for (const auto& [src, dst] : c) {
    flat.push_back(src);
    flat.push_back(dst);
  }
  w.vec(flat);
}

ModelRunner::StateCopies read_state_copies(Reader& r) {
  const std::vector<int32_t> flat = r.vec<int32_t>();
  if (flat.size() % 2 != 0) throw std::runtime_error("tensor-parallel control channel: odd state-copy list");
  ModelRunner::StateCopies c;
  for (size_t i = 0; i < flat.size(); i += 2) c.emplace_back(flat[i], flat[i + 1]);
  return c;
}

void write_stream(Writer& w, const StreamScale& x) {
  w.vec(x.values);
  w.pod<uint8_t>(x.from_checkpoint ? 1 : 0);
  w.str(x.source_tensor);
  w.str(x.source_file);
}

StreamScale read_stream(Reader& r) {
  StreamScale x;
  x.values = r.vec<float>();
  x.from_checkpoint = r.pod<uint8_t>() != 0;
  x.source_tensor = r.str();
  x.source_file = r.str();
  return x;
}

// A rank's KV clip counts ('C' reply): 1 and the per-layer counts, or 0
// (the rank does not count).
std::string write_clips(const std::optional<std::vector<KvClipCounts>>& c) {
  Writer w;
  w.pod<uint8_t>(c ? 1 : 0);
  if (c) w.vec(*c);
  return w.s;
}

std::optional<std::vector<KvClipCounts>> read_clips(const std::string& msg, int rank) {
  Reader r{msg, 0, rank};
  if (r.pod<uint8_t>() == 0) return std::nullopt;
  return r.vec<KvClipCounts>();
}

}  // namespace

void check_multi_process(const TpMultiProcess& mp, int world) {
  if (mp.nnodes < 1) throw InputError(fmt::format("--nnodes must be >= 1 (got {})", mp.nnodes));
  if (mp.node_rank < 0 || mp.node_rank >= mp.nnodes)
    throw InputError(fmt::format("--node-rank {} is out of range for --nnodes {} (0..{})", mp.node_rank, mp.nnodes,
                                 mp.nnodes - 1));
  if (mp.nnodes > 1 && mp.nnodes != world)
    throw InputError(fmt::format("--nnodes {} with --tensor-parallel-size {}: fp8kv runs one rank per process, so "
                                 "--nnodes must equal --tensor-parallel-size (or be 1: every rank in one process)",
                                 mp.nnodes, world));
  if (mp.nnodes > 1 && mp.master_addr.empty()) throw InputError("--master-addr must not be empty");
  if (!(mp.collective_timeout_s > 0 && mp.collective_timeout_s <= 1e6))
    throw InputError(fmt::format("--collective-timeout must be in (0, 1e6] seconds (got {})", mp.collective_timeout_s));
  if (mp.nnodes > 1 && (mp.master_port < 1 || mp.master_port > 65534))
    throw InputError(fmt::format("--master-port {} must be in 1..65534 (the collectives use --master-port + 1)",
                                 mp.master_port));
}

TpRunner::TpRunner(const ModelConfig& cfg, std::shared_ptr<const ModelWeights> weights, BackendChoice backend,
                   const BackendOptions& bo, int world, int max_num_batched_tokens, int max_num_seqs,
                   const TpMultiProcess& mp, const RankWeightsFn& rank_weights)
    : world_(world), full_cfg_(cfg) {
  if (!weights && !rank_weights) throw std::logic_error("TpRunner: no weights");
  check_tensor_parallel(cfg, world);
  check_multi_process(mp, world);
  if (mp.nnodes > 1) {
    // One rank per process: the control channel first (its failures are the
    // user's: a wrong address, a missing peer), then the collectives.
    grank_ = mp.node_rank;
    const BackendKind kind = resolve_backend(backend);
    const std::string_view name = backend_kind_name(kind);
    const auto timeout = std::chrono::milliseconds(static_cast<long long>(mp.collective_timeout_s * 1000.0 + 0.5));
    timeout_ = timeout;
    try {
      ctl_ = std::make_unique<comm::TcpRendezvous>(grank_, world, mp.master_addr, mp.master_port, timeout);
    } catch (const std::runtime_error& e) {
      throw InputError(fmt::format("multi-process tensor parallelism ({} processes, this is rank {}): {} "
                                   "(--collective-timeout sets the wait)",
                                   world, grank_, e.what()));
    }
    // Every process must run the same model with the same step limits.
    const std::string mine =
        fmt::format("model {} layers {} hidden {} vocab {} heads {}/{} backend {} max_num_batched_tokens {} "
                    "max_num_seqs {}",
                    cfg.model_type, cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads,
                    name, max_num_batched_tokens, max_num_seqs);
    const auto all = ctl_->all_gather(mine, "options check");
    for (int r = 1; r < world; ++r)
      if (all[r] != all[0])
        throw InputError(fmt::format("multi-process tensor parallelism: rank {} runs '{}' but rank 0 runs '{}'", r,
                                     all[r], all[0]));
    const ModelConfig rc = shard_config(cfg, world);
    BackendOptions o = bo;
    if (kind == BackendKind::cpu) {
      comms_.push_back(make_cpu_socket_communicator(grank_, world, mp.master_addr, mp.master_port + 1, timeout));
    } else {
#if defined(FP8KV_HAVE_CUDA_BACKEND)
      const int count = cuda_device_count();
      if (count < 1) throw InputError(fmt::format("--backend {} with --nnodes {}: no CUDA device here", name, world));
      o.device = (bo.device + grank_) % count;  // one host with N GPUs: rank r on GPU r
      comms_.push_back(make_nccl_communicator_tcp(grank_, world, o.device, mp.master_addr, mp.master_port + 1));
#else
      throw InputError(fmt::format("--nnodes {} with --backend {}: this build has no CUDA backend", world, name));
#endif
    }
    ranks_.resize(1);
    errors_.resize(1);
    Rank& k = ranks_[0];
    k.backend = make_backend(kind, rc, o);
    k.backend->set_communicator(comms_[0].get());
    const TpShard shard{grank_, world, !weights};
    k.runner = std::make_unique<ModelRunner>(cfg, *k.backend, weights ? std::move(weights) : rank_weights(shard),
                                             max_num_batched_tokens, max_num_seqs, shard);
    return;
  }
  ranks_.resize(static_cast<size_t>(world));
  errors_.resize(static_cast<size_t>(world));
  if (world == 1) {
    ranks_[0].backend = make_backend(backend, cfg, bo);
    if (!weights) weights = rank_weights(TpShard{0, 1, true});
    ranks_[0].runner = std::make_unique<ModelRunner>(cfg, *ranks_[0].backend, std::move(weights), max_num_batched_tokens,
                                                     max_num_seqs);
    return;
  }
  // The communicators exist before any backend does: the resolved kind picks them.
  const BackendKind kind = resolve_backend(backend);
  const ModelConfig rc = shard_config(cfg, world);
  if (kind == BackendKind::cpu) {
    comms_ = make_cpu_communicators(world);
  } else {
#if defined(FP8KV_HAVE_CUDA_BACKEND)
    const int count = cuda_device_count();
    if (bo.device + world > count)
      throw InputError(fmt::format("--tensor-parallel-size {} needs {} CUDA devices from device {}; this machine has {}",
                                   world, world, bo.device, count));
    std::vector<int> devices;
    for (int r = 0; r < world; ++r) devices.push_back(bo.device + r);
    comms_ = make_nccl_communicators(devices);
#else
    throw InputError(fmt::format("--tensor-parallel-size {} with --backend {}: this build has no CUDA backend", world,
                                 backend_kind_name(kind)));
#endif
  }
  for (int r = 1; r < world; ++r) workers_.emplace_back([this, r] { worker_loop(r); });
  try {
    // Each rank builds its backend and uploads its shard on its own thread
    // (a CUDA rank's device stays current there).
    const std::function<void(int)> build = [&](int r) {
      BackendOptions o = bo;
      o.device = bo.device + (kind == BackendKind::cpu ? 0 : r);
      // Simulated ranks are the parallelism (2-core CI): one OpenMP thread on
      // each worker rank. Rank 0 runs on the caller's thread, whose OpenMP
      // setting is left as the caller made it.
      if (kind == BackendKind::cpu && o.num_threads == 0 && r > 0) o.num_threads = 1;
      Rank& k = ranks_[r];
      k.backend = make_backend(kind, rc, o);
      k.backend->set_communicator(comms_[r].get());
      const TpShard shard{r, world, !weights};
      k.runner = std::make_unique<ModelRunner>(cfg, *k.backend, weights ? weights : rank_weights(shard),
                                               max_num_batched_tokens, max_num_seqs, shard);
    };
    run_all(build);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    throw;
  }
}

TpRunner::~TpRunner() {
  if (ctl_) {
    if (keepalive_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(ka_mu_);
        ka_stop_ = true;
      }
      ka_cv_.notify_all();
      keepalive_.join();
    }
    // The leader ends the followers' loops (best effort: a broken group's
    // followers end on their own, by a closed socket or a timeout).
    if (grank_ == 0 && !broken_) {
      try {
        ctl_->all_gather(std::string(1, kQuit), "shutdown");
      } catch (...) {
      }
    }
    ranks_[0].runner.reset();
    ranks_[0].backend.reset();
    comms_.clear();
    ctl_.reset();
    return;
  }
  // Each rank releases its memory on its own thread (its device current).
  try {
    run_all([&](int r) {
      ranks_[r].runner.reset();
      ranks_[r].backend.reset();
    });
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  for (auto& k : ranks_) {
    k.runner.reset();
    k.backend.reset();
  }
}

void TpRunner::worker_loop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || job_gen_ != seen; });
      if (stop_) return;
      seen = job_gen_;
      job = job_;
    }
    std::exception_ptr err;
    try {
      (*job)(rank);
    } catch (...) {
      err = std::current_exception();
      if (!comms_.empty()) abort_cpu_communicators(*comms_[rank]);  // wake ranks blocked in a collective
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      errors_[rank] = err;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
}

void TpRunner::run_all(const std::function<void(int)>& f) {
  if (world_ == 1) {
    f(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &f;
    pending_ = world_ - 1;
    for (auto& e : errors_) e = nullptr;
    ++job_gen_;
  }
  cv_.notify_all();
  try {
    f(0);
  } catch (...) {
    errors_[0] = std::current_exception();
    abort_cpu_communicators(*comms_[0]);
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
  }
  // The root cause is usually the first rank that failed on its own; a rank
  // woken by the abort reports "aborted". Prefer a non-abort error.
  std::exception_ptr first;
  for (auto& e : errors_) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const std::runtime_error& re) {
      if (std::string(re.what()).find("communicator aborted") != std::string::npos) continue;
      std::rethrow_exception(e);
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first) std::rethrow_exception(first);
}

void TpRunner::check_usable() const {
  if (!broken_) return;
  if (ctl_) {
    // The keepalive saw the failure first: that RankFailure is the cause.
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lk(ctl_mu_);
      e = deferred_error_;
    }
    if (e) std::rethrow_exception(e);
  }
  throw std::runtime_error("tensor-parallel group: unusable after an earlier failure (restart every process)");
}

void TpRunner::broadcast(const std::string& msg) {
  check_usable();
  if (grank_ != 0) throw std::logic_error("TpRunner: a follower does not issue calls (follow())");
  std::lock_guard<std::mutex> lk(ctl_mu_);
  try {
    ctl_->all_gather(msg, "the step broadcast");
  } catch (...) {
    broken_ = true;
    throw;
  }
  note_exchange_locked();
}

void TpRunner::note_exchange_locked() {
  last_ctl_ = std::chrono::steady_clock::now();
  if (!keepalive_.joinable()) keepalive_ = std::thread([this] { keepalive_loop(); });
}

void TpRunner::keepalive_loop() {
  const auto period = std::max<std::chrono::milliseconds>(timeout_ / 3, std::chrono::milliseconds(10));
  std::unique_lock<std::mutex> lk(ka_mu_);
  for (;;) {
    if (ka_cv_.wait_for(lk, period / 4, [&] { return ka_stop_; })) return;
    if (in_call_ || broken_) continue;
    lk.unlock();
    {
      std::lock_guard<std::mutex> g(ctl_mu_);
      // A call that began meanwhile waits for this exchange (the followers
      // are in follow() between calls, so it is one round trip).
      if (!in_call_ && !broken_ && std::chrono::steady_clock::now() - last_ctl_ >= period) {
        try {
          ctl_->all_gather(std::string(1, kPing), "the keepalive");
          last_ctl_ = std::chrono::steady_clock::now();
        } catch (...) {
          deferred_error_ = std::current_exception();
          broken_ = true;
        }
      }
    }
    lk.lock();
  }
}

void TpRunner::follow() {
  if (!is_follower()) throw std::logic_error("TpRunner::follow: not a multi-process follower");
  ModelRunner& m = *ranks_[0].runner;
  std::vector<float> scratch;
  std::vector<int32_t> ids;
  for (;;) {
    std::string msg;
    // Rank 0 gone, or silent past the timeout (its keepalive speaks while it
    // is idle): a RankFailure ("rank 0 lost during the wait for the next step").
    msg = ctl_->all_gather(std::string(), "the wait for the next step", timeout_)[0];
    if (msg.empty()) throw std::runtime_error("tensor-parallel control channel: empty message from rank 0");
    Reader r{msg, 1};
    switch (msg[0]) {
      case kQuit:
        return;
      case kPing:
        break;
      case kExecute: {
        StepBatch b = read_batch(r);
        ModelRunner::StateCopies restores = read_state_copies(r);
        m.set_prepared(std::move(b), std::move(restores), read_state_copies(r));
        m.run_prepared();
        break;
      }
      case kLogits: {
        const auto rows = r.vec<int32_t>();
        m.logits_to_host(rows, scratch);
        break;
      }
      case kSample: {
        const auto rows = r.vec<int32_t>();
        const auto params = r.vec<RowSampling>();
        ids.assign(rows.size(), 0);
        m.sample(rows, params, ids);
        break;
      }
      case kClips:  // the leader's kv_clip_counts: this rank's counts, in one all_gather
        ctl_->all_gather(write_clips(ranks_[0].backend->kv_clip_counts()), "the KV clip counts", timeout_);
        break;
      case kScales: {
        KvScales s;
        s.layers.resize(r.pod<uint32_t>() & 0xffffff);
        for (auto& l : s.layers) {
          l.k = read_stream(r);
          l.v = read_stream(r);
          l.q = read_stream(r);
        }
        apply_kv_scales(s);
        break;
      }
      default:
        throw std::runtime_error(fmt::format("tensor-parallel control channel: unknown op {} from rank 0",
                                             static_cast<int>(msg[0])));
    }
  }
}

void TpRunner::apply_kv_scales(const KvScales& s) {
  ranks_[0].backend->set_kv_scales(shard_kv_scales(s, full_cfg_, TpShard{grank_, world_}));
}

void TpRunner::set_kv(KvCacheManager& kv) {
  for (auto& k : ranks_) k.runner->set_kv(kv);
}

void TpRunner::allocate_kv(const KvPlan& plan, const KvCacheLayout& layout) {
  if (ctl_) {
    // Rank 0's scheduler hands out the block ids: every rank holds rank 0's
    // pool size (each process planned from its own memory). A state pool's
    // dtypes must be rank 0's: each rank rounds its own heads' states.
    const std::string dtypes =
        plan.state.empty() ? std::string()
                           : fmt::format("conv {}, recurrent {}", state_dtype_name(plan.state.conv_dtype),
                                         state_dtype_name(plan.state.ssm_dtype));
    std::unique_lock<std::mutex> lk(ctl_mu_);
    const auto all = ctl_->all_gather(fmt::format("{} {}", plan.num_blocks, dtypes), "KV pool size");
    lk.unlock();
    auto dtypes_of = [](const std::string& m) { return m.substr(m.find(' ') + 1); };
    for (size_t r = 1; r < all.size(); ++r)
      if (dtypes_of(all[r]) != dtypes_of(all[0]))
        throw InputError(fmt::format("multi-process tensor parallelism: rank {} keeps the linear-attention states as "
                                     "{} but rank 0 as {} (--mamba-cache-dtype, --mamba-ssm-cache-dtype)",
                                     r, dtypes_of(all[r]), dtypes_of(all[0])));
    KvPlan p = plan;
    KvCacheLayout l = layout;
    p.num_blocks = std::stoll(all[0]);
    l.num_blocks = static_cast<int>(p.num_blocks);
    ranks_[0].backend->allocate_kv(p, l);
    return;
  }
  run_all([&](int r) { ranks_[r].backend->allocate_kv(plan, layout); });
}

void TpRunner::set_kv_scales(const KvScales& s) {
  if (ctl_) {
    if (grank_ == 0) {
      InCall busy(in_call_);
      Writer w;
      w.pod<char>(kScales);
      w.pod<uint32_t>(static_cast<uint32_t>(s.layers.size()));
      for (const auto& l : s.layers) {
        write_stream(w, l.k);
        write_stream(w, l.v);
        write_stream(w, l.q);
      }
      broadcast(w.s);
    }
    apply_kv_scales(s);  // a follower outside follow(): its own (equal) scales, until rank 0's arrive
    return;
  }
  if (world_ == 1) {
    ranks_[0].backend->set_kv_scales(s);
    return;
  }
  run_all([&](int r) { ranks_[r].backend->set_kv_scales(shard_kv_scales(s, full_cfg_, TpShard{r, world_})); });
}

void TpRunner::set_store_observer(StoreObserver* o) {
  if (world_ > 1 && o)
    throw InputError(fmt::format("a KV observer (calibrate, eval kvstats) sees every head: run it with "
                                 "--tensor-parallel-size 1 (got {})",
                                 world_));
  for (auto& k : ranks_) k.backend->set_store_observer(o);
}

bool TpRunner::counts_kv_heads(int rank) const {
  return rank == 0 ||
         first_kv_head(full_cfg_, TpShard{rank - 1, world_}) != first_kv_head(full_cfg_, TpShard{rank, world_});
}

std::optional<std::vector<KvClipCounts>> TpRunner::kv_clip_counts() {
  std::vector<std::optional<std::vector<KvClipCounts>>> per_rank;
  if (ctl_) {
    // Between two calls, on the thread that makes them: the followers are in
    // follow(), waiting for the next message, so 'C' finds every rank at the
    // same point of the leader's call sequence. One hold of the channel for
    // both exchanges (no keepalive or other call in between).
    if (grank_ != 0) throw std::logic_error("TpRunner::kv_clip_counts: a follower answers in follow()");
    if (broken_) return std::nullopt;
    std::lock_guard<std::mutex> lk(ctl_mu_);
    try {
      ctl_->all_gather(std::string(1, kClips), "the KV clip counts");
      const std::vector<std::string> all =
          ctl_->all_gather(write_clips(ranks_[0].backend->kv_clip_counts()), "the KV clip counts");
      for (int r = 0; r < world_; ++r) per_rank.push_back(read_clips(all.at(static_cast<size_t>(r)), r));
    } catch (...) {
      // A diagnostic read does not throw (the server reads it for a gauge):
      // the group is unusable now, and the next call says why.
      deferred_error_ = std::current_exception();
      broken_ = true;
      return std::nullopt;
    }
    note_exchange_locked();
  } else {
    for (const auto& k : ranks_) per_rank.push_back(k.backend->kv_clip_counts());
  }
  std::optional<std::vector<KvClipCounts>> sum;
  for (int r = 0; r < world_; ++r) {
    std::optional<std::vector<KvClipCounts>>& c = per_rank[static_cast<size_t>(r)];
    if (!c) return std::nullopt;
    if (!sum) {
      sum = std::move(c);  // rank 0 always counts its heads
      continue;
    }
    if (c->size() != sum->size())
      throw std::logic_error(fmt::format("TpRunner::kv_clip_counts: rank {} counts {} layers, rank 0 {}", r,
                                         c->size(), sum->size()));
    if (!counts_kv_heads(r)) continue;  // a replica of the previous rank's heads
    for (size_t l = 0; l < sum->size(); ++l) (*sum)[l] += (*c)[l];
  }
  return sum;
}

StepOutput TpRunner::execute(const SchedulerOutput& out, const StepSampling& sampling) {
  forward(out, sampling);
  StepOutput res;
  if (sampling.empty()) return res;
  const std::vector<int32_t> rows = ranks_[0].runner->sample_rows(sampling);
  res.ids.assign(rows.size(), -1);
  if (ranks_[0].backend->uses_host_memory()) {
    if (sampling.host.size() != rows.size()) throw std::logic_error("TpRunner::execute: a host sampler per row");
    logits_to_host(rows, res.logits);
    const size_t V = static_cast<size_t>(full_cfg_.vocab_size);
    for (size_t j = 0; j < rows.size(); ++j)
      res.ids[j] = sampling.host[j]->sample(std::span<const float>(res.logits.data() + j * V, V));
    return res;
  }
  sample(rows, sampling.params, res.ids);
  if (sampling.want_logits) logits_to_host(rows, res.logits);
  return res;
}

void TpRunner::forward(const SchedulerOutput& out, const StepSampling& sampling) {
  if (ctl_) {
    InCall busy(in_call_);
    ModelRunner& m = *ranks_[0].runner;
    m.prepare(out);
    Writer w;
    w.pod<char>(kExecute);
    write_batch(w, m.batch());
    write_state_copies(w, m.state_restores());
    write_state_copies(w, m.state_saves());
    broadcast(w.s);
    try {
      m.run_prepared();
    } catch (...) {
      broken_ = true;
      throw;
    }
    return;
  }
  run_all([&](int r) { ranks_[r].runner->execute(out, sampling); });
}

void TpRunner::logits_to_host(std::span<const int32_t> rows, std::vector<float>& out) {
  if (world_ == 1) return ranks_[0].runner->logits_to_host(rows, out);
  if (ctl_) {
    InCall busy(in_call_);
    Writer w;
    w.pod<char>(kLogits);
    w.span(rows);
    broadcast(w.s);
    try {
      ranks_[0].runner->logits_to_host(rows, out);
    } catch (...) {
      broken_ = true;
      throw;
    }
    return;
  }
  std::vector<std::vector<float>> scratch(static_cast<size_t>(world_));
  run_all([&](int r) { ranks_[r].runner->logits_to_host(rows, r == 0 ? out : scratch[r]); });
}

void TpRunner::sample(std::span<const int32_t> rows, std::span<const RowSampling> params, std::span<int32_t> ids) {
  if (world_ == 1) return ranks_[0].runner->sample(rows, params, ids);
  if (ctl_) {
    InCall busy(in_call_);
    Writer w;
    w.pod<char>(kSample);
    w.span(rows);
    w.span(params);
    broadcast(w.s);
    try {
      ranks_[0].runner->sample(rows, params, ids);
    } catch (...) {
      broken_ = true;
      throw;
    }
    return;
  }
  run_all([&](int r) { ranks_[r].runner->sample(rows, params, ids); });  // rank 0 alone writes ids
}

}  // namespace fp8kv
