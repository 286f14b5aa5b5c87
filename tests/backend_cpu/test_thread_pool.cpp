// The CPU ops' thread pool (backend/cpu/thread_pool.h): every index runs
// exactly once, concurrent and nested callers run inline, the size follows
// the CPUs the process may use, and busy cores do not stall a job (issue 37
// A2: the OpenMP pool ran 20-60x slower than one thread with two busy loops
// beside it).
#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace fp8kv {
namespace {

struct ThreadsGuard {
  explicit ThreadsGuard(int n) { set_pool_threads(n); }
  ~ThreadsGuard() { set_pool_threads(0); }
};

TEST(ThreadPool, EveryIndexRunsOnceForAnySizeGrainAndThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadsGuard g(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 100003}) {
      for (int64_t grain : {1, 3, 4096}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        parallel_for(n, grain, [&](int64_t b, int64_t e) {
          ASSERT_LE(0, b);
          ASSERT_LT(b, e);
          ASSERT_LE(e, n);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << grain << " " << i;
      }
    }
  }
}

TEST(ThreadPool, SizeFollowsTheCpusThisProcessMayUse) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_GE(available_cpus(), 1);
  EXPECT_LE(available_cpus(), CPU_COUNT(&set));  // a cgroup quota may lower it further
  ThreadsGuard g(100000);
  EXPECT_EQ(pool_threads(), available_cpus());  // never more threads than CPUs
  set_pool_threads(0);
  EXPECT_EQ(pool_threads(), available_cpus());
  set_pool_threads(1);
  EXPECT_EQ(pool_threads(), 1);
}

TEST(ThreadPool, NestedAndConcurrentCallersRunInline) {
  ThreadsGuard g(0);
  std::atomic<int64_t> sum{0};
  parallel_for(64, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(100, 1, [&](int64_t b2, int64_t e2) { sum.fetch_add(e2 - b2); });  // nested: inline
  });
  EXPECT_EQ(sum.load(), 64 * 100);
  // Two threads submitting jobs at once: one gets the pool, the other runs inline.
  std::atomic<int64_t> a{0}, b{0};
  auto work = [](std::atomic<int64_t>& acc) {
    for (int k = 0; k < 300; ++k)
      parallel_for(5000, 64, [&](int64_t s, int64_t e) { acc.fetch_add(e - s); });
  };
  std::thread t1(work, std::ref(a)), t2(work, std::ref(b));
  t1.join();
  t2.join();
  EXPECT_EQ(a.load(), 300 * 5000);
  EXPECT_EQ(b.load(), 300 * 5000);
}

// Many short jobs, as a decode step issues them, while every CPU is busy:
// the caller takes the chunks of workers the OS has not scheduled, so the
// pool is not much slower than one thread. A pool that waited for every
// worker (a static schedule, a barrier) takes a scheduler time slice per
// job here, tens of times slower.
TEST(ThreadPool, BusyCoresDoNotStallJobs) {
  const int cpus = available_cpus();
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < cpus; ++i)
    busy.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  std::vector<float> v(1 << 14, 1.0f);
  auto run = [&](int threads) {
    ThreadsGuard g(threads);
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 2000; ++k)
      parallel_for(static_cast<int64_t>(v.size()), 1024, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) v[static_cast<size_t>(i)] = v[static_cast<size_t>(i)] * 0.999f + 0.001f;
      });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double one = run(1), pool = run(0);
  stop = true;
  for (auto& t : busy) t.join();
  std::printf("2000 jobs beside %d busy threads: 1 thread %.3f s, pool of %d %.3f s\n", cpus, one, cpus, pool);
  EXPECT_LT(pool, 4.0 * one + 0.2) << "the pool stalls on busy cores";
}

}  // namespace
}  // namespace fp8kv
