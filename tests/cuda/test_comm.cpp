// Tensor-parallel collectives (backend/cuda/comm_*; docs/comm.md): the TCP
// rendezvous (no GPU needed), NCCL and one-shot all-reduce / all-gather on 1
// and 2 GPUs against a host reference, barrier reuse over 1000 back-to-back
// calls, CUDA graph capture of the one-shot path, and two processes over the
// TCP rendezvous against the single-process result. GPU cases skip with
// fewer GPUs than they need or without NCCL.
//
// Reference and tolerance: with world 2 the sum is one fp32 addition of the
// two inputs, correctly rounded and commutative, so every algorithm and rank
// order gives bitwise the host's x0 + x1 (f32), and bf16(x0 + x1) for bf16
// inputs (the fp32 sum of two bf16 values is exact unless their exponents
// differ by more than 16, and then both roundings give the larger one). World
// 1 is the identity. So the comparisons below are exact.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/tcp_rendezvous.h"
#include "backend/cuda/comm/nccl.h"
#include "cuda_test_util.h"
#include "numerics/fp8.h"

extern char** environ;

namespace fp8kv {
namespace {

using cudatest::check;
using Bytes = std::vector<uint8_t>;

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define REQUIRE_GPUS(n)                                                                     \
  do {                                                                                      \
    if (!nccl_available()) GTEST_SKIP() << "built without NCCL";                            \
    if (gpu_count() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, have " << gpu_count(); \
  } while (0)

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw std::runtime_error("bind");
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs fn(rank, sync) on one thread per rank (device = rank); rethrows the
// first error. fn calls sync() between allocating and the collectives and
// after synchronising: in one process with peer access, a cudaMalloc/cudaFree
// on one device while a peer's collective kernel waits for this rank can
// deadlock (NCCL's documented rule), so they never overlap here.
struct Sync {
  std::barrier<>* b;
  void operator()() const { b->arrive_and_wait(); }
};
template <class F>
void per_rank(int world, F fn) {
  std::vector<std::thread> ts;
  std::mutex m;
  std::exception_ptr err;
  std::barrier<> bar(world);
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        check(cudaSetDevice(r), "cudaSetDevice");
        fn(r, Sync{&bar});
      } catch (...) {
        std::lock_guard<std::mutex> g(m);
        if (!err) err = std::current_exception();
        // The peers may wait at the barrier: a failed rank cannot leave them
        // stuck, so give up on the whole process (the error is printed).
        try {
          std::rethrow_exception(err);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d failed: %s\n", r, e.what());
        }
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  for (auto& t : ts) t.join();
  if (err) std::rethrow_exception(err);
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's input: arbitrary-mantissa floats in about [-8, 8] (bf16-rounded for bf16).
float input_value(int r, size_t i, uint64_t tag) {
  const uint64_t h = mix(tag * 1000003ull + static_cast<uint64_t>(r) * 7919ull + i);
  const float m = static_cast<float>(h & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
  return std::ldexp(m, static_cast<int>((h >> 32) % 7) - 3);
}

// Element i of b, an f32 or bf16 (rounded from v) array.
void put_value(Bytes& b, size_t i, ScalarType dt, float v) {
  if (dt == ScalarType::f32) {
    std::memcpy(b.data() + 4 * i, &v, 4);
  } else {
    const uint16_t h = f32_to_bf16(v);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
}
float get_value(const Bytes& b, size_t i, ScalarType dt) {
  if (dt == ScalarType::f32) {
    float x;
    std::memcpy(&x, b.data() + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return bf16_to_f32(h);
}

Bytes make_input(int r, size_t count, ScalarType dt, uint64_t tag) {
  Bytes b(count * scalar_type_bytes(dt));
  for (size_t i = 0; i < count; ++i) put_value(b, i, dt, input_value(r, i, tag));
  return b;
}

// Host reference: fp32 sum in rank order, rounded once to the dtype.
Bytes reference(int world, size_t count, ScalarType dt, uint64_t tag) {
  std::vector<Bytes> in;
  for (int r = 0; r < world; ++r) in.push_back(make_input(r, count, dt, tag));
  Bytes out(count * scalar_type_bytes(dt));
  for (size_t i = 0; i < count; ++i) {
    float acc = 0;
    for (int r = 0; r < world; ++r) {
      const float x = get_value(in[static_cast<size_t>(r)], i, dt);
      acc = r == 0 ? x : acc + x;
    }
    put_value(out, i, dt, acc);
  }
  return out;
}

size_t first_mismatch(const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return i;
  return SIZE_MAX;
}

struct Group {
  std::vector<std::unique_ptr<Communicator>> comms;
  CudaCommunicator* at(int r) { return dynamic_cast<CudaCommunicator*>(comms[static_cast<size_t>(r)].get()); }
};

Group make_group(int world, NcclCommOptions opt = {}) {
  std::vector<int> devs;
  for (int r = 0; r < world; ++r) devs.push_back(r);
  Group g{make_nccl_communicators(devs, opt)};
  for (int r = 0; r < world; ++r)
    if (!g.at(r)) throw std::runtime_error("factory did not return a CudaCommunicator");
  return g;
}

// One all-reduce per rank (own thread and stream); returns each rank's output.
std::vector<Bytes> run_all_reduce(Group& g, int world, AllReduceAlgo algo, size_t count, ScalarType dt, uint64_t tag) {
  std::vector<Bytes> out(static_cast<size_t>(world));
  per_rank(world, [&](int r, Sync sync) {
    const Bytes in = make_input(r, count, dt, tag);
    cudatest::DevBuf buf(in);
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    sync();
    g.at(r)->all_reduce_sum_algo(algo, buf.get(), count, dt, s);
    check(cudaStreamSynchronize(s), "sync");
    sync();
    check(cudaStreamDestroy(s), "stream destroy");
    out[static_cast<size_t>(r)] = buf.download<uint8_t>();
  });
  return out;
}

const char* algo_name(AllReduceAlgo a) {
  return a == AllReduceAlgo::nccl ? "nccl" : a == AllReduceAlgo::oneshot ? "oneshot" : "auto";
}

// ---------------------------------------------------------------- rendezvous

TEST(CommTcp, AllGatherThreeRanks) {
  const int port = free_port();
  std::vector<std::vector<std::string>> got(3);
  std::vector<std::thread> ts;
  std::mutex m;
  std::string err;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      try {
        comm::TcpRendezvous rdv(r, 3, "127.0.0.1", port, std::chrono::seconds(10));
        got[static_cast<size_t>(r)] = rdv.all_gather(std::string(static_cast<size_t>(r) * 1000, char('a' + r)), "test");
        // A second exchange on the same connections (as the factories do).
        const auto again = rdv.all_gather(std::to_string(r), "again");
        if (again != std::vector<std::string>{"0", "1", "2"}) throw std::runtime_error("second exchange wrong");
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(m);
        err += e.what();
      }
    });
  for (auto& t : ts) t.join();
  ASSERT_EQ(err, "");
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(got[static_cast<size_t>(r)].size(), 3u);
    for (int p = 0; p < 3; ++p)
      EXPECT_EQ(got[static_cast<size_t>(r)][static_cast<size_t>(p)], std::string(static_cast<size_t>(p) * 1000, char('a' + p)));
  }
}

template <class F>
std::string error_within(F fn, double max_s, double* took) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string what = "(no error)";
  try {
    fn();
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  *took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(*took, max_s) << what;
  return what;
}

TEST(CommTcp, NobodyListeningIsABoundedClearError) {
  const int port = free_port();
  double took = 0;
  const std::string e = error_within([&] { comm::TcpRendezvous(1, 2, "127.0.0.1", port, std::chrono::milliseconds(1500)); }, 10, &took);
  EXPECT_NE(e.find("could not connect to the master"), std::string::npos) << e;
  EXPECT_NE(e.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e;
  EXPECT_GE(took, 1.0);  // it retried until the deadline (rank 0 may start late)
}

TEST(CommTcp, UnresolvableAddressIsAClearError) {
  double took = 0;
  // Fails at once where DNS answers; bounded by the timeout where it stalls.
  const std::string e = error_within([&] { comm::TcpRendezvous(1, 2, "no-such-host.invalid", 29500, std::chrono::milliseconds(1500)); }, 10, &took);
  const bool clear = e.find("cannot resolve master address 'no-such-host.invalid'") != std::string::npos ||
                     e.find("resolving master address 'no-such-host.invalid' timed out") != std::string::npos;
  EXPECT_TRUE(clear) << e;
}

TEST(CommTcp, MasterTimesOutWaitingForPeers) {
  double took = 0;
  const std::string e = error_within([&] { comm::TcpRendezvous(0, 3, "127.0.0.1", free_port(), std::chrono::milliseconds(800)); }, 10, &took);
  EXPECT_NE(e.find("timed out"), std::string::npos) << e;
  EXPECT_NE(e.find("2 of 2 peers"), std::string::npos) << e;
}

TEST(CommTcp, BadArgumentsAreRejected) {
  double took = 0;
  EXPECT_NE(error_within([] { comm::TcpRendezvous(2, 2, "127.0.0.1", 29500, std::chrono::seconds(1)); }, 5, &took).find("rank 2 out of range"), std::string::npos);
  EXPECT_NE(error_within([] { comm::TcpRendezvous(0, 2, "127.0.0.1", 0, std::chrono::seconds(1)); }, 5, &took).find("port 0 out of range"), std::string::npos);
  EXPECT_NE(error_within([] { comm::TcpRendezvous(0, 0, "127.0.0.1", 29500, std::chrono::seconds(1)); }, 5, &took).find("world size 0"), std::string::npos);
}

TEST(CommTcp, FactoryWithBadPortFailsClearly) {
  // Whatever the GPUs, the rendezvous runs first and fails within the timeout.
  ::setenv("FP8KV_COMM_TIMEOUT_S", "1", 1);
  const int port = free_port();
  double took = 0;
  const std::string e = error_within([&] { make_nccl_communicator_tcp(1, 2, 0, "127.0.0.1", port); }, 10, &took);
  ::unsetenv("FP8KV_COMM_TIMEOUT_S");
  if (nccl_available())
    EXPECT_NE(e.find("could not connect to the master"), std::string::npos) << e;
  else
    EXPECT_NE(e.find("built without NCCL"), std::string::npos) << e;
}

// A rank whose local set-up fails (here: device 99) makes every rank throw,
// instead of leaving the others inside ncclCommInitRank.
TEST(CommTcp, FactorySetupFailureReachesEveryRank) {
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  ::setenv("FP8KV_COMM_TIMEOUT_S", "20", 1);
  const int port = free_port();
  std::vector<std::string> errs(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        make_nccl_communicator_tcp(r, 2, r == 1 ? 99 : 0, "127.0.0.1", port);
        errs[static_cast<size_t>(r)] = "(no error)";
      } catch (const std::exception& e) {
        errs[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  ::unsetenv("FP8KV_COMM_TIMEOUT_S");
  for (int r = 0; r < 2; ++r) EXPECT_NE(errs[static_cast<size_t>(r)].find("failed to set up"), std::string::npos) << errs[static_cast<size_t>(r)];
  if (gpu_count() >= 1) {  // else rank 0 fails first (no device at all)
    EXPECT_NE(errs[0].find("rank 1 of 2 failed to set up: device 99 out of range"), std::string::npos) << errs[0];
  }
}

// ---------------------------------------------------------------- all-reduce

// The override itself, without starting NCCL (an enabling value must never
// reach an NCCL init on these machines), then that a factory leaves it at 0.
TEST(CommNccl, NvlsIsForcedOff) {
  ::setenv("NCCL_NVLS_ENABLE", "1", 1);
  comm_force_nvls_off();
  const std::string v = std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)";
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // whatever happened above
  EXPECT_EQ(v, "0");
  REQUIRE_GPUS(1);
  ::unsetenv("NCCL_NVLS_ENABLE");
  Group g = make_group(1);
  const char* after = std::getenv("NCCL_NVLS_ENABLE");
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  ASSERT_NE(after, nullptr);
  EXPECT_STREQ(after, "0");
}

// The one-shot buffer is raised to 8 MiB here so that forced one-shot calls
// also cover messages where every thread loops over several chunks (the
// automatic threshold stays at its default).
void check_all_reduce(int world) {
  NcclCommOptions opt;
  opt.oneshot_capacity_bytes = size_t{8} << 20;
  Group g = make_group(world, opt);
  std::printf("world %d one-shot: %s (max %zu bytes)\n", world, g.at(0)->oneshot_status().c_str(), g.at(0)->oneshot_max_bytes());
  uint64_t tag = 1;
  for (ScalarType dt : {ScalarType::f32, ScalarType::bf16})
    for (size_t count : {size_t{1}, size_t{7}, size_t{4096}, size_t{65536}, size_t{1} << 20, size_t{16} << 20}) {
      ++tag;
      const Bytes ref = reference(world, count, dt, tag);
      for (AllReduceAlgo algo : {AllReduceAlgo::automatic, AllReduceAlgo::nccl, AllReduceAlgo::oneshot}) {
        if (algo == AllReduceAlgo::oneshot &&
            (!g.at(0)->oneshot_enabled() || count * scalar_type_bytes(dt) > g.at(0)->oneshot_capacity_bytes()))
          continue;
        const auto out = run_all_reduce(g, world, algo, count, dt, tag);
        for (int r = 0; r < world; ++r) {
          const size_t at = first_mismatch(out[static_cast<size_t>(r)], ref);
          EXPECT_EQ(at, SIZE_MAX) << "world " << world << " " << scalar_type_name(dt) << " count " << count << " "
                                  << algo_name(algo) << " rank " << r << ": first differing byte " << at;
        }
      }
    }
}

TEST(CommNccl, AllReduceWorld1) {
  REQUIRE_GPUS(1);
  check_all_reduce(1);
}

TEST(CommNccl, AllReduceWorld2) {
  REQUIRE_GPUS(2);
  check_all_reduce(2);
}

TEST(CommNccl, OneShotIsOnWithTwoPeerGpus) {
  REQUIRE_GPUS(2);
  int can = 0;
  check(cudaDeviceCanAccessPeer(&can, 0, 1), "canAccessPeer");
  if (!can) GTEST_SKIP() << "GPUs 0 and 1 have no peer access: the one-shot path is off by design";
  Group g = make_group(2);
  EXPECT_TRUE(g.at(0)->oneshot_enabled()) << g.at(0)->oneshot_status();
  EXPECT_TRUE(g.at(1)->oneshot_enabled()) << g.at(1)->oneshot_status();
  EXPECT_EQ(g.at(0)->oneshot_max_bytes(), size_t{256} * 1024);
}

// 1000 calls back to back per algorithm, each on a different input, results
// copied out on the stream: a barrier that lets a rank read a peer's buffer
// too early or too late shows up as another iteration's values.
TEST(CommNccl, ThousandBackToBackCallsStayCorrect) {
  REQUIRE_GPUS(2);
  NcclCommOptions opt;
  opt.oneshot_capacity_bytes = size_t{4} << 20;
  Group g = make_group(2, opt);
  constexpr int kInputs = 5;
  for (AllReduceAlgo algo : {AllReduceAlgo::oneshot, AllReduceAlgo::automatic, AllReduceAlgo::nccl})
    for (size_t count : {size_t{1000}, size_t{65536}, size_t{1} << 20}) {
      if (algo == AllReduceAlgo::oneshot && !g.at(0)->oneshot_enabled()) continue;
      // 1000 calls for the small sizes; 100 for 4 MiB (several chunks per thread).
      const int kIters = count == (size_t{1} << 20) ? 100 : 1000;
      const ScalarType dt = count == 65536 ? ScalarType::bf16 : ScalarType::f32;
      const size_t bytes = count * scalar_type_bytes(dt);
      std::vector<Bytes> outs(2);
      per_rank(2, [&](int r, Sync sync) {
        Bytes all_in;
        for (int k = 0; k < kInputs; ++k) {
          const Bytes b = make_input(r, count, dt, 500 + static_cast<uint64_t>(k));
          all_in.insert(all_in.end(), b.begin(), b.end());
        }
        cudatest::DevBuf in(all_in), work(bytes), res(bytes * kIters);
        cudaStream_t s;
        check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
        sync();
        for (int it = 0; it < kIters; ++it) {
          check(cudaMemcpyAsync(work.get(), in.as<uint8_t>() + bytes * static_cast<size_t>(it % kInputs), bytes,
                                cudaMemcpyDeviceToDevice, s), "copy in");
          g.at(r)->all_reduce_sum_algo(algo, work.get(), count, dt, s);
          check(cudaMemcpyAsync(res.as<uint8_t>() + bytes * static_cast<size_t>(it), work.get(), bytes, cudaMemcpyDeviceToDevice, s),
                "copy out");
        }
        check(cudaStreamSynchronize(s), "sync");
        sync();
        check(cudaStreamDestroy(s), "stream destroy");
        outs[static_cast<size_t>(r)] = res.download<uint8_t>();
      });
      std::vector<Bytes> refs;
      for (int k = 0; k < kInputs; ++k) refs.push_back(reference(2, count, dt, 500 + static_cast<uint64_t>(k)));
      int bad = 0;
      for (int r = 0; r < 2; ++r)
        for (int it = 0; it < kIters; ++it) {
          const Bytes got(outs[static_cast<size_t>(r)].begin() + static_cast<ptrdiff_t>(bytes * static_cast<size_t>(it)),
                          outs[static_cast<size_t>(r)].begin() + static_cast<ptrdiff_t>(bytes * static_cast<size_t>(it + 1)));
          if (got != refs[static_cast<size_t>(it % kInputs)] && ++bad <= 3)
            ADD_FAILURE() << algo_name(algo) << " count " << count << " rank " << r << " iteration " << it << " wrong";
        }
      EXPECT_EQ(bad, 0) << algo_name(algo) << " count " << count;
    }
}

TEST(CommNccl, AllGatherWorld2) {
  REQUIRE_GPUS(2);
  Group g = make_group(2);
  for (ScalarType dt : {ScalarType::f32, ScalarType::bf16})
    for (size_t count : {size_t{7}, size_t{1} << 20}) {
      std::vector<Bytes> outs(2);
      per_rank(2, [&](int r, Sync sync) {
        cudatest::DevBuf send(make_input(r, count, dt, 77)), recv(2 * count * scalar_type_bytes(dt));
        cudaStream_t s;
        check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
        sync();
        g.at(r)->all_gather(send.get(), recv.get(), count, dt, s);
        check(cudaStreamSynchronize(s), "sync");
        sync();
        check(cudaStreamDestroy(s), "stream destroy");
        outs[static_cast<size_t>(r)] = recv.download<uint8_t>();
      });
      Bytes expect = make_input(0, count, dt, 77);
      const Bytes b1 = make_input(1, count, dt, 77);
      expect.insert(expect.end(), b1.begin(), b1.end());
      EXPECT_EQ(outs[0], expect) << scalar_type_name(dt) << " count " << count;
      EXPECT_EQ(outs[1], expect) << scalar_type_name(dt) << " count " << count;
    }
}

// The one-shot kernel captured in a CUDA graph (its sequence numbers live in
// device memory): replays with new inputs, interleaved with direct calls.
TEST(CommNccl, OneShotUnderGraphCapture) {
  REQUIRE_GPUS(2);
  Group g = make_group(2);
  if (!g.at(0)->oneshot_enabled()) GTEST_SKIP() << g.at(0)->oneshot_status();
  const size_t count = 20000;
  const ScalarType dt = ScalarType::f32;
  const size_t bytes = count * 4;
  std::vector<std::vector<Bytes>> outs(2);
  per_rank(2, [&](int r, Sync sync) {
    cudatest::DevBuf work(bytes);
    std::vector<uint8_t*> host;  // pinned inputs and outputs, allocated before any collective
    for (int k = 0; k < 12; ++k) {
      void* p = nullptr;
      check(cudaMallocHost(&p, bytes), "cudaMallocHost");
      host.push_back(static_cast<uint8_t*>(p));
    }
    for (int k = 0; k < 6; ++k) {
      const Bytes in = make_input(r, count, dt, 900 + static_cast<uint64_t>(k));
      std::memcpy(host[static_cast<size_t>(k)], in.data(), bytes);
    }
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
    g.at(r)->all_reduce_sum_algo(AllReduceAlgo::oneshot, work.get(), count, dt, s);
    check(cudaStreamEndCapture(s, &graph), "end capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    sync();
    for (int k = 0; k < 6; ++k) {  // all queued back to back, checked at the end
      check(cudaMemcpyAsync(work.get(), host[static_cast<size_t>(k)], bytes, cudaMemcpyHostToDevice, s), "upload");
      if (k % 3 == 2)
        g.at(r)->all_reduce_sum_algo(AllReduceAlgo::oneshot, work.get(), count, dt, s);  // direct call in between
      else
        check(cudaGraphLaunch(exec, s), "graph launch");
      check(cudaMemcpyAsync(host[static_cast<size_t>(6 + k)], work.get(), bytes, cudaMemcpyDeviceToHost, s), "download");
    }
    check(cudaStreamSynchronize(s), "sync");
    sync();
    for (int k = 0; k < 6; ++k)
      outs[static_cast<size_t>(r)].emplace_back(host[static_cast<size_t>(6 + k)], host[static_cast<size_t>(6 + k)] + bytes);
    for (uint8_t* p : host) check(cudaFreeHost(p), "cudaFreeHost");
    check(cudaGraphExecDestroy(exec), "exec destroy");
    check(cudaGraphDestroy(graph), "graph destroy");
    check(cudaStreamDestroy(s), "stream destroy");
  });
  for (int k = 0; k < 6; ++k) {
    const Bytes ref = reference(2, count, dt, 900 + static_cast<uint64_t>(k));
    for (int r = 0; r < 2; ++r) EXPECT_EQ(outs[static_cast<size_t>(r)][static_cast<size_t>(k)], ref) << "replay " << k << " rank " << r;
  }
}

// ---------------------------------------------------------------- two processes

struct MpCase {
  size_t count;
  ScalarType dt;
};
const MpCase kMpCases[] = {{7, ScalarType::f32}, {4096, ScalarType::bf16}, {65536, ScalarType::f32}, {1 << 20, ScalarType::bf16}};

// The child side: runs only when the parent test below starts this binary
// with FP8KV_COMM_CHILD_RANK set.
TEST(CommChild, Rank) {
  const char* rank_s = std::getenv("FP8KV_COMM_CHILD_RANK");
  if (!rank_s) GTEST_SKIP() << "child half of CommMultiProcess (runs only when started by it)";
  const int rank = std::atoi(rank_s);
  const int port = std::atoi(std::getenv("FP8KV_COMM_CHILD_PORT"));
  const std::string dir = std::getenv("FP8KV_COMM_CHILD_OUT");
  auto c = make_nccl_communicator_tcp(rank, 2, rank, "127.0.0.1", port);
  auto* cc = dynamic_cast<CudaCommunicator*>(c.get());
  ASSERT_NE(cc, nullptr);
  std::ofstream(dir + "/status" + std::to_string(rank) + ".txt") << cc->oneshot_status() << "\n";
  std::ofstream f(dir + "/rank" + std::to_string(rank) + ".bin", std::ios::binary);
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  uint64_t tag = 300;
  for (const MpCase& mc : kMpCases) {
    cudatest::DevBuf buf(make_input(rank, mc.count, mc.dt, ++tag));
    c->all_reduce_sum(buf.get(), mc.count, mc.dt, s);
    check(cudaStreamSynchronize(s), "sync");
    const auto out = buf.download<uint8_t>();
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  }
  // An all-gather too.
  cudatest::DevBuf send(make_input(rank, 1000, ScalarType::f32, 999)), recv(2 * 1000 * 4);
  c->all_gather(send.get(), recv.get(), 1000, ScalarType::f32, s);
  check(cudaStreamSynchronize(s), "sync");
  const auto g = recv.download<uint8_t>();
  f.write(reinterpret_cast<const char*>(g.data()), static_cast<std::streamsize>(g.size()));
  check(cudaStreamDestroy(s), "stream destroy");
}

TEST(CommMultiProcess, TwoProcessesEqualSingleProcess) {
  REQUIRE_GPUS(2);
  const std::string dir = (std::filesystem::temp_directory_path() / ("fp8kv_comm_mp_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
    env_s.push_back("FP8KV_COMM_CHILD_RANK=" + std::to_string(r));
    env_s.push_back("FP8KV_COMM_CHILD_PORT=" + std::to_string(port));
    env_s.push_back("FP8KV_COMM_CHILD_OUT=" + dir);
    env_s.push_back("FP8KV_COMM_TIMEOUT_S=60");
    env_s.push_back("NCCL_NVLS_ENABLE=0");
    std::vector<char*> envp;
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
    std::string filt = "--gtest_filter=CommChild.Rank";
    char* argv[] = {exe.data(), filt.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  // Bounded wait: 180 s, then kill the children.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  std::vector<int> status(2, -1);
  int left = 2;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < 2; ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = st;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (size_t i = 0; i < 2; ++i)
    if (status[i] == -1) {
      ::kill(pids[i], SIGKILL);
      ::waitpid(pids[i], nullptr, 0);
      ADD_FAILURE() << "child rank " << i << " did not finish within 180 s";
    }
  for (size_t i = 0; i < 2; ++i)
    ASSERT_TRUE(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0) << "child rank " << i << " failed (status " << status[i] << ")";
  for (int r = 0; r < 2; ++r) {
    std::ifstream st(dir + "/status" + std::to_string(r) + ".txt");
    std::string line;
    std::getline(st, line);
    std::printf("multi-process rank %d one-shot: %s\n", r, line.c_str());
  }
  // The same collectives in one process.
  Group g = make_group(2);
  Bytes expect;
  uint64_t tag = 300;
  for (const MpCase& mc : kMpCases) {
    const auto out = run_all_reduce(g, 2, AllReduceAlgo::automatic, mc.count, mc.dt, ++tag);
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(out[0], reference(2, mc.count, mc.dt, tag));
    expect.insert(expect.end(), out[0].begin(), out[0].end());
  }
  Bytes ag = make_input(0, 1000, ScalarType::f32, 999);
  const Bytes ag1 = make_input(1, 1000, ScalarType::f32, 999);
  ag.insert(ag.end(), ag1.begin(), ag1.end());
  expect.insert(expect.end(), ag.begin(), ag.end());
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(dir + "/rank" + std::to_string(r) + ".bin", std::ios::binary);
    const Bytes got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(got.size(), expect.size()) << "rank " << r;
    EXPECT_EQ(first_mismatch(got, expect), SIZE_MAX) << "rank " << r << " differs from the single-process result";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fp8kv
