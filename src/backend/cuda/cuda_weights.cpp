// CudaBackend: weight upload (bf16 on the device, fused QKV and gate|up
// matrices) and the KV pool (allocate_kv, kv_layer, set_kv_scales).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "backend/cuda/backend_checks.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops/dummy_fill.h"
#include "backend/startup_profile.h"
#include "io/errors.h"
#include "model/weights.h"
#include "numerics/fp8.h"
#include "numerics/fp8_weights.h"

namespace fp8kv {

using namespace cuda_checks;

namespace {

// Weight upload through two pinned staging buffers (docs/cuda_backend.md
// "Startup"): the host fills one buffer (a parallel copy, or
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


// The e4m3 GEMV reads a row 16 bytes at a time, so the fp8 kernels need a
// column count divisible by 16. A host fp8 matrix without one (no released
// checkpoint has such a matrix; the small golden models do) is dequantized
// here to fp32 and uploaded as bf16: the bf16 path, with the bytes the W8A16
// prefill slices hold anyway (docs/cuda_backend.md "FP8 weights").
bool fp8_native(const WeightMatrix& m) { return !m.fp8 || m.cols % 16 == 0; }

// In W8A8 mode such a matrix (from a checkpoint, K % 4 == 0, rows % 4 == 0)
// stays e4m3 instead, each row padded with zero columns to a multiple of 16
// bytes: the W8A8 GEMM reads it at every row count (the codes of its
// activations get the same zero columns), so its numerics stay W8A8's.
bool w8a8_padded(const WeightMatrix& m, Fp8Compute c) {
  return c == Fp8Compute::w8a8 && m.fp8 && m.cols % 16 != 0 && m.cols % 4 == 0 && m.rows % 4 == 0 && m.data &&
         !m.dummy;
}
int64_t fp8_ld(const WeightMatrix& m, Fp8Compute c) { return w8a8_padded(m, c) ? (m.cols + 15) / 16 * 16 : m.cols; }

WeightMatrix dequantized_f32(const WeightMatrix& m) {
  auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(m.rows * m.cols));
  dequantize_fp8_weight_rows(static_cast<const uint8_t*>(m.data),
                             Fp8WeightScales{m.scales->data(), m.scale_granularity, Fp8Compute::w8a16}, m.rows, m.cols,
                             0, m.rows, out->data());
  WeightMatrix d;
  d.rows = m.rows;
  d.cols = m.cols;
  d.data = out->data();
  d.owner = out;
  return d;
}

// W8A8: the scales of an fp8 matrix [N][K] in the layout of the cuBLASLt
// FP8 GEMM (ops.h DeviceMatrix::w8a8_scale; linear/w8a8_gemm.cpp has the
// cuBLAS rules): block-wise [ceil(N/128)][L4], each row of ceil(K/128) block
// scales padded with zeros to L4 = a multiple of 4 (K-major, column stride
// a multiple of 4); tensor and channel [N], one per row.
std::vector<float> w8a8_layout(const std::vector<float>& s, ScaleGranularity g, int64_t N, int64_t K) {
  if (g == ScaleGranularity::channel) return s;
  if (g == ScaleGranularity::tensor) return std::vector<float>(static_cast<size_t>(N), s.at(0));
  const int64_t L = (K + kFp8WeightBlock - 1) / kFp8WeightBlock, L4 = (L + 3) / 4 * 4,
                nb = (N + kFp8WeightBlock - 1) / kFp8WeightBlock;
  std::vector<float> out(static_cast<size_t>(nb * L4), 0.0f);
  for (int64_t r = 0; r < nb; ++r) std::copy_n(s.begin() + r * L, L, out.begin() + r * L4);
  return out;
}

// w, or a copy of it whose fp8 matrices that fp8_native refuses are fp32.
std::shared_ptr<const ModelWeights> with_native_fp8(std::shared_ptr<const ModelWeights> w) {
  bool all = true;
  const Fp8Compute mode = w->fp8_compute;
  auto each = [&](auto&& f, auto& weights) {
    for (auto& L : weights.layers)
      for (auto* m : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) f(*m);
    if (weights.lm_head) f(*weights.lm_head);
  };
  each([&](const WeightMatrix& m) { all = all && (fp8_native(m) || w8a8_padded(m, mode)); }, *w);
  if (all) return w;
  auto c = std::make_shared<ModelWeights>(*w);
  int n = 0;
  each(
      [&](WeightMatrix& m) {
        if (fp8_native(m) || w8a8_padded(m, mode)) return;
        if (m.dummy || !m.data)
          throw InputError(fmt::format("--backend cuda: a generated fp8 weight of {} columns: the CUDA fp8 kernels "
                                       "need a column count divisible by 16",
                                       m.cols));
        m = dequantized_f32(m);
        ++n;
      },
      *c);
  if (n > 0 && mode == Fp8Compute::w8a8)
    spdlog::info("fp8 weights, W8A8 on CUDA: {} fp8 matrices with a column count not divisible by 16 (and not "
                 "by 4, or a row count not divisible by 4) are dequantized at upload and run the bf16 GEMM (bf16 "
                 "weights and activations, not W8A8)",
                 n);
  return c;
}

}  // namespace

