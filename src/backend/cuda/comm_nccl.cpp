// Stub until the NCCL communicator lands (see comm_nccl.h).
#include "backend/cuda/comm_nccl.h"

#include <stdexcept>

namespace fp8kv {

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int>) {
  throw std::runtime_error("make_nccl_communicators: not implemented yet (branch comm)");
}
std::unique_ptr<Communicator> make_nccl_communicator_tcp(int, int, int, const std::string&, int) {
  throw std::runtime_error("make_nccl_communicator_tcp: not implemented yet (branch comm)");
}
bool nccl_available() { return false; }

}  // namespace fp8kv
