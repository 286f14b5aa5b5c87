// The W8A8 GEMM on fp8 weights (Gemm::linear_w8a8, ops.h): the activations
// quantized to e4m3 per token or per 1x128 group (w8a8_quant.cu, the CPU's
// rule bit for bit), times the checkpoint's e4m3 weights in one cuBLASLt
// FP8 matmul whose scale modes apply both sides' f32 scales, fp32
// accumulation. docs/cuda_backend.md "FP8 weights".
//
// Layout decisions, from the cuBLAS documentation (CUDA 13.0; cublasLt.h
// has the enums): section 3.1.4 "Narrow precision" ("Scaling Mode Support
// Overview", 3.1.4.3 "Outer Vector Scaling for FP8 Data Types", 3.1.4.5
// "128-element 1D and 128x128 2D Block Scaling For FP8 Data Types" and its
// 3.1.4.5.1 "Scaling factors layouts") and 3.4.17 cublasLtMatmul():
//  - Orientation. cuBLAS is column-major. We compute D = op(A) op(B) with
//    m = N (weight rows), n = T (token rows), k = K: A = W's row-major
//    [N][K] bytes as a [K][N] column-major matrix (ld K) with TRANSA = T,
//    B = the codes' row-major [T][K] as [K][T] (ld K) with TRANSB = N, D =
//    y's row-major [T][N] as [N][T] (ld N). FP8 kernels require it: "A must
//    be transposed and B non-transposed (The "TN" format) on Ada (compute
//    capability 8.9), Hopper (compute capability 9.0) ..."; "The compute
//    type must be CUBLAS_COMPUTE_32F. The scale type must be CUDA_R_32F."
//    Every pointer and leading dimension 16-byte aligned ("pointers and
//    matrix dimension must support 16-byte alignment"): e4m3 rows of a
//    multiple of 16 bytes (a W with K % 16 != 0 is padded with zero columns
//    at upload, its codes too: DeviceMatrix::fp8_ld), N % 4 (f32 D).
//  - Output. D = f32 with C = f32 (or bf16 / bf16): with these scale modes
//    "the only supported precisions for D are CUDA_R_16F, CUDA_R_16BF, and
//    CUDA_R_32F" (FP8 D "is not supported when scaling modes are one of
//    ..._OUTER_VEC_32F, ..._VEC128_32F, and ..._BLK128x128_32F").
//  - Block-wise weights (128x128 weight_scale_inv): A_SCALE_MODE =
//    BLK128x128_32F, B_SCALE_MODE = VEC128_32F. The docs' combination table:
//    A BLK128x128 with B VEC128 "Yes" (both BLK128x128: "No"). Each mode's
//    layout (3.1.4.5.1): "Starting addresses of scaling factors must be 16B
//    aligned." "M and N must be multiples of 4." (M = our N, N = our T: a T
//    that is not a multiple of 4 runs padded, see linear_w8a8.)
//    "for the CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F scaling mode, the
//    scaling factors are ... N-major for B with shape N x L" (L =
//    ceil(K/128)): the scale of token t, group g at [g * n + t], token-
//    contiguous (quantize_rows_e4m3 writes it there; W8a8ScaleOut).
//    "For the CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F scaling mode, the
//    scaling factors are K-major and the stride between the consecutive
//    columns must be a multiple of 4 ... for A, the shape of the scaling
//    factors is L4 x ceil(M/128)": block (rb, kb) at [rb * L4 + kb]. The
//    checkpoint's weight_scale_inv [ceil(N/128)][L] (row-major) is already
//    K-major; the upload copies it with each row padded to L4 = L rounded
//    up to 4 (DeviceMatrix::w8a8_scale_ld). A partial last block (K % 128
//    != 0) is the definition's A_{i,(b-1)128+l} for l up to the row's end,
//    the CPU's short last group. PyTorch's _scaled_mm pairs them the same
//    way (aten ScaledBlas.cpp: 1x128 scales "outer-dim-major", 128x128
//    scales "near-inner-dim-major (with 16-byte aligned strides)"; it hands
//    cuBLAS the weights as A, TN, fast accumulation refused for both modes).
//  - Per-channel and per-tensor weights (compressed-tensors, ModelOpt):
//    OUTER_VEC_32F on both, "D_ij = alpha scale_A^i scale_B^j sum_l a_il
//    b_lj"; "scale_A and scale_B must be vectors of length M and N": the
//    weight's per-row scales (a tensor scale repeated at upload) and the
//    per-token activation scales.
//  - No fast accumulation: CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0 (the default,
//    set explicitly). Hopper's FP8 MMA keeps a reduced-precision
//    accumulator inside its k-chain; without fast accumulation the kernel
//    promotes into an fp32 accumulator (PyTorch's scaled_gemm refuses fast
//    accumulation for the 1x128 and 128x128 modes altogether). The error
//    bound of tests/cuda_ops/test_fp8_linear.cpp is fp32 accumulation's.
//  - Bias: the FP8 table's bias type with f32 output is CUDA_R_16BF, and
//    our biases are f32, so the bias is added after the GEMM (add_bias_rows,
//    or in w8a8_finish_rows), never rounded to bf16.
//  - Support: the overview lists outer-vector and 128-element 1D / 128x128
//    2D block scaling for compute capability "9.0" only (Blackwell has the
//    MX modes instead), from cuBLAS 12.9. The engine refuses W8A8 on other
//    devices before loading (engine.cpp), and check_w8a8 asks for every
//    matrix's algorithm at upload, so a missing one fails at load.
#include <cublasLt.h>

