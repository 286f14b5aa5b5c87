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
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend/comm.h"

namespace fp8kv {

class CpuCommunicator;

// `world` communicators (rank i at index i) sharing one rendezvous. world >= 1.
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int world);

// One rank of a group of processes (multi-process tensor parallelism,
// docs/design.md, "Multi-process tensor parallelism"): rank 0 listens on
// master_port, the others connect to master_addr:master_port
// (backend/cpu/cpu_comm_tcp.h; start order does not matter). Every
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