// ---- weights ----------------------------------------------------------------

BackendWeights CudaBackend::upload_weights(std::shared_ptr<const ModelWeights> w) {
  StartupPhase phase("weights upload (cuda)");
  w = with_native_fp8(std::move(w));
  // The fp8 GEMV reads e4m3 NaN bytes as finite values (docs/design.md
  // "FP8-weight checkpoints"), so a checkpoint holding them is refused here,
  // by name, instead of decoding finite nonsense.
  if (const auto nan = w->first_nan_fp8())
    throw InputError(fmt::format("fp8 weights: {} (an e4m3 NaN byte, S.1111.111: the checkpoint is damaged; "
                                 "`fp8kv inspect --check-values` lists every such tensor)",
                                 *nan));
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
  auto vec = [&](const std::vector<float>& v) -> Tensor {
    if (v.empty()) return {};
    DeviceBuffer buf = alloc(v.size() * sizeof(float));
    upload(buf.data(), v.data(), v.size() * sizeof(float));
    Tensor t{buf.data(), ScalarType::f32, 1, static_cast<int64_t>(v.size())};
    b.storage.push_back(std::move(buf));
    return t;
  };
  // fp8 matrices (docs/cuda_backend.md "FP8 weights"): the e4m3 bytes as
  // they are, the scales as f32 beside them; the linear kernels dequantize.
  bool any_fp8 = false;
  const Fp8Compute mode = w->fp8_compute;
  auto check_fp8 = [&](const WeightMatrix& m) {
    if (!fp8_native(m) && !w8a8_padded(m, mode))
      bad("upload_weights", "an fp8 matrix with a column count not divisible by 16");
    const auto [sr, sc] = fp8_scale_shape(m.scale_granularity, m.rows, m.cols);
    if (!m.scales || static_cast<int64_t>(m.scales->size()) != sr * sc)
      bad("upload_weights", "an fp8 matrix without scales of its shape");
    any_fp8 = true;
  };
  auto put_fp8 = [&](const WeightMatrix& m, uint8_t* dst) {
    const int64_t n = m.rows * m.cols;
    if (w8a8_padded(m, mode)) {  // rows of fp8_ld bytes, zero columns past K (small matrices: one plain copy)
      const int64_t ld = fp8_ld(m, mode);
      std::vector<uint8_t> padded(static_cast<size_t>(m.rows * ld), 0);
      const auto* src = static_cast<const uint8_t*>(m.data);
      for (int64_t r = 0; r < m.rows; ++r) std::memcpy(padded.data() + r * ld, src + r * m.cols, static_cast<size_t>(m.cols));
      FP8KV_CU(cudaMemcpy(dst, padded.data(), padded.size(), cudaMemcpyHostToDevice));
      return;
    }
    if (m.dummy) {
      cuda::dummy_fill_e4m3(dst, m.dummy_key, n, m.dummy_std, m.scales->front(), stream_);
      generated += static_cast<size_t>(n);
    } else {
      up.copy(MatrixRef{m.data, WeightType::bf16, 1, n / 2}, reinterpret_cast<uint16_t*>(dst));  // raw bytes
    }
  };
  // W8A8 (--fp8-weight-mode w8a8): each fp8 matrix also gets its scales in
  // the cuBLASLt layout (w8a8_layout); a matrix whose row count is not a
  // multiple of 4 (cuBLASLt's scale layouts need it) runs W8A16 (logged).
  const bool w8a8 = w->fp8_compute == Fp8Compute::w8a8;
  if (w8a8) {
    int major = 0, minor = 0;
    FP8KV_CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
    FP8KV_CU(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_));
    if (major != 9 || minor != 0)
      throw InputError(fmt::format("--fp8-weight-mode w8a8 on --backend cuda needs compute capability 9.0 (Hopper: "
                                   "cuBLASLt's FP8 block and outer-vector scale modes); this GPU is sm_{}{}; "
                                   "--fp8-weight-mode w8a16 runs these weights",
                                   major, minor));
  }
  auto gemm_scales = [&](const std::vector<float>& host, ScaleGranularity g, int64_t rows, int64_t cols) -> const float* {
    if (!w8a8 || rows % 4 != 0) return nullptr;
    return static_cast<const float*>(vec(w8a8_layout(host, g, rows, cols)).data);
  };
  auto fp8_tensor = [&](void* q, int64_t rows, int64_t cols, const float* scales, ScaleGranularity g,
                        const float* gemm, int64_t ld) {
    Tensor t{q, ScalarType::u8, rows, cols};
    t.fp8 = Fp8WeightScales{scales, g, w->fp8_compute, gemm, gemm && ld != cols ? ld : 0};
    return t;
  };
  auto mat = [&](const WeightMatrix& m) -> Tensor {
    if (!m.data && !m.dummy) return {};
    if (m.fp8) {
      check_fp8(m);
      const int64_t ld = fp8_ld(m, mode);
      DeviceBuffer buf = alloc(static_cast<size_t>(m.rows * ld));
      put_fp8(m, static_cast<uint8_t*>(buf.data()));
      const Tensor s = vec(*m.scales);
      Tensor t = fp8_tensor(buf.data(), m.rows, m.cols, static_cast<const float*>(s.data), m.scale_granularity,
                            gemm_scales(*m.scales, m.scale_granularity, m.rows, m.cols), ld);
      b.storage.push_back(std::move(buf));
      return t;
    }
    DeviceBuffer buf = alloc(static_cast<size_t>(m.rows * m.cols) * 2);
    put(m, static_cast<uint16_t*>(buf.data()));
    Tensor t{buf.data(), ScalarType::bf16, m.rows, m.cols};
    b.storage.push_back(std::move(buf));
    return t;
  };
  if (w->embed.fp8) bad("upload_weights", "an fp8 embedding table (fp8 checkpoints keep it bf16)");
  b.embed = mat(w->embed);
  b.output = w->lm_head ? mat(*w->lm_head) : b.embed;  // tied: the same device memory
  b.final_norm = vec(w->final_norm);
  b.embed_scale = w->embed_scale;
  // Several matrices with the same column count in one allocation (rows
  // concatenated): the fused matrix and a view of each part.
  // fp8 parts fuse when they share a granularity and, for 128x128 blocks,
  // every part but the last is whole blocks of rows; tensor scales become
  // per-row (channel) scales of the fused matrix. Otherwise no layer fuses
  // (the forward pass fuses all layers or none) and each part is its own
  // matrix.
  auto fusable = [](std::initializer_list<const WeightMatrix*> parts) {
    const WeightMatrix* first = *parts.begin();
    size_t i = 0;
    for (const WeightMatrix* m : parts) {
      ++i;
      if (m->fp8 != first->fp8) return false;
      if (!m->fp8) continue;
      if (m->scale_granularity != first->scale_granularity) return false;
      if (m->scale_granularity == ScaleGranularity::block128 && i < parts.size() && m->rows % kFp8WeightBlock != 0)
        return false;
    }
    return true;
  };
  bool fuse_all = true;
  for (const LayerWeights& L : w->layers)
    fuse_all = fuse_all && fusable({&L.q_proj, &L.k_proj, &L.v_proj}) && fusable({&L.gate_proj, &L.up_proj});
  auto fused_fp8 = [&](std::initializer_list<std::pair<const WeightMatrix*, Tensor*>> parts, int64_t rows,
                       int64_t cols) -> Tensor {
    const ScaleGranularity g0 = parts.begin()->first->scale_granularity;
    const ScaleGranularity g = g0 == ScaleGranularity::tensor ? ScaleGranularity::channel : g0;
    std::vector<float> scales;
    std::vector<size_t> offsets;
    std::vector<std::vector<float>> part_scales;  // each part's, in granularity g
    for (auto [m, t] : parts) {
      check_fp8(*m);
      offsets.push_back(scales.size());
      if (g0 == ScaleGranularity::tensor)
        part_scales.emplace_back(static_cast<size_t>(m->rows), m->scales->front());
      else
        part_scales.push_back(*m->scales);
      scales.insert(scales.end(), part_scales.back().begin(), part_scales.back().end());
    }
    // Parts share their columns, hence their row stride (padded or not).
    const int64_t ld = fp8_ld(*parts.begin()->first, mode);
    DeviceBuffer buf = alloc(static_cast<size_t>(rows * ld));
    const Tensor sd = vec(scales);
    const auto* sp = static_cast<const float*>(sd.data);
    auto* base = static_cast<uint8_t*>(buf.data());
    int64_t r0 = 0;
    size_t i = 0;
    for (auto [m, t] : parts) {
      if (fp8_ld(*m, mode) != ld) bad("upload_weights", "fused fp8 parts differ in their padded row length");
      put_fp8(*m, base + r0 * ld);
      *t = fp8_tensor(base + r0 * ld, m->rows, m->cols, sp + offsets[i], g,
                      gemm_scales(part_scales[i], g, m->rows, m->cols), ld);
      ++i;
      r0 += m->rows;
    }
    Tensor all = fp8_tensor(buf.data(), rows, cols, sp, g, gemm_scales(scales, g, rows, cols), ld);
    b.storage.push_back(std::move(buf));
    return all;
  };
  auto fused = [&](std::initializer_list<std::pair<const WeightMatrix*, Tensor*>> parts) -> Tensor {
    if (!fuse_all) {
      for (auto [m, t] : parts) *t = mat(*m);
      return {};
    }
    int64_t rows = 0, cols = -1;
    for (auto [m, t] : parts) {
      if (!m->data && !m->dummy) bad("upload_weights", "a fused projection part is missing");
      if (cols >= 0 && m->cols != cols) bad("upload_weights", "fused projection parts differ in columns");
      cols = m->cols;
      rows += m->rows;
    }
    if (parts.begin()->first->fp8) return fused_fp8(parts, rows, cols);
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
    bind_layer_vectors(L, o, vec);
    if (!L.in_proj_qkv.data && !L.in_proj_qkv.dummy)  // a linear_attention layer has no attention tensors
      o.qkv_proj = fused({{&L.q_proj, &o.q_proj}, {&L.k_proj, &o.k_proj}, {&L.v_proj, &o.v_proj}});
    o.in_proj_qkv = mat(L.in_proj_qkv);
    o.in_proj_z = mat(L.in_proj_z);
    o.in_proj_b = mat(L.in_proj_b);
    o.in_proj_a = mat(L.in_proj_a);
    o.out_proj = mat(L.out_proj);
    o.A_log = vec(L.A_log);
    o.dt_bias = vec(L.dt_bias);
    o.gdn_norm = vec(L.gdn_norm);
    o.conv1d = vec(L.conv1d);  // f32, as the CPU reference reads it: [C][K]
    if (!o.conv1d.empty()) {
      o.conv1d.rows = L.in_proj_qkv.rows;
      o.conv1d.cols = static_cast<int64_t>(L.conv1d.size()) / L.in_proj_qkv.rows;
    }
    o.o_proj = mat(L.o_proj);
    o.qkv_bias = fused_bias({{&L.q_bias, L.q_proj.rows}, {&L.k_bias, L.k_proj.rows}, {&L.v_bias, L.v_proj.rows}});
    o.gate_up_proj = fused({{&L.gate_proj, &o.gate_proj}, {&L.up_proj, &o.up_proj}});
    o.down_proj = mat(L.down_proj);
    o.gate_up_bias = fused_bias({{&L.gate_bias, L.gate_proj.rows}, {&L.up_bias, L.up_proj.rows}});
    b.layers.push_back(o);
  }
  // Per-projection GEMV routes (routes.h): the shapes this model's
  // fused projections and LM head run at.
  for (const BackendLayerWeights& o : b.layers) {
    if (!o.qkv_proj.empty()) {  // not a Gated DeltaNet layer (whose projections keep the default routes)
      gemm_->name_shape(o.qkv_proj.rows, o.qkv_proj.cols, cuda::LinearProj::qkv);
      gemm_->name_shape(o.o_proj.rows, o.o_proj.cols, cuda::LinearProj::o_proj);
    }
    gemm_->name_shape(o.gate_up_proj.rows, o.gate_up_proj.cols, cuda::LinearProj::gate_up);
    gemm_->name_shape(o.down_proj.rows, o.down_proj.cols, cuda::LinearProj::down);
  }
  gemm_->name_shape(b.output.rows, b.output.cols, cuda::LinearProj::lm_head);
  if (any_fp8) gemm_->reserve_fp8_scratch();
  // W8A8: every matrix's cuBLASLt algorithm now (Gemm::check_w8a8 throws
  // naming the shape), not at the first prefill.
  if (w8a8) {
    int w8a8_matrices = 0, w8a8_unaligned = 0;
    auto check = [&](const Tensor& t) {
      if (!t.is_fp8_weight()) return;
      if (!t.fp8.gemm) {
        ++w8a8_unaligned;
        return;
      }
      gemm_->check_w8a8(matrix(t, "upload_weights"));
      ++w8a8_matrices;
    };
    check(b.output);
    for (const BackendLayerWeights& o : b.layers) {
      // The matrices the forward pass runs: fused ones where there are.
      if (o.qkv_proj.empty()) {
        check(o.q_proj);
        check(o.k_proj);
        check(o.v_proj);
      } else {
        check(o.qkv_proj);
      }
      if (o.gate_up_proj.empty()) {
        check(o.gate_proj);
        check(o.up_proj);
      } else {
        check(o.gate_up_proj);
      }
      check(o.o_proj);
      check(o.down_proj);
      for (const Tensor* t : {&o.in_proj_qkv, &o.in_proj_z, &o.in_proj_b, &o.in_proj_a, &o.out_proj}) check(*t);
    }
    spdlog::info("fp8 weights, W8A8 on CUDA: {} fp8 matrices run the cuBLASLt FP8 GEMM at >= {} rows (activations "
                 "quantized to e4m3 from f32, scales 1x128 x 128x128 blocks or per token x per channel; fewer rows: "
                 "the fp8 GEMV with bf16 activations, W8A16 numerics, except matrices padded to 16-byte rows, which "
                 "take the W8A8 GEMM at every row count){}",
                 w8a8_matrices, cuda::kW8a8MinRows,
                 w8a8_unaligned ? fmt::format("; {} with a row count not divisible by 4 run W8A16", w8a8_unaligned)
                                : std::string());
  }
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
    if (layer_group_[l] < 0 && std::find(plan.state.layers.begin(), plan.state.layers.end(), l) == plan.state.layers.end())
      throw std::logic_error(fmt::format("CudaBackend::allocate_kv: layer {} is in no KV group and has no state", l));
  drop_graphs();
  allocate_state(plan.state);
  const size_t clip_bytes = static_cast<size_t>(cfg_.num_layers) * 2 * sizeof(unsigned long long);
  clips_dev_ = alloc(clip_bytes);
  FP8KV_CU(cudaMemsetAsync(clips_dev_.data(), 0, clip_bytes, stream_));
  stored_groups_ = plan.groups.size();
  stored_tokens_ = std::make_unique<std::atomic<uint64_t>[]>(stored_groups_);  // zeroed
  kv_storage_.clear();
  kv_scale_storage_.clear();
  StartupPhase phase("KV pool alloc + zero (cuda)");
  const size_t bytes = layout.cache_bytes();
  // Per-token-head dtypes: per slot one K and one V scale array beside the caches
  // ([num_blocks][block_size][num_kv_heads] f32; layout.scale_bytes()).
  const size_t sbytes = layout.scale_bytes();
  for (int i = 0; i < plan.group_size * 2; ++i) {
    kv_storage_.push_back(alloc(bytes));
    FP8KV_CU(cudaMemsetAsync(kv_storage_.back().data(), 0, bytes, stream_));
    if (sbytes > 0) {
      kv_scale_storage_.push_back(alloc(sbytes));
      FP8KV_CU(cudaMemsetAsync(kv_scale_storage_.back().data(), 0, sbytes, stream_));
    }
  }
  FP8KV_CU(cudaStreamSynchronize(stream_));
  phase.set_detail(fmt::format(", {:.2f} GB", static_cast<double>(bytes + sbytes) * plan.group_size * 2 / 1e9));
}

