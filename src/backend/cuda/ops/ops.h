// CUDA ops for the forward pass (everything but the paged KV kernels, which
// live in attention/attention.h): cuBLASLt linear, RMSNorm (+ residual, + Gemma sandwich
// post-norm), per-head QK-norm + RoPE, gated activations, embedding gather,
// logit softcap, per-row log-softmax / argmax, and GPU sampling.
//
// Conventions (docs/cuda_backend.md):
//  - Plain C++ API: device pointers and a cudaStream_t. bf16 device arrays are
//    passed as uint16_t (the bit pattern), so this header needs no CUDA
//    device headers and compiles with the host compiler.
//  - The residual stream and every GEMM output are fp32; GEMM inputs (normed
//    activations, the gated activation, attention output) are bf16; weights
//    are bf16. Accumulation is fp32 everywhere.
//  - Each op mirrors one CPU reference op (backend/cpu/ops.h) with the same
//    formula and rounding order where the math allows (IEEE mul/add/div, no
//    contraction where the CPU has none); tests/cuda_ops checks each against
//    it with tolerances derived from bf16 rounding.
//  - Every CUDA / cuBLAS status is checked; failures throw std::runtime_error
//    naming the call and file:line. Bad arguments throw std::invalid_argument.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/common/host_matrix.h"  // MatrixRef
#include "backend/cuda/linear/routes.h"
#include "backend/tensor.h"  // Activation
#include "numerics/fp8.h"  // KvDtype

namespace fp8kv::cuda {

// ---- device memory --------------------------------------------------------

// Owning device allocation (cudaMalloc: 256-byte aligned). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();

  // Grows to at least `bytes` (contents are lost when it reallocates).
  void reserve(size_t bytes);
  void upload(const void* host, size_t bytes, cudaStream_t stream = nullptr);  // synchronous
  void download(void* host, size_t bytes, cudaStream_t stream = nullptr) const;  // synchronous

