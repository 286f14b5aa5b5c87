// Device buffers, weight upload, and the cuBLASLt linear (ops.h).
#include <cublasLt.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/ops.h"
#include "numerics/fp8.h"

namespace fp8kv::cuda {

namespace detail {
[[noreturn]] void throw_cublas(const char* call, const char* file, int line, int status) {
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cublasLtGetStatusName(static_cast<cublasStatus_t>(status)) + " (" +
                           cublasLtGetStatusString(static_cast<cublasStatus_t>(status)) + ")");
}
}  // namespace detail

// Bias-add fallback when no cuBLASLt algorithm takes the bias epilogue (ops_misc.cu).
void add_bias_rows(float* y, const float* bias, int64_t T, int64_t N, cudaStream_t stream);
// The same on columns [0, N) of rows with leading dimension ld.
void add_bias_rows_strided(float* y, const float* bias, int64_t T, int64_t N, int64_t ld, cudaStream_t stream);

DeviceBuffer::DeviceBuffer(size_t bytes) : n_(bytes) {
  if (bytes) FP8KV_CU(cudaMalloc(&p_, bytes));
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);  // no throw from a destructor; a failed free leaks
}

void DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= n_) return;
  DeviceBuffer fresh(bytes);
  *this = std::move(fresh);
}

void DeviceBuffer::upload(const void* host, size_t bytes, cudaStream_t stream) {
  if (bytes > n_) throw std::invalid_argument("DeviceBuffer::upload: " + std::to_string(bytes) + " bytes > " +
                                              std::to_string(n_));
  if (!bytes) return;
  FP8KV_CU(cudaMemcpyAsync(p_, host, bytes, cudaMemcpyHostToDevice, stream));
  FP8KV_CU(cudaStreamSynchronize(stream));
}

void DeviceBuffer::download(void* host, size_t bytes, cudaStream_t stream) const {
  if (bytes > n_) throw std::invalid_argument("DeviceBuffer::download: " + std::to_string(bytes) + " bytes > " +
                                              std::to_string(n_));
  if (!bytes) return;
  FP8KV_CU(cudaMemcpyAsync(host, p_, bytes, cudaMemcpyDeviceToHost, stream));
  FP8KV_CU(cudaStreamSynchronize(stream));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool cuda_device_available() { return cuda_device_count() > 0; }

void upload_matrix_bf16_to(const MatrixRef& host, uint16_t* dst) {
  const size_t count = static_cast<size_t>(host.rows) * static_cast<size_t>(host.cols);
  if (!count) return;
  if (host.type == WeightType::bf16) {
    FP8KV_CU(cudaMemcpy(dst, host.data, count * 2, cudaMemcpyHostToDevice));
    return;
  }
  // fp32 -> bf16 (RNE) in slices, to bound the host staging memory.
  constexpr size_t kSlice = size_t{1} << 24;
  std::vector<uint16_t> tmp(std::min(count, kSlice));
  const float* src = static_cast<const float*>(host.data);
  for (size_t i0 = 0; i0 < count; i0 += kSlice) {
    const size_t n = std::min(kSlice, count - i0);
    for (size_t i = 0; i < n; ++i) tmp[i] = f32_to_bf16(src[i0 + i]);
    FP8KV_CU(cudaMemcpy(dst + i0, tmp.data(), n * 2, cudaMemcpyHostToDevice));
  }
}

DeviceMatrix upload_matrix_bf16(const MatrixRef& host, DeviceBuffer& dst) {
  const size_t count = static_cast<size_t>(host.rows) * static_cast<size_t>(host.cols);
  dst = DeviceBuffer(count * 2);
  upload_matrix_bf16_to(host, dst.as<uint16_t>());
  return DeviceMatrix{dst.as<const uint16_t>(), host.rows, host.cols};
}

void upload_f32(const std::vector<float>& host, DeviceBuffer& dst) {
  if (host.empty()) {
    dst = DeviceBuffer();
    return;
  }
  dst = DeviceBuffer(host.size() * sizeof(float));
  dst.upload(host.data(), host.size() * sizeof(float));
}

// ---- Gemm -------------------------------------------------------------------

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

int pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && (a % static_cast<uintptr_t>(align)) != 0) align /= 2;
  return align;
}
}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_epilogue = false;  // false with a bias: bias added by add_bias_rows
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Gemm::Gemm() : workspace_(kWorkspaceBytes) {
  cublasLtHandle_t h = nullptr;
  FP8KV_CUBLAS(cublasLtCreate(&h));
  handle_ = h;
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) delete p;
  destroy_w8a8_plans();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Gemm::Plan& Gemm::plan(int64_t T, int64_t N, int64_t K, bool bias, bool accumulate, int align_x, int align_w,
                       int align_y, bool out_bf16, int64_t ldy) {
  if (ldy <= 0) ldy = N;
  // The accumulate slot of the key also carries the output type (+2: bf16).
  const auto key = std::make_tuple(T, N, K, int{bias}, int{accumulate} + 2 * int{out_bf16}, align_x, align_w, align_y,
                                   ldy);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  auto* p = new Plan();
  try {
    // Column-major view: D[N][T] = W^T-op(A = W as [K][N], ld K) * B (x as [K][T], ld K).
    FP8KV_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    FP8KV_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, static_cast<uint64_t>(K), static_cast<uint64_t>(N), K));
    FP8KV_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, static_cast<uint64_t>(K), static_cast<uint64_t>(T), K));
    FP8KV_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, out_bf16 ? CUDA_R_16BF : CUDA_R_32F, static_cast<uint64_t>(N),
                                            static_cast<uint64_t>(T), ldy));

    cublasLtMatmulPreference_t pref = nullptr;
    FP8KV_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    auto find = [&](bool with_bias) {
      const cublasLtEpilogue_t epi = with_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      const uint64_t ws = kWorkspaceBytes;
      const uint32_t ax = static_cast<uint32_t>(align_x), aw = static_cast<uint32_t>(align_w),
                     ay = static_cast<uint32_t>(align_y);
      FP8KV_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      FP8KV_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw)));
      FP8KV_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof(ax)));
      FP8KV_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof(ay)));
      FP8KV_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof(ay)));
      // cuBLASLt's first heuristic pick (timing the first 8 picks at TTFT 8K
      // chose the same speed: 292.1 vs 292.7 ms; docs/cuda_backend.md).
      cublasLtMatmulHeuristicResult_t res{};
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a,
                                                                p->b, p->c, p->c, pref, 1, &res, &found);
      if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
      p->algo = res.algo;
      return true;
    };
    bool ok = false;
    if (bias) ok = p->bias_epilogue = find(true);
    if (!ok) ok = find(false);
    cublasLtMatmulPreferenceDestroy(pref);
    if (!ok)
      throw std::runtime_error("cuBLASLt found no algorithm for linear T=" + std::to_string(T) + " N=" +
                               std::to_string(N) + " K=" + std::to_string(K) + " (bf16 x bf16 -> fp32)");
  } catch (...) {
    delete p;
    throw;
  }
  plans_.emplace(key, p);
  return *p;
}

