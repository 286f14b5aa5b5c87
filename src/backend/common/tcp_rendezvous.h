// TCP rendezvous for one process per rank (docs/comm.md), shared by the CPU
// and CUDA backends and the engine's control channel: rank 0 listens on
// master_port, ranks 1..world-1 connect to master_addr:master_port (retrying
// until the deadline, so start order does not matter). Afterwards
// all_gather() exchanges small byte strings through rank 0 (the NCCL unique
// id, the one-shot all-reduce's CUDA IPC handles). Plain POSIX sockets; every
// wait is bounded by the timeout and a failure throws std::runtime_error
// naming the address, the rank and the step. No CUDA here. The usual
// timeout is fp8kv::comm_timeout() (backend/common/comm_timeout.h).
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace fp8kv::comm {

class TcpRendezvous {
 public:
  // Connects (rank > 0) or accepts world - 1 peers (rank 0) before returning.
  TcpRendezvous(int rank, int world, const std::string& master_addr, int master_port,
                std::chrono::milliseconds timeout);
  ~TcpRendezvous();
  TcpRendezvous(const TcpRendezvous&) = delete;
  TcpRendezvous& operator=(const TcpRendezvous&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  // Every rank passes its bytes (any length up to 1 GiB in all); every rank
  // gets all ranks' bytes, indexed by rank. `what` names the step in errors.
  // A peer that closes its socket (a dead process) fails the call at once,
  // one silent past the timeout fails it then: both throw RankFailure
  // (backend/common/rank_failure.h) naming the peer and `what`.
  std::vector<std::string> all_gather(const std::string& mine, const char* what);
  // The same with its own bound.
  std::vector<std::string> all_gather(const std::string& mine, const char* what, std::chrono::milliseconds timeout);
  const std::string& master() const { return where_; }

 private:
  int rank_, world_;
  std::string where_;  // "host:port", for errors
  std::chrono::milliseconds timeout_;
  int listen_fd_ = -1;
  std::vector<int> peer_fd_;  // rank 0: fd of rank r (index r); others: [0] = rank 0
};

}  // namespace fp8kv::comm
