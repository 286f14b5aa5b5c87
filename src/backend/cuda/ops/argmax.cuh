// The (value, lowest id) maximum of a row of logits and its NaN check, as
// greedy decoding picks it: the row stats (misc.cu) and the sampler
// (sample.cu) share it.
#pragma once
#include <cub/block/block_reduce.cuh>

namespace fp8kv::cuda {

struct ArgMax {
  float v;
  int i;
};
struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.v > b.v || (a.v == b.v && a.i < b.i)) return a;
    return b;
  }
};

// The block's maximum and NaN flag (any thread's) into best_s / nan_s, which
// every thread may read on return.
template <int kThreads>
__device__ __forceinline__ void block_argmax(const ArgMax& best, int nan,
                                             typename cub::BlockReduce<ArgMax, kThreads>::TempStorage& arg_tmp,
                                             typename cub::BlockReduce<int, kThreads>::TempStorage& int_tmp,
                                             ArgMax& best_s, int& nan_s) {
  const ArgMax b = cub::BlockReduce<ArgMax, kThreads>(arg_tmp).Reduce(best, ArgMaxOp());
  __syncthreads();
  const int any_nan = cub::BlockReduce<int, kThreads>(int_tmp).Sum(nan);
  if (threadIdx.x == 0) {
    best_s = b;
    nan_s = any_nan;
  }
  __syncthreads();
}

}  // namespace fp8kv::cuda