void Gemm::reserve_fp8_scratch() {
  dequant_.reserve(static_cast<size_t>(slice_elems_ ? slice_elems_ : kDequantSliceElemsLarge) * 2);
}

void Gemm::linear_fp8_sliced(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, void* y,
                             bool accumulate, bool out_bf16, cudaStream_t stream) {
  const int64_t slice_elems =
      slice_elems_ ? slice_elems_ : T >= kLargeSliceRows ? kDequantSliceElemsLarge : kDequantSliceElems;
  if (dequant_.bytes() < static_cast<size_t>(slice_elems) * 2)
    throw std::logic_error("cuda::Gemm: fp8 weight past the GEMV rows before reserve_fp8_scratch");
  if (W.cols > slice_elems)
    throw std::invalid_argument("cuda::Gemm: fp8 weight row of " + std::to_string(W.cols) + " columns is longer than "
                                "the dequantization slice");
  // Whole 128-row blocks per slice (at least one row).
  int64_t rows = std::max<int64_t>(1, slice_elems / W.cols);
  if (rows >= 128) rows -= rows % 128;
  auto* slice = dequant_.as<uint16_t>();
  const size_t out_bytes = out_bf16 ? 2 : 4;
  for (int64_t r0 = 0; r0 < W.rows; r0 += rows) {
    const int64_t n = std::min(rows, W.rows - r0);
    dequantize_fp8_rows_bf16(W, r0, n, slice, stream);
    void* yo = static_cast<char*>(y) + static_cast<size_t>(r0) * out_bytes;
    const float* bo = bias ? bias + r0 : nullptr;
    Plan& p = plan(T, n, W.cols, bo != nullptr, accumulate, pointer_alignment(x), pointer_alignment(slice),
                   pointer_alignment(yo), out_bf16, W.rows);
    if (p.bias_epilogue)
      FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bo, sizeof(bo)));
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    FP8KV_CUBLAS(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, slice, p.a, x, p.b, &beta, yo,
                                p.c, yo, p.c, &p.algo, workspace_.get(), kWorkspaceBytes, stream));
    if (bo && !p.bias_epilogue) {
      if (out_bf16) throw std::logic_error("cuda::Gemm: a bias with bf16 output");
      add_bias_rows_strided(static_cast<float*>(yo), bo, T, n, W.rows, stream);
    }
  }
}

