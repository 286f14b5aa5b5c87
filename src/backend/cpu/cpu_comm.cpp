// The CPU collectives (backend/comm.h, "the CPU implementation").
#include "backend/comm.h"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "backend/common/tcp_rendezvous.h"
#include "numerics/fp8.h"

namespace fp8kv {

namespace {

// The rendezvous all ranks of one group share.
struct Rendezvous {
  explicit Rendezvous(int w) : world(w), ptrs(static_cast<size_t>(w), nullptr) {}
  const int world;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<const void*> ptrs;  // each rank's buffer of the current collective

  // A generational barrier: returns once all ranks arrived.
  void barrier() {
    std::unique_lock<std::mutex> lk(mu);
    if (aborted) throw std::runtime_error("CPU communicator aborted (another rank failed)");
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    if (aborted) throw std::runtime_error("CPU communicator aborted (another rank failed)");
  }
  void abort() {
    std::lock_guard<std::mutex> lk(mu);
    aborted = true;
    cv.notify_all();
  }
};

}  // namespace

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<Rendezvous> rv, int rank) : rv_(std::move(rv)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return rv_->world; }

  void all_reduce_sum(void* data, size_t count, ScalarType dtype, void* /*stream*/) override {
    if (dtype != ScalarType::f32 && dtype != ScalarType::bf16)
      throw std::invalid_argument(std::string("CpuCommunicator::all_reduce_sum: dtype ") + scalar_type_name(dtype) +
                                  " (f32 or bf16)");
    if (rv_->world == 1 || count == 0) return;
    rv_->ptrs[rank_] = data;
    rv_->barrier();
    // Every rank computes the whole sum in rank order (identical bits on
    // every rank), then writes its own buffer once all ranks have read.
    sum_.assign(count, 0.0f);
    for (int r = 0; r < rv_->world; ++r) {
      if (dtype == ScalarType::f32) {
        const float* p = static_cast<const float*>(rv_->ptrs[r]);
        for (size_t i = 0; i < count; ++i) sum_[i] += p[i];
      } else {
        const uint16_t* p = static_cast<const uint16_t*>(rv_->ptrs[r]);
        for (size_t i = 0; i < count; ++i) sum_[i] += bf16_to_f32(p[i]);
      }
    }
    rv_->barrier();
    if (dtype == ScalarType::f32) {
      std::memcpy(data, sum_.data(), count * sizeof(float));
    } else {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) p[i] = f32_to_bf16(sum_[i]);
    }
  }

  void all_gather(const void* send, void* recv, size_t count, ScalarType dtype, void* /*stream*/) override {
    const size_t bytes = count * scalar_type_bytes(dtype);
    if (rv_->world == 1) {
      if (bytes && recv != send) std::memmove(recv, send, bytes);
      return;
    }
    rv_->ptrs[rank_] = send;
    rv_->barrier();
    for (int r = 0; r < rv_->world; ++r)
      if (bytes) std::memcpy(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes, rv_->ptrs[r], bytes);
    rv_->barrier();  // no rank reuses its send buffer before every rank has copied it
  }

  void abort() { rv_->abort(); }

 private:
  std::shared_ptr<Rendezvous> rv_;
  int rank_;
  std::vector<float> sum_;
};

std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int world) {
  if (world < 1) throw std::invalid_argument("make_cpu_communicators: world must be >= 1");
  auto rv = std::make_shared<Rendezvous>(world);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<CpuCommunicator>(rv, r));
  return out;
}

namespace {

// Sums `count` elements of every rank's bytes in rank order (fp32), rounding
// once to the dtype: the thread simulation's arithmetic.
class CpuSocketCommunicator final : public Communicator {
 public:
  CpuSocketCommunicator(int rank, int world, const std::string& addr, int port, std::chrono::milliseconds timeout)
      : rv_(rank, world, addr, port, timeout) {}
  int rank() const override { return rv_.rank(); }
  int world_size() const override { return rv_.world(); }

  void all_reduce_sum(void* data, size_t count, ScalarType dtype, void* /*stream*/) override {
    if (dtype != ScalarType::f32 && dtype != ScalarType::bf16)
      throw std::invalid_argument(std::string("CpuSocketCommunicator::all_reduce_sum: dtype ") +
                                  scalar_type_name(dtype) + " (f32 or bf16)");
    if (rv_.world() == 1 || count == 0) return;
    const size_t bytes = count * scalar_type_bytes(dtype);
    const auto all = rv_.all_gather(std::string(static_cast<const char*>(data), bytes), "all_reduce");
    sum_.assign(count, 0.0f);
    for (const std::string& b : all) {
      if (b.size() != bytes) throw std::runtime_error("CPU socket communicator: ranks disagree on an all_reduce size");
      if (dtype == ScalarType::f32) {
        const float* p = reinterpret_cast<const float*>(b.data());
        for (size_t i = 0; i < count; ++i) sum_[i] += p[i];
      } else {
        const uint16_t* p = reinterpret_cast<const uint16_t*>(b.data());
        for (size_t i = 0; i < count; ++i) sum_[i] += bf16_to_f32(p[i]);
      }
    }
    if (dtype == ScalarType::f32) {
      std::memcpy(data, sum_.data(), bytes);
    } else {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) p[i] = f32_to_bf16(sum_[i]);
    }
  }

  void all_gather(const void* send, void* recv, size_t count, ScalarType dtype, void* /*stream*/) override {
    const size_t bytes = count * scalar_type_bytes(dtype);
    const auto all = rv_.all_gather(std::string(static_cast<const char*>(send), bytes), "all_gather");
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].size() != bytes) throw std::runtime_error("CPU socket communicator: ranks disagree on an all_gather size");
      if (bytes) std::memcpy(static_cast<char*>(recv) + r * bytes, all[r].data(), bytes);
    }
  }

 private:
  comm::TcpRendezvous rv_;
  std::vector<float> sum_;
};

}  // namespace

std::unique_ptr<Communicator> make_cpu_socket_communicator(int rank, int world, const std::string& master_addr,
                                                           int master_port, std::chrono::milliseconds timeout) {
  return std::make_unique<CpuSocketCommunicator>(rank, world, master_addr, master_port, timeout);
}

void abort_cpu_communicators(Communicator& comm) {
  if (auto* c = dynamic_cast<CpuCommunicator*>(&comm)) c->abort();
}

}  // namespace fp8kv
