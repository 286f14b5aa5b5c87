// Programmatic dependent launch (PDL) for the forward ops (ops_*.cu): a
// kernel launched with launch_pdl may be scheduled while the previous kernel
// in the stream still runs, once that kernel has executed pdl_trigger() in
// every block (or finished). Every such kernel calls pdl_wait() before it
// reads anything an earlier kernel wrote: the wait returns when the previous
// grids have completed and their writes are visible (at once when the kernel
// was launched normally). A trigger is ignored when the next kernel is not
// PDL-launched (cuBLASLt, the store). docs/cuda_backend.md "GEMV for decode rows".
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/ops.h"
#include "backend/cuda/pdl_launch.cuh"

namespace fp8kv::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// The norm / RoPE / activation kernels are PDL-launched when Gemms route
// decode rows to the GEMV (kGemvDefaultRows > 0): the GEMV kernels trigger
// early, cuBLASLt does not, so without the GEMV PDL gains nothing there.
constexpr bool pdl_small_kernels() { return kGemvDefaultRows > 0; }

template <typename... KArgs, typename... Args>
void launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  FP8KV_CU(launch_maybe_pdl(pdl, kernel, grid, block, 0, stream, args...));
}

}  // namespace fp8kv::cuda