void Gemm::linear_bf16_out(const uint16_t* x, int64_t T, const DeviceMatrix& W, uint16_t* y, cudaStream_t stream) {
  if (T == 0) return;
  if (W.is_fp8() && W.fp8_padded())
    throw std::invalid_argument("cuda::Gemm::linear_bf16_out: a padded fp8 W (W8A8 only) takes linear_w8a8");
  if (W.is_fp8() && x && y && T > 0) return linear_fp8_sliced(x, T, W, nullptr, y, false, true, stream);
  if (T < 0 || !x || !W.data || !y || W.rows <= 0 || W.cols <= 0)
    throw std::invalid_argument("cuda::Gemm::linear_bf16_out: bad arguments (null pointer or empty shape)");
  Plan& p = plan(T, W.rows, W.cols, false, false, pointer_alignment(x), pointer_alignment(W.data),
                 pointer_alignment(y), true);
  const float alpha = 1.0f, beta = 0.0f;
  FP8KV_CUBLAS(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, W.data, p.a, x, p.b, &beta, y,
                              p.c, y, p.c, &p.algo, workspace_.get(), kWorkspaceBytes, stream));
}

void Gemm::name_shape(int64_t N, int64_t K, LinearProj proj) {
  const auto key = std::make_pair(N, K);
  const int p = static_cast<int>(proj);
  auto [it, fresh] = shape_proj_.emplace(key, p);
  if (!fresh && it->second != p) it->second = -1;  // two projections share the shape: no route
}

GemvKernel Gemm::route(int64_t T, int64_t N, int64_t K) const {
  if (T > gemv_max_rows_) return GemvKernel::lt;
  const auto it = shape_proj_.find(std::make_pair(N, K));
  if (it == shape_proj_.end() || it->second < 0) return GemvKernel::simt_or_mma;
  return gemv_route(static_cast<LinearProj>(it->second));
}

void Gemm::linear(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
                  cudaStream_t stream) {
  if (T == 0) return;
  if (W.is_fp8() && x && y && T > 0 && W.rows > 0 && W.cols > 0) {
    if (takes_w8a8(T, W) && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0) {
      // This Gemm's own scratch (tests, benches): CudaBackend calls
      // linear_w8a8 with a buffer it grows outside graph captures.
      const size_t need = w8a8_scratch_bytes(T, W.fp8_row_bytes(), W.block128());
      if (w8a8_own_.bytes() < need) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        FP8KV_CU(cudaStreamIsCapturing(stream, &cs));
        if (cs != cudaStreamCaptureStatusNone)
          throw std::logic_error("cuda::Gemm::linear: the W8A8 scratch would grow during a graph capture");
        w8a8_own_.reserve(need);
      }
      linear_w8a8(W8a8Input{x, false, nullptr}, T, W, bias, y, accumulate, false, w8a8_own_.get(), w8a8_own_.bytes(),
                  stream);
      return;
    }
    if (gemv_fp8_fits(x, T, W))
      gemv_fp8(x, T, W, bias, y, accumulate, stream);
    else
      linear_fp8_sliced(x, T, W, bias, y, accumulate, false, stream);
    return;
  }
  if (T < 0 || !x || !W.data || !y || W.rows <= 0 || W.cols <= 0)
    throw std::invalid_argument("cuda::Gemm::linear: bad arguments (null pointer or empty shape)");
  if (T <= gemv_max_rows_ && gemv_bf16_fits(x, T, W)) {
    switch (route(T, W.rows, W.cols)) {
      case GemvKernel::lt: break;  // cuBLASLt below
      case GemvKernel::simt_or_mma: gemv_bf16(x, T, W, bias, y, accumulate, stream); return;
      case GemvKernel::simt_split: gemv_bf16_simt_split(x, T, W, bias, y, accumulate, 0, stream); return;
      case GemvKernel::simt_split8: gemv_bf16_simt_split(x, T, W, bias, y, accumulate, 8, stream); return;
    }
  }
  Plan& p = plan(T, W.rows, W.cols, bias != nullptr, accumulate, pointer_alignment(x), pointer_alignment(W.data),
                 pointer_alignment(y));
  if (p.bias_epilogue)
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  FP8KV_CUBLAS(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, W.data, p.a, x, p.b, &beta, y,
                              p.c, y, p.c, &p.algo, workspace_.get(), kWorkspaceBytes, stream));
  if (bias && !p.bias_epilogue) add_bias_rows(y, bias, T, W.rows, stream);
}

}  // namespace fp8kv::cuda
