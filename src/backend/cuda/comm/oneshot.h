// One-shot all-reduce for small messages over peer memory (docs/comm.md,
// docs/design.md "Collectives"), as vLLM's custom all-reduce and TRT-LLM's
// oneshot: each rank owns a registered device buffer that every peer can
// address (peer access in one process, CUDA IPC across processes). One
// kernel per call: copy the input into the own buffer, a per-block flag
// barrier with every peer (release/acquire at system scope), then every rank
// reads all ranks' copies and sums them in rank order 0..world-1 in fp32, so
// every rank gets bitwise the same result. bf16 is accumulated in fp32 and
// rounded once.
//
// Sequence numbers live in device memory (one counter per block), so the
// kernel has no per-call host arguments and can be captured in a CUDA graph;
// each rank must replay its graphs in the same order as its peers. Buffers
// alternate by parity of the sequence number, so a rank that is one call
// ahead never overwrites data a peer is still reading.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/tensor.h"

namespace fp8kv::comm {

constexpr int kOneShotMaxWorld = 8;

class OneShotAllReduce {
 public:
  // Allocates this rank's registered buffer on the current device (which the
  // caller has set to the rank's device): 2 x capacity_bytes of data + flags.
  OneShotAllReduce(int rank, int world, size_t capacity_bytes);
  ~OneShotAllReduce();
  OneShotAllReduce(const OneShotAllReduce&) = delete;
  OneShotAllReduce& operator=(const OneShotAllReduce&) = delete;

  // The base of the own registered allocation (to share via IPC / peer access).
  void* local_base() const { return base_; }
  // Every rank's base as mapped on this device (index = rank; [rank] = local_base()).
  void set_peer_bases(const std::vector<void*>& bases);
  bool ready() const { return ready_; }

  size_t capacity_bytes() const { return capacity_; }
  // Largest message (in bytes) this instance takes.
  bool fits(size_t count, ScalarType dtype) const;

  // In place on `stream`; dtype f32 or bf16; count * size <= capacity.
  void all_reduce_sum(void* data, size_t count, ScalarType dtype, cudaStream_t stream);

 private:
  int rank_, world_;
  size_t capacity_;
  void* base_ = nullptr;
  std::vector<void*> peers_;
  bool ready_ = false;
  unsigned long long spin_timeout_ns_;
};

}  // namespace fp8kv::comm