#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/ops.h"

namespace fp8kv::cuda {

// Bias add after the GEMM (ops_misc.cu).
void add_bias_rows(float* y, const float* bias, int64_t T, int64_t N, cudaStream_t stream);

namespace {
int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace

struct Gemm::W8a8Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~W8a8Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void Gemm::destroy_w8a8_plans() {
  for (auto& [key, p] : w8a8_plans_) delete p;
  w8a8_plans_.clear();
}

Gemm::W8a8Plan& Gemm::w8a8_plan(int64_t n, int64_t N, int64_t K, bool block, bool out_bf16, bool accumulate) {
  const auto key = std::make_tuple(n, N, K, int{block}, int{out_bf16}, int{accumulate});
  if (auto it = w8a8_plans_.find(key); it != w8a8_plans_.end()) return *it->second;
  auto* p = new W8a8Plan();
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    FP8KV_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const int32_t am = block ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const int32_t bm = block ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am)));
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm)));
    const int8_t fast = 0;
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    // Placeholders for the heuristic (each call sets the real scale pointers).
    const void* dummy = workspace_.get();
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof(dummy)));
    FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof(dummy)));
    const auto K64 = static_cast<uint64_t>(K), N64 = static_cast<uint64_t>(N), n64 = static_cast<uint64_t>(n);
    FP8KV_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, K64, N64, K));
    FP8KV_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, K64, n64, K));
    FP8KV_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, out_bf16 ? CUDA_R_16BF : CUDA_R_32F, N64, n64, N));
    FP8KV_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_.bytes();
    // Every W8A8 operand is 16-byte aligned (linear_w8a8 checks): one plan
    // per shape, whatever the pointers' larger alignments.
    const uint32_t al = 16;
    FP8KV_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      FP8KV_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a,
                                                              p->b, p->c, p->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    pref = nullptr;
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      throw std::runtime_error(
          "cuBLASLt has no FP8 algorithm for the W8A8 GEMM N=" + std::to_string(N) + " K=" + std::to_string(K) +
          " at " + std::to_string(n) + " rows (e4m3 x e4m3 -> " + (out_bf16 ? "bf16" : "f32") + ", scales " +
          (block ? "128x128 blocks x 1x128 groups" : "per channel x per token") + ", " +
          cublasLtGetStatusName(st) + "): the W8A8 scale modes need compute capability 9.0 and cuBLAS >= 12.9; "
          "--fp8-weight-mode w8a16 runs these weights");
    p->algo = res.algo;
  } catch (...) {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    delete p;
    throw;
  }
  w8a8_plans_.emplace(key, p);
  return *p;
}

