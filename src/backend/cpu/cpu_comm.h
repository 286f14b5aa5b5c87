// The CPU simulation of tensor-parallel collectives (backend/comm.h): the
// ranks are threads of one process sharing one rendezvous. all_reduce_sum
// adds the ranks' buffers in rank order (rank 0 + rank 1 + ...), in fp32, so
// every rank gets bitwise the same result and the result does not depend on
// thread timing; all_gather concatenates in rank order. Waiting is a
// condition-variable barrier (no busy spin: 2-core CI runs 4 ranks).
//
// Every rank must call the same collectives in the same order (the forward
// pass is one graph). abort() (any rank, e.g. from an exception handler)
// wakes every waiting rank with std::runtime_error, so a failing rank never
// leaves the others blocked; the communicators stay unusable afterwards.
#pragma once
#include <memory>
#include <vector>

#include "backend/comm.h"

namespace fp8kv {

class CpuCommunicator;

// `world` communicators (rank i at index i) sharing one rendezvous. world >= 1.
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int world);

// Wakes every rank waiting in a collective of `comm`'s group with an error
// (no-op for a non-CPU communicator).
void abort_cpu_communicators(Communicator& comm);

}  // namespace fp8kv
