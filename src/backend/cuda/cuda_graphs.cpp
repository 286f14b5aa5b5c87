// CudaBackend's CUDA graphs and the scratch buffers they point into.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"

namespace fp8kv {

// ---- CUDA graphs --------------------------------------------------------------
// docs/cuda_backend.md "CUDA graphs": one graph per decode bucket, captured by
// the ModelRunner after an eager warm-up of the same bucket; the step's inputs
// reach a replay through step_dev_ (begin_step copies into the same buffer),
// and its decode plan is made for max_model_len, so it covers every context.

void CudaBackend::grow(cuda::DeviceBuffer& buf, size_t bytes) {
  if (bytes <= buf.bytes()) return;
  if (&buf == &w8a8_act_ && norm_codes_.x)  // a reallocation would lose them (add_rmsnorm_for sizes it first)
    throw std::logic_error("CudaBackend: the W8A8 activation buffer would grow while a norm's codes wait for a GEMM");
  if (capturing_)
    throw std::logic_error(fmt::format("CudaBackend: a scratch buffer would grow to {} bytes during graph capture "
                                       "(the eager warm-up must size it)",
                                       bytes));
  // Geometric growth: a few reallocations (each invalidates the graphs) in a run.
  if (!graphs_.empty())
    spdlog::info("CudaBackend: a scratch buffer grows from {} to {} bytes: {} CUDA graphs will be re-captured",
                  buf.bytes(), bytes, graphs_.size());
  buf.reserve(std::max(bytes, buf.bytes() + buf.bytes() / 2));
  ++buffers_gen_;
}

// The decode workspace of every plan a step can ask for: batches of 1 ..
// max_seqs decode rows (a mixed step's decode part is not a bucket size) at
// max_context, for each distinct window of the model's layers. plan_decode
// is host arithmetic; the largest workspace is reserved once.
void CudaBackend::reserve_decode_scratch(int max_seqs, int max_context) {
  std::vector<int> windows;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const int w = cfg_.window_for_layer(l);
    if (std::find(windows.begin(), windows.end(), w) == windows.end()) windows.push_back(w);
  }
  size_t most = 16;
  for (int w : windows)
    for (int b = 1; b <= max_seqs; ++b)
      most = std::max(most, cuda::plan_decode(b, cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim, max_context, w,
                                              cuda::device_sm_count(), /*split_tokens=*/0,
                                              /*ctas_per_sm=*/0, layout_.dtype)
                                .workspace_bytes);
  grow(decode_ws_, most);
}

void CudaBackend::drop_graphs() {
  if (capturing_) throw std::logic_error("CudaBackend: buffers changed during graph capture");
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  ++buffers_gen_;
}

bool CudaBackend::replay_graph(int64_t key) {
  if (!supports_graphs()) return false;
  auto it = graphs_.find(key);
  if (it == graphs_.end()) return false;
  if (it->second.gen != buffers_gen_) {
    cudaGraphExecDestroy(it->second.exec);
    graphs_.erase(it);
    return false;
  }
  FP8KV_CU(cudaGraphLaunch(it->second.exec, stream_));
  if (sprof_) sprof_->graph_launched(stream_);
  return true;
}

void CudaBackend::begin_graph_capture(int64_t /*key*/) {
  if (capturing_) throw std::logic_error("CudaBackend::begin_graph_capture: already capturing");
  if (!supports_graphs()) throw std::logic_error("CudaBackend::begin_graph_capture: graphs are off");
  // Thread-local mode: other threads' unrelated CUDA calls do not break it.
  FP8KV_CU(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

void CudaBackend::end_graph_capture(int64_t key) {
  if (!capturing_) throw std::logic_error("CudaBackend::end_graph_capture without begin_graph_capture");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  FP8KV_CU(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  FP8KV_CU(e);
  if (auto it = graphs_.find(key); it != graphs_.end()) cudaGraphExecDestroy(it->second.exec);
  graphs_[key] = Graph{exec, buffers_gen_};
}

void CudaBackend::abort_graph_capture() {
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(stream_, &graph);  // fails when the capture was invalidated
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
}


}  // namespace fp8kv