  void* get() const { return p_; }
  template <class T> T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// The CUDA devices this process sees: cudaGetDeviceCount, or 0 when it fails
// (its sticky error cleared).
int cuda_device_count();
// True when a CUDA device is usable (cuda_device_count() > 0).
bool cuda_device_available();

// Row-major weight matrix [rows][cols] on the device: bf16 (data), or fp8
// e4m3 bytes (fp8) with f32 scales, element (r, c) = e4m3(fp8[r][c]) *
// scale[(r >> scale_row_shift) * scale_ld + (c >> 7) * scale_k_step]:
//   tensor   shift 0, ld 0,           k_step 0  (scale[0])
//   channel  shift 0, ld 1,           k_step 0  (scale[r])
//   block128 shift 7, ld ceil(K/128), k_step 1  (scale[r/128][c/128])
// (numerics/fp8_weights.h; docs/design.md "FP8-weight checkpoints").
//
// W8A8 (--fp8-weight-mode w8a8) adds the weight scales in the layout the
// cuBLASLt FP8 GEMM reads (linear/w8a8_gemm.cpp has the layout decisions):
//   block128         [ceil(N/128)][w8a8_scale_ld], K-major, w8a8_scale_ld =
//                    ceil(K/128) rounded up to a multiple of 4 (pad zeros)
//   tensor, channel  [N], one per row (a tensor scale repeated)
// w8a8_scale null: the matrix runs W8A16 in either mode. fp8_ld: the e4m3
// rows' stride when the upload padded them (W8A8 only, K % 16 != 0: K
// rounded up to 16, zero columns; such a matrix has no W8A16 kernel and
// takes the W8A8 GEMM at every row count); 0: cols.
struct DeviceMatrix {
  const uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* fp8 = nullptr;
  const float* scale = nullptr;
  int scale_row_shift = 0;
  int64_t scale_ld = 0;
  int scale_k_step = 0;
  const float* w8a8_scale = nullptr;
  int64_t w8a8_scale_ld = 0;
  int64_t fp8_ld = 0;
  bool is_fp8() const { return fp8 != nullptr; }
  bool w8a8() const { return fp8 != nullptr && w8a8_scale != nullptr; }
  bool block128() const { return scale_row_shift == 7; }
  bool fp8_padded() const { return fp8_ld != 0 && fp8_ld != cols; }
  int64_t fp8_row_bytes() const { return fp8_ld ? fp8_ld : cols; }
};

// Converts a host matrix (fp32 or bf16 elements, row-major) to bf16 (RNE) and
// uploads it into `dst` (resized). fp32 -> bf16 is the only rounding.
DeviceMatrix upload_matrix_bf16(const MatrixRef& host, DeviceBuffer& dst);
// The same into caller-owned device memory of rows * cols * 2 bytes.
void upload_matrix_bf16_to(const MatrixRef& host, uint16_t* dst);
// Uploads fp32 values (norm weights, biases); empty -> null buffer.
void upload_f32(const std::vector<float>& host, DeviceBuffer& dst);

// ---- linear (cuBLASLt) ----------------------------------------------------

// Decode GEMV (gemv_bf16 below): the most rows it takes, and how many a
// Gemm routes to it (1: the GEMV measured faster than cuBLASLt at T = 1
// only; docs/cuda_backend.md "GEMV for decode rows").
constexpr int kGemvMaxRows = 8;
constexpr int kGemvDefaultRows = 1;

// Where quantize_rows_e4m3 writes the scale of row t, group g: t < n_main:
// main[g * n_main + t], else tail[g * n_tail + (t - n_main)]: token-major
// per group, the layout of cuBLASLt's 1x128 (VEC128_32F) and per-token
// (OUTER_VEC_32F) scales of B for the GEMM over rows [0, n_main) and the
// one over the n_tail rows after it (Gemm::linear_w8a8).
struct W8a8ScaleOut {
  float* main = nullptr;
  int64_t n_main = 0;
  float* tail = nullptr;
  int64_t n_tail = 0;
};

// One cuBLASLt handle, a workspace, and a cache of matmul plans (descriptors
// + heuristic algorithm) per shape and pointer alignment. Not thread-safe:
// one Gemm per stream.
class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[T][N] = x[T][K] (bf16) * W[N][K]^T (bf16) (+ bias[N], fp32) (+ y when
  // accumulate: the residual add fused into the GEMM as beta = 1), fp32
  // accumulation and output. T == 0 is a no-op. An fp8 W: linear_w8a8 when
  // takes_w8a8(T, W) (with this Gemm's own scratch), else (W8A16) the fp8
  // GEMV (gemv_fp8) up to kGemvMaxRows rows, else linear_fp8_sliced.
  void linear(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
              cudaStream_t stream);
  // y[T][N] = bf16(x W^T) with fp32 accumulation, no bias, always cuBLASLt
  // (the prefill gate|up GEMM, CudaBackend::linear_gated_act); an fp8 W runs
  // W8A16 (linear_fp8_sliced) here: in W8A8 mode the backend's rows that
  // take the W8A8 GEMM have f32 inputs and never come here.
  void linear_bf16_out(const uint16_t* x, int64_t T, const DeviceMatrix& W, uint16_t* y, cudaStream_t stream);

  // Calls with T <= this many rows (and shapes gemv_bf16 takes) run
  // gemv_bf16 instead of cuBLASLt: kGemvDefaultRows. The setter is for
  // tests and bench_linear (0..kGemvMaxRows).
  void set_gemv_max_rows(int rows) { gemv_max_rows_ = rows; }
  // The slice buffer fp8 weights need past the GEMV rows (once, at weight
  // upload: never inside a CUDA graph capture).
  void reserve_fp8_scratch();
  // The slice linear_fp8_sliced dequantizes at a time, in elements: at
  // fewer than kLargeSliceRows rows 8M (16 MB of bf16, which stays in L2 for
  // the GEMM reading it), else 128M (256 MB: whole matrices up to 128M
  // weights, one GEMM of full width instead of 16 slices re-reading x; T =
  // 8192 bench_prefill_gemm on an H100: W8A16 down 1,270 vs 1,530 us, the
  // 27B gate|up 3,820 vs 4,466, faster than bf16 weights' 1,354 / 4,013).
  static constexpr int64_t kDequantSliceElems = int64_t{1} << 23;
  static constexpr int64_t kDequantSliceElemsLarge = int64_t{1} << 27;
  static constexpr int64_t kLargeSliceRows = 1024;
  // Bench only (bench_prefill_gemm, before reserve_fp8_scratch): one slice
  // size at every row count instead of the plan above.
  void set_dequant_slice_elems(int64_t n) { slice_elems_ = n; }
  int gemv_max_rows() const { return gemv_max_rows_; }

  // ---- W8A8 (linear/w8a8_gemm.cpp; docs/cuda_backend.md "FP8 weights") ----
  // The activations of a W8A8 call: bf16 or f32 rows of K elements, row t
  // at data + rows[t] * K (rows null: row t); 16-byte aligned.
  struct W8a8Input {
    const void* data = nullptr;
    bool f32 = false;
    const int32_t* rows = nullptr;
  };
  // True when a call of T rows on W runs the W8A8 GEMM: W.w8a8(), T >=
  // kW8a8MinRows (routes.h; any T for a padded W), N % 4 == 0
  // (cuBLASLt's block-scale layouts) and 16-byte e4m3 rows. Fewer rows keep
  // the fp8 GEMV (W8A16).
  bool takes_w8a8(int64_t T, const DeviceMatrix& W) const;
  // y[T][N] (+)= dequant(e4m3(x)) * dequant(W)^T (+ bias): x quantized to
  // e4m3 per token, or per 1x128 group for block-wise W (quantize_rows_e4m3:
  // the CPU's rule bit for bit), then one cuBLASLt FP8 GEMM with the scale
  // modes of W's granularity, fp32 accumulation (no fast accumulation), f32
  // out (or bf16 out: then no bias and no accumulate). T % 4 != 0 rows (the
  // block-scale layouts need a multiple of 4) run through a padded GEMM
  // into the fp8 slice buffer (reserve_fp8_scratch) and a copy-out.
  // `scratch` (w8a8_scratch_bytes(T, K, W.block128()) bytes, 256-aligned)
  // holds the codes and scales: the caller's (CudaBackend grows it outside
  // graph captures). y 16-byte aligned.
  void linear_w8a8(const W8a8Input& x, int64_t T, const DeviceMatrix& W, const float* bias, void* y, bool accumulate,
                   bool out_bf16, void* scratch, size_t scratch_bytes, cudaStream_t stream);
  // K: the codes' row length (W.fp8_row_bytes()).
  static size_t w8a8_scratch_bytes(int64_t T, int64_t K, bool block128);
  // Where linear_w8a8(x, T, W, ..., out_bf16, scratch, ...) keeps the codes
  // and scales in `scratch`: the arguments of its quantize_rows_e4m3 call
  // (codes [T_pad][Kc], T_pad = T rounded up to kW8a8Rows, Kc =
  // W.fp8_row_bytes(), K = W.cols, group 128 or K, the scale layout of its
  // direct / padded / tail GEMMs). A function of (T, W, out_bf16) and the
  // scratch pointer only.
  struct W8a8Codes {
    uint8_t* codes = nullptr;
    int64_t T = 0, T_pad = 0, K = 0, Kc = 0, group = 0;
    W8a8ScaleOut scales;
  };
  W8a8Codes w8a8_codes(int64_t T, const DeviceMatrix& W, bool out_bf16, void* scratch) const;
  // linear_w8a8's GEMMs on codes already in `scratch`, where
  // w8a8_codes(T, W, out_bf16, scratch) says (gated_act_quantize_e4m3 writes
  // them there): linear_w8a8 = quantize_rows_e4m3 into w8a8_codes, then
  // this. Same arguments and rules as linear_w8a8, without x.
  void linear_w8a8_codes(int64_t T, const DeviceMatrix& W, const float* bias, void* y, bool accumulate,
                         bool out_bf16, void* scratch, size_t scratch_bytes, cudaStream_t stream);
  // The W8A8 GEMMs' row quantum: cuBLASLt's block-scale layouts need the
  // token count n to be a multiple of 4 ("M and N must be multiples of 4").
  static constexpr int64_t kW8a8Rows = 4;
  // At weight upload: asks cuBLASLt for W's W8A8 algorithms (the plans at 4
  // and 64 rows, cached) and throws std::runtime_error naming the shape when
  // it has none, so that a GPU or cuBLAS without the FP8 scale modes fails
  // at load, not while serving.
  void check_w8a8(const DeviceMatrix& W);

  // Names the projection of weight shape [N][K], so that GEMV-path calls of
  // that shape follow kGemvRoutes (routes.h). Unnamed shapes, and
  // a shape named for two projections, take gemv_bf16's own choice.
  void name_shape(int64_t N, int64_t K, LinearProj proj);
  // The kernel a call of T rows with W [N][K] runs (lt: cuBLASLt).
  GemvKernel route(int64_t T, int64_t N, int64_t K) const;

 private:
  struct Plan;
  Plan& plan(int64_t T, int64_t N, int64_t K, bool bias, bool accumulate, int align_x, int align_w, int align_y,
             bool out_bf16 = false, int64_t ldy = 0);
  // An fp8 W past the GEMV rows: W dequantized to bf16 in row slices (of at
  // most kDequantSliceElems or kDequantSliceElemsLarge elements, by T),
  // each slice one cuBLASLt GEMM into its columns of y.
  void linear_fp8_sliced(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, void* y,
                         bool accumulate, bool out_bf16, cudaStream_t stream);
  struct W8a8Plan;
  void destroy_w8a8_plans();
  W8a8Plan& w8a8_plan(int64_t n, int64_t N, int64_t K, bool block, bool out_bf16, bool accumulate);
  // linear_w8a8's checks of everything but x (throws std::invalid_argument).
  void check_w8a8_call(int64_t T, const DeviceMatrix& W, const float* bias, const void* y, bool accumulate,
                       bool out_bf16, const void* scratch, size_t scratch_bytes) const;
  // The rows of linear_w8a8's first GEMM: T, T rounded up to kW8a8Rows (the
  // padded GEMM), or T - T % kW8a8Rows (then a kW8a8Rows-row tail GEMM).
  int64_t w8a8_main_rows(int64_t T, const DeviceMatrix& W, bool out_bf16) const;
  // One cuBLASLt call of linear_w8a8: n columns of codes (n % 4 == 0).
  void w8a8_gemm(const uint8_t* codes, const float* act_scale, int64_t n, const DeviceMatrix& W, void* d,
                 bool accumulate, bool out_bf16, cudaStream_t stream);
  DeviceBuffer dequant_;
  int64_t slice_elems_ = 0;  // 0: the plan of kDequantSliceElems / kDequantSliceElemsLarge
  DeviceBuffer w8a8_own_;  // linear()'s W8A8 scratch (tests, benches; CudaBackend passes its own)
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int, int>, W8a8Plan*> w8a8_plans_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int, int64_t>, Plan*> plans_;
  int gemv_max_rows_ = kGemvDefaultRows;
  std::map<std::pair<int64_t, int64_t>, int> shape_proj_;  // -> LinearProj, or -1: named twice
};

// Decode-shaped linear without cuBLASLt: y[T][N] = x[T][K] W[N][K]^T (+ bias)
// (+ y when accumulate), bf16 inputs, fp32 accumulation and output, for
// 1 <= T <= kGemvMaxRows; W is streamed once. gemv_bf16_fits: K % 8 == 0 and
// 16-byte aligned x and W (else gemv_bf16 throws std::invalid_argument).
bool gemv_bf16_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W);
void gemv_bf16(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
               cudaStream_t stream);
