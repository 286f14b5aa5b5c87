// CUDA collectives for tensor parallelism (docs/design.md, "Collectives";
// docs/comm.md). Communicators over NCCL, with a one-shot peer-memory
// all-reduce for small messages (below comm_oneshot_max_bytes()).
//
// NVLink multicast (NVLS) is never used: every factory sets
// NCCL_NVLS_ENABLE=0 (overriding any other value) before NCCL initialises,
// and nothing here calls cuMulticastCreate.
//
// Built without NCCL (no nccl.h found by CMake), the factories throw
// std::runtime_error("... built without NCCL ...").
#pragma once
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/comm.h"

namespace fp8kv {

struct NcclCommOptions {
  // all_reduce_sum of at most this many bytes uses the one-shot peer-memory
  // all-reduce (when every rank can map every peer's buffer); larger ones use
  // NCCL. 0 = NCCL only. The engine keeps the default (measured on 2 H200s:
  // one-shot at least as fast as NCCL from 4 KiB to 16 MiB; docs/comm.md);
  // tests and bench_allreduce pass other values. Every rank must pass the
  // same value (the TCP factory checks).
  size_t oneshot_max_bytes = 256 * 1024;
  // Registered buffer per rank (2 x this, plus 8 KiB of flags); raised to
  // oneshot_max_bytes if smaller. The benchmark raises it to time larger sizes.
  size_t oneshot_capacity_bytes = 0;
};

enum class AllReduceAlgo { automatic, nccl, oneshot };

// What the factories return (a Communicator; tests and the benchmark
// dynamic_cast to pick an algorithm).
class CudaCommunicator : public Communicator {
 public:
  virtual int device() const = 0;
  // Same contract as all_reduce_sum with the algorithm forced (oneshot:
  // throws if unavailable or the message exceeds the buffer).
  virtual void all_reduce_sum_algo(AllReduceAlgo algo, void* data, size_t count, ScalarType dtype, void* stream) = 0;
  // True when the one-shot path is set up on every rank; otherwise why not.
  virtual bool oneshot_enabled() const = 0;
  virtual std::string oneshot_status() const = 0;
  virtual size_t oneshot_max_bytes() const = 0;
  virtual size_t oneshot_capacity_bytes() const = 0;
};

// One process, ncclCommInitAll over `devices` (CUDA ordinals, distinct).
// Communicator i belongs to devices[i] (rank i) and is used from one thread
// per device; its collectives make that device current on the calling thread.
// All collectives of one step must be issued by every rank (from its own
// thread) in the same order.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int> devices);
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int> devices,
                                                                   const NcclCommOptions& options);

// One process per GPU: rank 0 creates the ncclUniqueId and serves it over a
// TCP rendezvous on master_port (plain POSIX sockets); the other ranks
// connect to master_addr:master_port. Every step is bounded by a timeout
// (FP8KV_COMM_TIMEOUT_S, default 60 s): a bad address/port or a missing
// peer gives std::runtime_error naming the address and the step, not a hang.
std::unique_ptr<Communicator> make_nccl_communicator_tcp(int rank, int world, int device,
                                                         const std::string& master_addr, int master_port);
std::unique_ptr<Communicator> make_nccl_communicator_tcp(int rank, int world, int device,
                                                         const std::string& master_addr, int master_port,
                                                         const NcclCommOptions& options);

// Sets NCCL_NVLS_ENABLE=0, overriding any value (every factory calls it
// before NCCL initialises; call it yourself before any other NCCL use).
void comm_force_nvls_off();

// True when this build has NCCL (the factories above can work).
bool nccl_available();

}  // namespace fp8kv
