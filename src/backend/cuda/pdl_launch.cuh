// One kernel launch, with or without programmatic dependent launch (PDL):
// with `pdl`, the kernel may be scheduled while the previous kernel in the
// stream still runs (cudaLaunchAttributeProgrammaticStreamSerialization), and
// must execute griddepcontrol.wait before it reads what that kernel wrote.
// Stream capture into CUDA graphs keeps the attribute (CUDA >= 12.3). Shared
// by the forward ops (ops_launch.cuh's launch_pdl) and the decode attention
// kernels; returns the launch's status for the caller's own check macro.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace fp8kv::cuda {

template <typename... KArgs, typename... Args>
cudaError_t launch_maybe_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, stream>>>(args...);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace fp8kv::cuda
