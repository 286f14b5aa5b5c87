// The CPU ops' thread pool (docs/design.md "CPU threads").
//
// parallel_for(n, grain, body) splits [0, n) into chunks of at least `grain`
// items and runs body(begin, end) on each. The calling thread takes part and
// claims chunks from a shared counter like every worker, so a job finishes
// as soon as its chunks are done: a worker that the OS has not scheduled
// (busy cores) does not hold the caller back, it finds no chunk left and goes
// back to sleep. A worker that finds no job spins for a short bounded time
// (kSpinNs) and then blocks on a futex: no core is burnt between jobs.
//
// Sizing: the pool never starts more threads than the CPUs the process may
// run on (sched_getaffinity, capped by a cgroup cpu.max quota), and a job
// uses at most one thread per chunk: a job of one chunk runs inline.
//
// Results never depend on the thread count: the chunking (which items one
// body call covers) is a function of n, grain and the thread count, so bodies
// must compute each item independently of its chunk, as every CPU op does.
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

namespace fp8kv {

// CPUs this process can run on: sched_getaffinity's count, lowered to
// ceil(quota / period) when a cgroup v2 cpu.max quota is set. At least 1.
int available_cpus();

// Threads for parallel_for on the calling thread (n <= 0: available_cpus()).
// Per calling thread, like OpenMP's num_threads: a tensor-parallel rank
// thread may run with 1 while rank 0 uses the pool.
void set_pool_threads(int n);
int pool_threads();

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_for_impl(int64_t n, int64_t grain, ChunkFn fn, void* ctx);
}  // namespace detail

// body(int64_t begin, int64_t end) for chunks covering [0, n), each of at
// least `grain` items (grain >= 1). Returns when every chunk is done. One
// job at a time runs on the pool; a second concurrent caller (another
// thread) runs its job inline. Exceptions thrown by body are not allowed
// (the ops do not throw inside loops).
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  detail::parallel_for_impl(
      n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

}  // namespace fp8kv