// The two kernels behind gemv_bf16 (same contract): one warp per output
// column with fp32 fmaf (simt), or a block per 16 columns with bf16
// mma.sync and K split over its 8 warps (mma). gemv_bf16 takes mma for
// T >= kGemvMmaMinRows. bench_linear times both (docs/cuda_backend.md "GEMV for decode rows").
constexpr int kGemvMmaMinRows = 2;
void gemv_bf16_simt(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y,
                    bool accumulate, cudaStream_t stream);
void gemv_bf16_mma(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
                   cudaStream_t stream);
// The SIMT kernel with `split` warps per output column (1, 2, 4 or 8; K
// split over them, partial sums added in fixed order: deterministic; split 1
// is gemv_bf16_simt bitwise), or split <= 0: gemv_simt_auto_split(N, K).
void gemv_bf16_simt_split(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y,
                          bool accumulate, int split, cudaStream_t stream);
// The split the SIMT kernel takes for W[N][K] by default (split <= 0): enough
// warps to fill the GPU twice (N * split >= 16384) while each lane keeps at
// least 4 16-byte chunks of its row (8B shape: qkv, o_proj, down 4; gate_up,
// LM head 1).
int gemv_simt_auto_split(int64_t N, int64_t K);
// The gate|up GEMV with the gated activation fused, for T = 1 or 2 rows
// (gemv_gated_act_max_rows): W = [gate; up] ([2I][K], the fused gate_up
// projection), out[T][I] = bf16(act(x W_gate^T + b_gate) * (x W_up^T + b_up)),
// with the SIMT GEMV's sums (split 1) and gated_act's element math: bitwise
// gemv_bf16_simt + gated_act(out_bf16). Same fit rules as gemv_bf16.
constexpr int kGemvGatedActMaxRows = 2;
void gemv_gated_act_bf16(Activation act, const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias,
                         uint16_t* out, cudaStream_t stream);