unsigned long long* CudaBackend::layer_clips(int layer) const {
  if (!kv_dtype_per_tensor_scaled(layout_.dtype) || !clips_dev_.data()) return nullptr;
  return static_cast<unsigned long long*>(clips_dev_.data()) + static_cast<size_t>(layer) * 2;
}

std::optional<std::vector<KvClipCounts>> CudaBackend::kv_clip_counts() const {
  std::vector<KvClipCounts> r(static_cast<size_t>(cfg_.num_layers));
  if (!stored_tokens_) return r;  // before allocate_kv: nothing stored
  std::vector<unsigned long long> c(r.size() * 2, 0);
  if (layer_clips(0)) {
    // The caller may be another rank's thread (TpRunner sums the ranks):
    // this device for the copy, the caller's current device kept.
    int prev = 0;
    FP8KV_CU(cudaGetDevice(&prev));
    FP8KV_CU(cudaSetDevice(device_));
    FP8KV_CU(cudaMemcpyAsync(c.data(), clips_dev_.data(), c.size() * sizeof c[0], cudaMemcpyDeviceToHost, stream_));
    FP8KV_CU(cudaStreamSynchronize(stream_));
    FP8KV_CU(cudaSetDevice(prev));
  }
  const uint64_t row = static_cast<uint64_t>(layout_.num_kv_heads) * static_cast<uint64_t>(layout_.head_dim);
  for (size_t l = 0; l < r.size(); ++l) {
    r[l].k = c[l * 2];
    r[l].v = c[l * 2 + 1];
    const int g = layer_group_[l];
    // A state-only layer (linear_attention) stores no K/V.
    r[l].stored = g >= 0 ? stored_tokens_[static_cast<size_t>(g)].load(std::memory_order_relaxed) * row : 0;
  }
  return r;
}

KvLayerStorage CudaBackend::kv_layer(int layer) const {
  if (kv_storage_.empty()) throw std::logic_error("CudaBackend::kv_layer before allocate_kv");
  return kv_slot_storage(layout_, kv_storage_, kv_scale_storage_, layer_slot_.at(layer));
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

}  // namespace fp8kv
