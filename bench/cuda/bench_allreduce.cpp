// All-reduce latency and bus bandwidth on 2 GPUs (one process, one thread per
// GPU): NCCL vs the one-shot peer-memory kernel (docs/comm.md), f32 messages
// of 4 KiB .. 64 MiB. Per call: CUDA events around the call on every rank;
// the figure is the larger of the two ranks' medians over `iters` calls after
// 20 warm-up calls (this includes the ranks' host launch skew); the mean over
// one back-to-back loop; and the mean per call of 50 calls captured in a CUDA
// graph, replayed 4 times (no host launch cost: the decode path's case). The
// threshold suggestion uses the graph figure. Bus bandwidth is nccl-tests'
// definition: bytes / time * 2 (world - 1) / world.
//   bench_allreduce [--iters N] [--max-mib M] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/comm/nccl.h"

using namespace fp8kv;

namespace {

struct Result {
  double median_us = 0, loop_us = 0, graph_us = 0;
  bool ran = false;
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 0;  // 0 = by size
  size_t max_mib = 64;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--max-mib" && i + 1 < argc) max_mib = static_cast<size_t>(std::atol(argv[++i]));
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_allreduce [--iters N] [--max-mib M] [--json FILE]\n");
      return 2;
    }
  }
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 2) {
    std::fprintf(stderr, "bench_allreduce: needs 2 GPUs (have %d)\n", ngpu);
    return 77;
  }
  if (!nccl_available()) {
    std::fprintf(stderr, "bench_allreduce: built without NCCL\n");
    return 77;
  }
  const int world = 2;
  const std::vector<int> devs = {0, 1};
  NcclCommOptions opt;
  const size_t oneshot_cap = std::min<size_t>(16, max_mib) << 20;
  opt.oneshot_capacity_bytes = oneshot_cap;
  auto comms = make_nccl_communicators(devs, opt);
  auto* c0 = dynamic_cast<CudaCommunicator*>(comms[0].get());
  std::printf("NCCL_NVLS_ENABLE=%s; one-shot: %s; auto threshold %zu bytes\n", std::getenv("NCCL_NVLS_ENABLE"),
              c0->oneshot_status().c_str(), c0->oneshot_max_bytes());
  std::vector<size_t> sizes;
  for (size_t b = 4096; b <= (max_mib << 20); b *= 2) sizes.push_back(b);
  const AllReduceAlgo algos[2] = {AllReduceAlgo::nccl, AllReduceAlgo::oneshot};
  std::vector<std::vector<std::vector<Result>>> res(static_cast<size_t>(world),
                                                    std::vector<std::vector<Result>>(sizes.size(), std::vector<Result>(2)));
  std::barrier sync(world);
  std::vector<char> graph_ok(static_cast<size_t>(world), 0);
  std::vector<std::thread> ts;
  std::string err;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        FP8KV_CU(cudaSetDevice(r));
        auto* c = dynamic_cast<CudaCommunicator*>(comms[static_cast<size_t>(r)].get());
        void* buf = nullptr;
        FP8KV_CU(cudaMalloc(&buf, sizes.back()));
        FP8KV_CU(cudaMemset(buf, 0, sizes.back()));
        cudaStream_t s;
        FP8KV_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        const int max_it = 2000;
        std::vector<cudaEvent_t> ev(2 * max_it + 2);
        for (auto& e : ev) FP8KV_CU(cudaEventCreate(&e));
        for (size_t si = 0; si < sizes.size(); ++si)
          for (int ai = 0; ai < 2; ++ai) {
            const size_t bytes = sizes[si];
            const size_t count = bytes / 4;
            const bool ok = algos[ai] == AllReduceAlgo::nccl || (c->oneshot_enabled() && bytes <= c->oneshot_capacity_bytes());
            sync.arrive_and_wait();
            if (!ok) continue;
            const int n = std::min(max_it, iters > 0 ? iters : bytes <= (1u << 20) ? 1000 : bytes <= (16u << 20) ? 200 : 50);
            for (int w = 0; w < 20; ++w) c->all_reduce_sum_algo(algos[ai], buf, count, ScalarType::f32, s);
            FP8KV_CU(cudaStreamSynchronize(s));
            sync.arrive_and_wait();
            for (int i = 0; i < n; ++i) {
              FP8KV_CU(cudaEventRecord(ev[static_cast<size_t>(2 * i)], s));
              c->all_reduce_sum_algo(algos[ai], buf, count, ScalarType::f32, s);
              FP8KV_CU(cudaEventRecord(ev[static_cast<size_t>(2 * i + 1)], s));
            }
            FP8KV_CU(cudaStreamSynchronize(s));
            std::vector<float> t(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i)
              FP8KV_CU(cudaEventElapsedTime(&t[static_cast<size_t>(i)], ev[static_cast<size_t>(2 * i)], ev[static_cast<size_t>(2 * i + 1)]));
            sync.arrive_and_wait();
            // One back-to-back loop, timed as a whole.
            FP8KV_CU(cudaEventRecord(ev[ev.size() - 2], s));
            for (int i = 0; i < n; ++i) c->all_reduce_sum_algo(algos[ai], buf, count, ScalarType::f32, s);
            FP8KV_CU(cudaEventRecord(ev[ev.size() - 1], s));
            FP8KV_CU(cudaStreamSynchronize(s));
            float loop_ms = 0;
            FP8KV_CU(cudaEventElapsedTime(&loop_ms, ev[ev.size() - 2], ev[ev.size() - 1]));
            Result& R = res[static_cast<size_t>(r)][si][static_cast<size_t>(ai)];
            R.median_us = median(t) * 1000.0;
            R.loop_us = loop_ms * 1000.0 / n;
            R.ran = true;
            // CUDA graph of kGraphCalls calls. Capture runs no collective, so
            // a failure on one rank is agreed on before any replay.
            constexpr int kGraphCalls = 50, kReplays = 4;
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec = nullptr;
            bool gok = true;
            try {
              FP8KV_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
              try {
                for (int i = 0; i < kGraphCalls; ++i) c->all_reduce_sum_algo(algos[ai], buf, count, ScalarType::f32, s);
              } catch (...) {
                cudaStreamEndCapture(s, &graph);
                throw;
              }
              FP8KV_CU(cudaStreamEndCapture(s, &graph));
              FP8KV_CU(cudaGraphInstantiate(&exec, graph, 0));
            } catch (const std::exception& e) {
              std::fprintf(stderr, "rank %d: graph capture of %zu bytes failed: %s\n", r, bytes, e.what());
              (void)cudaGetLastError();
              gok = false;
            }
            graph_ok[static_cast<size_t>(r)] = gok;
            sync.arrive_and_wait();
            bool all_ok = true;
            for (int q = 0; q < world; ++q) all_ok = all_ok && graph_ok[static_cast<size_t>(q)];
            if (all_ok) {
              FP8KV_CU(cudaGraphLaunch(exec, s));  // warm-up replay
              FP8KV_CU(cudaStreamSynchronize(s));
              sync.arrive_and_wait();
              FP8KV_CU(cudaEventRecord(ev[ev.size() - 2], s));
              for (int k = 0; k < kReplays; ++k) FP8KV_CU(cudaGraphLaunch(exec, s));
              FP8KV_CU(cudaEventRecord(ev[ev.size() - 1], s));
              FP8KV_CU(cudaStreamSynchronize(s));
              float gms = 0;
              FP8KV_CU(cudaEventElapsedTime(&gms, ev[ev.size() - 2], ev[ev.size() - 1]));
              R.graph_us = gms * 1000.0 / (kGraphCalls * kReplays);
            }
            sync.arrive_and_wait();
            if (exec) cudaGraphExecDestroy(exec);
            if (graph) cudaGraphDestroy(graph);
          }
        for (auto& e : ev) cudaEventDestroy(e);
        cudaStreamDestroy(s);
        cudaFree(buf);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        std::fflush(stderr);
        std::_Exit(1);
      }
    });
  for (auto& t : ts) t.join();

  FILE* jf = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
  const double busf = 2.0 * (world - 1) / world;
  std::printf("\nper call, us (larger of the 2 ranks); graph = mean per call inside a CUDA graph\n");
  std::printf("%10s | %8s %8s %8s | %8s %8s %8s | %9s %9s | %s\n", "bytes", "nccl med", "loop", "graph", "1sh med", "loop",
              "graph", "nccl GB/s", "1sh GB/s", "faster (graph)");
  size_t threshold = 0;
  bool still = true;
  for (size_t si = 0; si < sizes.size(); ++si) {
    Result m[2];
    for (int ai = 0; ai < 2; ++ai)
      for (int r = 0; r < world; ++r) {
        const Result& R = res[static_cast<size_t>(r)][si][static_cast<size_t>(ai)];
        m[ai].ran = R.ran;
        m[ai].median_us = std::max(m[ai].median_us, R.median_us);
        m[ai].loop_us = std::max(m[ai].loop_us, R.loop_us);
        m[ai].graph_us = std::max(m[ai].graph_us, R.graph_us);
      }
    const double b = static_cast<double>(sizes[si]);
    // Bus bandwidth from the graph figure (falls back to the median).
    auto bw = [&](const Result& R) {
      const double t = R.graph_us > 0 ? R.graph_us : R.median_us;
      return R.ran && t > 0 ? b / (t * 1e-6) * busf / 1e9 : 0.0;
    };
    auto num = [](bool ran, double v) {
      char x[32];
      if (!ran || v <= 0) return std::string("-");
      std::snprintf(x, sizeof(x), "%.2f", v);
      return std::string(x);
    };
    const double t0 = m[0].graph_us > 0 ? m[0].graph_us : m[0].median_us;
    const double t1 = m[1].graph_us > 0 ? m[1].graph_us : m[1].median_us;
    const bool one_wins = m[1].ran && t1 < t0;
    if (still && one_wins) threshold = sizes[si];
    if (!one_wins) still = false;
    std::printf("%10zu | %8s %8s %8s | %8s %8s %8s | %9.1f %9s | %s\n", sizes[si], num(true, m[0].median_us).c_str(),
                num(true, m[0].loop_us).c_str(), num(true, m[0].graph_us).c_str(), num(m[1].ran, m[1].median_us).c_str(),
                num(m[1].ran, m[1].loop_us).c_str(), num(m[1].ran, m[1].graph_us).c_str(), bw(m[0]),
                m[1].ran ? num(true, bw(m[1])).c_str() : "-", !m[1].ran ? "nccl" : one_wins ? "oneshot" : "nccl");
    if (jf)
      std::fprintf(jf,
                   "{\"kind\":\"allreduce\",\"world\":%d,\"dtype\":\"f32\",\"bytes\":%zu,\"nccl_median_us\":%.3f,\"nccl_loop_us\":%.3f,"
                   "\"nccl_graph_us\":%.3f,\"nccl_busbw_gbs\":%.2f,\"oneshot_median_us\":%.3f,\"oneshot_loop_us\":%.3f,"
                   "\"oneshot_graph_us\":%.3f,\"oneshot_busbw_gbs\":%.2f}\n",
                   world, sizes[si], m[0].median_us, m[0].loop_us, m[0].graph_us, bw(m[0]), m[1].ran ? m[1].median_us : -1.0,
                   m[1].ran ? m[1].loop_us : -1.0, m[1].ran ? m[1].graph_us : -1.0, bw(m[1]));
  }
  std::printf("\none-shot faster than NCCL (graph figure) for every size up to %zu bytes (auto threshold now %zu)\n", threshold,
              c0->oneshot_max_bytes());
  if (jf) std::fclose(jf);
  return 0;
}