// ---- fp8 weights (W8A16) --------------------------------------------------

// The decode GEMV on an fp8 weight (W.is_fp8()): y[T][N] (+)= x[T][K] (bf16)
// * W^T (+ bias), 1 <= T <= kGemvMaxRows, on the tensor cores: a warp tile
// of 16 output rows, the e4m3 bytes turned into bf16 fragments in registers
// (e4m3 * 2^-120, exact), one bf16 mma.sync (fp32 accumulate) per 16 k, each
// 128-column group's sum times its scale in fp32. K split over
// gemv_fp8_split(N, K) warps per tile, added in fixed order
// (deterministic). gemv_fp8_fits: K % 16 == 0, 16-byte aligned x and W.
bool gemv_fp8_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W);
void gemv_fp8(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
              cudaStream_t stream);
// The warps per 16-row tile gemv_fp8 takes for W[N][K] (1, 2, 4 or 8): the
// split doubles while tiles x split < 4096 warps and each warp keeps at
// least 2 of the 128-column groups (8B shape: qkv, o_proj, down 8; gate_up
// 4; LM head 1). For tests and benches.
int gemv_fp8_split(int64_t N, int64_t K);
// The gate|up GEMV with the gated activation fused on an fp8 W (T = 1 or 2,
// the fused gate_up projection whose gemv_fp8 split is at most 4):
// out[T][I] = bf16(act(gate + b) * (up + b)), bitwise gemv_fp8 +
// gated_act(out_bf16).
bool gemv_fp8_gated_act_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W);
void gemv_fp8_gated_act(Activation act, const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias,
                        uint16_t* out, cudaStream_t stream);
