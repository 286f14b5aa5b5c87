// The ranks of one engine: N x (Backend + ModelRunner + KV storage of the
// rank's heads) under ONE Scheduler / KvCacheManager (the block ids are the
// same on every rank; each rank's pool holds only its KV heads). world 1 is
// the plain single-backend engine, run on the caller's thread.
//
// With world > 1, rank 0 runs on the caller's thread and ranks 1..N-1 on
// persistent worker threads (one per rank, started once). Each rank's
// Backend is constructed on its own thread, so a CUDA rank keeps its device
// current on that thread (one thread and one context per GPU). A step is
// dispatched to every rank at once; the forward pass is one graph whose
// collectives (Backend::all_reduce / all_gather) line the ranks up. Rank 0's
// logits / sampled ids are the engine's (every rank computes the same ones).
// docs/design.md, "Tensor parallelism"; docs/tp.md.
//
// Multi-process mode (TpMultiProcess::nnodes > 1; docs/design.md,
// "Multi-process tensor parallelism"): one rank per process. Rank 0 (the
// leader) owns the Scheduler / KvCacheManager and, before each ModelRunner
// call, broadcasts it (the prepared StepBatch, the logits / sampling rows,
// new KV scales) over a TCP control channel on master_port; the followers
// (node_rank > 0) run follow(), which replays those calls on their rank
// until the leader shuts the group down. The collectives use their own
// connection (master_port + 1): NCCL (cuda) or sockets (cpu).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "engine/model_runner.h"

namespace fp8kv {

namespace comm {
class TcpRendezvous;
}

// vLLM's --nnodes / --node-rank / --master-addr / --master-port, with one
// rank per process: nnodes is 1 (every rank in this process) or equal to the
// tensor-parallel size.
struct TpMultiProcess {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // control channel; the collectives use master_port + 1
  // The watchdog (--collective-timeout; docs/tp.md "The watchdog"): the
  // longest wait for a peer at startup, in a collective or a control step.
  // A peer silent that long, or gone, ends the run with a RankFailure
  // (backend/common/rank_failure.h). In (0, 1e6].
  double collective_timeout_s = 60.0;
};

// Per-rank weights (`--load-format dummy`: each rank makes only its shard,
// engine/tp_shard.h dummy_weights_shard). Called on the rank's thread with
// presharded = true.
using RankWeightsFn = std::function<std::shared_ptr<const ModelWeights>(const TpShard&)>;

// InputError (exit 2) for a combination that cannot form a group.
void check_multi_process(const TpMultiProcess& mp, int world);

class TpRunner {
 public:
  // backend: auto_ | cpu | cuda (resolve_backend). world > 1 on the CPU simulates the
  // ranks (backend/comm.h); on CUDA rank r uses device r
  // (bo.device + r) and NCCL. `weights` null: each rank calls rank_weights. Throws InputError when world does not fit the
  // model (engine/tp_shard.h check_tensor_parallel) or the machine.
  TpRunner(const ModelConfig& cfg, std::shared_ptr<const ModelWeights> weights, BackendChoice backend,
           const BackendOptions& bo, int world, int max_num_batched_tokens, int max_num_seqs,
           const TpMultiProcess& mp = {}, const RankWeightsFn& rank_weights = {});
  ~TpRunner();
  TpRunner(const TpRunner&) = delete;
  TpRunner& operator=(const TpRunner&) = delete;

  int world() const { return world_; }
  // Multi-process: this process's rank; a follower serves the leader's calls.
  int process_rank() const { return grank_; }
  bool is_follower() const { return ctl_ != nullptr && grank_ > 0; }
  // Follower: replays the leader's calls until it shuts the group down
  // (returns) or fails (throws: the leader died, a collective failed).
  void follow();
  Backend& backend(int rank = 0) { return *ranks_.at(rank).backend; }
  ModelRunner& runner(int rank = 0) { return *ranks_.at(rank).runner; }
  // CUDA graphs (rank 0's counters; ModelRunner::set_pad_eager on every rank).
  void set_pad_eager(bool on) {
    for (auto& k : ranks_) k.runner->set_pad_eager(on);
  }
  void set_tp_graphs(bool on) {  // tests (ModelRunner::set_tp_graphs)
    for (auto& k : ranks_) k.runner->set_tp_graphs(on);
  }
  int64_t graph_replays() const { return ranks_[0].runner->graph_replays(); }
  int64_t graph_captures() const { return ranks_[0].runner->graph_captures(); }
  // ModelRunner::warm_up_graphs on one rank (tensor-parallel ranks capture
  // lazily, as before): graphs captured.
  int warm_up_graphs() { return world_ == 1 && !ctl_ ? ranks_[0].runner->warm_up_graphs() : 0; }

