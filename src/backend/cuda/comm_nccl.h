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
//
// CHANGE LOG (additive only):
//   2026-11-30  first version.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/comm.h"

namespace fp8kv {

// One process, ncclCommInitAll over `devices` (CUDA ordinals, distinct).
// Communicator i belongs to devices[i] (rank i) and is used from one thread
// per device; its collectives must be called with that device current.
// All collectives of one step must be issued by every rank (from its own
// thread) in the same order.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int> devices);

// One process per GPU: rank 0 creates the ncclUniqueId and serves it over a
// TCP rendezvous on master_port (plain POSIX sockets); the other ranks
// connect to master_addr:master_port. Every step is bounded by a timeout
// (FP8KV_COMM_TIMEOUT_S, default 60 s): a bad address/port or a missing
// peer gives std::runtime_error naming the address and the step, not a hang.
std::unique_ptr<Communicator> make_nccl_communicator_tcp(int rank, int world, int device,
                                                         const std::string& master_addr, int master_port);

// True when this build has NCCL (the factories above can work).
bool nccl_available();

}  // namespace fp8kv