// Rows [r0, r0 + n) of an fp8 W dequantized to bf16: out[i][c] =
// bf16_rn(e4m3(W[r0 + i][c]) * scale(r0 + i, c)) (one fp32 multiply, RNE).
void dequantize_fp8_rows_bf16(const DeviceMatrix& W, int64_t r0, int64_t n, uint16_t* out, cudaStream_t stream);

// ---- fp8 weights, W8A8 (linear/w8a8_quant.cu) -------------------------------

// (W8a8ScaleOut, the scales' layout, is above Gemm.)
// W8A8's activation quantization, mirroring quantize_activations_e4m3
// (numerics/fp8_weights.h) bit for bit: rows t < T of x (bf16, or f32 with
// x_f32; K elements, row t at x + rows[t] * K, rows null: row t) into codes
// [T_pad][Kc] e4m3 (columns [K, Kc) zero: a padded weight's) and one scale
// per (row, group of `group` columns: 128, or K for per token). Rows [T,
// T_pad) are the GEMM's padding: codes 0, scale 0. K % 4 == 0, Kc % 16 ==
// 0, K <= Kc < K + 16; x and codes 16-byte aligned.
void quantize_rows_e4m3(const void* x, bool x_f32, const int32_t* rows, int64_t T, int64_t T_pad, int64_t K,
                        int64_t Kc, int64_t group, uint8_t* codes, W8a8ScaleOut s, cudaStream_t stream);
