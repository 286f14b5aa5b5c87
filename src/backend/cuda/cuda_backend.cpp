// CudaBackend's shell: construction, memory, the per-step upload
// (begin_step) and the op scope that feeds the profiles. The ops, weights,
// sampling and graphs are in cuda_forward.cpp, cuda_weights.cpp,
// cuda_sample.cpp and cuda_graphs.cpp.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "backend/common/profile.h"
#include "backend/cuda/backend_checks.h"
#include "backend/cuda/check.h"
#include "backend/startup_profile.h"
#include "io/errors.h"

namespace fp8kv {

using namespace cuda_checks;

namespace {
size_t align16(size_t n) { return (n + 15) / 16 * 16; }
}  // namespace

bool cuda_device_available() { return cuda::cuda_device_available(); }
int cuda_device_count() { return cuda::cuda_device_count(); }

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& cfg, const BackendOptions& opts) {
  return std::make_unique<CudaBackend>(cfg, opts);
}

CudaBackend::CudaBackend(const ModelConfig& cfg, const BackendOptions& opts)
    : cfg_(cfg),
      device_(opts.device),
      rope_full_(cfg.rope_full, cfg.head_dim, cfg.max_position_embeddings),
      rope_sliding_(cfg.rope_sliding, cfg.head_dim, cfg.max_position_embeddings) {
  if (!cuda::cuda_device_available())
    throw InputError("--backend cuda: no CUDA device is available (cudaGetDeviceCount found none); use --backend cpu");
  if (cfg.head_dim != 64 && cfg.head_dim != 128 && cfg.head_dim != 256)
    throw InputError(fmt::format("--backend cuda: head_dim {} is not supported by the CUDA attention kernels "
                                 "(64, 128 or 256); use --backend cpu",
                                 cfg.head_dim));
  if (cfg.num_kv_heads <= 0 || cfg.num_heads % cfg.num_kv_heads != 0)
    throw InputError(fmt::format("--backend cuda: num_heads {} is not a multiple of num_kv_heads {}", cfg.num_heads,
                                 cfg.num_kv_heads));
  enforce_eager_ = opts.enforce_eager;
  StartupPhase phase("backend init (cuda context, stream, cuBLASLt)");
  FP8KV_CU(cudaSetDevice(device_));
  FP8KV_CU(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<cuda::Gemm>();
  const ProfileConfig profile = profile_config();  // FP8KV_PROFILE
  if (profile.prefill) prof_ = std::make_unique<cuda::PrefillProfile>(profile.prefill_min_rows);
  if (profile.step) sprof_ = std::make_unique<cuda::StepProfile>(profile.step_op_step);
  cuda::upload_f32(rope_full_.inv_freq(), inv_freq_full_);
  cuda::upload_f32(rope_sliding_.inv_freq(), inv_freq_sliding_);
}

CudaBackend::~CudaBackend() {
  prof_.reset();  // prints the pending prefill profile while the stream exists
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  if (stream_) {
    cudaStreamSynchronize(stream_);
    if (sprof_) sprof_->report(true);
    cudaStreamDestroy(stream_);
  }
}

CudaBackend::Pinned::~Pinned() {
  if (done) {
    cudaEventSynchronize(done);
    cudaEventDestroy(done);
  }
  if (p) cudaFreeHost(p);
}

void* CudaBackend::Pinned::get(size_t bytes) {
  if (pending) {
    FP8KV_CU(cudaEventSynchronize(done));
    pending = false;
  }
  if (bytes > n) {
    const size_t want = std::max<size_t>({bytes, n + n / 2, 256});
    if (p) FP8KV_CU(cudaFreeHost(p));
    p = nullptr;
    n = 0;
    FP8KV_CU(cudaHostAlloc(&p, want, cudaHostAllocDefault));
    n = want;
  }
  return p;
}

void CudaBackend::Pinned::copied(cudaStream_t stream) {
  if (!done) FP8KV_CU(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  FP8KV_CU(cudaEventRecord(done, stream));
  pending = true;
}

// ---- profiling scope ----------------------------------------------------------

CudaBackend::OpScope::OpScope(CudaBackend* b, const char* step_op, const char* prefill_key, double flops)
    : be_(b), op_(step_op) {
  start(prefill_key, flops);
}

CudaBackend::OpScope::OpScope(CudaBackend* b, const char* step_op, int64_t n, int64_t k,
                              const std::string& prefill_key, double flops)
    : be_(b), op_(step_op), n_(n), k_(k) {
  start(prefill_key.empty() ? nullptr : prefill_key.c_str(), flops);
}

CudaBackend::OpScope::OpScope(CudaBackend* b, const char* step_op, const std::string& prefill_key, double flops)
    : be_(b), op_(step_op) {
  start(prefill_key.empty() ? nullptr : prefill_key.c_str(), flops);
}

void CudaBackend::OpScope::start(const char* prefill_key, double flops) {
  cuda::PrefillProfile* p = be_->prof_.get();
  if (!prefill_key || !p || !p->active()) return;
  p->start(prefill_key, flops);
  prefill_ = p;
}

CudaBackend::OpScope::~OpScope() {
  if (prefill_) prefill_->stop();
  if (op_ && be_->sprof_ && be_->sprof_->op_mode()) be_->sprof_->op_mark(op_, n_, k_, be_->stream_);
}


bool CudaBackend::op_profile_due() { return sprof_ && sprof_->op_due(capturing_); }

void CudaBackend::op_profile(bool on) {
  if (!sprof_) return;
  if (on)
    sprof_->op_begin(stream_);
  else
    sprof_->op_end(stream_);
}

MemoryInfo CudaBackend::memory_info() const {
  size_t free_b = 0, total_b = 0;
  FP8KV_CU(cudaMemGetInfo(&free_b, &total_b));
  return MemoryInfo{total_b, free_b};
}

DeviceBuffer CudaBackend::alloc(size_t bytes) {
  void* p = nullptr;
  FP8KV_CU(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  return DeviceBuffer(p, bytes, [](void* q) { cudaFree(q); });
}

void CudaBackend::upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  FP8KV_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  FP8KV_CU(cudaStreamSynchronize(stream_));
}

void CudaBackend::download(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  FP8KV_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  FP8KV_CU(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() { FP8KV_CU(cudaStreamSynchronize(stream_)); }

// ---- step ------------------------------------------------------------------------

void CudaBackend::begin_step(const StepBatch& b) {
  norm_codes_ = {};
  if (sprof_) sprof_->begin_step(stream_);
  const int T = b.num_tokens, S = b.num_seqs, G = b.num_groups, B = b.max_blocks_per_seq, nd = b.num_decodes;
  if (static_cast<int>(b.token_ids.size()) != T || static_cast<int>(b.positions.size()) != T ||
      static_cast<int>(b.query_start.size()) != S + 1 || static_cast<int>(b.context_lens.size()) != S ||
      static_cast<int>(b.slot_mapping.size()) != G || static_cast<int>(b.block_tables.size()) != G || nd < 0 || nd > S)
    bad("begin_step", "StepBatch arrays do not match num_tokens / num_seqs / num_groups");
  for (int g = 0; g < G; ++g)
    if (static_cast<int>(b.slot_mapping[g].size()) != T ||
        static_cast<int64_t>(b.block_tables[g].size()) != static_cast<int64_t>(S) * B)
      bad("begin_step", fmt::format("group {}: slot mapping / block table sizes", g));
  for (int t = 0; t < T; ++t)
    if (b.token_ids[t] < 0 || b.token_ids[t] >= cfg_.vocab_size)
      throw std::out_of_range(fmt::format("CudaBackend::begin_step: token id {} outside the vocabulary ({})",
                                          b.token_ids[t], cfg_.vocab_size));
  StepView v;
  v.T = T;
  v.S = S;
  v.num_decodes = nd;
  v.B = B;
  for (int s = 0; s < nd; ++s) {
    if (b.query_len(s) != 1) bad("begin_step", fmt::format("decode sequence {} has {} query tokens", s, b.query_len(s)));
    v.max_decode_context = std::max(v.max_decode_context, b.context_lens[s]);
  }
  for (int s = nd; s < S; ++s) v.max_prefill_query = std::max(v.max_prefill_query, b.query_len(s));
  v.prefill_row0 = b.query_start[nd];
  if (b.decode_plan_context < 0) bad("begin_step", "negative decode_plan_context");
  v.decode_plan_context = std::max(v.max_decode_context, b.decode_plan_context);

  // Pack everything into one host buffer (16-byte aligned sections) and copy once.
  const int P = S - nd;
  size_t off = 0;
  auto section = [&](size_t bytes) {
    const size_t at = off;
    off += align16(bytes);
    return at;
  };
  const size_t o_ids = section(T * 4), o_pos = section(T * 4), o_ctx = section(S * 4), o_qs = section((P + 1) * 4);
  // Every sequence's rows and its state slot (Gated DeltaNet kernels, gdn/gdn.h).
  const bool has_slots = !b.state_slots.empty();
  if (has_slots && static_cast<int>(b.state_slots.size()) != S)
    bad("begin_step", fmt::format("the step has {} state slots for {} sequences", b.state_slots.size(), S));
  const size_t o_qall = section((S + 1) * 4), o_sslots = section(has_slots ? S * 4 : 0);
  const int ns = static_cast<int>(b.sample_rows.size());
  if (b.sample_params.size() != b.sample_rows.size()) bad("begin_step", "sample_rows and sample_params differ in size");
  for (int i = 0; i < ns; ++i)
    if (b.sample_rows[i] < 0 || b.sample_rows[i] >= T)
      bad("begin_step", fmt::format("sample row {} outside the step's {} rows", b.sample_rows[i], T));
  const size_t o_srows = section(static_cast<size_t>(ns) * 4),
               o_sparams = section(static_cast<size_t>(ns) * sizeof(cuda::SampleParams));
  std::vector<size_t> o_slots(G), o_bt(G);
  for (int g = 0; g < G; ++g) o_slots[g] = section(static_cast<size_t>(T) * 8);
  for (int g = 0; g < G; ++g) o_bt[g] = section(static_cast<size_t>(S) * B * 4);
  // Pageable staging on purpose: a small pageable H2D copy is staged by the
  // driver at the call (the buffer is free again on return); the pinned
  // variant (a copy-engine DMA) gained nothing (docs/cuda_backend.md
  // "Batch-1 step").
  step_host_.assign(off, 0);
  uint8_t* host = step_host_.data();
  std::memcpy(host + o_ids, b.token_ids.data(), T * 4);
  std::memcpy(host + o_pos, b.positions.data(), T * 4);
  std::memcpy(host + o_ctx, b.context_lens.data(), S * 4);
  auto* qs = reinterpret_cast<int32_t*>(host + o_qs);
  for (int i = 0; i <= P; ++i) qs[i] = b.query_start[nd + i] - v.prefill_row0;
  std::memcpy(host + o_qall, b.query_start.data(), static_cast<size_t>(S + 1) * 4);
  if (has_slots) std::memcpy(host + o_sslots, b.state_slots.data(), static_cast<size_t>(S) * 4);
  const int64_t capacity = static_cast<int64_t>(layout_.num_blocks) * layout_.block_size;
  for (int g = 0; g < G && static_cast<size_t>(g) < stored_groups_; ++g) {  // kv_clip_counts' stored elements
    uint64_t n = 0;
    for (const int64_t slot : b.slot_mapping[g]) n += slot >= 0 && slot < capacity;
    if (n) stored_tokens_[g].fetch_add(n, std::memory_order_relaxed);
  }
  for (int g = 0; g < G; ++g) {
    std::memcpy(host + o_slots[g], b.slot_mapping[g].data(), static_cast<size_t>(T) * 8);
    std::memcpy(host + o_bt[g], b.block_tables[g].data(), static_cast<size_t>(S) * B * 4);
  }
  std::memcpy(host + o_srows, b.sample_rows.data(), static_cast<size_t>(ns) * 4);
  for (int i = 0; i < ns; ++i) {
    const RowSampling& r = b.sample_params[i];
    const cuda::SampleParams sp{r.temperature, r.top_p, r.top_k, r.seed, r.counter};
    std::memcpy(host + o_sparams + i * sizeof(cuda::SampleParams), &sp, sizeof sp);
  }
  grow(step_dev_, std::max<size_t>(off, 16));
  FP8KV_CU(cudaMemcpyAsync(step_dev_.get(), host, off, cudaMemcpyHostToDevice, stream_));
  const auto* base = static_cast<const uint8_t*>(step_dev_.get());
  v.ids = reinterpret_cast<const int32_t*>(base + o_ids);
  v.positions = reinterpret_cast<const int32_t*>(base + o_pos);
  v.context_lens = reinterpret_cast<const int32_t*>(base + o_ctx);
  v.prefill_q_start = reinterpret_cast<const int32_t*>(base + o_qs);
  v.q_start = reinterpret_cast<const int32_t*>(base + o_qall);
  v.state_slots = has_slots ? reinterpret_cast<const int32_t*>(base + o_sslots) : nullptr;
  for (int g = 0; g < G; ++g) {
    v.slots.push_back(reinterpret_cast<const int64_t*>(base + o_slots[g]));
    v.block_tables.push_back(reinterpret_cast<const int32_t*>(base + o_bt[g]));
  }
  v.n_sample = ns;
  v.sample_rows = reinterpret_cast<const int32_t*>(base + o_srows);
  v.sample_params = reinterpret_cast<const cuda::SampleParams*>(base + o_sparams);
  step_ = std::move(v);
  have_step_ = true;
  if (prof_) prof_->begin_step(T, S, nd, stream_, capturing_);
}

const CudaBackend::StepView& CudaBackend::step(const char* op) const {
  if (!have_step_) throw std::logic_error(fmt::format("CudaBackend::{} before begin_step", op));
  return step_;
}


}  // namespace fp8kv