  // Fan-outs to every rank.
  void set_kv(KvCacheManager& kv);
  void allocate_kv(const KvPlan& plan, const KvCacheLayout& layout);
  void set_kv_scales(const KvScales& global);  // validated global scales; each rank gets its shard
  // world > 1: only nullptr (an observer sees every head; InputError otherwise).
  void set_store_observer(StoreObserver* observer);
  // KV store saturation summed over the ranks (each stores its own KV
  // heads; a head replicated on several ranks counts once, so the sum is
  // TP 1's), per layer. nullopt when a rank does not count
  // (Backend::kv_clip_counts). Multi-process leader: one control exchange
  // ('C', then every rank's counts in one all_gather; docs/design.md
  // "Multi-process tensor parallelism"), so call it between steps, only
  // when the counts are wanted (the engine's warning checks, the server's
  // gauge); a failed exchange marks the group broken and returns nullopt
  // (the next call rethrows the cause). Not on a follower (follow() answers).
  std::optional<std::vector<KvClipCounts>> kv_clip_counts();

  // The ModelRunner calls, run on every rank (rank 0's results returned).
  // One step: the forward pass over `out`, then the rows of `sampling`
  // sampled (on the backend, or on the host with each request's stream when
  // the backend uses_host_memory()): one id per sampling.seqs entry, and
  // their logits when asked (always on a host-memory backend).
  StepOutput execute(const SchedulerOutput& out, const StepSampling& sampling);
  int first_row(int i) const { return ranks_[0].runner->first_row(i); }
  void logits_to_host(std::span<const int32_t> rows, std::vector<float>& out);

 private:
  struct Rank {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<ModelRunner> runner;
  };
  // Runs f(rank) on every rank (rank 0 here, the others on their workers)
  // and waits; rethrows the first failure (lowest rank).
  void run_all(const std::function<void(int)>& f);
  // Multi-process leader: sends one call to the followers (marks the group
  // broken on failure: every later call throws).
  void broadcast(const std::string& msg);
  void check_usable() const;
  void forward(const SchedulerOutput& out, const StepSampling& sampling);
  void sample(std::span<const int32_t> rows, std::span<const RowSampling> params, std::span<int32_t> ids);
  void apply_kv_scales(const KvScales& s);
  void worker_loop(int rank);
  // Multi-process leader, started by the first broadcast (the followers are
  // then in follow()): while no call is in flight, a no-op control message
  // ('P') once the channel has been quiet for a third of the collective
  // timeout, so a follower can bound its wait for the next step by the
  // timeout (docs/tp.md "The watchdog"). A failure is kept for the next call.
  void keepalive_loop();
  // Multi-process leader, ctl_mu_ held: after a control exchange (notes the
  // time; the first one starts keepalive_loop).
  void note_exchange_locked();
  // Whether this rank's KV heads count in kv_clip_counts' sum: the first
  // rank holding them (a replicated head counts once).
  bool counts_kv_heads(int rank) const;

  int world_ = 1;
  int grank_ = 0;                             // multi-process: this process's rank
  std::unique_ptr<comm::TcpRendezvous> ctl_;  // multi-process: the control channel
  std::chrono::milliseconds timeout_{60000};  // multi-process: --collective-timeout
  std::atomic<bool> broken_{false};
  // Multi-process leader: one control exchange at a time (calls, keepalive).
  mutable std::mutex ctl_mu_;
  std::chrono::steady_clock::time_point last_ctl_;  // guarded by ctl_mu_
  // A failure outside a call (the keepalive, a clip-count read); the next
  // call rethrows it. Guarded by ctl_mu_.
  std::exception_ptr deferred_error_;
  std::atomic<bool> in_call_{false};                // a call (broadcast + this rank's part) in flight
  std::mutex ka_mu_;
  std::condition_variable ka_cv_;
  bool ka_stop_ = false;  // guarded by ka_mu_
  std::thread keepalive_;
  ModelConfig full_cfg_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<Rank> ranks_;
  // Worker dispatch.
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t job_gen_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> workers_;
};

}  // namespace fp8kv