// The down projection's quantization fused into the MLP's gated activation
// (CudaBackend::linear_gated_act_linear): the codes and scales that
// gated_act_bf16_in(act, gate, up, in_stride, T, K, out, out_bf16) followed
// by quantize_rows_e4m3(out, !out_bf16, nullptr, T, T_pad, K, Kc, group,
// codes, s) write, bit for bit, without writing out: each element is
// act(gate) * up in gated_act's f32 math (act.cuh), rounded to bf16 (RNE)
// when out_bf16, then quantized by the same kernels as quantize_rows_e4m3
// (group 128 or K: per 1x128 group or per token). gate / up: bf16 rows
// in_stride elements apart (in_stride % 4 == 0, >= K), 8-byte aligned; the
// other rules as quantize_rows_e4m3.
void gated_act_quantize_e4m3(Activation act, const uint16_t* gate, const uint16_t* up, int64_t in_stride,
                             bool out_bf16, int64_t T, int64_t T_pad, int64_t K, int64_t Kc, int64_t group,
                             uint8_t* codes, W8a8ScaleOut s, cudaStream_t stream);
// y[t][n] = (accumulate ? y + s : s)[t][n] (+ bias[n]) for rows of [rows][N]
// (fp32 adds in that order; a plain copy without bias and accumulate).
void w8a8_finish_rows(const float* s, int64_t rows, int64_t N, const float* bias, float* y, bool accumulate,
                      cudaStream_t stream);

// ---- norms ----------------------------------------------------------------

// Per row r of [rows][n]:
//   if delta:   d = delta[r], and if delta_w: d = rmsnorm(d) * delta_w (Gemma 3's
//               post-attention / post-ffn norm); h[r] += d (fp32, in place)
//   out[r] = rmsnorm(h[r]) * w   (w already holds 1 + w for Gemma norms)
// rmsnorm(x) = x * (1 / sqrt(mean(x^2) + eps)), as rmsnorm_cpu. out is bf16
// (out_bf16) or fp32 and may alias h; without delta, h is only read.
void rmsnorm_residual(float* h, const float* delta, const float* delta_w, const float* w, float eps, int64_t rows,
                      int n, void* out, bool out_bf16, cudaStream_t stream);

// rmsnorm_residual(h, delta, nullptr, w, eps, rows, n, out, out_bf16)
// followed by quantize_rows_e4m3(out, !out_bf16, nullptr, rows, rows, n, n,
// group, codes, s), bit for bit (h, codes, scales), without writing out:
// the W8A8 GEMM's input written by the norm in front of it
// (CudaBackend::add_rmsnorm_for). n % 16 == 0 (codes rows of n bytes), n <=
// 8192; group 128 (n % 128 == 0) or n; no padding rows (s.n_main == rows);
// codes 16-byte aligned.
void rmsnorm_residual_e4m3(float* h, const float* delta, const float* w, float eps, int64_t rows, int n,
                           bool out_bf16, int64_t group, uint8_t* codes, W8a8ScaleOut s, cudaStream_t stream);

// out[i] = bf16(rmsnorm(h[row_index[i]]) * w) for i < num_rows (row_index
// null: row i). For the final norm of the rows whose logits are needed.
void rmsnorm_rows(const float* h, const int32_t* row_index, int num_rows, const float* w, float eps, int n,
                  uint16_t* out, cudaStream_t stream);

// ---- attention input: per-head norm + RoPE ---------------------------------

