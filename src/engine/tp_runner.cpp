#include "engine/tp_runner.h"

#include <stdexcept>

#include <fmt/format.h>

#include "backend/cpu/cpu_comm.h"
#include "engine/tp_shard.h"
#include "io/errors.h"

#if defined(FP8KV_HAVE_CUDA_BACKEND)
#include <cuda_runtime.h>

#include "backend/cuda/comm_nccl.h"
#endif

namespace fp8kv {

TpRunner::TpRunner(const ModelConfig& cfg, std::shared_ptr<const ModelWeights> weights, std::string_view backend,
                   const BackendOptions& bo, int world, int max_num_batched_tokens, int max_num_seqs)
    : world_(world), full_cfg_(cfg) {
  check_tensor_parallel(cfg, world);
  ranks_.resize(static_cast<size_t>(world));
  errors_.resize(static_cast<size_t>(world));
  if (world == 1) {
    ranks_[0].backend = make_backend(backend, cfg, bo);
    ranks_[0].runner = std::make_unique<ModelRunner>(cfg, *ranks_[0].backend, std::move(weights), max_num_batched_tokens,
                                                     max_num_seqs);
    return;
  }
  const std::string name = resolve_backend_name(backend);
  const ModelConfig rc = shard_config(cfg, world);
  if (name == "cpu") {
    comms_ = make_cpu_communicators(world);
  } else {
#if defined(FP8KV_HAVE_CUDA_BACKEND)
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    if (bo.device + world > count)
      throw InputError(fmt::format("--tensor-parallel-size {} needs {} CUDA devices from device {}; this machine has {}",
                                   world, world, bo.device, count));
    std::vector<int> devices;
    for (int r = 0; r < world; ++r) devices.push_back(bo.device + r);
    comms_ = make_nccl_communicators(devices);
#else
    throw InputError(fmt::format("--tensor-parallel-size {} with --backend {}: this build has no CUDA backend", world,
                                 name));
#endif
  }
  for (int r = 1; r < world; ++r) workers_.emplace_back([this, r] { worker_loop(r); });
  try {
    // Each rank builds its backend and uploads its shard on its own thread
    // (a CUDA rank's device stays current there).
    const std::function<void(int)> build = [&](int r) {
      BackendOptions o = bo;
      o.device = bo.device + (name == "cpu" ? 0 : r);
      // Simulated ranks are the parallelism (2-core CI): one OpenMP thread on
      // each worker rank. Rank 0 runs on the caller's thread, whose OpenMP
      // setting is left as the caller made it.
      if (name == "cpu" && o.num_threads == 0 && r > 0) o.num_threads = 1;
      Rank& k = ranks_[r];
      k.backend = make_backend(name, rc, o);
      k.backend->set_communicator(comms_[r].get());
      k.runner = std::make_unique<ModelRunner>(cfg, *k.backend, weights, max_num_batched_tokens, max_num_seqs,
                                               TpShard{r, world});
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

void TpRunner::set_kv(KvCacheManager& kv) {
  for (auto& k : ranks_) k.runner->set_kv(kv);
}

void TpRunner::allocate_kv(const KvPlan& plan, const KvCacheLayout& layout) {
  run_all([&](int r) { ranks_[r].backend->allocate_kv(plan, layout); });
}

void TpRunner::set_kv_scales(const KvScales& s) {
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

void TpRunner::execute(const SchedulerOutput& out) {
  run_all([&](int r) { ranks_[r].runner->execute(out); });
}

void TpRunner::logits_to_host(std::span<const int32_t> rows, std::vector<float>& out) {
  if (world_ == 1) return ranks_[0].runner->logits_to_host(rows, out);
  std::vector<std::vector<float>> scratch(static_cast<size_t>(world_));
  run_all([&](int r) { ranks_[r].runner->logits_to_host(rows, r == 0 ? out : scratch[r]); });
}

void TpRunner::sample(std::span<const int32_t> rows, std::span<const RowSampling> params, std::span<int32_t> ids) {
  if (world_ == 1) return ranks_[0].runner->sample(rows, params, ids);
  run_all([&](int r) { ranks_[r].runner->sample(rows, params, ids); });  // rank 0 alone writes ids
}

}  // namespace fp8kv
