// Collectives between tensor-parallel ranks (docs/design.md, "Tensor
// parallelism"). One Communicator per rank; every rank calls the same
// collectives in the same order. Implementations:
//   - CPU simulation (ranks are threads of one process; sums in rank order,
//     so results are identical on every rank and reproducible),
//   - CUDA: NCCL (ncclCommInitAll in one process, or one process per GPU
//     bootstrapped by a TCP rendezvous), with a one-shot peer-memory
//     all-reduce for small messages. NVLink multicast (NVLS) is never used.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

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

// ---- the CPU implementation (backend/cpu/cpu_comm.cpp) --------------------
// Ranks are threads of one process sharing one rendezvous. all_reduce_sum
// adds the ranks' buffers in rank order (rank 0 + rank 1 + ...), in fp32, so
// every rank gets bitwise the same result and the result does not depend on
// thread timing; all_gather concatenates in rank order. Waiting is a
// condition-variable barrier (no busy spin: 2-core CI runs 4 ranks).
// abort_cpu_communicators() (any rank, e.g. from an exception handler) wakes
// every waiting rank with std::runtime_error, so a failing rank never leaves
// the others blocked; the communicators stay unusable afterwards.

// `world` communicators (rank i at index i) sharing one rendezvous. world >= 1.
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int world);

// One rank of a group of processes (multi-process tensor parallelism,
// docs/design.md, "Multi-process tensor parallelism"): rank 0 listens on
// master_port, the others connect to master_addr:master_port
// (backend/common/tcp_rendezvous.h; start order does not matter). Every
// collective sends each rank's buffer to every rank (through rank 0) and
// each rank sums in rank order in fp32, exactly as the thread simulation
// does: world W as W processes == world W as W threads, bitwise. Each call
// is bounded by `timeout`; a dead peer fails it at once (closed socket).
// Throws std::runtime_error naming the address when the group cannot form.
std::unique_ptr<Communicator> make_cpu_socket_communicator(int rank, int world, const std::string& master_addr,
                                                           int master_port, std::chrono::milliseconds timeout);

// Wakes every rank waiting in a collective of `comm`'s group with an error
// (no-op for a non-CPU communicator).
void abort_cpu_communicators(Communicator& comm);

}  // namespace fp8kv
