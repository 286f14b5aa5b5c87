#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <cuda_profiler_api.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/dummy_fill.h"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/prefill_profile.h"
#include "backend/startup_profile.h"
#include "io/errors.h"
#include "model/weights.h"
#include "numerics/fp8.h"

namespace fp8kv {

namespace {

[[noreturn]] void bad(const char* op, const std::string& what) {
  throw std::invalid_argument(fmt::format("CudaBackend::{}: {}", op, what));
}

std::string shape(const Tensor& t) { return fmt::format("[{}][{}] {}", t.rows, t.cols, scalar_type_name(t.dtype)); }

float* f32(const Tensor& t, const char* op, const char* name) {
  if (t.dtype != ScalarType::f32) bad(op, fmt::format("{} must be f32, got {}", name, shape(t)));
  if (!t.data && t.numel() > 0) bad(op, fmt::format("{} is empty", name));
  return static_cast<float*>(t.data);
}

const float* opt_vec(const Tensor& t, int64_t n, const char* op, const char* name) {
  if (t.empty()) return nullptr;
  if (t.dtype != ScalarType::f32 || t.numel() != n)
    bad(op, fmt::format("{} must be f32 with {} elements, got {}", name, n, shape(t)));
  return static_cast<const float*>(t.data);
}

cuda::DeviceMatrix matrix(const Tensor& w, const char* op) {
  if (w.dtype != ScalarType::bf16) bad(op, fmt::format("weight must be bf16 (uploaded by this backend), got {}", shape(w)));
  return cuda::DeviceMatrix{static_cast<const uint16_t*>(w.data), w.rows, w.cols};
}

void same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.rows != b.rows || a.cols != b.cols) bad(op, fmt::format("shapes differ: {} vs {}", shape(a), shape(b)));
}

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// FP8KV_PREFILL_PROFILE (prefill_profile.h): a GEMM's class key (by weight
// shape; formatted only on profiled steps) and FLOPs.
std::string gemm_key(const cuda::PrefillProfile* p, const Tensor& w, const char* suffix = "") {
  return p && p->active() ? fmt::format("gemm N={} K={}{}", w.rows, w.cols, suffix) : std::string();
}
double gemm_flops(int64_t T, const Tensor& w) {
  return 2.0 * static_cast<double>(T) * static_cast<double>(w.rows) * static_cast<double>(w.cols);
}

// Weight upload through two pinned staging buffers (docs/cuda_backend.md
// "Startup (2026-12-01)"): the host fills one buffer (a parallel copy, or
// the parallel fp32 -> bf16 RNE conversion of f32_to_bf16) while the copy
// engine reads the other, so the upload runs at pinned-copy speed instead
// of the driver's pageable staging, and fp32 checkpoints convert on all
// cores. The bytes on the device are the same as upload_matrix_bf16_to's.
// A failed pinned allocation falls back to that function.
class PinnedUploader {
 public:
  explicit PinnedUploader(cudaStream_t stream) : stream_(stream) {}
  PinnedUploader(const PinnedUploader&) = delete;
  PinnedUploader& operator=(const PinnedUploader&) = delete;
  ~PinnedUploader() {
    for (Buf& b : bufs_) {
      if (b.ev) {
        cudaEventSynchronize(b.ev);
        cudaEventDestroy(b.ev);
      }
      if (b.p) cudaFreeHost(b.p);
    }
  }
  void copy(const MatrixRef& m, uint16_t* dst) {
    const size_t count = static_cast<size_t>(m.rows) * static_cast<size_t>(m.cols);
    if (!count) return;
    bytes_ += count * 2;
    if (!ready()) {
      cuda::upload_matrix_bf16_to(m, dst);
      return;
    }
    for (size_t i0 = 0; i0 < count; i0 += kChunk) {
      Buf& b = bufs_[next_];
      next_ ^= 1;
      if (b.pending) FP8KV_CU(cudaEventSynchronize(b.ev));
      b.pending = false;
      const int64_t n = static_cast<int64_t>(std::min(kChunk, count - i0));
      if (m.type == WeightType::bf16) {
        const auto* src = static_cast<const uint16_t*>(m.data) + i0;
        constexpr int64_t kPiece = int64_t{1} << 19;  // 1 MB per task
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n; j += kPiece)
          std::memcpy(b.p + j, src + j, static_cast<size_t>(std::min(kPiece, n - j)) * 2);
      } else {
        const float* src = static_cast<const float*>(m.data) + i0;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n; ++j) b.p[j] = f32_to_bf16(src[j]);
      }
      FP8KV_CU(cudaMemcpyAsync(dst + i0, b.p, static_cast<size_t>(n) * 2, cudaMemcpyHostToDevice, stream_));
      FP8KV_CU(cudaEventRecord(b.ev, stream_));
      b.pending = true;
    }
  }
  void finish() { FP8KV_CU(cudaStreamSynchronize(stream_)); }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return state_ == 1; }

 private:
  static constexpr size_t kChunk = size_t{1} << 25;  // elements per staging buffer (64 MB)
  struct Buf {
    uint16_t* p = nullptr;
    cudaEvent_t ev = nullptr;
    bool pending = false;
  };
  bool ready() {
    if (state_ == 0) {
      state_ = 1;
      for (Buf& b : bufs_) {
        void* p = nullptr;
        if (cudaHostAlloc(&p, kChunk * 2, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&b.ev, cudaEventDisableTiming) != cudaSuccess) {
          (void)cudaGetLastError();
          if (p) cudaFreeHost(p);
          state_ = 2;  // pageable fallback
          break;
        }
        b.p = static_cast<uint16_t*>(p);
      }
    }
    return state_ == 1;
  }
  cudaStream_t stream_;
  Buf bufs_[2];
  int next_ = 0;
  int state_ = 0;  // 0: not yet allocated, 1: pinned, 2: pageable fallback
  size_t bytes_ = 0;
};

}  // namespace

// FP8KV_PREFILL_Q_BF16 (read per step): q in bf16 on prefill-only steps.
bool prefill_q_bf16_from_env();

bool cuda_device_available() { return cuda::cuda_device_available(); }

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
  if (const char* e = std::getenv("FP8KV_STEP_PROFILE"); e && *e && std::string(e) != "0") {
    sprof_.on = true;
    sprof_.op_step = std::max(1, std::atoi(e));
  }
  FP8KV_CU(cudaSetDevice(device_));
  FP8KV_CU(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<cuda::Gemm>();
  if (const int n = cuda::PrefillProfile::threshold_from_env(); n > 0)
    prof_ = std::make_unique<cuda::PrefillProfile>(n);  // FP8KV_PREFILL_PROFILE
  cuda::upload_f32(rope_full_.inv_freq(), inv_freq_full_);
  cuda::upload_f32(rope_sliding_.inv_freq(), inv_freq_sliding_);
}