void Gemm::w8a8_gemm(const uint8_t* codes, const float* act_scale, int64_t n, const DeviceMatrix& W, void* d,
                     bool accumulate, bool out_bf16, cudaStream_t stream) {
  W8a8Plan& p = w8a8_plan(n, W.rows, W.fp8_row_bytes(), W.block128(), out_bf16, accumulate);
  const void* as = W.w8a8_scale;
  const void* bs = act_scale;
  FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof(as)));
  FP8KV_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof(bs)));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  FP8KV_CUBLAS(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, W.fp8, p.a, codes, p.b, &beta, d,
                              p.c, d, p.c, &p.algo, workspace_.get(), workspace_.bytes(), stream));
}

bool Gemm::takes_w8a8(int64_t T, const DeviceMatrix& W) const {
  return W.w8a8() && T >= 1 && (W.fp8_padded() || T >= kW8a8MinRows) && W.rows > 0 &&
         W.rows % 4 == 0 && W.cols > 0 && W.cols % 4 == 0 && W.fp8_row_bytes() % 16 == 0;
}

size_t Gemm::w8a8_scratch_bytes(int64_t T, int64_t K, bool block128) {
  const int64_t T4 = round_up(T, kW8a8Rows), L = block128 ? (K + 127) / 128 : 1;
  return static_cast<size_t>(round_up(T4 * K, 256) + 4 * (round_up(L * T4, 64) + round_up(kW8a8Rows * L, 64)));
}

void Gemm::check_w8a8(const DeviceMatrix& W) {
  if (!W.w8a8()) return;
  for (int64_t n : {kW8a8Rows, int64_t{64}}) (void)w8a8_plan(n, W.rows, W.fp8_row_bytes(), W.block128(), false, false);
}

void Gemm::check_w8a8_call(int64_t T, const DeviceMatrix& W, const float* bias, const void* y, bool accumulate,
                           bool out_bf16, const void* scratch, size_t scratch_bytes) const {
  // K: x's row length; Kp: the e4m3 rows' (K, or K rounded up to 16 for a
  // padded W): the GEMM's k, the codes' row length.
  const int64_t N = W.rows, K = W.cols, Kp = W.fp8_row_bytes();
  if (T < 0 || !y || !W.w8a8() || N <= 0 || N % 4 != 0 || K <= 0 || K % 4 != 0 || Kp % 16 != 0 || Kp < K ||
      Kp >= K + 16 || !aligned16(y) || !aligned16(W.fp8) || !aligned16(W.w8a8_scale) || !scratch ||
      scratch_bytes < w8a8_scratch_bytes(T, Kp, W.block128()) || reinterpret_cast<uintptr_t>(scratch) % 256 != 0 ||
      (out_bf16 && (bias || accumulate || N % 8 != 0)))
    throw std::invalid_argument("cuda::Gemm::linear_w8a8: bad arguments (T=" + std::to_string(T) + " N=" +
                                std::to_string(N) + " K=" + std::to_string(K) + " e4m3 row " + std::to_string(Kp) +
                                "; needs W8A8 scales, N % 4 == 0, K % 4 == 0, e4m3 rows of a multiple of 16 bytes, "
                                "16-byte aligned x, y and W, w8a8_scratch_bytes of scratch; bf16 out without bias "
                                "or accumulate, N % 8 == 0)");
}

// T % 4 != 0 (the block-scale layouts need n % 4 == 0): either one GEMM of
// T rounded up to 4 rows into the fp8 slice buffer (dequant_) and a copy of
// T rows out (when that copy moves fewer bytes than the weight: 2 T4
// out_bytes <= K, and it fits the buffer), or the first T - T % 4 rows
// straight into y and the last ones as a 4-row GEMM into dequant_, copied
// out. The padding rows' codes are 0 (quantize_rows_e4m3), their outputs
// discarded. The bias of rows GEMMed into y is added by add_bias_rows, of
// copied rows by w8a8_finish_rows; accumulate likewise (cuBLASLt's beta = 1
// into y, or the copy's add): the same fp32 operations either way.
int64_t Gemm::w8a8_main_rows(int64_t T, const DeviceMatrix& W, bool out_bf16) const {
  const int64_t T4 = round_up(T, kW8a8Rows);
  if (T == T4) return T;
  const size_t ob = out_bf16 ? 2 : 4;
  const bool padded =
      static_cast<size_t>(T4 * W.rows) * ob <= dequant_.bytes() && static_cast<int64_t>(2 * ob) * T4 <= W.fp8_row_bytes();
  if (!padded && static_cast<size_t>(kW8a8Rows * W.rows) * ob > dequant_.bytes())
    throw std::logic_error("cuda::Gemm::linear_w8a8: " + std::to_string(T) + " rows (not a multiple of 4) of N=" +
                           std::to_string(W.rows) + " need the fp8 slice buffer (reserve_fp8_scratch: " +
                           std::to_string(dequant_.bytes()) + " bytes)");
  return padded ? T4 : T - T % kW8a8Rows;
}

