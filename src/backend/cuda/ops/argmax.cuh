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

// block_argmax's shared scratch (a kernel may overlay it with its other
// reductions' in a union).
template <int kThreads>
union ArgMaxTemp {
  typename cub::BlockReduce<ArgMax, kThreads>::TempStorage arg;
  typename cub::BlockReduce<int, kThreads>::TempStorage nan;
};

// The block's maximum and NaN flag (any thread's) into best_s / nan_s, which
// every thread may read on return.
template <int kThreads>
__device__ __forceinline__ void block_argmax(const ArgMax& best, int nan, ArgMaxTemp<kThreads>& tmp, ArgMax& best_s,
                                             int& nan_s) {
  const ArgMax b = cub::BlockReduce<ArgMax, kThreads>(tmp.arg).Reduce(best, ArgMaxOp());
  __syncthreads();
  const int any_nan = cub::BlockReduce<int, kThreads>(tmp.nan).Sum(nan);
  if (threadIdx.x == 0) {
    best_s = b;
    nan_s = any_nan;
  }
  __syncthreads();
}

}  // namespace fp8kv::cuda