CudaBackend::~CudaBackend() {
  prof_.reset();  // prints the pending prefill profile while the stream exists
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  if (stream_) {
    cudaStreamSynchronize(stream_);
    if (sprof_.on) prof_report(true);
    cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : {sprof_.begin, sprof_.graph_end, sprof_.tail_end, sprof_.prev_end, sprof_.op_start})
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : sprof_.op_events) cudaEventDestroy(e);
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

// ---- step profile (FP8KV_STEP_PROFILE) ------------------------------------------

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
}  // namespace

bool CudaBackend::op_profile_due() {
  return sprof_.on && !sprof_.op_done && !capturing_ && sprof_.replays + 1 >= sprof_.op_step;
}

void CudaBackend::op_profile(bool on) {
  if (!sprof_.on) return;
  if (on) {
    sprof_.op_mode = true;
    sprof_.op_used = 0;
    FP8KV_CU(cudaStreamSynchronize(stream_));
    (void)cudaProfilerStart();  // for ncu --profile-from-start off (scripts/gpu_step.sh); a no-op otherwise
    (void)cudaGetLastError();   // (the stream is idle: nothing else can be pending)
    sprof_.op_this_step = true;  // this step's graph time would contain the copy: not counted
    FP8KV_CU(cudaEventRecord(timing_event(sprof_.op_start), stream_));
    return;
  }
  sprof_.op_mode = false;
  sprof_.op_done = true;
  FP8KV_CU(cudaStreamSynchronize(stream_));
  (void)cudaProfilerStop();
  (void)cudaGetLastError();
  // Per label: time from the previous mark to this op's end (eager, the
  // host launching ahead: GPU time of the op plus the gap before it).
  std::map<std::string, std::pair<double, int>> per;
  double total = 0;
  cudaEvent_t prev = sprof_.op_start;
  for (size_t i = 0; i < sprof_.op_used; ++i) {
    const double us = elapsed_us(prev, sprof_.op_events[i]);
    auto& [t, c] = per[sprof_.op_labels[i]];
    t += us;
    ++c;
    total += us;
    prev = sprof_.op_events[i];
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(per.begin(), per.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  fmt::print(stderr, "step profile: eager op-timed decode step (replayed step {}): {} ops, {:.1f} us\n",
             sprof_.replays + 1, sprof_.op_used, total);
  for (const auto& [label, tc] : rows)
    fmt::print(stderr, "step profile op: {:34} {:9.1f} us {:4d} calls {:8.2f} us/call {:6.1f}%\n", label, tc.first,
               tc.second, tc.first / tc.second, 100.0 * tc.first / std::max(total, 1e-9));
}

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
  if (op_ && be_->sprof_.op_mode) be_->op_mark(op_, n_, k_);
}

void CudaBackend::op_mark(const char* op, int64_t n, int64_t k) {
  if (sprof_.op_used == sprof_.op_events.size()) {
    sprof_.op_events.push_back(nullptr);
    timing_event(sprof_.op_events.back());
    sprof_.op_labels.emplace_back();
  }
  sprof_.op_labels[sprof_.op_used] = n > 0 ? fmt::format("{} {}x{}", op, n, k) : std::string(op);
  FP8KV_CU(cudaEventRecord(sprof_.op_events[sprof_.op_used], stream_));
  ++sprof_.op_used;
}

void CudaBackend::prof_report(bool final_report) {
  const StepProfile& p = sprof_;
  if (p.n == 0) return;
  const double n = static_cast<double>(p.n);
  const double idle = p.n_idle ? p.idle_us / p.n_idle : 0, gap = p.n_host_gap ? p.host_gap_us / p.n_host_gap : 0;
  fmt::print(stderr,
             "step profile{}: {} replayed steps, per step (us): graph {:.1f} (begin_step's copy + replay, on the "
             "device), logits+sample tail {:.1f}, device idle before the step {:.1f} ({} steps); period {:.1f}; "
             "host: sample's sync -> begin_step {:.1f}, begin_step + launch {:.1f}; routes {}\n",
             final_report ? "" : " (running)", p.n, p.graph_us / n, p.tail_us / n, idle, p.n_idle,
             p.graph_us / n + p.tail_us / n + idle, gap, p.host_launch_us / n, p.routes);
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

// ---- weights ----------------------------------------------------------------

BackendWeights CudaBackend::upload_weights(std::shared_ptr<const ModelWeights> w) {
  StartupPhase phase("weights upload (cuda)");
  BackendWeights b;
  PinnedUploader up(stream_);
  // A host matrix through the staging buffers, or a dummy one generated here.
  size_t generated = 0;  // bytes made on the device (dummy)
  auto put = [&](const WeightMatrix& m, uint16_t* dst) {
    if (m.dummy) {
      cuda::dummy_fill_bf16(dst, m.dummy_key, m.rows * m.cols, m.dummy_std, stream_);
      generated += static_cast<size_t>(m.rows * m.cols) * 2;
    } else
      up.copy(MatrixRef{m.data, m.bf16 ? WeightType::bf16 : WeightType::f32, m.rows, m.cols}, dst);
  };
  auto mat = [&](const WeightMatrix& m) -> Tensor {
    if (!m.data && !m.dummy) return {};
    DeviceBuffer buf = alloc(static_cast<size_t>(m.rows * m.cols) * 2);
    put(m, static_cast<uint16_t*>(buf.data()));
    Tensor t{buf.data(), ScalarType::bf16, m.rows, m.cols};
    b.storage.push_back(std::move(buf));
    return t;
  };
  auto vec = [&](const std::vector<float>& v) -> Tensor {
    if (v.empty()) return {};
    DeviceBuffer buf = alloc(v.size() * sizeof(float));
    upload(buf.data(), v.data(), v.size() * sizeof(float));
    Tensor t{buf.data(), ScalarType::f32, 1, static_cast<int64_t>(v.size())};
    b.storage.push_back(std::move(buf));
    return t;
  };
  b.embed = mat(w->embed);
  b.output = w->lm_head ? mat(*w->lm_head) : b.embed;  // tied: the same device memory
  b.final_norm = vec(w->final_norm);
  b.embed_scale = w->embed_scale;
  // Several matrices with the same column count in one allocation (rows
  // concatenated): the fused matrix and a view of each part.
  auto fused = [&](std::initializer_list<std::pair<const WeightMatrix*, Tensor*>> parts) -> Tensor {
    int64_t rows = 0, cols = -1;
    for (auto [m, t] : parts) {
      if (!m->data && !m->dummy) bad("upload_weights", "a fused projection part is missing");
      if (cols >= 0 && m->cols != cols) bad("upload_weights", "fused projection parts differ in columns");
      cols = m->cols;
      rows += m->rows;
    }
    DeviceBuffer buf = alloc(static_cast<size_t>(rows * cols) * 2);
    auto* base = static_cast<uint16_t*>(buf.data());
    int64_t r0 = 0;
    for (auto [m, t] : parts) {
      put(*m, base + r0 * cols);
      *t = Tensor{base + r0 * cols, ScalarType::bf16, m->rows, m->cols};
      r0 += m->rows;
    }
    Tensor all{buf.data(), ScalarType::bf16, rows, cols};
    b.storage.push_back(std::move(buf));
    return all;
  };
  // Biases of fused parts: concatenated (a missing part is zeros); none at all -> empty.
  auto fused_bias = [&](std::initializer_list<std::pair<const std::vector<float>*, int64_t>> parts) -> Tensor {
    bool any = false;
    for (auto [v, n] : parts) any = any || !v->empty();
    if (!any) return {};
    std::vector<float> all;
    for (auto [v, n] : parts) {
      if (v->empty())
        all.insert(all.end(), static_cast<size_t>(n), 0.0f);
      else
        all.insert(all.end(), v->begin(), v->end());
    }
    return vec(all);
  };
  b.layers.reserve(w->layers.size());
  for (const LayerWeights& L : w->layers) {
    BackendLayerWeights o;
    o.input_norm = vec(L.input_norm);
    o.qkv_proj = fused({{&L.q_proj, &o.q_proj}, {&L.k_proj, &o.k_proj}, {&L.v_proj, &o.v_proj}});
    o.o_proj = mat(L.o_proj);
    o.q_bias = vec(L.q_bias);
    o.k_bias = vec(L.k_bias);
    o.v_bias = vec(L.v_bias);
    o.qkv_bias = fused_bias({{&L.q_bias, L.q_proj.rows}, {&L.k_bias, L.k_proj.rows}, {&L.v_bias, L.v_proj.rows}});
    o.o_bias = vec(L.o_bias);
    o.q_norm = vec(L.q_norm);
    o.k_norm = vec(L.k_norm);
    o.post_attention_norm = vec(L.post_attention_norm);
    o.pre_ffn_norm = vec(L.pre_ffn_norm);
    o.post_ffn_norm = vec(L.post_ffn_norm);
    o.gate_up_proj = fused({{&L.gate_proj, &o.gate_proj}, {&L.up_proj, &o.up_proj}});
    o.down_proj = mat(L.down_proj);
    o.gate_bias = vec(L.gate_bias);
    o.up_bias = vec(L.up_bias);
    o.gate_up_bias = fused_bias({{&L.gate_bias, L.gate_proj.rows}, {&L.up_bias, L.up_proj.rows}});
    o.down_bias = vec(L.down_bias);
    b.layers.push_back(o);
  }
  // Per-projection GEMV routes (linear_routes.h): the shapes this model's
  // fused projections and LM head run at.
  for (const BackendLayerWeights& o : b.layers) {
    gemm_->name_shape(o.qkv_proj.rows, o.qkv_proj.cols, cuda::LinearProj::qkv);
    gemm_->name_shape(o.o_proj.rows, o.o_proj.cols, cuda::LinearProj::o_proj);
    gemm_->name_shape(o.gate_up_proj.rows, o.gate_up_proj.cols, cuda::LinearProj::gate_up);
    gemm_->name_shape(o.down_proj.rows, o.down_proj.cols, cuda::LinearProj::down);
  }
  gemm_->name_shape(b.output.rows, b.output.cols, cuda::LinearProj::lm_head);
  up.finish();
  phase.set_detail(fmt::format(", {:.2f} GB matrices copied, {:.1f} GB/s ({}), {:.2f} GB generated on the device",
                               static_cast<double>(up.bytes()) / 1e9,
                               static_cast<double>(up.bytes()) / 1e9 / std::max(phase.seconds(), 1e-9),
                               up.pinned() ? "pinned staging" : up.bytes() ? "pageable" : "none",
                               static_cast<double>(generated) / 1e9));
  return b;  // the host weights are no longer needed (host_owner stays empty)
}

// ---- KV storage ----------------------------------------------------------------

void CudaBackend::allocate_kv(const KvPlan& plan, const KvCacheLayout& layout) {
  if (layout.block_size <= 0 || layout.block_size % 16 != 0)
    throw InputError(fmt::format("--backend cuda: block size {} is not a multiple of 16 (the CUDA attention kernels "
                                 "need whole 16-token tiles per page)",
                                 layout.block_size));
  if (layout.head_dim != cfg_.head_dim) bad("allocate_kv", fmt::format("layout head_dim {} != model {}", layout.head_dim, cfg_.head_dim));
  layout_ = layout;
  layer_group_.assign(cfg_.num_layers, -1);
  layer_slot_.assign(cfg_.num_layers, -1);
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const auto& layers = plan.groups[g].layers;
    for (size_t i = 0; i < layers.size(); ++i) {
      const int l = layers[i];
      if (l < 0 || l >= cfg_.num_layers) continue;  // padding
      layer_group_[l] = static_cast<int>(g);
      layer_slot_[l] = static_cast<int>(i);
    }
  }
  for (int l = 0; l < cfg_.num_layers; ++l)
    if (layer_group_[l] < 0) throw std::logic_error(fmt::format("CudaBackend::allocate_kv: layer {} is in no KV group", l));
  drop_graphs();
  kv_storage_.clear();
  StartupPhase phase("KV pool alloc + zero (cuda)");
  const size_t bytes = layout.cache_bytes();
  for (int i = 0; i < plan.group_size * 2; ++i) {
    kv_storage_.push_back(alloc(bytes));
    FP8KV_CU(cudaMemsetAsync(kv_storage_.back().data(), 0, bytes, stream_));
  }
  FP8KV_CU(cudaStreamSynchronize(stream_));
  phase.set_detail(fmt::format(", {:.2f} GB", static_cast<double>(bytes) * plan.group_size * 2 / 1e9));
}

KvLayerStorage CudaBackend::kv_layer(int layer) const {
  if (kv_storage_.empty()) throw std::logic_error("CudaBackend::kv_layer before allocate_kv");
  const size_t s = static_cast<size_t>(layer_slot_.at(layer)) * 2;
  return KvLayerStorage{layout_, kv_storage_[s].data(), kv_storage_[s + 1].data()};
}

void CudaBackend::set_kv_scales(const KvScales& scales) {
  if (static_cast<int>(scales.layers.size()) != cfg_.num_layers)
    bad("set_kv_scales", fmt::format("{} layers of scales for {} model layers", scales.layers.size(), cfg_.num_layers));
  drop_graphs();  // the scale buffers are reallocated
  scales_.resize(scales.layers.size());
  for (size_t l = 0; l < scales.layers.size(); ++l) {
    cuda::upload_f32(scales.layers[l].k.values, scales_[l].k);
    cuda::upload_f32(scales.layers[l].v.values, scales_[l].v);
    scales_[l].k_count = static_cast<int>(scales.layers[l].k.values.size());
    scales_[l].v_count = static_cast<int>(scales.layers[l].v.values.size());
  }
}

// ---- step ------------------------------------------------------------------------

void CudaBackend::begin_step(const StepBatch& b) {
  if (sprof_.on) {
    if (sprof_.routes_gen != cuda::linear_routes_generation()) {  // a new route set: report, restart
      prof_report(true);
      sprof_.routes_gen = cuda::linear_routes_generation();
      sprof_.n = sprof_.n_idle = sprof_.n_host_gap = 0;
      sprof_.graph_us = sprof_.tail_us = sprof_.idle_us = sprof_.host_gap_us = sprof_.host_launch_us = 0;
      sprof_.routes.clear();
    }
    if (sprof_.routes.empty()) sprof_.routes = cuda::linear_routes_string(cuda::linear_routes());
    sprof_.t_begin = std::chrono::steady_clock::now();
    if (sprof_.have_synced && sprof_.sampled)
      sprof_.host_gap_us += std::chrono::duration<double, std::micro>(sprof_.t_begin - sprof_.t_synced).count(),
          ++sprof_.n_host_gap;
    sprof_.have_prev = sprof_.have_prev && sprof_.sampled;
    sprof_.replayed = sprof_.sampled = sprof_.op_this_step = false;
    FP8KV_CU(cudaEventRecord(timing_event(sprof_.begin), stream_));
  }
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
  v.prefill_q_bf16 = nd == 0 && T >= 64 && prefill_q_bf16_from_env();
  q_bf16_data_ = nullptr;

  // Pack everything into one host buffer (16-byte aligned sections) and copy once.
  const int P = S - nd;
  size_t off = 0;
  auto section = [&](size_t bytes) {
    const size_t at = off;
    off += align16(bytes);
    return at;
  };
  const size_t o_ids = section(T * 4), o_pos = section(T * 4), o_ctx = section(S * 4), o_qs = section((P + 1) * 4);
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
  // variant (a copy-engine DMA) gained nothing in run K2 (docs/cuda_backend.md
  // "Batch-1 step (2026-12-01)").
  step_host_.assign(off, 0);
  uint8_t* host = step_host_.data();
  std::memcpy(host + o_ids, b.token_ids.data(), T * 4);
  std::memcpy(host + o_pos, b.positions.data(), T * 4);
  std::memcpy(host + o_ctx, b.context_lens.data(), S * 4);
  auto* qs = reinterpret_cast<int32_t*>(host + o_qs);
  for (int i = 0; i <= P; ++i) qs[i] = b.query_start[nd + i] - v.prefill_row0;
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

// ---- ops -------------------------------------------------------------------------

const uint16_t* CudaBackend::to_bf16_input(const Tensor& x, const char* op) {
  if (x.dtype == ScalarType::bf16) return static_cast<const uint16_t*>(x.data);
  const float* xp = f32(x, op, "x");
  grow(x_bf16_, static_cast<size_t>(x.numel()) * 2);
  cuda::to_bf16_rows(xp, nullptr, x.rows, x.cols, x_bf16_.as<uint16_t>(), stream_);
  return x_bf16_.as<const uint16_t>();
}

void CudaBackend::embedding(const Tensor& table, float scale, Tensor& out) {
  OpScope op(this, "embedding", "embedding");
  const StepView& s = step("embedding");
  if (out.rows != s.T || out.cols != table.cols)
    bad("embedding", fmt::format("out {}, expected [{}][{}]", shape(out), s.T, table.cols));
  cuda::embedding(matrix(table, "embedding"), s.ids, s.T, scale, f32(out, "embedding", "out"), stream_);
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  OpScope op(this, "linear", w.rows, w.cols, gemm_key(prof_.get(), w), gemm_flops(x.rows, w));
  if (x.cols != w.cols || y.rows != x.rows || y.cols != w.rows)
    bad("linear", fmt::format("x {}, W {}, y {}", shape(x), shape(w), shape(y)));
  const cuda::DeviceMatrix W = matrix(w, "linear");
  const float* bp = opt_vec(bias, w.rows, "linear", "bias");
  const uint16_t* xb = to_bf16_input(x, "linear");
  if (y.dtype == ScalarType::f32) {
    gemm_->linear(xb, x.rows, W, bp, static_cast<float*>(y.data), false, stream_);
  } else if (y.dtype == ScalarType::bf16) {
    grow(y_f32_, static_cast<size_t>(y.numel()) * 4);
    gemm_->linear(xb, x.rows, W, bp, y_f32_.as<float>(), false, stream_);
    cuda::to_bf16_rows(y_f32_.as<float>(), nullptr, y.rows, y.cols, static_cast<uint16_t*>(y.data), stream_);
  } else {
    bad("linear", fmt::format("y must be f32 or bf16, got {}", shape(y)));
  }
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  OpScope op(this, "rmsnorm", "rmsnorm");
  same_shape("rmsnorm", x, y);
  if (y.dtype != ScalarType::f32 && y.dtype != ScalarType::bf16) bad("rmsnorm", "y must be f32 or bf16");
  const float* wp = opt_vec(w, x.cols, "rmsnorm", "w");
  if (!wp) bad("rmsnorm", "w is empty");
  // Without a delta the kernel only reads h.
  cuda::rmsnorm_residual(f32(x, "rmsnorm", "x"), nullptr, nullptr, wp, eps, x.rows, static_cast<int>(x.cols), y.data,
                         y.dtype == ScalarType::bf16, stream_);
}

void CudaBackend::add_rmsnorm(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  OpScope op(this, "add_rmsnorm", "add+rmsnorm");
  same_shape("add_rmsnorm", h, x);
  same_shape("add_rmsnorm", h, y);
  if (y.dtype != ScalarType::f32 && y.dtype != ScalarType::bf16) bad("add_rmsnorm", "y must be f32 or bf16");
  const float* wp = opt_vec(w, h.cols, "add_rmsnorm", "w");
  if (!wp) bad("add_rmsnorm", "w is empty");
  cuda::rmsnorm_residual(f32(h, "add_rmsnorm", "h"), f32(x, "add_rmsnorm", "x"), nullptr, wp, eps, h.rows,
                         static_cast<int>(h.cols), y.data, y.dtype == ScalarType::bf16, stream_);
}

void CudaBackend::head_rmsnorm(Tensor& x, int head_dim, const Tensor& w, float eps) {
  if (head_dim <= 0 || x.cols % head_dim != 0) bad("head_rmsnorm", fmt::format("x {} with head_dim {}", shape(x), head_dim));
  const float* wp = opt_vec(w, head_dim, "head_rmsnorm", "w");
  if (!wp) bad("head_rmsnorm", "w is empty");
  float* xp = f32(x, "head_rmsnorm", "x");
  cuda::QkvPrepArgs a;
  a.T = static_cast<int>(x.rows);
  a.num_q_heads = static_cast<int>(x.cols / head_dim);
  a.head_dim = head_dim;
  a.q_in = xp;
  a.q_stride = x.cols;
  a.q_norm_w = wp;
  a.eps = eps;
  a.q_out = xp;  // in place: each warp reads its head before writing it
  cuda::qkv_prep(a, stream_);
}

void CudaBackend::rope(int layer, Tensor& q, Tensor& k) {
  const StepView& s = step("rope");
  const int D = cfg_.head_dim;
  if (q.rows != s.T || k.rows != s.T || q.cols != static_cast<int64_t>(cfg_.num_heads) * D ||
      k.cols != static_cast<int64_t>(cfg_.num_kv_heads) * D)
    bad("rope", fmt::format("q {}, k {} for {} tokens", shape(q), shape(k), s.T));
  const bool sliding = cfg_.is_sliding(layer);
  const RopeTable& rt = sliding ? rope_sliding_ : rope_full_;
  cuda::QkvPrepArgs a;
  a.T = s.T;
  a.num_q_heads = cfg_.num_heads;
  a.num_kv_heads = cfg_.num_kv_heads;
  a.head_dim = D;
  a.q_in = a.q_out = f32(q, "rope", "q");
  a.k_in = a.k_out = f32(k, "rope", "k");
  a.q_stride = q.cols;
  a.k_stride = k.cols;
  a.positions = s.positions;
  a.inv_freq = (sliding ? inv_freq_sliding_ : inv_freq_full_).as<float>();
  a.rot_dim = rt.rot_dim();
  a.attention_factor = rt.attention_factor();
  cuda::qkv_prep(a, stream_);
}

void CudaBackend::gated_act(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) {
  same_shape("gated_act", gate, up);
  same_shape("gated_act", gate, out);
  if (out.dtype != ScalarType::f32 && out.dtype != ScalarType::bf16) bad("gated_act", "out must be f32 or bf16");
  cuda::gated_act(act, f32(gate, "gated_act", "gate"), f32(up, "gated_act", "up"), gate.cols, gate.rows, gate.cols,
                  out.data, out.dtype == ScalarType::bf16, stream_);
}

void CudaBackend::qkv_split(int layer, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                            Tensor& q, Tensor& k, Tensor& v) {
  qkv_split_impl(layer, qkv, q_norm, k_norm, eps, q, k, v, nullptr);
}

void CudaBackend::qkv_split_store(const StepBatch& b, int layer, const Tensor& qkv, const Tensor& q_norm,
                                  const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v) {
  OpScope op(this, "qkv_split_store");
  // "store=separate" in the routes (FP8KV_GEMV_ROUTES, bench --gemv-routes):
  // the separate store kernel (A/B and fallback).
  if (!cuda::linear_routes().fused_store || observer_) {  // the observer gets host copies of q/k/v at store_kv
    Backend::qkv_split_store(b, layer, qkv, q_norm, k_norm, eps, q, k, v);
    return;
  }
  const cuda::QkvPrepArgs::FusedStore fs = fused_store_target(b, layer, "qkv_split_store");
  qkv_split_impl(layer, qkv, q_norm, k_norm, eps, q, k, v, &fs);
}

cuda::QkvPrepArgs::FusedStore CudaBackend::fused_store_target(const StepBatch& b, int layer, const char* op) const {
  const StepView& s = step(op);
  if (b.num_tokens != s.T) bad(op, fmt::format("batch of {} tokens, step of {}", b.num_tokens, s.T));
  if (kv_storage_.empty()) throw std::logic_error(fmt::format("CudaBackend::{} before allocate_kv", op));
  if (scales_.size() != static_cast<size_t>(cfg_.num_layers))
    throw std::logic_error(fmt::format("CudaBackend::{} before set_kv_scales", op));
  const KvLayerStorage st = kv_layer(layer);
  const LayerScales& sc = scales_[layer];
  cuda::QkvPrepArgs::FusedStore fs;
  fs.k_cache = st.k_cache;
  fs.v_cache = st.v_cache;
  fs.dtype = layout_.dtype;
  fs.slots = s.slots.at(layer_group_.at(layer));
  fs.capacity = static_cast<int64_t>(layout_.num_blocks) * layout_.block_size;
  fs.k_scale = sc.k.as<float>();
  fs.v_scale = sc.v.as<float>();
  fs.k_scale_count = sc.k_count;
  fs.v_scale_count = sc.v_count;
  return fs;
}

void CudaBackend::qkv_split_impl(int layer, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                 Tensor& q, Tensor& k, Tensor& v, const cuda::QkvPrepArgs::FusedStore* store) {
  const cuda::QkvPrepArgs a = qkv_split_args(layer, qkv, q_norm, k_norm, eps, q, k, v, store);
  q_bf16_data_ = a.q_out_bf16 ? q.data : nullptr;
  OpScope ps(this, nullptr, store ? "qkv prep+store" : "qkv prep");
  cuda::qkv_prep(a, stream_);
}

cuda::QkvPrepArgs CudaBackend::qkv_split_args(int layer, const Tensor& qkv, const Tensor& q_norm,
                                              const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v,
                                              const cuda::QkvPrepArgs::FusedStore* store) const {
  const StepView& s = step("qkv_split");
  const int D = cfg_.head_dim;
  const int64_t Q = static_cast<int64_t>(cfg_.num_heads) * D, KV = static_cast<int64_t>(cfg_.num_kv_heads) * D;
  if (qkv.rows != s.T || qkv.cols != Q + 2 * KV || q.rows != s.T || k.rows != s.T || v.rows != s.T || q.cols != Q ||
      k.cols != KV || v.cols != KV)
    bad("qkv_split", fmt::format("qkv {}, q {}, k {}, v {} for {} tokens", shape(qkv), shape(q), shape(k), shape(v), s.T));
  const bool sliding = cfg_.is_sliding(layer);
  const RopeTable& rt = sliding ? rope_sliding_ : rope_full_;
  const float* in = f32(qkv, "qkv_split", "qkv");
  cuda::QkvPrepArgs a;
  a.T = s.T;
  a.num_q_heads = cfg_.num_heads;
  a.num_kv_heads = cfg_.num_kv_heads;
  a.head_dim = D;
  a.q_in = in;
  a.k_in = in + Q;
  a.v_in = in + Q + KV;
  a.q_stride = a.k_stride = a.v_stride = Q + 2 * KV;
  a.q_norm_w = opt_vec(q_norm, D, "qkv_split", "q_norm");
  a.k_norm_w = opt_vec(k_norm, D, "qkv_split", "k_norm");
  a.eps = eps;
  a.positions = s.positions;
  a.inv_freq = (sliding ? inv_freq_sliding_ : inv_freq_full_).as<float>();
  a.rot_dim = rt.rot_dim();
  a.attention_factor = rt.attention_factor();
  a.q_out = f32(q, "qkv_split", "q");
  a.k_out = f32(k, "qkv_split", "k");
  a.v_out = f32(v, "qkv_split", "v");
  if (store) a.store = *store;
  // Prefill-only step with FP8KV_PREFILL_Q_BF16: q rows in bf16 (the fused
  // store path only: the observer's host copies read fp32 q).
  a.q_out_bf16 = store && s.prefill_q_bf16;
  return a;
}

void CudaBackend::gated_act_fused(Activation act, const Tensor& gate_up, Tensor& out) {
  if (gate_up.cols % 2 != 0 || out.rows != gate_up.rows || out.cols * 2 != gate_up.cols)
    bad("gated_act_fused", fmt::format("gate_up {}, out {}", shape(gate_up), shape(out)));
  if (out.dtype != ScalarType::f32 && out.dtype != ScalarType::bf16) bad("gated_act_fused", "out must be f32 or bf16");
  const float* g = f32(gate_up, "gated_act_fused", "gate_up");
  if (!out.data && out.numel() > 0) bad("gated_act_fused", "out is empty");
  OpScope ps(this, nullptr, "act (f32 in)");
  cuda::gated_act(act, g, g + out.cols, gate_up.cols, out.rows, out.cols, out.data, out.dtype == ScalarType::bf16,
                  stream_);
}

// At 1-2 rows on the SIMT GEMV route (and act=fused in the routes), one
// kernel computes the gate|up GEMV and the activation (ops.h
// gemv_gated_act_bf16: bitwise the two-kernel result); gate_up is not
// written. Otherwise the GEMM, then the activation kernel.
void CudaBackend::linear_gated_act(Activation act, const Tensor& x, const Tensor& w, const Tensor& bias,
                                   Tensor& gate_up, Tensor& out) {
  OpScope op(this, "linear_gated_act");
  const int64_t T = x.rows;
  bool fuse = cuda::linear_routes().fused_act && out.dtype == ScalarType::bf16 && x.dtype == ScalarType::bf16 &&
              T >= 1 && T <= std::min<int64_t>(cuda::kGemvGatedActMaxRows, gemm_->gemv_max_rows()) &&
              x.cols == w.cols && w.rows % 2 == 0 && out.rows == T && out.cols * 2 == w.rows;
  if (fuse) {
    const cuda::GemvKernel k = gemm_->route(T, w.rows, w.cols);
    fuse = k == cuda::GemvKernel::simt || (k == cuda::GemvKernel::auto_ && T < cuda::kGemvMmaMinRows);
  }
  const cuda::DeviceMatrix W = fuse ? matrix(w, "linear_gated_act") : cuda::DeviceMatrix{};
  const uint16_t* xb = fuse ? static_cast<const uint16_t*>(x.data) : nullptr;
  if (!fuse || !cuda::gemv_bf16_fits(xb, T, W) || !out.data) {
    // FP8KV_PREFILL_BF16_ACT (default on since 2026-12-01; =0 turns it off):
    // past the GEMV rows, the gate|up GEMM writes bf16 (half the bytes of
    // the widest GEMM output, written and read back once per layer) and the
    // activation reads bf16; gate and up are rounded to bf16 before the
    // activation, as in a bf16 transformers model. The residual stream and
    // q/k/v stay fp32. Only without a bias (Llama / Qwen / Gemma MLPs).
    // GPU accuracy with it on: docs/cuda_backend.md "Prefill/TTFT (2026-12-01)".
    static const bool bf16_act = [] {
      const char* e = std::getenv("FP8KV_PREFILL_BF16_ACT");
      return !e || std::atoi(e) > 0;
    }();
    if (bf16_act && bias.empty() && x.dtype == ScalarType::bf16 && T > gemm_->gemv_max_rows() && w.rows % 2 == 0 &&
        out.rows == T && out.cols * 2 == w.rows && gate_up.data && gate_up.numel() == T * w.rows &&
        (out.dtype == ScalarType::bf16 || out.dtype == ScalarType::f32) && out.data) {
      auto* gu = static_cast<uint16_t*>(gate_up.data);  // [T][2I] bf16 in the f32 buffer's first half
      {
        OpScope ps(this, nullptr, gemm_key(prof_.get(), w, " bf16 out"), gemm_flops(T, w));
        gemm_->linear_bf16_out(static_cast<const uint16_t*>(x.data), T, matrix(w, "linear_gated_act"), gu, stream_);
      }
      OpScope ps(this, nullptr, "act (bf16 in)");
      cuda::gated_act_bf16_in(act, gu, gu + out.cols, w.rows, T, out.cols, out.data, out.dtype == ScalarType::bf16,
                              stream_);
      return;
    }
    Backend::linear_gated_act(act, x, w, bias, gate_up, out);
    return;
  }
  cuda::gemv_gated_act_bf16(act, xb, T, W, opt_vec(bias, w.rows, "linear_gated_act", "bias"),
                            static_cast<uint16_t*>(out.data), stream_);
}

void CudaBackend::add(Tensor& x, const Tensor& y) {
  same_shape("add", x, y);
  cuda::add_inplace(f32(x, "add", "x"), f32(y, "add", "y"), x.numel(), stream_);
}

void CudaBackend::store_kv(const StepBatch& b, int layer, const Tensor& q, const Tensor& k, const Tensor& v) {
  OpScope op(this, "store_kv");
  const StepView& s = step("store_kv");
  const int T = b.num_tokens, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  if (T != s.T || q.rows != T || k.rows != T || v.rows != T || q.cols != static_cast<int64_t>(Hq) * D ||
      k.cols != static_cast<int64_t>(Hkv) * D || v.cols != k.cols)
    bad("store_kv", fmt::format("q {}, k {}, v {} for {} tokens", shape(q), shape(k), shape(v), T));
  if (kv_storage_.empty()) throw std::logic_error("CudaBackend::store_kv before allocate_kv");
  if (scales_.size() != static_cast<size_t>(cfg_.num_layers)) throw std::logic_error("CudaBackend::store_kv before set_kv_scales");
  const float* qp = f32(q, "store_kv", "q");
  const float* kp = f32(k, "store_kv", "k");
  const float* vp = f32(v, "store_kv", "v");
  if (observer_) {  // host copies at the store point (calibration is offline: the copy is fine)
    obs_q_.resize(static_cast<size_t>(q.numel()));
    obs_k_.resize(static_cast<size_t>(k.numel()));
    obs_v_.resize(static_cast<size_t>(v.numel()));
    download(obs_q_.data(), qp, q.bytes());
    download(obs_k_.data(), kp, k.bytes());
    download(obs_v_.data(), vp, v.bytes());
    observer_->observe(layer, obs_q_.data(), Hq, obs_k_.data(), obs_v_.data(), Hkv, D, T);
  }
  const int group = layer_group_.at(layer);
  const KvLayerStorage st = kv_layer(layer);
  const LayerScales& sc = scales_[layer];
  OpScope ps(this, nullptr, "store_kv");
  cuda::StoreKvArgs a;
  a.layout = layout_;
  a.k_cache = st.k_cache;
  a.v_cache = st.v_cache;
  a.k = kp;
  a.v = vp;
  a.input_dtype = cuda::ActDtype::f32;
  a.slot_mapping = s.slots.at(group);
  a.num_tokens = T;
  a.k_scale = {sc.k.as<float>(), sc.k_count};
  a.v_scale = {sc.v.as<float>(), sc.v_count};
  cuda::store_kv(a, stream_);
}

void CudaBackend::attention(const StepBatch& b, int layer, const Tensor& q, Tensor& out) {
  OpScope scope(this, "attention");
  const StepView& s = step("attention");
  const int Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  same_shape("attention", q, out);
  if (q.rows != b.num_tokens || q.rows != s.T || q.cols != static_cast<int64_t>(Hq) * D)
    bad("attention", fmt::format("q {} for {} tokens", shape(q), s.T));
  const int group = layer_group_.at(layer);
  const KvLayerStorage st = kv_layer(layer);
  const LayerScales& sc = scales_.at(layer);
  const float* qp = f32(q, "attention", "q");
  // q holds bf16 rows when qkv_split_store wrote them (prefill-only steps, FP8KV_PREFILL_Q_BF16).
  const bool q_bf16 = q.data == q_bf16_data_ && q_bf16_data_ != nullptr;
  // out: f32, or bf16 when it only feeds the o_proj GEMM (fused forward).
  if (out.dtype != ScalarType::f32 && out.dtype != ScalarType::bf16) bad("attention", "out must be f32 or bf16");
  if (!out.data && out.numel() > 0) bad("attention", "out is empty");
  auto* op = static_cast<uint8_t*>(out.data);
  const cuda::ActDtype odt = out.dtype == ScalarType::bf16 ? cuda::ActDtype::bf16 : cuda::ActDtype::f32;
  const int64_t oeb = out.dtype == ScalarType::bf16 ? 2 : 4;
  const int window = cfg_.window_for_layer(layer);
  const float softcap = cfg_.attn_logit_softcapping ? static_cast<float>(*cfg_.attn_logit_softcapping) : 0.0f;

  cuda::PagedKv kv;
  kv.layout = layout_;
  kv.k_cache = st.k_cache;
  kv.v_cache = st.v_cache;
  kv.max_blocks_per_seq = std::max(1, s.B);
  kv.k_scale = {sc.k.as<float>(), sc.k_count};
  kv.v_scale = {sc.v.as<float>(), sc.v_count};

  // Decodes: sequences [0, nd), query rows [0, nd).
  if (s.num_decodes > 0) {
    cuda::DecodeArgs a;
    a.kv = kv;
    a.kv.block_tables = s.block_tables.at(group);
    a.kv.context_lens = s.context_lens;
    a.batch = s.num_decodes;
    a.num_heads = Hq;
    a.max_context_len = s.decode_plan_context;
    a.window = window;
    a.softmax_scale = cfg_.attention_scale();
    a.logit_softcap = softcap;
    a.q = qp;
    a.q_dtype = cuda::ActDtype::f32;
    a.out = op;
    a.out_dtype = odt;
    // split_tokens: plan_decode's choice, or the routes' dsplit (A/B sweeps).
    a.plan = cuda::plan_decode(s.num_decodes, Hq, Hkv, D, s.decode_plan_context, window, cuda::device_sm_count(),
                               cuda::linear_routes().decode_split_tokens, /*ctas_per_sm=*/0, layout_.dtype);
    grow(decode_ws_, std::max<size_t>(a.plan.workspace_bytes, 16));
    a.workspace = decode_ws_.get();
    OpScope ps(this, nullptr, "attention (decode rows)");
    cuda::paged_decode(a, stream_);
  }
  // Prefill chunks: sequences [nd, S), query rows from query_start[nd].
  const int P = s.S - s.num_decodes;
  if (P > 0) {
    cuda::PrefillArgs a;
    a.kv = kv;
    a.kv.block_tables = s.block_tables.at(group) + static_cast<int64_t>(s.num_decodes) * s.B;
    a.kv.context_lens = s.context_lens + s.num_decodes;
    a.batch = P;
    a.num_heads = Hq;
    a.max_query_len = s.max_prefill_query;
    a.window = window;
    a.softmax_scale = cfg_.attention_scale();
    a.logit_softcap = softcap;
    a.q_start = s.prefill_q_start;
    if (q_bf16) {  // no decode rows on such a step: prefill_row0 == 0
      a.q = static_cast<const uint16_t*>(q.data) + static_cast<int64_t>(s.prefill_row0) * Hq * D;
      a.q_dtype = cuda::ActDtype::bf16;
    } else {
      a.q = qp + static_cast<int64_t>(s.prefill_row0) * Hq * D;
      a.q_dtype = cuda::ActDtype::f32;
    }
    a.out = op + static_cast<int64_t>(s.prefill_row0) * Hq * D * oeb;
    a.out_dtype = odt;
    prefill_attention(a, layer);
  }
}

bool prefill_q_bf16_from_env() {
  const char* e = std::getenv("FP8KV_PREFILL_Q_BF16");
  return e && std::atoi(e) > 0;
}

// The prefill attention launch; with FP8KV_PREFILL_ATTN_AB=1 on a profiled
// prefill step (FP8KV_PREFILL_PROFILE) also, after the real call, the same
// kernel on the same K/V into a throwaway output (the step's result is the
// real call's): "[ab] again" (back to back), "[ab] q bf16" (q converted to
// bf16 first, as bench_attention passes it; the conversion is its own
// scope), and on layers 0, 8, 16, 24 "[ab] after 200 ms idle" (the stream
// drained and the host asleep first: the SM clock back from the GEMMs'
// power draw) and "[ab] after idle, 2nd" (right after it, in case the
// clock was still ramping up from idle). docs/cuda_backend.md "Prefill attention in the engine".
void CudaBackend::prefill_attention(const cuda::PrefillArgs& a, int layer) {
  {
    OpScope ps(this, nullptr, "attention (prefill)");
    cuda::paged_prefill(a, stream_);
  }
  static const bool ab = [] {
    const char* e = std::getenv("FP8KV_PREFILL_ATTN_AB");
    return e && std::atoi(e) > 0;
  }();
  if (!ab || !prof_ || !prof_->active() || capturing_) return;
  const StepView& s = step("attention");
  const int64_t rows = s.T - s.prefill_row0, width = static_cast<int64_t>(cfg_.num_heads) * cfg_.head_dim;
  const int64_t oeb = a.out_dtype == cuda::ActDtype::bf16 ? 2 : 4;
  ab_out_.reserve(static_cast<size_t>(rows * width * oeb));
  cuda::PrefillArgs b = a;
  b.out = ab_out_.get();
  {
    OpScope ps(this, nullptr, "attention (prefill) [ab] again");
    cuda::paged_prefill(b, stream_);
  }
  if (a.q_dtype == cuda::ActDtype::f32) {
    ab_q_.reserve(static_cast<size_t>(rows * width * 2));
    {
      OpScope ps(this, nullptr, "[ab] q f32 -> bf16");
      cuda::to_bf16_rows(static_cast<const float*>(a.q), nullptr, rows, width, ab_q_.as<uint16_t>(), stream_);
    }
    b.q = ab_q_.get();
    b.q_dtype = cuda::ActDtype::bf16;
    OpScope ps(this, nullptr, "attention (prefill) [ab] q bf16");
    cuda::paged_prefill(b, stream_);
    b.q = a.q;
    b.q_dtype = a.q_dtype;
  }
  if (layer % 8 == 0) {
    FP8KV_CU(cudaStreamSynchronize(stream_));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    {
      OpScope ps(this, nullptr, "attention (prefill) [ab] after 200 ms idle");
      cuda::paged_prefill(b, stream_);
    }
    // The clock may still be ramping up from idle in the first call: a second one.
    OpScope ps(this, nullptr, "attention (prefill) [ab] after idle, 2nd");
    cuda::paged_prefill(b, stream_);
  }
}

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
  // Its own staging buffer: never in a graph, so its growth does not drop them.
  logits_x_bf16_.reserve(static_cast<size_t>(n * H) * 2);
  cuda::to_bf16_rows(h, rows_dev_.as<int32_t>(), n, H, logits_x_bf16_.as<uint16_t>(), stream_);
  gemm_->linear(logits_x_bf16_.as<uint16_t>(), n, matrix(output, "logits"), nullptr, y, false, stream_);
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
  if (sprof_.on) FP8KV_CU(cudaEventRecord(timing_event(sprof_.tail_end), stream_));
  FP8KV_CU(cudaStreamSynchronize(stream_));
  std::memcpy(ids.data(), ih, bytes);
  prof_synced();
  for (size_t r = 0; r < ids.size(); ++r)
    if (ids[r] < 0) throw std::runtime_error(fmt::format("non-finite logits (NaN) from the model in sampled row {}", r));
}

void CudaBackend::prof_synced() {
  if (!sprof_.on) return;
  StepProfile& q = sprof_;
  if (q.replayed) {
    q.graph_us += elapsed_us(q.begin, q.graph_end);
    q.tail_us += elapsed_us(q.graph_end, q.tail_end);
    if (q.have_prev) q.idle_us += elapsed_us(q.prev_end, q.begin), ++q.n_idle;
    if (++q.n % 32 == 0) prof_report(false);
  }
  std::swap(q.prev_end, q.tail_end);
  q.have_prev = q.sampled = true;
  q.t_synced = std::chrono::steady_clock::now();
  q.have_synced = true;
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
  grow(step_logits_x_, static_cast<size_t>(n * H) * 2);
  grow(step_sample_ids_, static_cast<size_t>(n) * 4);
  cuda::to_bf16_rows(h, s.sample_rows, n, H, step_logits_x_.as<uint16_t>(), stream_);
  gemm_->linear(step_logits_x_.as<uint16_t>(), n, matrix(output, "sample_step"), nullptr, y, false, stream_);
  if (cfg_.final_logit_softcapping)
    cuda::softcap(y, n * V, static_cast<float>(*cfg_.final_logit_softcapping), stream_);
  cuda::sample_rows(y, static_cast<int>(n), static_cast<int>(V), s.sample_params, step_sample_ids_.as<int32_t>(),
                    stream_);
}

bool CudaBackend::samples_in_step() const { return cuda::linear_routes().sample_in_graph; }

void CudaBackend::step_sampled_ids(std::span<int32_t> ids) {
  const StepView& s = step("step_sampled_ids");
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n > s.n_sample) bad("step_sampled_ids", fmt::format("{} ids asked, the step sampled {} rows", n, s.n_sample));
  if (n == 0) return;
  if (capturing_) throw std::logic_error("CudaBackend::step_sampled_ids during graph capture");
  download_ids(step_sample_ids_.get(), ids);
}

