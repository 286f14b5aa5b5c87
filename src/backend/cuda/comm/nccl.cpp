// NCCL communicators with the one-shot peer-memory all-reduce for small
// messages (comm_nccl.h, docs/comm.md, docs/design.md "Collectives").
#include "backend/cuda/comm/nccl.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include "backend/common/comm_timeout.h"
#include "backend/common/tcp_rendezvous.h"
#include "backend/cuda/check.h"
#include "backend/cuda/comm/oneshot.h"

#ifdef FP8KV_HAVE_NCCL
#include <nccl.h>
#endif

namespace fp8kv {

// NVLink multicast (NVLS) must stay off on these machines (docs/design.md,
// "Collectives"): set before any NCCL call, overriding the environment.
void comm_force_nvls_off() { ::setenv("NCCL_NVLS_ENABLE", "0", 1); }

#ifndef FP8KV_HAVE_NCCL

bool nccl_available() { return false; }
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int>, const NcclCommOptions&) {
  throw std::runtime_error("make_nccl_communicators: fp8kv was built without NCCL (nccl.h/libnccl not found at configure time)");
}
std::unique_ptr<Communicator> make_nccl_communicator_tcp(int, int, int, const std::string&, int, const NcclCommOptions&) {
  throw std::runtime_error("make_nccl_communicator_tcp: fp8kv was built without NCCL (nccl.h/libnccl not found at configure time)");
}

#else

namespace {

[[noreturn]] void throw_nccl(const char* call, const char* file, int line, ncclResult_t r) {
  std::string msg = std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(nullptr); last && *last) msg += std::string(" (") + last + ")";
  throw std::runtime_error(msg);
}

