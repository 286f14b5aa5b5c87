// Collectives between tensor-parallel ranks (docs/design.md, "Tensor
// parallelism"). One Communicator per rank; every rank calls the same
// collectives in the same order. Implementations:
//   - CPU simulation (ranks are threads of one process; sums in rank order,
//     so results are identical on every rank and reproducible),
//   - CUDA: NCCL (ncclCommInitAll in one process, or one process per GPU
//     bootstrapped by a TCP rendezvous), with a one-shot peer-memory
//     all-reduce for small messages. NVLink multicast (NVLS) is never used.
//
// CHANGE LOG (additive only):
//   2026-11-30  first version.
//   2026-11-30  backend/cpu/cpu_comm.h: the CPU implementation (make_cpu_communicators).
#pragma once
#include <cstddef>

#include "backend/tensor.h"

namespace fp8kv {

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place: data[i] = sum over ranks of data[i], for `count` elements of
  // `dtype` (f32 or bf16). `data` is device memory on CUDA (ordered on
  // `stream`, a cudaStream_t; nullptr = the legacy default stream) and host
  // memory on the CPU (stream ignored). Every rank gets identical results.
  virtual void all_reduce_sum(void* data, size_t count, ScalarType dtype, void* stream) = 0;

  // recv[r * count + i] = rank r's send[i], for every rank r (recv holds
  // world_size * count elements). Same memory and stream rules.
  virtual void all_gather(const void* send, void* recv, size_t count, ScalarType dtype, void* stream) = 0;
};

}  // namespace fp8kv
