#include "backend/cpu/thread_pool.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fp8kv {

namespace {

// How long an idle worker (and a caller waiting for its last chunks) spins
// before it blocks. Back-to-back ops of one layer arrive within this; the
// gap between decode steps does not, so idle workers sleep there.
constexpr auto kSpin = std::chrono::microseconds(20);
// Chunks per thread: more chunks than threads, so the caller can take over a
// late worker's share instead of waiting for it.
constexpr int64_t kChunksPerThread = 4;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

void futex_wait(std::atomic<uint32_t>* a, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* a, int n) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}

// Spins (bounded by kSpin) until pred() holds; false if it did not.
template <class P>
bool spin_until(P pred) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= until) return pred();
  }
}

int cgroup_quota_cpus() {
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long long period = 0;
  if (!(f >> quota >> period) || quota == "max" || period <= 0) return 0;
  try {
    const long long q = std::stoll(quota);
    if (q <= 0) return 0;
    return static_cast<int>(std::min<long long>((q + period - 1) / period, INT_MAX));
  } catch (...) {
    return 0;
  }
}

// The job state, one word: next chunk to claim (bits 0-23), chunk count
// (24-47), seats left for workers (48-63). A claim is a CAS on the whole
// word, so a claim always belongs to the job current at that moment (a job
// cannot end before its claimed chunks are done).
constexpr uint64_t kMask24 = (1ull << 24) - 1;
constexpr int64_t kMaxChunks = static_cast<int64_t>(kMask24);
uint64_t pack(uint64_t next, uint64_t n, uint64_t seats) { return next | (n << 24) | (seats << 48); }
uint64_t next_of(uint64_t s) { return s & kMask24; }
uint64_t n_of(uint64_t s) { return (s >> 24) & kMask24; }
uint64_t seats_of(uint64_t s) { return s >> 48; }

class Pool {
 public:
  static Pool& get() {
    static Pool* p = new Pool;  // never destroyed: workers sleep until exit
    return *p;
  }

  void run(int64_t n, int64_t grain, detail::ChunkFn fn, void* ctx, int threads) {
    const int64_t g = std::max<int64_t>(grain, 1);
    const int64_t wanted = (n + g - 1) / g;
    threads = static_cast<int>(std::min<int64_t>(threads, wanted));
    if (threads <= 1) return fn(ctx, 0, n);
    std::unique_lock<std::mutex> lk(job_mu_, std::try_to_lock);
    if (!lk.owns_lock()) return fn(ctx, 0, n);  // another thread's job holds the pool
    ensure_workers(threads - 1);
    int64_t chunks = std::min({wanted, static_cast<int64_t>(threads) * kChunksPerThread, kMaxChunks});
    const int64_t chunk = (n + chunks - 1) / chunks;
    chunks = (n + chunk - 1) / chunk;
    const int seats = std::min<int>(threads - 1, static_cast<int>(workers_.size()));
    fn_ = fn;
    ctx_ = ctx;
    items_ = n;
    chunk_ = chunk;
    done_.store(0, std::memory_order_relaxed);
    state_.store(pack(0, static_cast<uint64_t>(chunks), static_cast<uint64_t>(seats)), std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake(&epoch_, seats);
    work();  // the caller claims chunks too
    const uint32_t total = static_cast<uint32_t>(chunks);
    auto all_done = [&] { return done_.load(std::memory_order_acquire) == total; };
    if (!spin_until(all_done)) {
      for (;;) {
        caller_waiting_.store(1, std::memory_order_seq_cst);
        const uint32_t d = done_.load(std::memory_order_seq_cst);
        if (d == total) break;
        futex_wait(&done_, d);
      }
      caller_waiting_.store(0, std::memory_order_relaxed);
    }
  }

 private:
  // Claims and runs chunks of the current job until none is left.
  void work() {
    uint64_t s = state_.load(std::memory_order_acquire);
    while (next_of(s) < n_of(s)) {
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const int64_t i = static_cast<int64_t>(next_of(s));
      const int64_t b = i * chunk_, e = std::min(items_, b + chunk_);
      fn_(ctx_, b, e);
      const uint32_t d = done_.fetch_add(1, std::memory_order_seq_cst) + 1;
      if (d == static_cast<uint32_t>(n_of(s)) && caller_waiting_.load(std::memory_order_seq_cst))
        futex_wake(&done_, 1);
      s = state_.load(std::memory_order_acquire);
    }
  }

  bool take_seat() {
    uint64_t s = state_.load(std::memory_order_acquire);
    while (next_of(s) < n_of(s) && seats_of(s) > 0)
      if (state_.compare_exchange_weak(s, s - (1ull << 48), std::memory_order_acq_rel, std::memory_order_acquire))
        return true;
    return false;
  }

  void worker_loop() {
    uint32_t seen = epoch_.load(std::memory_order_acquire);
    for (;;) {
      if (!spin_until([&] { return epoch_.load(std::memory_order_acquire) != seen; })) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        while (epoch_.load(std::memory_order_seq_cst) == seen) futex_wait(&epoch_, seen);
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = epoch_.load(std::memory_order_acquire);
      if (take_seat()) work();
    }
  }

  void ensure_workers(int n) {
    while (static_cast<int>(workers_.size()) < n) {
      workers_.emplace_back([this] { worker_loop(); });
      workers_.back().detach();
    }
  }

  std::mutex job_mu_;  // one job on the pool at a time
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> epoch_{0}, done_{0}, caller_waiting_{0};
  std::atomic<int> sleepers_{0};
  // The current job; written only while no chunk of the previous job is in
  // flight, published by the release store of state_.
  detail::ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t items_ = 0, chunk_ = 1;
};

thread_local int t_threads = 0;  // 0: available_cpus()

}  // namespace

int available_cpus() {
  static const int n = [] {
    int c = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) c = CPU_COUNT(&set);
    if (c <= 0) c = static_cast<int>(std::thread::hardware_concurrency());
    if (const int q = cgroup_quota_cpus(); q > 0) c = std::min(c, q);
    return std::max(c, 1);
  }();
  return n;
}

void set_pool_threads(int n) { t_threads = n > 0 ? n : 0; }
int pool_threads() { return t_threads > 0 ? std::min(t_threads, available_cpus()) : available_cpus(); }

namespace detail {
void parallel_for_impl(int64_t n, int64_t grain, ChunkFn fn, void* ctx) {
  Pool::get().run(n, grain, fn, ctx, pool_threads());
}
}  // namespace detail

}  // namespace fp8kv
