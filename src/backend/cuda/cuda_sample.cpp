// CudaBackend's LM head and sampling: logits + sample (host-driven), and
// sample_step, the same kernels inside the decode step (and its CUDA graph).
#include <cstring>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "backend/cuda/backend_checks.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"

namespace fp8kv {

using namespace cuda_checks;

void CudaBackend::logits(const Tensor& hidden, std::span<const int32_t> rows, const Tensor& output, Tensor& out) {
  const int64_t n = static_cast<int64_t>(rows.size()), H = hidden.cols, V = output.rows;
  if (output.cols != H || out.rows != n || out.cols != V)
    bad("logits", fmt::format("hidden {}, output {}, out {} for {} rows", shape(hidden), shape(output), shape(out), n));
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] < 0 || rows[i] >= hidden.rows) bad("logits", fmt::format("row {} outside hidden {}", rows[i], shape(hidden)));
  if (n == 0) return;
  const float* h = f32(hidden, "logits", "hidden");
  float* y = f32(out, "logits", "out");
  OpScope op(this, "logits", n, V, std::string("logits"));
  rows_dev_.reserve(static_cast<size_t>(n) * 4);
  void* rh = rows_host_.get(static_cast<size_t>(n) * 4);
  std::memcpy(rh, rows.data(), static_cast<size_t>(n) * 4);
  FP8KV_CU(cudaMemcpyAsync(rows_dev_.get(), rh, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
  rows_host_.copied(stream_);
  const cuda::DeviceMatrix Wo = matrix(output, "logits");
  if (gemm_->takes_w8a8(n, Wo) && reinterpret_cast<uintptr_t>(h) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0) {
    // An fp8 LM head in W8A8 mode: the chosen rows quantized straight from
    // the f32 hidden states (as the CPU's linear does), no bf16 copy. Its own
    // scratch (never in a graph).
    logits_w8a8_.reserve(cuda::Gemm::w8a8_scratch_bytes(n, Wo.fp8_row_bytes(), Wo.block128()));
    gemm_->linear_w8a8(cuda::Gemm::W8a8Input{h, true, rows_dev_.as<int32_t>()}, n, Wo, nullptr, y, false, false,
                       logits_w8a8_.get(), logits_w8a8_.bytes(), stream_);
  } else {
    // Its own staging buffer: never in a graph, so its growth does not drop them.
    logits_x_bf16_.reserve(static_cast<size_t>(n * H) * 2);
    cuda::to_bf16_rows(h, rows_dev_.as<int32_t>(), n, H, logits_x_bf16_.as<uint16_t>(), stream_);
    gemm_->linear(logits_x_bf16_.as<uint16_t>(), n, Wo, nullptr, y, false, stream_);
  }
  if (cfg_.final_logit_softcapping)
    cuda::softcap(y, n * V, static_cast<float>(*cfg_.final_logit_softcapping), stream_);
}

void CudaBackend::sample(const Tensor& logits, std::span<const RowSampling> params, std::span<int32_t> ids) {
  OpScope op(this, "sample");
  const int64_t n = logits.rows, V = logits.cols;
  if (static_cast<int64_t>(params.size()) != n || static_cast<int64_t>(ids.size()) != n)
    bad("sample", fmt::format("params/ids do not have one entry per logits row {}", shape(logits)));
  if (n == 0) return;
  OpScope ps(this, nullptr, "sample (+ids download)");
  const size_t pbytes = static_cast<size_t>(n) * sizeof(cuda::SampleParams);
  auto* p = static_cast<cuda::SampleParams*>(params_host_.get(pbytes));
  for (int64_t r = 0; r < n; ++r)
    p[r] = cuda::SampleParams{params[r].temperature, params[r].top_p, params[r].top_k, params[r].seed, params[r].counter};
  sample_params_.reserve(pbytes);
  sample_ids_.reserve(static_cast<size_t>(n) * 4);
  FP8KV_CU(cudaMemcpyAsync(sample_params_.get(), p, pbytes, cudaMemcpyHostToDevice, stream_));
  params_host_.copied(stream_);
  cuda::sample_rows(f32(logits, "sample", "logits"), static_cast<int>(n), static_cast<int>(V),
                    sample_params_.as<cuda::SampleParams>(), sample_ids_.as<int32_t>(), stream_);
  download_ids(sample_ids_.get(), ids);
}

// The sampled ids of the last sample kernel (on the device at dev) -> ids,
// one copy and the step's only sync; a negative id is the kernel's NaN mark.
void CudaBackend::download_ids(const void* dev, std::span<int32_t> ids) {
  const size_t bytes = ids.size() * sizeof(int32_t);
  void* ih = ids_host_.get(bytes);
  FP8KV_CU(cudaMemcpyAsync(ih, dev, bytes, cudaMemcpyDeviceToHost, stream_));
  if (sprof_) sprof_->before_ids_sync(stream_);
  FP8KV_CU(cudaStreamSynchronize(stream_));
  std::memcpy(ids.data(), ih, bytes);
  if (sprof_) sprof_->ids_synced();
  for (size_t r = 0; r < ids.size(); ++r)
    if (ids[r] < 0) throw std::runtime_error(fmt::format("non-finite logits (NaN) from the model in sampled row {}", r));
}

// The LM head of the step's sample rows and the sampling kernel, with every
// input in the step buffer (begin_step) and every output in a buffer that
// only grows through grow(): capturable, so a decode graph ends with the
// sampled ids on the device. The same kernels as logits() + sample() (the
// LM-head route of n rows, then sample_rows).
void CudaBackend::sample_step(const Tensor& hidden, const Tensor& output, Tensor& out) {
  OpScope op(this, "sample_step");
  const StepView& s = step("sample_step");
  const int64_t n = s.n_sample, H = hidden.cols, V = output.rows;
  if (n == 0) bad("sample_step", "the step has no sample rows (StepBatch::sample_rows)");
  if (output.cols != H || out.rows != n || out.cols != V || hidden.rows != s.T)
    bad("sample_step", fmt::format("hidden {}, output {}, out {} for {} rows", shape(hidden), shape(output),
                                   shape(out), n));
  const float* h = f32(hidden, "sample_step", "hidden");
  float* y = f32(out, "sample_step", "out");
  grow(step_sample_ids_, static_cast<size_t>(n) * 4);
  const cuda::DeviceMatrix Wo = matrix(output, "sample_step");
  if (gemm_->takes_w8a8(n, Wo) && reinterpret_cast<uintptr_t>(h) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0) {
    // W8A8 LM head: as logits() (the sample rows quantized from f32 h).
    writes_codes("sample_step");
    grow(w8a8_act_, cuda::Gemm::w8a8_scratch_bytes(n, Wo.fp8_row_bytes(), Wo.block128()));
    gemm_->linear_w8a8(cuda::Gemm::W8a8Input{h, true, s.sample_rows}, n, Wo, nullptr, y, false, false,
                       w8a8_act_.get(), w8a8_act_.bytes(), stream_);
  } else {
    grow(step_logits_x_, static_cast<size_t>(n * H) * 2);
    cuda::to_bf16_rows(h, s.sample_rows, n, H, step_logits_x_.as<uint16_t>(), stream_);
    gemm_->linear(step_logits_x_.as<uint16_t>(), n, Wo, nullptr, y, false, stream_);
  }
  if (cfg_.final_logit_softcapping)
    cuda::softcap(y, n * V, static_cast<float>(*cfg_.final_logit_softcapping), stream_);
  cuda::sample_rows(y, static_cast<int>(n), static_cast<int>(V), s.sample_params, step_sample_ids_.as<int32_t>(),
                    stream_);
}

bool CudaBackend::samples_in_step() const { return true; }

void CudaBackend::step_sampled_ids(std::span<int32_t> ids) {
  const StepView& s = step("step_sampled_ids");
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n > s.n_sample) bad("step_sampled_ids", fmt::format("{} ids asked, the step sampled {} rows", n, s.n_sample));
  if (n == 0) return;
  if (capturing_) throw std::logic_error("CudaBackend::step_sampled_ids during graph capture");
  download_ids(step_sample_ids_.get(), ids);
}


}  // namespace fp8kv