#define FP8KV_NCCL(call)                                                        \
  do {                                                                          \
    const ncclResult_t r_ = (call);                                             \
    if (r_ != ncclSuccess) throw_nccl(#call, __FILE__, __LINE__, r_);           \
  } while (0)

ncclDataType_t nccl_type(ScalarType d, const char* what) {
  switch (d) {
    case ScalarType::f32: return ncclFloat32;
    case ScalarType::bf16: return ncclBfloat16;
    case ScalarType::f16: return ncclFloat16;
    case ScalarType::i32: return ncclInt32;
    case ScalarType::i64: return ncclInt64;
    case ScalarType::u8: return ncclUint8;
  }
  throw std::runtime_error(std::string(what) + ": unsupported dtype");
}

NcclCommOptions resolve(NcclCommOptions o) {
  if (o.oneshot_capacity_bytes < o.oneshot_max_bytes) o.oneshot_capacity_bytes = o.oneshot_max_bytes;
  return o;
}

// Identifies the host (so CUDA IPC is only tried between processes of one host).
std::string host_id() {
  char h[256] = {};
  ::gethostname(h, sizeof(h) - 1);
  std::string id = h;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  if (f >> boot) id += "/" + boot;
  return id;
}

class NcclCommunicator final : public CudaCommunicator {
 public:
  NcclCommunicator(int rank, int world, int device, ncclComm_t comm, size_t oneshot_max)
      : rank_(rank), world_(world), device_(device), comm_(comm), oneshot_max_(oneshot_max) {}
  // Every rank's GPU work is finished before anything is freed: a peer may
  // still be reading this rank's buffers (one-shot or NCCL peer copies).
  // One process: synchronise every device of the group. One process per GPU:
  // a last rendezvous exchange (bounded by the timeout; a dead peer closes
  // its socket, which ends the wait at once).
  ~NcclCommunicator() override {
    for (int d : sync_devices_) {
      cudaSetDevice(d);
      cudaDeviceSynchronize();
    }
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
    if (rdv_) {
      try {
        rdv_->all_gather(std::string(), "shutdown");
      } catch (const std::exception&) {
        // a peer that is gone cannot be reading our buffers any more
      }
    }
    for (void* p : ipc_opened_) cudaIpcCloseMemHandle(p);
    oneshot_.reset();
    if (comm_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int device() const override { return device_; }
  bool oneshot_enabled() const override { return oneshot_ && oneshot_->ready(); }
  std::string oneshot_status() const override { return status_; }
  size_t oneshot_max_bytes() const override { return oneshot_enabled() ? oneshot_max_ : 0; }
  size_t oneshot_capacity_bytes() const override { return oneshot_ ? oneshot_->capacity_bytes() : 0; }

  void all_reduce_sum(void* data, size_t count, ScalarType dtype, void* stream) override {
    all_reduce_sum_algo(AllReduceAlgo::automatic, data, count, dtype, stream);
  }

  void all_reduce_sum_algo(AllReduceAlgo algo, void* data, size_t count, ScalarType dtype, void* stream) override {
    if (dtype != ScalarType::f32 && dtype != ScalarType::bf16)
      throw std::runtime_error(std::string("all_reduce_sum: dtype ") + scalar_type_name(dtype) + " not supported (f32, bf16)");
    FP8KV_CU(cudaSetDevice(device_));
    const size_t bytes = count * scalar_type_bytes(dtype);
    if (algo == AllReduceAlgo::automatic)
      algo = (oneshot_enabled() && bytes <= oneshot_max_ && oneshot_->fits(count, dtype)) ? AllReduceAlgo::oneshot
                                                                                          : AllReduceAlgo::nccl;
    if (count == 0) return;
    if (algo == AllReduceAlgo::oneshot) {
      if (!oneshot_enabled()) throw std::runtime_error("all_reduce_sum: one-shot path unavailable: " + status_);
      oneshot_->all_reduce_sum(data, count, dtype, static_cast<cudaStream_t>(stream));
      return;
    }
    FP8KV_NCCL(ncclAllReduce(data, data, count, nccl_type(dtype, "all_reduce_sum"), ncclSum, comm_,
                             static_cast<cudaStream_t>(stream)));
  }

  void all_gather(const void* send, void* recv, size_t count, ScalarType dtype, void* stream) override {
    FP8KV_CU(cudaSetDevice(device_));
    if (count == 0) return;
    FP8KV_NCCL(ncclAllGather(send, recv, count, nccl_type(dtype, "all_gather"), comm_, static_cast<cudaStream_t>(stream)));
  }

  // Set-up helpers used by the factories.
  void make_oneshot(size_t capacity) {
    FP8KV_CU(cudaSetDevice(device_));
    oneshot_ = std::make_unique<comm::OneShotAllReduce>(rank_, world_, capacity);
  }
  comm::OneShotAllReduce* oneshot() { return oneshot_.get(); }
  void set_status(std::string s) { status_ = std::move(s); }
  void disable_oneshot(std::string why) {
    oneshot_.reset();
    status_ = std::move(why);
  }
  std::vector<void*> ipc_opened_;
  std::vector<int> sync_devices_;
  std::unique_ptr<comm::TcpRendezvous> rdv_;

 private:
  int rank_, world_, device_;
  ncclComm_t comm_;
  size_t oneshot_max_;
  std::unique_ptr<comm::OneShotAllReduce> oneshot_;
  std::string status_ = "not set up";
};

}  // namespace

bool nccl_available() { return true; }

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int> devices,
                                                                   const NcclCommOptions& options_in) {
  comm_force_nvls_off();  // first, whatever fails below
  const NcclCommOptions opt = resolve(options_in);
  const int n = static_cast<int>(devices.size());
  int caller_device = 0;
  FP8KV_CU(cudaGetDevice(&caller_device));
  struct RestoreDevice {
    int d;
    ~RestoreDevice() { cudaSetDevice(d); }
  } restore{caller_device};
  if (n < 1) throw std::runtime_error("make_nccl_communicators: no devices");
  int have = 0;
  FP8KV_CU(cudaGetDeviceCount(&have));
  for (int i = 0; i < n; ++i) {
    if (devices[i] < 0 || devices[i] >= have)
      throw std::runtime_error("make_nccl_communicators: device " + std::to_string(devices[i]) + " out of range (" +
                               std::to_string(have) + " CUDA devices)");
    for (int j = 0; j < i; ++j)
      if (devices[i] == devices[j])
        throw std::runtime_error("make_nccl_communicators: device " + std::to_string(devices[i]) + " listed twice");
  }
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  FP8KV_NCCL(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  std::vector<NcclCommunicator*> raw;
  for (int i = 0; i < n; ++i) {
    auto c = std::make_unique<NcclCommunicator>(i, n, devices[i], comms[static_cast<size_t>(i)], opt.oneshot_max_bytes);
    c->sync_devices_.assign(devices.begin(), devices.end());
    raw.push_back(c.get());
    out.push_back(std::move(c));
  }
  // One-shot path: peer access between every pair, plain device pointers.
  if (opt.oneshot_max_bytes == 0) {
    for (auto* c : raw) c->set_status("off (oneshot_max_bytes = 0)");
    return out;
  }
  if (n == 1) {
    raw[0]->make_oneshot(opt.oneshot_capacity_bytes);
    raw[0]->oneshot()->set_peer_bases({raw[0]->oneshot()->local_base()});
    raw[0]->set_status("on (world 1: no-op)");
    return out;
  }
  if (n > comm::kOneShotMaxWorld) {
    for (auto* c : raw) c->set_status("off (world > " + std::to_string(comm::kOneShotMaxWorld) + ")");
    return out;
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      int can = 0;
      FP8KV_CU(cudaDeviceCanAccessPeer(&can, devices[i], devices[j]));
      if (!can) {
        for (auto* c : raw)
          c->set_status("off (no peer access from device " + std::to_string(devices[i]) + " to " + std::to_string(devices[j]) + ")");
        return out;
      }
    }
  for (int i = 0; i < n; ++i) {
    FP8KV_CU(cudaSetDevice(devices[i]));
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[j], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        continue;
      }
      FP8KV_CU(e);
    }
  }
  std::vector<void*> bases;
  for (auto* c : raw) {
    c->make_oneshot(opt.oneshot_capacity_bytes);
    bases.push_back(c->oneshot()->local_base());
  }
  for (auto* c : raw) {
    c->oneshot()->set_peer_bases(bases);
    c->set_status("on (peer access, single process)");
  }
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator_tcp(int rank, int world, int device,
                                                         const std::string& master_addr, int master_port,
                                                         const NcclCommOptions& options_in) {
  comm_force_nvls_off();  // first, whatever fails below
  const NcclCommOptions opt = resolve(options_in);
  // The rendezvous comes first (no CUDA needed): a bad address or a missing
  // peer fails within the timeout whatever the GPU state.
  auto rdv_owned = std::make_unique<comm::TcpRendezvous>(rank, world, master_addr, master_port, comm_timeout());
  comm::TcpRendezvous& rdv = *rdv_owned;
  // Local set-up, then one exchange: 'E' + error or 'K' (+ the NCCL id from
  // rank 0). A rank that fails here makes every rank throw its message
  // instead of leaving the others waiting inside ncclCommInitRank.
  ncclUniqueId id{};
  std::string setup;
  try {
    int have = 0;
    FP8KV_CU(cudaGetDeviceCount(&have));
    if (device < 0 || device >= have)
      throw std::runtime_error("device " + std::to_string(device) + " out of range (" + std::to_string(have) + " CUDA devices)");
    FP8KV_CU(cudaSetDevice(device));
    if (rank == 0) FP8KV_NCCL(ncclGetUniqueId(&id));
    setup.assign(1, 'K');
    if (rank == 0) setup.append(reinterpret_cast<const char*>(&id), sizeof(id));
  } catch (const std::exception& e) {
    setup.assign(1, 'E');
    setup.append(e.what());
  }
  const auto ids = rdv.all_gather(setup, "nccl unique id");
  for (int p = 0; p < world; ++p) {
    const std::string& s = ids[static_cast<size_t>(p)];
    if (s.empty() || s[0] != 'K')
      throw std::runtime_error("make_nccl_communicator_tcp: rank " + std::to_string(p) + " of " + std::to_string(world) +
                               " failed to set up: " + (s.empty() ? std::string("(no message)") : s.substr(1)));
  }
  if (ids[0].size() != 1 + sizeof(id)) throw std::runtime_error("make_nccl_communicator_tcp: rank 0 sent a malformed NCCL unique id");
  std::memcpy(&id, ids[0].data() + 1, sizeof(id));
  ncclComm_t comm = nullptr;
  FP8KV_NCCL(ncclCommInitRank(&comm, world, id, rank));
  auto c = std::make_unique<NcclCommunicator>(rank, world, device, comm, opt.oneshot_max_bytes);
  c->rdv_ = std::move(rdv_owned);  // kept for the shutdown exchange

  // One-shot path over CUDA IPC, only when every rank is on this host and
  // every rank opened every peer's handle (all ranks agree, else all use NCCL).
  // Every rank takes part in both exchanges whatever its own settings, and the
  // thresholds must match (a mismatch would send one rank to NCCL and its peer
  // to the one-shot kernel).
  const bool want = opt.oneshot_max_bytes > 0 && world <= comm::kOneShotMaxWorld;
  if (want) c->make_oneshot(opt.oneshot_capacity_bytes);
  cudaIpcMemHandle_t h{};
  if (want) FP8KV_CU(cudaIpcGetMemHandle(&h, c->oneshot()->local_base()));
  const std::string my_host = host_id();
  // "max_bytes capacity\n" host "\n" handle bytes
  std::string mine = std::to_string(opt.oneshot_max_bytes) + " " + std::to_string(opt.oneshot_capacity_bytes) + "\n" + my_host + "\n";
  if (want) mine.append(reinterpret_cast<const char*>(&h), sizeof(h));
  const auto all = rdv.all_gather(mine, "one-shot ipc handles");
  const std::string my_cfg = mine.substr(0, mine.find('\n'));
  std::string why;
  if (!want) why = opt.oneshot_max_bytes == 0 ? "oneshot_max_bytes = 0" : "world > " + std::to_string(comm::kOneShotMaxWorld);
  std::vector<void*> bases(static_cast<size_t>(world), nullptr);
  if (want) bases[static_cast<size_t>(rank)] = c->oneshot()->local_base();
  for (int p = 0; p < world; ++p) {
    const std::string& s = all[static_cast<size_t>(p)];
    const size_t nl1 = s.find('\n');
    const size_t nl2 = nl1 == std::string::npos ? nl1 : s.find('\n', nl1 + 1);
    if (nl2 == std::string::npos) throw std::runtime_error("make_nccl_communicator_tcp: malformed one-shot message from rank " + std::to_string(p));
    if (s.substr(0, nl1) != my_cfg)
      throw std::runtime_error("make_nccl_communicator_tcp: rank " + std::to_string(p) + " has one-shot settings '" + s.substr(0, nl1) +
                               "' (max_bytes capacity), rank " + std::to_string(rank) + " has '" + my_cfg +
                               "': pass the same NcclCommOptions on every rank");
    if (!why.empty() || p == rank) continue;
    if (s.substr(nl1 + 1, nl2 - nl1 - 1) != my_host) {
      why = "rank " + std::to_string(p) + " is on another host";
      continue;
    }
    if (s.size() != nl2 + 1 + sizeof(h)) {
      why = "rank " + std::to_string(p) + " sent no IPC handle";
      continue;
    }
    cudaIpcMemHandle_t ph{};
    std::memcpy(&ph, s.data() + nl2 + 1, sizeof(h));
    void* ptr = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&ptr, ph, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      why = std::string("cudaIpcOpenMemHandle of rank ") + std::to_string(p) + ": " + cudaGetErrorString(e);
      continue;
    }
    c->ipc_opened_.push_back(ptr);
    bases[static_cast<size_t>(p)] = ptr;
  }
  const auto verdicts = rdv.all_gather(why, "one-shot agreement");
  for (int p = 0; p < world && why.empty(); ++p)
    if (!verdicts[static_cast<size_t>(p)].empty()) why = "rank " + std::to_string(p) + ": " + verdicts[static_cast<size_t>(p)];
  if (!why.empty()) {
    for (void* ptr : c->ipc_opened_) cudaIpcCloseMemHandle(ptr);
    c->ipc_opened_.clear();
    c->disable_oneshot("off (" + why + ")");
    return c;
  }
  c->oneshot()->set_peer_bases(bases);
  c->set_status("on (CUDA IPC, one process per GPU)");
  return c;
}

#endif  // FP8KV_HAVE_NCCL

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int> devices) {
  return make_nccl_communicators(devices, NcclCommOptions{});
}
std::unique_ptr<Communicator> make_nccl_communicator_tcp(int rank, int world, int device, const std::string& master_addr,
                                                         int master_port) {
  return make_nccl_communicator_tcp(rank, world, device, master_addr, master_port, NcclCommOptions{});
}

}  // namespace fp8kv