// ---- CUDA graphs --------------------------------------------------------------
// docs/cuda_backend.md "CUDA graphs": one graph per decode bucket, captured by
// the ModelRunner after an eager warm-up of the same bucket; the step's inputs
// reach a replay through step_dev_ (begin_step copies into the same buffer),
// and its decode plan is made for max_model_len, so it covers every context.

void CudaBackend::grow(cuda::DeviceBuffer& buf, size_t bytes) {
  if (bytes <= buf.bytes()) return;
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
                                              cuda::device_sm_count(), cuda::linear_routes().decode_split_tokens,
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
  if (it->second.gen != buffers_gen_ || it->second.routes_gen != cuda::linear_routes_generation()) {
    cudaGraphExecDestroy(it->second.exec);
    graphs_.erase(it);
    return false;
  }
  FP8KV_CU(cudaGraphLaunch(it->second.exec, stream_));
  if (sprof_.on) {
    FP8KV_CU(cudaEventRecord(timing_event(sprof_.graph_end), stream_));
    sprof_.host_launch_us +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - sprof_.t_begin).count();
    sprof_.replayed = !sprof_.op_this_step;
    ++sprof_.replays;
  }
  return true;
}

void CudaBackend::begin_graph_capture(int64_t /*key*/) {
  if (capturing_) throw std::logic_error("CudaBackend::begin_graph_capture: already capturing");
  if (!supports_graphs()) throw std::logic_error("CudaBackend::begin_graph_capture: graphs are off");
  // Thread-local mode: other threads' unrelated CUDA calls do not break it.
  FP8KV_CU(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  routes_gen_at_capture_ = cuda::linear_routes_generation();
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
  graphs_[key] = Graph{exec, buffers_gen_, routes_gen_at_capture_};
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
