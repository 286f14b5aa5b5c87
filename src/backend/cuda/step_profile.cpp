#include "backend/cuda/step_profile.h"

#include <cuda_profiler_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "backend/cuda/check.h"

namespace fp8kv::cuda {

namespace {

cudaEvent_t timing_event(cudaEvent_t& e) {
  if (!e) FP8KV_CU(cudaEventCreate(&e));
  return e;
}

float elapsed_us(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  FP8KV_CU(cudaEventElapsedTime(&ms, a, b));
  return ms * 1e3f;
}

double since_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

StepProfile::~StepProfile() {
  for (cudaEvent_t e : {begin_, graph_end_, tail_end_, prev_end_, op_start_})
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : op_events_) cudaEventDestroy(e);
}

void StepProfile::begin_step(cudaStream_t stream) {
  t_begin_ = std::chrono::steady_clock::now();
  if (have_synced_ && sampled_)
    host_gap_us_ += std::chrono::duration<double, std::micro>(t_begin_ - t_synced_).count(), ++n_host_gap_;
  have_prev_ = have_prev_ && sampled_;
  replayed_ = sampled_ = op_this_step_ = false;
  FP8KV_CU(cudaEventRecord(timing_event(begin_), stream));
}

void StepProfile::graph_launched(cudaStream_t stream) {
  FP8KV_CU(cudaEventRecord(timing_event(graph_end_), stream));
  host_launch_us_ += since_us(t_begin_);
  replayed_ = !op_this_step_;
  ++replays_;
}

void StepProfile::before_ids_sync(cudaStream_t stream) { FP8KV_CU(cudaEventRecord(timing_event(tail_end_), stream)); }

void StepProfile::ids_synced() {
  if (replayed_) {
    graph_us_ += elapsed_us(begin_, graph_end_);
    tail_us_ += elapsed_us(graph_end_, tail_end_);
    if (have_prev_) idle_us_ += elapsed_us(prev_end_, begin_), ++n_idle_;
    if (++n_ % 32 == 0) report(false);
  }
  std::swap(prev_end_, tail_end_);
  have_prev_ = sampled_ = true;
  t_synced_ = std::chrono::steady_clock::now();
  have_synced_ = true;
}

void StepProfile::op_begin(cudaStream_t stream) {
  op_mode_ = true;
  op_used_ = 0;
  FP8KV_CU(cudaStreamSynchronize(stream));
  (void)cudaProfilerStart();  // for ncu --profile-from-start off; a no-op otherwise
  (void)cudaGetLastError();   // (the stream is idle: nothing else can be pending)
  op_this_step_ = true;       // this step's graph time would contain the copy: not counted
  FP8KV_CU(cudaEventRecord(timing_event(op_start_), stream));
}

void StepProfile::op_end(cudaStream_t stream) {
  op_mode_ = false;
  op_done_ = true;
  FP8KV_CU(cudaStreamSynchronize(stream));
  (void)cudaProfilerStop();
  (void)cudaGetLastError();
  // Per label: time from the previous mark to this op's end (eager, the
  // host launching ahead: GPU time of the op plus the gap before it).
  std::map<std::string, std::pair<double, int>> per;
  double total = 0;
  cudaEvent_t prev = op_start_;
  for (size_t i = 0; i < op_used_; ++i) {
    const double us = elapsed_us(prev, op_events_[i]);
    auto& [t, c] = per[op_labels_[i]];
    t += us;
    ++c;
    total += us;
    prev = op_events_[i];
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(per.begin(), per.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  fmt::print(stderr, "step profile: eager op-timed decode step (replayed step {}): {} ops, {:.1f} us\n", replays_ + 1,
             op_used_, total);
  for (const auto& [label, tc] : rows)
    fmt::print(stderr, "step profile op: {:34} {:9.1f} us {:4d} calls {:8.2f} us/call {:6.1f}%\n", label, tc.first,
               tc.second, tc.first / tc.second, 100.0 * tc.first / std::max(total, 1e-9));
}

void StepProfile::op_mark(const char* op, int64_t n, int64_t k, cudaStream_t stream) {
  if (op_used_ == op_events_.size()) {
    op_events_.push_back(nullptr);
    timing_event(op_events_.back());
    op_labels_.emplace_back();
  }
  op_labels_[op_used_] = n > 0 ? fmt::format("{} {}x{}", op, n, k) : std::string(op);
  FP8KV_CU(cudaEventRecord(op_events_[op_used_], stream));
  ++op_used_;
}

void StepProfile::report(bool final_report) const {
  if (n_ == 0) return;
  const double n = static_cast<double>(n_);
  const double idle = n_idle_ ? idle_us_ / n_idle_ : 0, gap = n_host_gap_ ? host_gap_us_ / n_host_gap_ : 0;
  fmt::print(stderr,
             "step profile{}: {} replayed steps, per step (us): graph {:.1f} (begin_step's copy + replay, on the "
             "device), logits+sample tail {:.1f}, device idle before the step {:.1f} ({} steps); period {:.1f}; "
             "host: sample's sync -> begin_step {:.1f}, begin_step + launch {:.1f}\n",
             final_report ? "" : " (running)", n_, graph_us_ / n, tail_us_ / n, idle, n_idle_,
             graph_us_ / n + tail_us_ / n + idle, gap, host_launch_us_ / n);
}

}  // namespace fp8kv::cuda