Gemm::W8a8Codes Gemm::w8a8_codes(int64_t T, const DeviceMatrix& W, bool out_bf16, void* scratch) const {
  const int64_t Kp = W.fp8_row_bytes(), T4 = round_up(T, kW8a8Rows), L = W.block128() ? (W.cols + 127) / 128 : 1;
  const int64_t n_main = w8a8_main_rows(T, W, out_bf16);
  auto* codes = static_cast<uint8_t*>(scratch);
  float* sc = reinterpret_cast<float*>(codes + round_up(T4 * Kp, 256));
  W8a8Codes c;
  c.codes = codes;
  c.T = T;
  c.T_pad = T4;
  c.K = W.cols;
  c.Kc = Kp;
  c.group = W.block128() ? 128 : W.cols;
  c.scales = W8a8ScaleOut{sc, n_main, sc + round_up(L * n_main, 64), kW8a8Rows};
  return c;
}

void Gemm::linear_w8a8(const W8a8Input& x, int64_t T, const DeviceMatrix& W, const float* bias, void* y,
                       bool accumulate, bool out_bf16, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (T == 0) return;
  if (!x.data || !aligned16(x.data))
    throw std::invalid_argument("cuda::Gemm::linear_w8a8: x must be a 16-byte aligned device pointer");
  check_w8a8_call(T, W, bias, y, accumulate, out_bf16, scratch, scratch_bytes);
  const W8a8Codes c = w8a8_codes(T, W, out_bf16, scratch);
  quantize_rows_e4m3(x.data, x.f32, x.rows, c.T, c.T_pad, c.K, c.Kc, c.group, c.codes, c.scales, stream);
  linear_w8a8_codes(T, W, bias, y, accumulate, out_bf16, scratch, scratch_bytes, stream);
}

void Gemm::linear_w8a8_codes(int64_t T, const DeviceMatrix& W, const float* bias, void* y, bool accumulate,
                             bool out_bf16, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (T == 0) return;
  check_w8a8_call(T, W, bias, y, accumulate, out_bf16, scratch, scratch_bytes);
  const int64_t N = W.rows, Kp = W.fp8_row_bytes();
  const W8a8Codes c = w8a8_codes(T, W, out_bf16, scratch);
  const int64_t n_main = c.scales.n_main;
  const bool padded = n_main > T, tail = n_main < T;
  void* ys = dequant_.get();
  if (n_main > 0) {
    w8a8_gemm(c.codes, c.scales.main, n_main, W, padded ? ys : y, accumulate && !padded, out_bf16, stream);
    if (!padded && bias) add_bias_rows(static_cast<float*>(y), bias, n_main, N, stream);
  }
  if (tail) w8a8_gemm(c.codes + n_main * Kp, c.scales.tail, kW8a8Rows, W, ys, false, out_bf16, stream);
  if (padded || tail) {
    const int64_t r0 = padded ? 0 : n_main, rows = T - r0;
    if (out_bf16)
      FP8KV_CU(cudaMemcpyAsync(static_cast<uint16_t*>(y) + r0 * N, ys, static_cast<size_t>(rows * N) * 2,
                               cudaMemcpyDeviceToDevice, stream));
    else
      w8a8_finish_rows(static_cast<const float*>(ys), rows, N, bias, static_cast<float*>(y) + r0 * N, accumulate,
                       stream);
  }
}

}  // namespace fp8kv::cuda