// Per token t: q[t] = rope(qnorm(q_in[t])), k[t] = rope(knorm(k_in[t])),
// v[t] = v_in[t] (copy), outputs contiguous [T][heads][D] fp32. Inputs may be
// rows of a fused QKV GEMM output (row strides in elements). Norm weights
// null: no norm. inv_freq null: no rope. Rope matches rope_cpu fed the table
// of RopeTable::fill: f = inv_freq[i] * pos (fp32), cos/sin in double, times
// attention_factor, rotate_half over the first rot_dim dims.
struct QkvPrepArgs {
  int T = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  const float* q_in = nullptr;
  const float* k_in = nullptr;
  const float* v_in = nullptr;  // null: no v copy
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  // q head h of a row starts at q_in + h * q_head_stride (0: head_dim). A
  // gated q projection (Qwen3.5) interleaves each head's query and output
  // gate: q_head_stride = 2 * head_dim.
  int64_t q_head_stride = 0;
  const float* q_norm_w = nullptr;  // [head_dim]
  const float* k_norm_w = nullptr;  // [head_dim]
  float eps = 1e-6f;
  const int32_t* positions = nullptr;  // [T]
  const float* inv_freq = nullptr;     // [rot_dim / 2]
  int rot_dim = 0;
  float attention_factor = 1.0f;
  float* q_out = nullptr;  // [T][num_q_heads][head_dim]
  float* k_out = nullptr;  // [T][num_kv_heads][head_dim]
  float* v_out = nullptr;  // [T][num_kv_heads][head_dim]
  // Optional store fused in (kv_cache non-null): k and v rows go straight to
  // the paged cache, the same bytes store_kv writes (kv_quant.cuh), instead
  // of k_out / v_out (then unused, may be null). Slot < 0 or >= capacity:
  // not stored. docs/cuda_backend.md "Ops (`ops/ops.h`)".
  struct FusedStore {
    void* k_cache = nullptr;  // [capacity][num_kv_heads][head_dim], dtype
    void* v_cache = nullptr;
    KvDtype dtype = KvDtype::bf16;
    const int64_t* slots = nullptr;  // [T]
    int64_t capacity = 0;            // num_blocks * block_size
    const float* k_scale = nullptr;  // fp8: 1 or num_kv_heads values
    const float* v_scale = nullptr;
    int k_scale_count = 1, v_scale_count = 1;
    unsigned long long* clips = nullptr;  // [2]: K, V clipped (as StoreKvArgs::clips); null: not counted
  } store;
};
void qkv_prep(const QkvPrepArgs& args, cudaStream_t stream);
// ---- MLP, embedding, logits -------------------------------------------------

// out[r][i] = act(gate[r][i]) * up[r][i] for r < rows, i < n (out bf16 or
// fp32, row stride n; may alias gate when in_stride == n); gate/up rows are
// in_stride elements apart (a fused gate|up GEMM output: gate = base,
// up = base + n, in_stride = 2n).
void gated_act(Activation act, const float* gate, const float* up, int64_t in_stride, int64_t rows, int64_t n,
               void* out, bool out_bf16, cudaStream_t stream);
// gated_act with bf16 gate / up (the prefill gate|up GEMM's bf16 output).
void gated_act_bf16_in(Activation act, const uint16_t* gate, const uint16_t* up, int64_t in_stride, int64_t rows,
                       int64_t n, void* out, bool out_bf16, cudaStream_t stream);

// dst[i] = bf16(src[row_index[i]]) (RNE) for i < rows (row_index null: row i);
// rows of `cols` elements. The GEMM input of fp32 activations.
void to_bf16_rows(const float* src, const int32_t* row_index, int64_t rows, int64_t cols, uint16_t* dst,
                  cudaStream_t stream);

// x[i] += y[i] (fp32).
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);

// out[t] = E[ids[t]] * scale (fp32). ids must be valid (checked on the host).
void embedding(const DeviceMatrix& E, const int32_t* ids, int T, float scale, float* out, cudaStream_t stream);

// x = tanh(x / cap) * cap, elementwise (final logit softcapping).
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// Per row r of logits [rows][V]: argmax[r] (ties -> lowest id; -1 when the row
// holds a NaN) and, when ids is given, logprob[r] = log_softmax(row)[ids[r]]
// (max-shifted, exp in fp32, sum in double).
void row_logprob_argmax(const float* logits, int rows, int V, const int32_t* ids, float* logprob, int32_t* argmax,
                        cudaStream_t stream);

// ---- sampling ---------------------------------------------------------------

// Per-row sampling parameters (device array, one per row).
struct SampleParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax, ties -> lowest id)
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0: off
  uint64_t seed = 0;
  uint64_t counter = 0;      // per-request draw index (e.g. tokens generated so far)
};

// out_ids[r] = token sampled from row r of logits [rows][V]: the softmax of
// logits / temperature restricted to the top_k largest (ties -> lower ids
// first) and then to the smallest prefix (descending probability, ties ->
// lower ids) whose mass reaches top_p, drawn with a uniform derived from
// (seed, counter) only. Probability masses are 2^-40 fixed point, summed as
// integers, so the draw is deterministic. -1: the row holds a NaN or no
// finite logit.
void sample_rows(const float* logits, int rows, int V, const SampleParams* params, int32_t* out_ids,
                 cudaStream_t stream);

// The uniform in [0, 1) that sample_rows draws for (seed, counter), for tests.
double sample_uniform(uint64_t seed, uint64_t counter);

}  // namespace fp8kv::cuda
