// The step part of FP8KV_PROFILE (backend/common/profile.h; docs/cuda_backend.md
// "Batch-1 step"): per replayed decode step, the event times of the graph
// (begin_step's copy + replay), of the logits / sample tail, and the device
// idle time before the step, with the host's gaps, printed to stderr every
// 32 steps and at the end; and one eager, op-timed copy of the N-th replayed
// step (the runner runs it before the replay: Backend::op_profile_due), with
// one line per op label. Events only: the kernels and their results are
// those of an unprofiled run.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fp8kv::cuda {

class StepProfile {
 public:
  explicit StepProfile(int op_step) : op_step_(op_step) {}
  ~StepProfile();  // destroys the events (report(true) first, while the stream exists)
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  // The step's start (CudaBackend::begin_step).
  void begin_step(cudaStream_t stream);
  // After a decode graph's launch.
  void graph_launched(cudaStream_t stream);
  // Before the sync that brings the sampled ids to the host, and after it.
  void before_ids_sync(cudaStream_t stream);
  void ids_synced();

  // The op-timed eager step: due (this replayed step is the N-th), then
  // op_begin / op_end around it, op_mark at the end of each op.
  bool op_due(bool capturing) const { return !op_done_ && !capturing && replays_ + 1 >= op_step_; }
  void op_begin(cudaStream_t stream);
  void op_end(cudaStream_t stream);
  bool op_mode() const { return op_mode_; }
  // label: "op" or, with n > 0, "op NxK" (a GEMM's weight shape).
  void op_mark(const char* op, int64_t n, int64_t k, cudaStream_t stream);

  // The per-step averages so far (final_report: the end of the run).
  void report(bool final_report) const;

 private:
  int op_step_;                // replayed step that gets the op-timed eager copy
  bool op_done_ = false, op_mode_ = false, op_this_step_ = false;
  int64_t replays_ = 0;        // replayed steps so far
  bool replayed_ = false, sampled_ = false, have_prev_ = false;
  cudaEvent_t begin_ = nullptr, graph_end_ = nullptr, tail_end_ = nullptr, prev_end_ = nullptr;
  std::chrono::steady_clock::time_point t_begin_{}, t_synced_{};
  bool have_synced_ = false;
  int64_t n_ = 0;
  double graph_us_ = 0, tail_us_ = 0, idle_us_ = 0, host_gap_us_ = 0, host_launch_us_ = 0;
  int64_t n_idle_ = 0, n_host_gap_ = 0;
  cudaEvent_t op_start_ = nullptr;
  std::vector<cudaEvent_t> op_events_;
  std::vector<std::string> op_labels_;
  size_t op_used_ = 0;
};

}  // namespace fp8kv::cuda
