// One-shot peer-memory all-reduce (comm_oneshot.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "backend/common/comm_timeout.h"
#include "backend/cuda/check.h"
#include "backend/cuda/comm/oneshot.h"

namespace fp8kv::comm {
namespace {

constexpr int kThreads = 512;
constexpr int kBlocks = 64;
// Layout of one rank's allocation: flags [kBlocks][kOneShotMaxWorld] u32 (written
// by peers), counters [kBlocks] u32 (own), then 2 data halves of `capacity`.
constexpr size_t kFlagsOff = 0;
constexpr size_t kCountersOff = 4096;
constexpr size_t kDataOff = 8192;
static_assert(kBlocks * kOneShotMaxWorld * 4 <= kCountersOff, "flags overflow");
static_assert(kCountersOff + kBlocks * 4 <= kDataOff, "counters overflow");

struct Args {
  char* base[kOneShotMaxWorld];  // every rank's allocation, mapped here
  void* data;
  size_t count;
  size_t capacity;
  int rank;
  int world;
  unsigned long long spin_timeout_ns;
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <class T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Chunk i (16 bytes of the message) belongs to block (i / kThreads) % kBlocks,
// thread i % kThreads, whatever the count: a buffer location is only ever
// touched by the same block, which is what makes the per-block barrier and the
// parity double buffer sufficient across calls.
template <class T>
__global__ void __launch_bounds__(kThreads) oneshot_kernel(Args a) {
  constexpr int kE = 16 / sizeof(T);
  const int b = blockIdx.x;
  __shared__ uint32_t s_seq;
  uint32_t* counters = reinterpret_cast<uint32_t*>(a.base[a.rank] + kCountersOff);
  if (threadIdx.x == 0) s_seq = counters[b] + 1;
  __syncthreads();
  const uint32_t seq = s_seq;
  const size_t half = (seq & 1u) ? a.capacity : 0;
  const size_t n_chunks = (a.count + kE - 1) / kE;
  const bool aligned = (reinterpret_cast<uintptr_t>(a.data) & 15u) == 0;
  T* data = static_cast<T*>(a.data);
  T* mine = reinterpret_cast<T*>(a.base[a.rank] + kDataOff + half);

  // 1. Copy in.
  for (size_t i = static_cast<size_t>(b) * kThreads + threadIdx.x; i < n_chunks; i += static_cast<size_t>(kBlocks) * kThreads) {
    const size_t e0 = i * kE;
    if (aligned && e0 + kE <= a.count) {
      reinterpret_cast<int4*>(mine)[i] = reinterpret_cast<const int4*>(data)[i];
    } else {
      for (size_t e = e0; e < e0 + kE && e < a.count; ++e) mine[e] = data[e];
    }
  }
  __syncthreads();
  // 2. Barrier with the same block of every rank.
  if (threadIdx.x < static_cast<unsigned>(a.world)) {
    const int p = static_cast<int>(threadIdx.x);
    uint32_t* peer_flags = reinterpret_cast<uint32_t*>(a.base[p] + kFlagsOff);
    st_release_sys(peer_flags + b * kOneShotMaxWorld + a.rank, seq);
    const uint32_t* my_flag = reinterpret_cast<const uint32_t*>(a.base[a.rank] + kFlagsOff) + b * kOneShotMaxWorld + p;
    const unsigned long long t0 = a.spin_timeout_ns ? globaltimer() : 0;
    unsigned spins = 0;
    while (static_cast<int32_t>(ld_acquire_sys(my_flag) - seq) < 0) {
      if (a.spin_timeout_ns && ++spins % 1024u == 0 && globaltimer() - t0 > a.spin_timeout_ns) {
        printf("fp8kv one-shot all-reduce: rank %d block %d timed out waiting for rank %d (seq %u)\n", a.rank, b, p, seq);
        __trap();
      }
    }
  }
  __syncthreads();
  // 3. Sum every rank's copy in rank order, fp32 accumulation.
  for (size_t i = static_cast<size_t>(b) * kThreads + threadIdx.x; i < n_chunks; i += static_cast<size_t>(kBlocks) * kThreads) {
    const size_t e0 = i * kE;
    if (e0 + kE <= a.count) {
      float acc[kE];
      for (int p = 0; p < a.world; ++p) {
        const int4 v = __ldcg(reinterpret_cast<const int4*>(a.base[p] + kDataOff + half) + i);
        const T* x = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int k = 0; k < kE; ++k) acc[k] = p == 0 ? to_f(x[k]) : acc[k] + to_f(x[k]);
      }
      if (aligned) {
        int4 o;
        T* y = reinterpret_cast<T*>(&o);
#pragma unroll
        for (int k = 0; k < kE; ++k) y[k] = from_f<T>(acc[k]);
        reinterpret_cast<int4*>(data)[i] = o;
      } else {
        for (int k = 0; k < kE; ++k) data[e0 + k] = from_f<T>(acc[k]);
      }
    } else {
      for (size_t e = e0; e < a.count; ++e) {
        float acc = 0.f;
        for (int p = 0; p < a.world; ++p) {
          const T x = reinterpret_cast<const T*>(a.base[p] + kDataOff + half)[e];
          acc = p == 0 ? to_f(x) : acc + to_f(x);
        }
        data[e] = from_f<T>(acc);
      }
    }
  }
  if (threadIdx.x == 0) counters[b] = seq;
}

}  // namespace

OneShotAllReduce::OneShotAllReduce(int rank, int world, size_t capacity_bytes)
    : rank_(rank), world_(world), capacity_((capacity_bytes + 255) / 256 * 256) {
  if (world < 1 || world > kOneShotMaxWorld)
    throw std::runtime_error("one-shot all-reduce: world size " + std::to_string(world) + " outside 1.." +
                             std::to_string(kOneShotMaxWorld));
  if (rank < 0 || rank >= world) throw std::runtime_error("one-shot all-reduce: bad rank " + std::to_string(rank));
  const size_t bytes = kDataOff + 2 * capacity_;
  FP8KV_CU(cudaMalloc(&base_, bytes));
  FP8KV_CU(cudaMemset(base_, 0, kDataOff));
  FP8KV_CU(cudaDeviceSynchronize());
  // A peer that never arrives (mismatched collectives) traps the kernel
  // instead of spinning forever, after the one bound on every wait between
  // ranks (FP8KV_COMM_TIMEOUT_S, backend/common/comm_timeout.h).
  spin_timeout_ns_ = static_cast<unsigned long long>(comm_timeout_seconds() * 1e9);
}

OneShotAllReduce::~OneShotAllReduce() {
  if (base_) {
    cudaDeviceSynchronize();
    cudaFree(base_);
  }
}

void OneShotAllReduce::set_peer_bases(const std::vector<void*>& bases) {
  if (static_cast<int>(bases.size()) != world_ || bases[static_cast<size_t>(rank_)] != base_)
    throw std::runtime_error("one-shot all-reduce: set_peer_bases needs one base per rank, own base at index rank");
  peers_ = bases;
  ready_ = true;
}

bool OneShotAllReduce::fits(size_t count, ScalarType dtype) const {
  return (dtype == ScalarType::f32 || dtype == ScalarType::bf16) && count * scalar_type_bytes(dtype) <= capacity_;
}

void OneShotAllReduce::all_reduce_sum(void* data, size_t count, ScalarType dtype, cudaStream_t stream) {
  if (!ready_) throw std::runtime_error("one-shot all-reduce: peers not set");
  if (!fits(count, dtype))
    throw std::runtime_error("one-shot all-reduce: " + std::to_string(count) + " x " + scalar_type_name(dtype) +
                             " does not fit the " + std::to_string(capacity_) + "-byte buffer (f32/bf16 only)");
  if (count == 0 || world_ == 1) return;
  Args a{};
  for (int p = 0; p < world_; ++p) a.base[p] = static_cast<char*>(peers_[static_cast<size_t>(p)]);
  a.data = data;
  a.count = count;
  a.capacity = capacity_;
  a.rank = rank_;
  a.world = world_;
  a.spin_timeout_ns = spin_timeout_ns_;
  const size_t chunks = (count * scalar_type_bytes(dtype) + 15) / 16;
  const int grid = static_cast<int>(std::min<size_t>(kBlocks, (chunks + kThreads - 1) / kThreads));
  if (dtype == ScalarType::f32)
    oneshot_kernel<float><<<grid, kThreads, 0, stream>>>(a);
  else
    oneshot_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::comm
