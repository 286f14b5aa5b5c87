// Runs on the GPU machine: converts every input of tools/fp8_golden_inputs.h
// with CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3 / __NV_E5M2)
// and writes tests/golden/numerics/fp8_cuda_satfinite.bin:
//   "FP8G" magic, uint32 count, then count bytes e4m3, then count bytes e5m2.
// Build+run: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Itools
//   tools/gen_fp8_golden.cu -o /tmp/gen_fp8_golden && /tmp/gen_fp8_golden OUT.bin
#include <cuda_fp8.h>
#include <cstdio>
#include <vector>

#include "fp8_golden_inputs.h"

__global__ void cvt(const float* x, unsigned char* e4, unsigned char* e5, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    e4[i] = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3);
    e5[i] = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E5M2);
  }
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char** argv) {
  if (argc != 2) { std::fprintf(stderr, "usage: %s OUT.bin\n", argv[0]); return 2; }
  std::vector<float> in = fp8golden::inputs();
  const int n = static_cast<int>(in.size());
  float* dx; unsigned char *d4, *d5;
  CK(cudaMalloc(&dx, n * sizeof(float)));
  CK(cudaMalloc(&d4, n));
  CK(cudaMalloc(&d5, n));
  CK(cudaMemcpy(dx, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cvt<<<(n + 255) / 256, 256>>>(dx, d4, d5, n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned char> h4(n), h5(n);
  CK(cudaMemcpy(h4.data(), d4, n, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h5.data(), d5, n, cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(argv[1], "wb");
  if (!f) { std::perror(argv[1]); return 1; }
  const unsigned count = static_cast<unsigned>(n);
  std::fwrite("FP8G", 1, 4, f);
  std::fwrite(&count, 4, 1, f);
  std::fwrite(h4.data(), 1, n, f);
  std::fwrite(h5.data(), 1, n, f);
  std::fclose(f);
  std::printf("fp8 golden: %d values written to %s\n", n, argv[1]);
  return 0;
}
